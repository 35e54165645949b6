//! mesh.cuh's phase lock (`MESH_PHASE_LOCK`: the wait `mesh_warp_try_recv` learns after each message,
//! and its trials) driven by a model of a warp polling a host channel with a model clock, on the CPU
//! (`tests/emu/phase_lock.cpp`): it must take the lost poll out for a client that answers at once, come
//! down to no wait for a stream, and cost at most 5% at any client turnaround up to 5,000 clocks. The
//! model's figures are session 17's H100 / H200 measurements (BENCHMARKS.md); it checks the policy's
//! arithmetic, not the GPU. Without a C++20 compiler the test says SKIPPED and passes.

use std::time::Duration;

#[path = "emu/driver.rs"]
mod driver;

#[test]
fn the_phase_lock_takes_the_lost_poll_out_and_costs_no_client_more_than_five_percent() {
    if let Some(exe) = driver::built("phase_lock.cpp", "phase_lock", &[]) {
        driver::passes(&exe, &[], Duration::from_secs(240), "all passed");
    }
}
