//! Soak: 1000 load / upgrade / unload cycles through meshd in each mode, with the daemon's file
//! descriptors, threads and child processes and the GPU's memory in use recorded before and after.
//! Counts must come back exactly to where they started; device memory may grow by what the driver
//! itself keeps for the same module loads (measured in this process, plain before and after the soak
//! and launched after it, the largest counted: see [`driver_retention_mib`]) and 1% more.

use std::process::Command;
use std::time::Duration;

use mesh_backend::{ImageKind, LaunchShape};
use mesh_cuda::{Context, Device, Module};
use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::{Fixture, program, programs_dir, require_gpu, wait_until};

const CYCLES: usize = 1000;

/// What is counted, for one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    fds: usize,
    threads: usize,
    children: usize,
}

fn entries(dir: String) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Processes whose parent is `pid` (the MPS control daemon and workers in MPS mode).
fn children(pid: u32) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            // The parent pid is the second field after the parenthesised command name.
            stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)).and_then(|p| p.parse().ok())
                == Some(pid)
        })
        .count()
}

fn counts(pid: u32) -> Counts {
    Counts {
        fds: entries(format!("/proc/{pid}/fd")),
        threads: entries(format!("/proc/{pid}/task")),
        children: children(pid),
    }
}

/// The GPU's memory in use, MiB, as nvidia-smi reports it.
fn gpu_memory_mib() -> Option<u64> {
    let out =
        Command::new("nvidia-smi").args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().next()?.trim().parse().ok()
}

/// The device memory (MiB, as nvidia-smi counts it) that the driver keeps after `loads` loads and
/// unloads of test program `name`, linked as meshd links it, in a context of this process, never
/// launched: what no loader can give back. Some drivers keep a few KiB
/// per module with system-scope release stores (`MEMBAR.SYS`, which `mesh_begin` and `mesh_end`
/// compile to); others keep nothing until the module is launched ([`driver_retention_launched_mib`]).
/// The soak allows the largest of the three measurements.
fn driver_retention_mib(name: &str, loads: usize) -> u64 {
    let device = Device::get(0).expect("device 0");
    let ctx = Context::primary(&device).expect("primary context");
    let linked = mesh_cuda::jit::link(&device.arch(), name, &program(name), ImageKind::Ptx)
        .unwrap_or_else(|e| panic!("linking {name}: {e}"));
    let load = || Module::load(&ctx, &linked.cubin).unwrap_or_else(|e| panic!("loading {name}: {e}"));
    drop(load()); // the first load sizes the context's code pool, as the soak's first cycle does
    let before = gpu_memory_mib().expect("nvidia-smi");
    for _ in 0..loads {
        drop(load());
    }
    let kept = gpu_memory_mib().expect("nvidia-smi").saturating_sub(before);
    // Fresh for the next measurement: every module is gone.
    ctx.reset_primary().expect("resetting the primary context");
    kept
}

/// The same with each load launched and stopped before its unload, as meshd's cycle does: the kernel
/// (`name`'s `mesh_main`, one warp) finds its stop word set, returns at its second check (~100 us),
/// and the stream is synchronized before the module goes. On the H100 a launched module's
/// retention is of the same order as meshd's own growth over its cycles, so it is measured, not assumed.
fn driver_retention_launched_mib(name: &str, loads: usize) -> u64 {
    let f = Fixture::new();
    let linked = f.jit.link(name, program(name), ImageKind::Ptx).unwrap_or_else(|e| panic!("linking {name}: {e}"));
    let slot = f.mailbox.slot(0).unwrap();
    slot.bind(name, &[]).unwrap();
    slot.arm(1);
    slot.request_stop();
    let stream = f.ctx.stream().unwrap();
    let shape = LaunchShape { grid: [1, 1, 1], block: [32, 1, 1], shared_mem: 0 };
    let params = f.mailbox.mesh_ctx(0, f.registered.device_address()).unwrap();
    let cycle = || {
        let module = Module::load(&f.ctx, &linked.cubin).unwrap_or_else(|e| panic!("loading {name}: {e}"));
        module.function("mesh_main").unwrap().launch(&shape, &stream, &params).unwrap();
        stream.synchronize().unwrap_or_else(|e| panic!("{name}'s launch: {e}"));
    };
    cycle(); // sizes the context's pools, as the soak's first cycle does
    let before = gpu_memory_mib().expect("nvidia-smi");
    for _ in 0..loads {
        cycle();
    }
    gpu_memory_mib().expect("nvidia-smi").saturating_sub(before)
}

