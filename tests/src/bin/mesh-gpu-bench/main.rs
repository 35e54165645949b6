//! `cargo xtask bench`: GPU benchmarks, each beside its raw baseline in the same run. Numbers, not assertions.
//!
//! * channels (`channels` module): round trips by size through the warp and one-thread paths beside
//!   the relaxed raw mapped-word ping-pong and `launch + synchronize` of a copy kernel; one-way
//!   streaming beside one warp's plain mapped-memory bandwidth; all in one process and context;
//! * host↔GPU round trips in turns (`roundtrip` module, `mesh-gpu-bench rt-ab blink|mps`): the header's
//!   loop, the raw mapped word and the one-warp LL probe (`raw_ll`), each measured in every turn, so
//!   that a drift of the machine within the run falls on all three;
//! * bulk channels (`bulk` module, `mesh-gpu-bench bulk blink|mps`): large messages host↔GPU and
//!   GPU→GPU beside back-to-back cudaMemcpyAsync;
//! * bulk channels of P parts (`parts` module, `mesh-gpu-bench parts blink|mps`): one channel served
//!   by B = P blocks each end beside a plain copy kernel of the same B blocks;
//! * a service of many clients (`service` module, `mesh-gpu-bench service [blink|mps]`): request → reply
//!   latency and aggregate rate with 1, 8 and 64 client processes beside the SPSC round trip through
//!   `echo_warp`, all through one meshd;
//! * nvJitLink: cold (library start-up, paid once by `Jit::start`), warm, cached.

use std::time::{Duration, Instant};

use mesh_backend::{ImageKind, LaunchShape};
use mesh_cuda::StreamState;
use mesh_gpu_tests::{Fixture, program};

mod bulk;
mod channels;
mod fanin_host;
mod parts;
mod roundtrip;
mod service;
use channels::channel_benches;

const ONE: LaunchShape = LaunchShape { grid: [1, 1, 1], block: [32, 1, 1], shared_mem: 0 };

fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    v.sort_unstable();
    (v[v.len() / 2], v[v.len() * 99 / 100], v[0])
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    if !mesh_gpu_tests::gpu_enabled("mesh-gpu-bench") {
        return;
    }
    // MPS in a process of its own: this one's plain context would otherwise share the GPU with the server.
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["mps"] => return mps_benches(),
        ["rt", mode @ ("blink" | "mps")] => return roundtrip::host_round_trips(*mode == "mps"),
        ["rt-ab", mode @ ("blink" | "mps")] => return roundtrip::host_round_trips_interleaved(*mode == "mps"),
        ["g2g", mode @ ("blink" | "mps")] => return roundtrip::gpu_round_trips(*mode == "mps"),
        ["g2g-lean", mode @ ("blink" | "mps")] => return roundtrip::gpu_round_trips_lean(*mode == "mps"),
        ["bulk", mode @ ("blink" | "mps")] => return bulk::bulk_benches(*mode == "mps"),
        ["parts", mode @ ("blink" | "mps")] => return parts::parts_benches(*mode == "mps"),
        ["service"] => return service::service_benches(false),
        ["fanin-host"] => return fanin_host::fanin_host(),
        ["service", mode @ ("blink" | "mps")] => return service::service_benches(*mode == "mps"),
        [] => {}
        other => {
            eprintln!(
                "mesh-gpu-bench: unknown arguments {other:?}; expected none, `mps`, `rt blink|mps`, `rt-ab blink|mps`, `g2g blink|mps`, `g2g-lean blink|mps`, `bulk blink|mps`, `parts blink|mps` or `service [blink|mps]`"
            );
            std::process::exit(2);
        }
    }
    let f = Fixture::new();
    println!("device: {} ({}), {} SMs", f.device.name, f.device.arch(), f.device.sm_count);

    channel_benches(&f);
    println!();
    println!("| benchmark                                    |     median |        p99 |        min |");
    println!("|----------------------------------------------|------------|------------|------------|");

    // nvJitLink.
    println!(
        "| {:<44} | {:>9.2} ms |            |            |",
        "JIT cold: library start + first link",
        f.jit.warmup.as_secs_f64() * 1e3
    );
    for name in ["echo", "heartbeat"] {
        // A fresh image (a comment changes its hash) so that the link is warm, not cached.
        let mut image = program(name);
        image.extend_from_slice(format!("\n// bench {:?}\n", Instant::now()).as_bytes());
        let warm = f.jit.link(name, image.clone(), ImageKind::Ptx).unwrap();
        let t = Instant::now();
        let cached = f.jit.link(name, image, ImageKind::Ptx).unwrap();
        let cached_time = t.elapsed();
        assert!(cached.cached);
        println!(
            "| {:<44} | {:>9.3} ms |            |            |",
            format!("JIT warm link: {name}.ptx"),
            warm.link_time.as_secs_f64() * 1e3
        );
        println!(
            "| {:<44} | {:>9.3} ms |            |            |",
            format!("JIT cached: {name}.ptx"),
            cached_time.as_secs_f64() * 1e3
        );
    }
    blink_benches(&f);
}

