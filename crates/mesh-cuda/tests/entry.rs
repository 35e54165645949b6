//! `mesh_cuda::entry` on real nvcc output: the entry point is found in the cubins that have it, and
//! missing from one that has another kernel only; no CUDA library needed.

use std::path::PathBuf;

use mesh_cuda::entry::{Entry, function};

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/images").join(name);
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (tests/images/README.md says how to build it)", path.display()))
}

#[test]
fn mesh_main_is_read_off_real_cubins() {
    assert_eq!(function(&fixture("heartbeat.sm_90.cubin"), "mesh_main"), Entry::Defined);
    assert_eq!(function(&fixture("heartbeat.dc.sm_90.cubin"), "mesh_main"), Entry::Defined);
    assert_eq!(function(&fixture("heartbeat.sm_90.cubin"), "mesh_mai"), Entry::Missing, "whole names only");
    assert_eq!(function(&fixture("no_entry.sm_90.cubin"), "mesh_main"), Entry::Missing);
    assert_eq!(function(&fixture("no_entry.sm_90.cubin"), "not_mesh_main"), Entry::Defined);
    assert_eq!(
        function(&fixture("heartbeat.sm_90.fatbin"), "mesh_main"),
        Entry::Unknown,
        "a fatbin is the driver's to read"
    );
    // A truncated cubin is read without a panic, and what cannot be read is not taken for the entry.
    let whole = fixture("heartbeat.sm_90.cubin");
    for cut in (0..whole.len()).step_by(7) {
        let _ = function(&whole[..cut], "mesh_main");
    }
}
