//! Every CUDA program under examples/ (the ones the README, the tutorial and the how-to guides show) compiles against the shipped header, in the host emulation that `cargo xtask test` uses; the GPU run builds them with nvcc and runs them (tests/gpu-run.sh, `examples`).
//!
//! Syntax and types only, with the emulation's definitions of CUDA's built-ins (tests/emu/warp_emu.h):
//! a header change that breaks an example, or an example edited without nvcc at hand, fails here.
//! Without a C++20 compiler (`$CXX`, `c++` or `g++`) the test says SKIPPED and passes.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "emu/driver.rs"]
#[allow(dead_code)]
mod driver;

/// Every `.cu` file under `dir`, recursively, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "cu") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn every_example_program_compiles_against_the_header() {
    let Some(cxx) = driver::compiler() else {
        println!("SKIPPED: no C++ compiler ($CXX, c++ or g++) for the example programs");
        return;
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let examples = manifest.join("../../examples");
    let programs = sources(&examples);
    // The docs' programs: the README's, the tutorial's two versions, the services, bulk and native ones.
    for must in
        ["hello/hello.cu", "tutorial/scale.cu", "tutorial/scale_v2.cu", "services/kv_server.cu", "bulk/bulk_echo.cu"]
    {
        assert!(programs.iter().any(|p| p.ends_with(must)), "examples/{must} is missing");
    }
    let mut compiled = 0;
    for source in &programs {
        // A native worker's host program (examples/native-cuda/native_echo.cu) needs the CUDA runtime's
        // headers: the GPU run builds it with nvcc; its kernel, a separate file, is compiled here.
        if std::fs::read_to_string(source).unwrap().contains("#include <cuda_runtime.h>") {
            continue;
        }
        compiled += 1;
        let out = Command::new(&cxx)
            .args(["-std=c++20", "-fsyntax-only", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function", "-x", "c++"])
            .arg("-include")
            .arg(manifest.join("tests/emu/warp_emu.h"))
            .arg("-I")
            .arg(manifest.join("include"))
            .arg("-I")
            .arg(source.parent().unwrap())
            .arg(source)
            .output()
            .expect("run the compiler");
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && (err.contains("c++20") || err.contains("<barrier>")) {
            println!("SKIPPED: {cxx} cannot build C++20: {}", err.lines().next().unwrap_or(""));
            return;
        }
        assert!(out.status.success(), "{} does not compile against mesh.cuh:\n{err}", source.display());
        assert!(err.trim().is_empty(), "{} compiles with warnings:\n{err}", source.display());
    }
    println!("{compiled} example programs compiled against mesh.cuh");
}
