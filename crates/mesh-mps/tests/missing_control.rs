//! A missing `nvidia-cuda-mps-control` is an error naming where it was looked for. A test binary of
//! its own: it changes `PATH` and `MESH_MPS_CONTROL` for the whole process, which would break (or,
//! with a concurrent `getenv`, crash) any test beside it that spawns a process.

use std::path::Path;

use mesh_mps::control::MpsControl;

#[test]
fn a_missing_control_binary_names_where_it_was_looked_for() {
    // SAFETY: this test binary has this one test; nothing else reads the environment concurrently.
    unsafe {
        std::env::set_var("PATH", "/nonexistent-bin");
        std::env::set_var("MESH_MPS_CONTROL", "/nonexistent/nvidia-cuda-mps-control");
    }
    let err = MpsControl::start(None).unwrap_err().to_string();
    assert!(
        err.contains("nvidia-cuda-mps-control not found at /nonexistent/nvidia-cuda-mps-control (MESH_MPS_CONTROL)"),
        "{err}"
    );
    // SAFETY: as above.
    unsafe { std::env::remove_var("MESH_MPS_CONTROL") };
    if Path::new("/usr/local/nvidia/bin/nvidia-cuda-mps-control").exists()
        || Path::new("/usr/bin/nvidia-cuda-mps-control").exists()
    {
        eprintln!(
            "SKIPPED the search half of a_missing_control_binary_names_where_it_was_looked_for: this machine has MPS"
        );
        return;
    }
    let err = MpsControl::start(None).unwrap_err().to_string();
    assert!(err.contains("nvidia-cuda-mps-control not found; looked at"), "{err}");
    assert!(err.contains("/nonexistent-bin/nvidia-cuda-mps-control") && err.contains("/usr/local/nvidia/bin"), "{err}");
}