/// The blink pause: meshd's blink backend against a raw driver-API blink of the same N, and load latency.
fn blink_benches(f: &Fixture) {
    use mesh_backend::{Backend, ProgramSpec};
    use mesh_cuda::{BlinkBackend, BlinkConfig, Module};
    const REPEAT: u32 = 20;
    println!();
    println!("| blink pause, N resident programs             |       mean |        min |        max |");
    println!("|----------------------------------------------|------------|------------|------------|");
    let cubin = f.jit.link("heartbeat", program("heartbeat"), ImageKind::Ptx).unwrap().cubin;
    for n in [1u32, 8, 32] {
        // Raw: the driver API alone: stop N kernels through their slots, load and unload a module, relaunch N.
        let module = Module::load(&f.ctx, &cubin).unwrap();
        let streams: Vec<_> = (0..n).map(|_| f.ctx.stream().unwrap()).collect();
        let base = f.registered.device_address();
        let launch_all = |generation: u32| {
            for (i, s) in (0u32..).zip(&streams) {
                let slot = f.mailbox.slot(i).unwrap();
                slot.arm(generation);
                module.function("mesh_main").unwrap().launch(&ONE, s, &f.mailbox.mesh_ctx(i, base).unwrap()).unwrap();
            }
        };
        for i in 0..n {
            f.mailbox.slot(i).unwrap().bind("raw", &[]).unwrap();
        }
        launch_all(1);
        let mut raw = Vec::new();
        for g in 0..REPEAT {
            std::thread::sleep(Duration::from_millis(2));
            let t = Instant::now();
            for i in 0..n {
                f.mailbox.slot(i).unwrap().request_stop();
            }
            while streams.iter().any(|s| s.state() == StreamState::Busy) {}
            drop(Module::load(&f.ctx, &cubin).unwrap());
            launch_all(g + 2);
            raw.push(t.elapsed());
        }
        for i in 0..n {
            f.mailbox.slot(i).unwrap().request_stop();
        }
        while streams.iter().any(|s| s.state() == StreamState::Busy) {}
        drop(streams);
        drop(module);
        stats_row(&format!("raw driver blink, N={n}"), &raw);

        // meshd's blink backend, in its own mailbox: upgrades of one program with a cached image.
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let mb = mesh_shm::Mailbox::create(
            dir.path().join("mb"),
            &mesh_shm::MailboxConfig { size: 4 << 20, slots: 64, channels: 4 },
            mesh_shm::CreateMode::Exclusive,
        )
        .unwrap();
        let mut backend = BlinkBackend::open(&mb, BlinkConfig::default()).unwrap();
        for i in 0..n {
            backend.load(ProgramSpec::new(format!("p{i}"), program("heartbeat")).unwrap()).unwrap();
        }
        let mut ours = Vec::new();
        for _ in 0..REPEAT {
            std::thread::sleep(Duration::from_millis(2));
            backend.upgrade("p0", program("heartbeat")).unwrap();
            ours.push(backend.last_blink().total);
        }
        stats_row(&format!("meshd blink backend (upgrade), N={n}"), &ours);
        let t = backend.last_blink();
        println!(
            "| {:<44} | stop {:>6.0} µs, change {:>6.0} µs, relaunch {:>6.0} µs |",
            format!("  last blink's phases, N={n}"),
            us(t.stop),
            us(t.change),
            us(t.relaunch)
        );
        if n == 8 {
            let mut loads = Vec::new();
            for k in 0..REPEAT {
                backend.unload("p7").unwrap();
                let t = Instant::now();
                backend.load(ProgramSpec::new("p7", program("heartbeat")).unwrap()).unwrap();
                loads.push(t.elapsed());
                let _ = k;
            }
            stats_row("load, request to running (cached cubin, N=8)", &loads);
        }
        backend.shutdown().unwrap();
        f.ctx.bind().unwrap();
    }
}

