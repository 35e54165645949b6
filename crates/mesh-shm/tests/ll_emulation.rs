//! mesh.cuh's LL channel calls run inside whole echo programs of tests/programs (echo_header.cu, echo_warp.cu, echo.cu) on the CPU (`tests/emu/ll_channels.cpp`), against a driver playing mesh-shm's host ends.
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
use std::time::Duration;

#[path = "emu/driver.rs"]
mod driver;

/// Longer than the program's own watchdog (120 s): a child that outlives this is hung past it.
const HANG_GUARD: Duration = Duration::from_secs(240);

/// Builds `tests/emu/ll_channels.cpp` around `program` (a file of tests/programs) with `defines`; None
/// (after saying SKIPPED) without a C++20 compiler.
fn built(program: &str, defines: &[&str]) -> Option<PathBuf> {
    let mut args = vec![format!("-DPROGRAM=\"{program}\"")];
    args.extend(defines.iter().map(|d| d.to_string()));
    // One executable per program and defines: tests run in parallel, each builds its own.
    let suffix: String = defines
        .iter()
        .map(|d| format!("_{}", d.trim_start_matches("-D").replace(|c: char| !c.is_ascii_alphanumeric(), "_")))
        .collect();
    driver::built("ll_channels.cpp", &format!("ll_channels_{}{suffix}", program.trim_end_matches(".cu")), &args)
}

/// Runs the emulation; it must say "all passed".
fn passes(exe: &Path) {
    driver::passes(exe, &[], HANG_GUARD, "all passed");
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

/// The batch calls built with `MESH_PUBLISH_ON_DRAIN=0`: an empty poll publishes only once half a ring
/// is owed, and a receive only what earlier receives took, so the producer must keep its half ring of
/// credit however many messages one receive takes.
#[test]
fn the_batch_echo_without_publication_on_drain_keeps_the_producer_going() {
    if let Some(exe) = built("echo_warp.cu", &["-DMESH_PUBLISH_ON_DRAIN=0"]) {
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
