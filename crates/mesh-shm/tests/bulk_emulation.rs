//! mesh.cuh's bulk block calls (open / close, send / reserve / publish, recv / peek / release) run as one block of emulated warps on the CPU (`tests/emu/bulk_blocks.cpp`) against a bulk channel laid out as bulk.rs lays it out.
//!
//! The device code is the shipped header, compiled by the host's C++ compiler with
//! `MESH_HOST_EMULATION` (warp_emu.h swaps its PTX primitives for atomics): the program checks what
//! the calls compute, for one block of 1, 2 and 8 warps serving a share of a channel of 1 to 32 parts
//! against a driver that plays the far end and the other blocks, not the GPU's memory model or speed
//! (tests/tests/large.rs and parts.rs do that on the H200). Without a C++20 compiler (`$CXX`, `c++` or
//! `g++`) the tests say SKIPPED and pass.

use std::path::{Path, PathBuf};
use std::process::Command;

fn compiler() -> Option<String> {
    let candidates = std::env::var("CXX").into_iter().chain(["c++".to_string(), "g++".to_string()]);
    candidates.into_iter().find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
}

/// Builds `tests/emu/bulk_blocks.cpp` with `defines` into the target's scratch folder as `name`; None
/// (after saying SKIPPED) without a C++20 compiler.
fn built(name: &str, defines: &[&str]) -> Option<PathBuf> {
    let Some(cxx) = compiler() else {
        println!("SKIPPED: no C++ compiler ($CXX, c++ or g++) for mesh.cuh's warp emulation");
        return None;
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let output = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-pthread", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function"])
        .arg("-I")
        .arg(manifest.join("include"))
        .args(defines)
        .arg(manifest.join("tests/emu/bulk_blocks.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("{cxx}: {e}"));
    if !output.status.success() {
        let e = String::from_utf8_lossy(&output.stderr);
        if e.contains("c++20") || e.contains("<barrier>") {
            println!("SKIPPED: {cxx} cannot build C++20 (std::barrier): {}", e.lines().next().unwrap_or(""));
            return None;
        }
        panic!("building tests/emu/bulk_blocks.cpp with {cxx} failed:\n{e}");
    }
    Some(exe)
}

/// Runs the program on `side` (all, producer or consumer); it ends itself within 60 s (a watchdog
/// turns a deadlock into a failure).
fn passes(exe: &Path, side: &str) {
    let run = Command::new(exe).arg(side).output().expect("run the emulation");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    println!("{stdout}");
    assert!(
        run.status.success() && stdout.contains("all passed"),
        "the bulk emulation failed ({} {side}):\n{stdout}\n{stderr}",
        exe.display()
    );
}

/// Both ends, both paths (copy and in place), every shape: each byte of every message checked, counts,
/// resumes, the parts' lines and the header's lower bound after each close.
#[test]
fn one_block_moves_its_share_of_every_message_once_in_order() {
    if let Some(exe) = built("bulk_blocks_emu", &[]) {
        passes(&exe, "all");
    }
}

/// MESH_BULK_PUBLISHER_WARP 1: mesh_block_try_send leaves the first warp out of the copy. Only the
/// sending side reaches that code, so only the producer scenarios run.
#[test]
fn the_send_without_the_publisher_warp_in_the_copy_moves_every_byte() {
    if let Some(exe) = built("bulk_blocks_emu_pubwarp", &["-DMESH_BULK_PUBLISHER_WARP=1"]) {
        passes(&exe, "producer");
    }
}

/// MESH_BULK_LOOKAHEAD 1: every peek loads its flags (no message known whole ahead). Only the receiving
/// side reaches that code, so only the consumer scenarios run.
#[test]
fn a_peek_looking_one_message_ahead_takes_every_message_once() {
    if let Some(exe) = built("bulk_blocks_emu_lookahead1", &["-DMESH_BULK_LOOKAHEAD=1u"]) {
        passes(&exe, "consumer");
    }
}

/// A producer block resuming where a launch of more blocks left its parts apart, with a part behind
/// whose consumer is a full ring behind: the open completes that part as its consumer frees slots, and
/// both parts' consumers get every message (mesh.cuh deadlocked here before session 10: the part's
/// flags between were never written, and its head was published past them).
#[test]
fn a_producer_resuming_with_a_full_part_behind_completes_it_as_room_comes() {
    if let Some(exe) = built("bulk_blocks_emu", &[]) {
        let run = Command::new(&exe).arg("probe-resume-full").output().expect("run the emulation");
        let stdout = String::from_utf8_lossy(&run.stdout);
        println!("{stdout}");
        assert!(
            run.status.success() && stdout.contains("probe: delivered"),
            "a part behind stayed stuck:\n{stdout}\n{}",
            String::from_utf8_lossy(&run.stderr)
        );
    }
}

/// The same resume with a stop while the open waits for that part's consumer: the open returns an end
/// whose calls fail (msg_size 0), writes no flag the consumer has no room for and publishes no head past
/// the gap; the next launch, with the consumers draining, delivers every message.
#[test]
fn a_stop_while_the_open_waits_for_a_part_behind_leaves_nothing_past_the_gap() {
    if let Some(exe) = built("bulk_blocks_emu", &[]) {
        let run = Command::new(&exe).arg("probe-stop-while-resuming").output().expect("run the emulation");
        let stdout = String::from_utf8_lossy(&run.stdout);
        println!("{stdout}");
        assert!(
            run.status.success() && stdout.contains("probe: stopped cleanly, then delivered"),
            "a stop during the open's wait:\n{stdout}\n{}",
            String::from_utf8_lossy(&run.stderr)
        );
    }
}
