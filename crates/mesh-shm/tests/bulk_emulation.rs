//! mesh.cuh's bulk block calls (open / close, send / reserve / publish, recv / peek / release, one or several messages a call) run as one block of emulated warps on the CPU (`tests/emu/bulk_blocks.cpp`) against a bulk channel laid out as bulk.rs lays it out.
//!
//! The device code is the shipped header, compiled by the host's C++ compiler with
//! `MESH_HOST_EMULATION` (warp_emu.h swaps its PTX primitives for atomics): the program checks what
//! the calls compute, for one block of 1, 2 and 8 warps serving a share of a channel of 1 to 32 parts
//! against a driver that plays the far end and the other blocks, not the GPU's memory model or speed
//! (tests/tests/large.rs and parts.rs do that on a GPU). Without a C++20 compiler (`$CXX`, `c++` or
//! `g++`) the tests say SKIPPED and pass.

use std::path::{Path, PathBuf};
use std::time::Duration;

#[path = "emu/driver.rs"]
mod driver;

/// Longer than the program's own watchdog (60 s): a child that outlives this is hung past it.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// Builds `tests/emu/bulk_blocks.cpp` with `defines` as `name`; None (after saying SKIPPED) without a
/// C++20 compiler.
fn built(name: &str, defines: &[&str]) -> Option<PathBuf> {
    driver::built("bulk_blocks.cpp", name, &defines.iter().map(|d| d.to_string()).collect::<Vec<_>>())
}

/// Runs the program on `side` (all, producer or consumer, or a probe) until it says `expect`.
fn passes(exe: &Path, side: &str, expect: &str) {
    driver::passes(exe, &[side], HANG_GUARD, expect);
}

/// Both ends, both paths (copy and in place), every shape: each byte of every message checked, counts,
/// resumes, the parts' lines and the header's lower bound after each close.
#[test]
fn one_block_moves_its_share_of_every_message_once_in_order() {
    if let Some(exe) = built("bulk_blocks_emu", &[]) {
        passes(&exe, "all", "all passed");
    }
}

/// EMU_SEND_N 2 and 3: the producer sends that many messages a barrier and a fence (on rings of 1 slot,
/// one at a time): mesh_block_try_send_n on the copy path, mesh_block_reserve_n / mesh_block_publish_n
/// in place. Only the sending side reaches that code, so only the producer scenarios run.
#[test]
fn the_send_of_several_messages_a_fence_moves_every_byte() {
    for n in [2, 3] {
        if let Some(exe) = built(&format!("bulk_blocks_emu_send{n}"), &[&format!("-DEMU_SEND_N={n}u")]) {
            passes(&exe, "producer", "all passed");
        }
    }
}

/// EMU_RECV_N 2 and 3: the consumer takes up to that many whole messages a call and gives them back with
/// one barrier: mesh_block_try_recv_n on the copy path, mesh_block_peek_n / mesh_block_release_n in
/// place; with MESH_BULK_LOOKAHEAD 1 as well, where every call finds one message at most. Only the
/// receiving side reaches that code, so only the consumer scenarios run.
#[test]
fn the_receive_of_several_messages_a_barrier_takes_every_message_once() {
    for (n, lookahead) in [(2, 8), (3, 8), (3, 1)] {
        let name = format!("bulk_blocks_emu_recv{n}_ahead{lookahead}");
        let defines = [format!("-DEMU_RECV_N={n}u"), format!("-DMESH_BULK_LOOKAHEAD={lookahead}u")];
        if let Some(exe) = built(&name, &defines.iter().map(String::as_str).collect::<Vec<_>>()) {
            passes(&exe, "consumer", "all passed");
        }
    }
}

/// MESH_BULK_LOOKAHEAD 1: every peek loads its flags (no message known whole ahead). Only the receiving
/// side reaches that code, so only the consumer scenarios run.
#[test]
fn a_peek_looking_one_message_ahead_takes_every_message_once() {
    if let Some(exe) = built("bulk_blocks_emu_lookahead1", &["-DMESH_BULK_LOOKAHEAD=1u"]) {
        passes(&exe, "consumer", "all passed");
    }
}

/// A producer block resuming where a launch of more blocks left its parts apart, with a part behind
/// whose consumer is a full ring behind: the open completes that part as its consumer frees slots, and
/// both parts' consumers get every message (without that completion the part's flags between would
/// never be written, and its head would be published past them: a deadlock).
#[test]
fn a_producer_resuming_with_a_full_part_behind_completes_it_as_room_comes() {
    if let Some(exe) = built("bulk_blocks_emu", &[]) {
        passes(&exe, "probe-resume-full", "probe: delivered");
    }
}

/// The same resume with a stop while the open waits for that part's consumer: the open returns an end
/// whose calls fail (msg_size 0), writes no flag the consumer has no room for and publishes no head past
/// the gap; the next launch, with the consumers draining, delivers every message.
#[test]
fn a_stop_while_the_open_waits_for_a_part_behind_leaves_nothing_past_the_gap() {
    if let Some(exe) = built("bulk_blocks_emu", &[]) {
        passes(&exe, "probe-stop-while-resuming", "probe: stopped cleanly, then delivered");
    }
}
