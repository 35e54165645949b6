//! mesh.cuh's LL channel calls run inside whole echo programs of tests/programs (echo_header.cu, echo_warp.cu, echo.cu, echo_poll.cu) on the CPU (`tests/emu/ll_channels.cpp`), against a driver playing mesh-shm's host ends.
//!
//! The device code is the shipped header and the shipped programs, compiled by the host's C++
//! compiler with `MESH_HOST_EMULATION` (warp_emu.h swaps its PTX primitives for atomics): channels of
//! 8 B to 4 KiB messages and capacities 4 and 16, rings wrapping many times with back-pressure both
//! ways, messages written torn, and a stop half way with messages in flight followed by a second
//! launch on the same memory that must continue exactly; and a producer's resume after a crash that
//! left a message with both ends written and a word between missing (it must be written again). It
//! checks what the calls compute, not the
//! GPU's memory model or speed. Without a C++20 compiler (`$CXX`, `c++` or `g++`) the tests say
//! SKIPPED and pass.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longer than the program's own watchdog (120 s): a child that outlives this is hung past it.
const HANG_GUARD: Duration = Duration::from_secs(240);

fn compiler() -> Option<String> {
    let candidates = std::env::var("CXX").into_iter().chain(["c++".to_string(), "g++".to_string()]);
    candidates.into_iter().find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
}

/// Builds `tests/emu/ll_channels.cpp` around `program` (a file of tests/programs) with `defines` into
/// the target's scratch folder; None (after saying SKIPPED) without a C++20 compiler.
fn built(program: &str, defines: &[&str]) -> Option<PathBuf> {
    let Some(cxx) = compiler() else {
        println!("SKIPPED: no C++ compiler ($CXX, c++ or g++) for mesh.cuh's warp emulation");
        return None;
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ll_channels_{}", program.trim_end_matches(".cu")));
    let output = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-pthread", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function"])
        .arg("-I")
        .arg(manifest.join("include"))
        .arg("-I")
        .arg(manifest.join("../../tests/programs"))
        .arg(format!("-DPROGRAM=\"{program}\""))
        .args(defines)
        .arg(manifest.join("tests/emu/ll_channels.cpp"))
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
        panic!("building tests/emu/ll_channels.cpp for {program} with {cxx} failed:\n{e}");
    }
    Some(exe)
}

/// Runs the emulation; it must say "all passed". A child still running after HANG_GUARD (its own
/// watchdog failed too) is killed and the test fails, rather than stalling the suite.
fn passes(exe: &Path) {
    let mut child = Command::new(exe).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run the emulation");
    let started = Instant::now();
    // Pipes drained on their own threads: a child blocked on a full pipe would look hung.
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || std::io::read_to_string(&mut out).unwrap_or_default());
    let err = std::thread::spawn(move || std::io::read_to_string(&mut err).unwrap_or_default());
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the emulation") {
            break status;
        }
        if started.elapsed() > HANG_GUARD {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} hung: killed after {HANG_GUARD:?}\n{}", exe.display(), err.join().unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    println!("{stdout}");
    println!("{} in {:.1} s", exe.display(), started.elapsed().as_secs_f64());
    assert!(
        status.success() && stdout.contains("all passed"),
        "the LL emulation failed ({}, {status}):\n{stdout}\n{stderr}",
        exe.display()
    );
}

/// The header's own loop: mesh_chan_room, mesh_warp_try_recv (its short path up to 1 KiB, the batch
/// path above), mesh_warp_try_send, mesh_chan_close, across a stop and a relaunch.
#[test]
fn the_headers_warp_echo_returns_every_message_once_in_order_across_a_relaunch() {
    if let Some(exe) = built("echo_header.cu", &[]) {
        passes(&exe);
    }
}

/// The batch calls: mesh_warp_try_recv_batch (several messages per poll, the partial wait) and
/// mesh_warp_try_send_batch, across a stop and a relaunch.
#[test]
fn the_batch_echo_returns_every_message_once_in_order_across_a_relaunch() {
    if let Some(exe) = built("echo_warp.cu", &[]) {
        passes(&exe);
    }
}

/// The one-thread calls: mesh_try_recv (mesh_try_recv_deferred and its partial wait, mesh_chan_commit)
/// and mesh_try_send, messages up to 256 bytes (echo.cu's buffer).
#[test]
fn the_one_thread_echo_returns_every_message_once_in_order_across_a_relaunch() {
    if let Some(exe) = built("echo.cu", &["-DEMU_ONE_THREAD=1"]) {
        passes(&exe);
    }
}

/// The poll stream: mesh_poll_start, mesh_poll_serve (MESH_POLLERS warps polling in turn, the claim,
/// the hand-off through the shared box), mesh_poll_try_recv and mesh_poll_stop (a claimed message
/// handed over at the stop, an armed one left in the ring), in a block of MESH_POLLERS + 1 warps
/// across a stop and a relaunch; and exit code 2 in a block of one warp.
#[test]
fn the_poll_stream_echo_returns_every_message_once_in_order_across_a_relaunch() {
    if let Some(exe) = built("echo_poll.cu", &["-DEMU_POLL=1"]) {
        passes(&exe);
    }
}
