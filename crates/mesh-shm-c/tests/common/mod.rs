//! What the tests against meshd's control plane share: the C API's last error, and compiling one of tests/c/*.c against the header and this build's static library.

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use mesh_shm_c::mesh_shm_last_error;

/// The message of this thread's last failed call of the C API.
pub fn last_error() -> String {
    // SAFETY: mesh_shm_last_error returns a NUL-terminated string valid until the next call on this thread.
    unsafe { CStr::from_ptr(mesh_shm_last_error()) }.to_string_lossy().into_owned()
}

/// Compiles `tests/c/NAME.c` into `out/NAME` against `include/mesh_shm.h` and the static library
/// `cargo test` builds beside the test binary; `None`, after saying SKIPPED, where there is no C
/// compiler (`$CC`, else `cc`). A compiler that refuses the program fails the test.
pub fn build_c_program(name: &str, out: &Path) -> Option<PathBuf> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The test binary is target/<profile>/deps/TEST-HASH; the library is one level up.
    let lib = std::env::current_exe().unwrap().parent().unwrap().join("libmesh_shm_c.a");
    assert!(lib.exists(), "{} was not built with the tests", lib.display());
    let exe = out.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join(format!("tests/c/{name}.c")))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .status();
    match status {
        Ok(s) => {
            assert!(s.success(), "{cc} failed on tests/c/{name}.c");
            Some(exe)
        }
        Err(e) => {
            println!("SKIPPED: no C compiler ({cc}: {e})");
            None
        }
    }
}