fn stats_row(name: &str, v: &[Duration]) {
    let mean = v.iter().sum::<Duration>() / u32::try_from(v.len()).unwrap();
    let min = *v.iter().min().unwrap();
    let max = *v.iter().max().unwrap();
    println!("| {name:<44} | {:>7.0} µs | {:>7.0} µs | {:>7.0} µs |", us(mean), us(min), us(max));
}

/// MPS mode: load latency (request to running, cached cubin) with a warm pool and with an empty one.
fn mps_benches() {
    use mesh_backend::{Backend, ProgramSpec};
    use mesh_mps::{MpsBackend, MpsConfig};
    const REPEAT: usize = 20;
    println!();
    println!("| MPS mode                                     |       mean |        min |        max |");
    println!("|----------------------------------------------|------------|------------|------------|");
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let config = mesh_shm::MailboxConfig { size: 4 << 20, slots: 64, channels: 4 };
    let mb = mesh_shm::Mailbox::create(dir.path().join("warm"), &config, mesh_shm::CreateMode::Exclusive).unwrap();
    let t = Instant::now();
    let mut b = MpsBackend::open(&mb, MpsConfig { pool: 2, ..MpsConfig::default() }).unwrap();
    println!(
        "| {:<44} | {:>7.0} ms |            |            |",
        "open: daemon + 2 pool workers (server start)",
        t.elapsed().as_secs_f64() * 1e3
    );
    b.load(ProgramSpec::new("bystander", program("heartbeat")).unwrap()).unwrap();
    b.load(ProgramSpec::new("warm-up", program("heartbeat")).unwrap()).unwrap();
    b.unload("warm-up").unwrap();
    let mut loads = Vec::new();
    let mut unloads = Vec::new();
    for _ in 0..REPEAT {
        let t = Instant::now();
        b.load(ProgramSpec::new("p", program("heartbeat")).unwrap()).unwrap();
        loads.push(t.elapsed());
        let t = Instant::now();
        b.unload("p").unwrap();
        unloads.push(t.elapsed());
    }
    stats_row("load, warm pool, cached cubin (1 running)", &loads);
    stats_row("unload (stop + module unload)", &unloads);
    b.shutdown().unwrap();
    drop(b);
    // An empty pool: every load beyond the running ones starts a worker (a new MPS client).
    let mb = mesh_shm::Mailbox::create(dir.path().join("cold"), &config, mesh_shm::CreateMode::Exclusive).unwrap();
    let mut b = MpsBackend::open(&mb, MpsConfig { pool: 0, pool_grow: true, ..MpsConfig::default() }).unwrap();
    let mut cold = Vec::new();
    for i in 0..6 {
        let t = Instant::now();
        b.load(ProgramSpec::new(format!("c{i}"), program("heartbeat")).unwrap()).unwrap();
        let took = t.elapsed();
        if i == 0 {
            println!(
                "| {:<44} | {:>7.0} ms |            |            |",
                "load, empty pool, first (starts the server)",
                took.as_secs_f64() * 1e3
            );
        } else {
            cold.push(took);
        }
    }
    stats_row("load, empty pool (new MPS client each)", &cold);
    b.shutdown().unwrap();
}