fn soak(mode: &str, extra: &[&str]) {
    // Every cycle loads two modules (the load and the upgrade's new image).
    let kept_before = gpu_memory_mib().map(|_| driver_retention_mib("heartbeat", 2 * CYCLES));
    let d = Meshd::start(extra);
    let pid = d.child.id();
    let image = programs_dir().join("heartbeat.ptx");
    let dir = tempfile::tempdir().unwrap();
    let v2 = dir.path().join("v2.ptx");
    let mut bytes = program("heartbeat");
    bytes.extend_from_slice(b"\n// v2\n");
    std::fs::write(&v2, bytes).unwrap();
    let (image, v2) = (image.to_str().unwrap(), v2.to_str().unwrap());
    d.ok(&["load", "bystander", image]);
    let cycle = || {
        d.ok(&["load", "p", image]);
        d.ok(&["upgrade", "p", v2]);
        d.ok(&["unload", "p"]);
    };
    // One cycle first: the JIT's cache, the modules and the pool reach their working size.
    cycle();
    // Connection threads end after each request: let the daemon settle before counting.
    let settle = |want: Option<Counts>| {
        let mut last = counts(pid);
        wait_until(Duration::from_secs(5), || {
            last = counts(pid);
            want.is_none_or(|w| w == last)
        });
        last
    };
    let before = settle(None);
    let mem_before = gpu_memory_mib();
    let started = std::time::Instant::now();
    for _ in 0..CYCLES {
        cycle();
    }
    let took = started.elapsed();
    let after = settle(Some(before));
    let mem_after = gpu_memory_mib();
    let rows: Vec<serde_json::Value> = serde_json::from_str(&d.ok(&["ps", "--json"])).unwrap();
    eprintln!(
        "soak {mode}: {CYCLES} load/upgrade/unload cycles in {took:?}; fds {} -> {}, threads {} -> {}, children {} -> {}, GPU memory {mem_before:?} -> {mem_after:?} MiB; programs after: {}",
        before.fds,
        after.fds,
        before.threads,
        after.threads,
        before.children,
        after.children,
        rows.len()
    );
    assert_eq!(after, before, "{mode}: the daemon's descriptors, threads or children did not come back");
    assert_eq!(rows.len(), 1, "only the bystander is left: {rows:?}");
    assert_eq!(rows[0]["state"], "running", "the bystander survived every cycle: {}", rows[0]);
    d.ok(&["shutdown"]);
    drop(d);
    if let (Some(a), Some(b), Some(kept_before)) = (mem_before, mem_after, kept_before) {
        let kept_after = driver_retention_mib("heartbeat", 2 * CYCLES);
        let kept_launched = driver_retention_launched_mib("heartbeat", 2 * CYCLES);
        let kept = kept_before.max(kept_after).max(kept_launched);
        eprintln!(
            "soak {mode}: the driver alone keeps {kept_before} MiB (before the soak) / {kept_after} MiB (after) for {} raw loads of the same image, {kept_launched} MiB with each launched and stopped",
            2 * CYCLES
        );
        assert!(
            b.saturating_sub(kept).abs_diff(a) * 100 <= a.max(1),
            "{mode}: GPU memory {a} -> {b} MiB, more than 1% beyond the {kept} MiB the driver keeps for the same loads"
        );
    }
}

#[test]
fn a_thousand_cycles_leak_nothing_blink() {
    require_gpu!("a_thousand_cycles_leak_nothing_blink");
    soak("blink", &[]);
}

#[test]
fn a_thousand_cycles_leak_nothing_mps() {
    require_gpu!("a_thousand_cycles_leak_nothing_mps");
    let dir = tempfile::tempdir().unwrap();
    let mps = dir.path().join("mps");
    soak("mps", &["--isolation", "mps", "--pool", "3", "--mps-dir", mps.to_str().unwrap()]);
}
