//! mesh.cuh's fan-in consumer calls run as one warp on the CPU (`tests/emu`: 32 threads, every warp intrinsic an exchange between barriers), checked against a model of each shard.
//!
//! The device code is the shipped header, compiled by the host's C++ compiler with
//! `MESH_HOST_EMULATION` (which swaps its few PTX primitives for atomics): what the calls compute is
//! tested on every CI run, not the GPU's memory model or speed (the GPU tests do that). Without a C++20
//! compiler (`$CXX`, `c++` or `g++`) the test says SKIPPED and passes.

use std::path::{Path, PathBuf};
use std::process::Command;

fn compiler() -> Option<String> {
    let candidates = std::env::var("CXX").into_iter().chain(["c++".to_string(), "g++".to_string()]);
    candidates.into_iter().find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
}

fn build(cxx: &str, source: &Path, out: &Path) -> Result<(), String> {
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let output = Command::new(cxx)
        .args(["-std=c++20", "-O1", "-pthread", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function"])
        .arg("-I")
        .arg(&include)
        .arg(source)
        .arg("-o")
        .arg(out)
        .output()
        .map_err(|e| format!("{cxx}: {e}"))?;
    if output.status.success() { Ok(()) } else { Err(String::from_utf8_lossy(&output.stderr).into_owned()) }
}

#[test]
fn the_fanin_consumer_calls_take_every_request_once_in_order_one_ring_and_sharded() {
    let Some(cxx) = compiler() else {
        println!("SKIPPED: no C++ compiler ($CXX, c++ or g++) for mesh.cuh's warp emulation");
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/emu");
    let exe: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fanin_shards_emu");
    if let Err(e) = build(&cxx, &dir.join("fanin_shards.cpp"), &exe) {
        if e.contains("c++20") || e.contains("barrier") {
            println!("SKIPPED: {cxx} cannot build C++20 (std::barrier): {}", e.lines().next().unwrap_or(""));
            return;
        }
        panic!("building tests/emu/fanin_shards.cpp with {cxx} failed:\n{e}");
    }
    let run = Command::new(&exe).output().expect("run the emulation");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    println!("{stdout}");
    assert!(run.status.success() && stdout.contains("all passed"), "the warp emulation failed:\n{stdout}\n{stderr}");
}
