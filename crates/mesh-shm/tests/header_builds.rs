//! mesh.cuh's parts and build options, compiled by the host's C++ compiler with the emulation's definitions of CUDA's built-ins (`tests/emu/warp_emu.h`): each part compiles on its own, a program of `mesh/core.cuh` and `mesh/channel.cuh` alone compiles, every non-default value of every build option compiles the programs that use it, and every removed option fails the build naming what replaces it.
//!
//! Syntax and types only (`-fsyntax-only`: every function body is checked, nothing is linked). Without a
//! C++20 compiler (`$CXX`, `c++` or `g++`) the tests say SKIPPED and pass.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "emu/driver.rs"]
#[expect(dead_code, reason = "this test needs only the driver's compiler lookup")]
mod driver;

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Compiles `source` (a file) with `defines`, syntax only, the header and tests/programs on the include
/// path; None (after saying SKIPPED) without a C++20 compiler.
fn compile(source: &Path, defines: &[&str]) -> Option<Output> {
    let Some(cxx) = driver::compiler() else {
        println!("SKIPPED: no C++ compiler ($CXX, c++ or g++) for mesh.cuh's parts");
        return None;
    };
    let out = Command::new(&cxx)
        .args(["-std=c++20", "-fsyntax-only", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function", "-x", "c++"])
        .arg("-include")
        .arg(manifest().join("tests/emu/warp_emu.h"))
        .arg("-I")
        .arg(manifest().join("include"))
        .arg("-I")
        .arg(manifest().join("../../tests/programs"))
        .args(defines)
        .arg(source)
        .output()
        .unwrap_or_else(|e| panic!("{cxx}: {e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && (err.contains("c++20") || err.contains("<barrier>")) {
        println!("SKIPPED: {cxx} cannot build C++20: {}", err.lines().next().unwrap_or(""));
        return None;
    }
    Some(out)
}

/// Writes `text` to a scratch file named `name` and returns its path.
fn scratch(name: &str, text: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, text).expect("write a scratch source");
    path
}

fn must_compile(source: &Path, defines: &[&str]) {
    if let Some(out) = compile(source, defines) {
        assert!(
            out.status.success(),
            "{} with {defines:?} does not compile:\n{}",
            source.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every file of the header, public part or internal, compiles when it is the only include: each one
/// includes what it needs.
#[test]
fn each_part_of_the_header_compiles_on_its_own() {
    let mut parts = vec!["mesh.cuh".to_string()];
    for dir in ["mesh", "mesh/detail"] {
        let mut names: Vec<_> = std::fs::read_dir(manifest().join("include").join(dir))
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "cuh"))
            .map(|p| format!("{dir}/{}", p.file_name().unwrap().to_string_lossy()))
            .collect();
        names.sort();
        parts.extend(names);
    }
    assert!(parts.len() >= 12, "found only {parts:?}");
    for part in &parts {
        let source = scratch(&format!("alone_{}.cu", part.replace('/', "_")), &format!("#include \"{part}\"\n"));
        must_compile(&source, &[]);
    }
    println!("{} header files compiled on their own", parts.len());
}

/// A program that includes only the parts it uses (the life cycle and LL channels) compiles: the echo
/// loop of mesh/channel.cuh.
#[test]
fn a_program_of_core_and_channel_alone_compiles() {
    let source = scratch(
        "core_and_channel.cu",
        r#"#include "mesh/core.cuh"
#include "mesh/channel.cuh"
extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    __shared__ uint32_t buf[1024];
    if (threadIdx.x >= 32) return;
    uint64_t beat = 0;
    if (threadIdx.x == 0) beat = mesh_begin(ctx);
    mesh_chan in = mesh_chan_open(ctx, 0, false);
    mesh_chan out = mesh_chan_open(ctx, 1, true);
    for (uint32_t i = 0; !mesh_should_stop(ctx); i++) {
        if (threadIdx.x == 0 && (i & 4095u) == 0) mesh_heartbeat(ctx, ++beat);
        if (mesh_chan_room(&out) > 0 && mesh_warp_try_recv(&in, buf)) mesh_warp_try_send(&out, buf);
    }
    mesh_chan_close(&in);
    mesh_chan_close(&out);
    if (threadIdx.x == 0) mesh_end(ctx);
}
"#,
    );
    must_compile(&source, &[]);
}

/// Every build option the header keeps, at a value other than its default, compiles the programs whose
/// calls it changes (the LL echoes, the bulk programs, the services).
#[test]
fn every_build_option_compiles_at_a_non_default_value() {
    let programs = manifest().join("../../tests/programs");
    let options: [(&str, &[&str]); 5] = [
        ("-DMESH_STOP_PERIOD_NS=5000u", &["echo_header.cu", "bulk_echo.cu", "service.cu"]),
        ("-DMESH_PUBLISH_ON_DRAIN=0", &["echo_header.cu", "echo_warp.cu", "echo.cu", "service.cu"]),
        ("-DMESH_BULK_LOOKAHEAD=1u", &["bulk_echo.cu", "bulk_parts_sink.cu", "bulk_sink.cu"]),
        ("-DMESH_GROUP_PERIOD_NS=1000u", &["service.cu", "service_x_serial.cu"]),
        ("-DMESH_GROUP_MAX_ENTRIES=64u", &["service.cu", "service_x_serial.cu"]),
    ];
    let mut built = 0;
    for (define, sources) in options {
        for program in sources {
            must_compile(&programs.join(program), &[define]);
            built += 1;
        }
    }
    println!("{built} builds with a non-default option");
}

/// Each option that was removed fails the build, and the message names the option and what replaces it.
#[test]
fn every_removed_option_fails_the_build_saying_what_replaces_it() {
    let source = scratch("removed_option.cu", "#include \"mesh.cuh\"\n");
    let removed = [
        ("MESH_PHASE_LOCK", "polls on every call"),
        ("MESH_PHASE_UP", "removed with the phase lock"),
        ("MESH_PHASE_DOWN", "removed with the phase lock"),
        ("MESH_PHASE_MAX", "removed with the phase lock"),
        ("MESH_PHASE_CHOOSE", "removed with the phase lock"),
        ("MESH_POLLERS", "mesh_warp_try_recv"),
        ("MESH_POLL_SPACING_NS", "mesh_warp_try_recv"),
        ("MESH_POLL_MAX_PAIRS", "mesh_warp_try_recv"),
        ("MESH_FANIN_PREFETCH", "loads each batch when called"),
        ("MESH_REPLY_SPREAD", "always spreads"),
        ("MESH_LEAN_PAIRS", "fixed at 1 KiB"),
        ("MESH_FANIN_POLL_MIN", "a fixed constant"),
        ("MESH_PROTOCOL_FANIN", "protocol codes of the mailbox"),
        ("MESH_PROTOCOL_GROUP", "protocol codes of the mailbox"),
    ];
    for (option, replacement) in removed {
        let define = format!("-D{option}=1");
        let Some(out) = compile(&source, &[&define]) else { return };
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a build with {define} succeeded; it must fail");
        assert!(
            err.contains("#error") && err.contains(option) && err.contains(replacement),
            "a build with {define} must fail naming {option} and `{replacement}`:\n{err}"
        );
    }
}
