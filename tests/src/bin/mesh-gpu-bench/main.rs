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
//! * channels created and deleted beside a running program (`churn` module, `mesh-gpu-bench churn blink|mps`):
//!   a bystander's round trips while another thread churns the mailbox, beside its quiet windows;
//! * nvJitLink: cold (library start-up, paid once by `Jit::start`), warm, cached.
//!
//! Every figure also goes to a results file, one JSON line each (`results` module, bench/README.md):
//! `--results FILE`, else `target/bench-results/DATE-GPU.jsonl`. Variants are options of the benchmark
//! (`rt-ab blink --variants echo:8 --host-delay-ns 0-1500`; `--help` lists them), not environment
//! variables.

use std::time::{Duration, Instant};

use mesh_backend::{ImageKind, LaunchShape};
use mesh_cuda::StreamState;
use mesh_gpu_tests::{Fixture, program};

mod bulk;
mod channels;
mod churn;
mod fanin_host;
mod parts;
mod probe;
mod results;
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

/// Each benchmark's options (`--NAME VALUE`), with what they say; anything else is refused.
const OPTIONS: &[(&str, &[(&str, &str)])] = &[
    (
        "rt-ab",
        &[
            (
                "variants",
                "echo programs beside the header's loop, comma-separated PROGRAM[:MAX_BYTES[:THREADS]], word:PROGRAM, ll:PROGRAM, llring:PROGRAM",
            ),
            ("host-delay-ns", "the client's untimed turnaround: N, or LO-HI drawn for each request"),
        ],
    ),
    (
        "parts",
        &[
            ("variant", "_x_NAME: bulk_parts_source_x_NAME and bulk_parts_sink_x_NAME instead"),
            ("blocks", "the B of every row, comma-separated (default 1,2,4,8,16,32)"),
            ("sizes", "1M and/or 16M, comma-separated (default both)"),
        ],
    ),
    (
        "service",
        &[
            ("clients", "client counts of the rows, comma-separated (default 1,8,64)"),
            ("programs", "service programs measured, comma-separated (default service,service_x_serial)"),
            ("shards", "fan-in shards, a power of two 1-64 (default 32)"),
            ("grid", "blocks the service is loaded with (default 4)"),
            ("block", "threads a block (default 256)"),
            ("reply-capacity", "each client's reply ring, a power of two 1-1024 (default 16)"),
        ],
    ),
    ("fanin-host", &[("senders", "sender counts, comma-separated, each 1-64")]),
    ("churn", &[("cycles", "create/delete cycles while the bystander runs (default 1000)")]),
];

const USAGE: &str = "usage: mesh-gpu-bench [--results FILE] [--commit SHA] [BENCH [MODE] [--OPTION VALUE]...]
  BENCH: none (channels, JIT, blink), mps, rt|rt-ab|g2g|g2g-lean|bulk|parts|churn blink|mps, service [blink|mps], fanin-host
  --results FILE: where the figures go, one JSON line each (default target/bench-results/DATE-GPU.jsonl)
  --commit SHA: the commit the binaries were built from (default: git's HEAD here)";

static OPTS: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

/// The value of the benchmark option `--name`, if it was given.
pub fn opt(name: &str) -> Option<String> {
    OPTS.get()?.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
}

/// The list option `--name` split at commas (and spaces), if it was given.
pub fn opt_list(name: &str) -> Option<Vec<String>> {
    opt(name).map(|v| v.split([',', ' ']).filter(|s| !s.is_empty()).map(str::to_string).collect())
}

fn usage_exit(why: &str, code: i32) -> ! {
    eprintln!("mesh-gpu-bench: {why}\n{USAGE}");
    for (bench, opts) in OPTIONS {
        for (name, what) in *opts {
            eprintln!("  {bench} --{name}: {what}");
        }
    }
    std::process::exit(code);
}

/// The command line, split.
#[derive(Debug, PartialEq)]
struct Args {
    /// `--results FILE`.
    results: Option<std::path::PathBuf>,
    /// `--commit SHA`.
    commit: Option<String>,
    /// The benchmark and its mode.
    words: Vec<String>,
    /// The benchmark's `--NAME VALUE` options.
    opts: Vec<(String, String)>,
    /// The arguments less `--results` and `--commit`: what reproduces the run.
    bench_args: Vec<String>,
}

/// Splits the command line into the results file, the commit, the benchmark's words and its options;
/// an option the benchmark does not have, or one without its value, is refused, naming it.
fn parse_args(args: &[String]) -> Result<Args, String> {
    let (mut results, mut commit, mut words, mut opts, mut bench_args) =
        (None, None, Vec::new(), Vec::new(), Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let Some(name) = a.strip_prefix("--") else {
            words.push(a.clone());
            bench_args.push(a.clone());
            continue;
        };
        let (name, value) = match name.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => {
                let v = it.next().filter(|v| !v.starts_with("--")).ok_or(format!("--{name} needs a value"))?;
                (name.to_string(), v.clone())
            }
        };
        match name.as_str() {
            "results" => results = Some(value.into()),
            "commit" => commit = Some(value),
            _ => {
                bench_args.extend([format!("--{name}"), value.clone()]);
                opts.push((name, value));
            }
        }
    }
    let bench = words.first().map_or("", String::as_str);
    let known: &[(&str, &str)] = OPTIONS.iter().find(|(b, _)| *b == bench).map_or(&[], |(_, o)| o);
    if let Some((name, _)) = opts.iter().find(|(name, _)| !known.iter().any(|(k, _)| k == name)) {
        let of = if bench.is_empty() { "the default run" } else { bench };
        return Err(format!("--{name} is not an option of {of}"));
    }
    Ok(Args { results, commit, words, opts, bench_args })
}

/// The service helpers shared with the GPU test read their shape from the environment (the test
/// binary has no other way to take it): the bench's options are handed on that way.
fn service_shape_to_env() {
    for (option, var) in
        [("shards", "MESH_SERVICE_SHARDS"), ("grid", "MESH_SERVICE_GRID"), ("block", "MESH_SERVICE_BLOCK")]
    {
        if let Some(v) = opt(option) {
            // SAFETY: called from main before any thread is started; nothing reads the environment concurrently.
            unsafe { std::env::set_var(var, v) };
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        usage_exit("the GPU benchmarks", 0);
    }
    // Bad arguments are refused before the GPU gate, so that a typo shows on any machine.
    let Args { results: results_path, commit, words, opts, bench_args } =
        parse_args(&args).unwrap_or_else(|why| usage_exit(&why, 2));
    if !mesh_gpu_tests::gpu_enabled("mesh-gpu-bench") {
        return;
    }
    let _ = OPTS.set(opts);
    service_shape_to_env();
    results::init(results_path, commit, &bench_args);
    // MPS in a process of its own: this one's plain context would otherwise share the GPU with the server.
    match words.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["mps"] => return mps_benches(),
        ["rt", mode @ ("blink" | "mps")] => return roundtrip::host_round_trips(*mode == "mps"),
        ["rt-ab", mode @ ("blink" | "mps")] => return roundtrip::host_round_trips_interleaved(*mode == "mps"),
        ["g2g", mode @ ("blink" | "mps")] => return roundtrip::gpu_round_trips(*mode == "mps"),
        ["g2g-lean", mode @ ("blink" | "mps")] => return roundtrip::gpu_round_trips_lean(*mode == "mps"),
        ["bulk", mode @ ("blink" | "mps")] => return bulk::bulk_benches(*mode == "mps"),
        ["parts", mode @ ("blink" | "mps")] => return parts::parts_benches(*mode == "mps"),
        ["service"] => return service::service_benches(false),
        ["churn", mode @ ("blink" | "mps")] => return churn::churn_bench(*mode == "mps"),
        ["fanin-host"] => return fanin_host::fanin_host(),
        ["service", mode @ ("blink" | "mps")] => return service::service_benches(*mode == "mps"),
        [] => {}
        other => usage_exit(&format!("unknown arguments {other:?}"), 2),
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
    results::record("jit", "cold: library start + first link", f.jit.warmup.as_secs_f64() * 1e3, "ms", None, None);
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
        results::record("jit", &format!("warm link: {name}.ptx"), warm.link_time.as_secs_f64() * 1e3, "ms", None, None);
        results::record("jit", &format!("cached: {name}.ptx"), cached_time.as_secs_f64() * 1e3, "ms", None, None);
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
        let raw_mean = stats_row(&format!("raw driver blink, N={n}"), &raw);

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
        let ours_mean = stats_row(&format!("meshd blink backend (upgrade), N={n}"), &ours);
        let figure = format!("blink pause (upgrade), N={n}, mean");
        results::record("blink", &figure, ours_mean, "µs", Some(("raw driver-API blink", raw_mean)), None);
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
            let mean = stats_row("load, request to running (cached cubin, N=8)", &loads);
            results::record("blink", "load, request to running, cached cubin, N=8, mean", mean, "µs", None, None);
        }
        backend.shutdown().unwrap();
        f.ctx.bind().unwrap();
    }
}

/// Prints one row of mean, min and max; returns the mean, µs.
fn stats_row(name: &str, v: &[Duration]) -> f64 {
    let mean = v.iter().sum::<Duration>() / u32::try_from(v.len()).unwrap();
    let min = *v.iter().min().unwrap();
    let max = *v.iter().max().unwrap();
    println!("| {name:<44} | {:>7.0} µs | {:>7.0} µs | {:>7.0} µs |", us(mean), us(min), us(max));
    us(mean)
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
    // No orphan grace: a bench that panics must not leave programs running into the next.
    let mps = MpsConfig { pool: 2, orphan_grace: Duration::ZERO, ..MpsConfig::default() };
    let mut b = MpsBackend::open(&mb, mps).unwrap();
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
    let load = stats_row("load, warm pool, cached cubin (1 running)", &loads);
    let unload = stats_row("unload (stop + module unload)", &unloads);
    results::record("mps", "load, warm pool, cached cubin, mean", load, "µs", None, None);
    results::record("mps", "unload (stop + module unload), mean", unload, "µs", None, None);
    b.shutdown().unwrap();
    drop(b);
    // An empty pool: every load beyond the running ones starts a worker (a new MPS client).
    let mb = mesh_shm::Mailbox::create(dir.path().join("cold"), &config, mesh_shm::CreateMode::Exclusive).unwrap();
    let mps = MpsConfig { pool: 0, pool_grow: true, orphan_grace: Duration::ZERO, ..MpsConfig::default() };
    let mut b = MpsBackend::open(&mb, mps).unwrap();
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
    let cold_mean = stats_row("load, empty pool (new MPS client each)", &cold);
    results::record("mps", "load, empty pool (a new MPS client each), mean", cold_mean / 1e3, "ms", None, None);
    b.shutdown().unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn results_and_commit_are_taken_out_of_the_command_that_reproduces_the_run() {
        let a = parse_args(&args("--results /tmp/r.jsonl rt-ab blink --host-delay-ns 0-1500 --commit=abc")).unwrap();
        assert_eq!(a.results, Some("/tmp/r.jsonl".into()));
        assert_eq!(a.commit.as_deref(), Some("abc"));
        assert_eq!(a.words, ["rt-ab", "blink"]);
        assert_eq!(a.opts, [("host-delay-ns".to_string(), "0-1500".to_string())]);
        assert_eq!(a.bench_args.join(" "), "rt-ab blink --host-delay-ns 0-1500");
    }

    #[test]
    fn an_option_of_another_benchmark_or_without_a_value_is_refused_by_name() {
        let why = parse_args(&args("rt-ab blink --blocks 16")).unwrap_err();
        assert!(why.contains("--blocks") && why.contains("rt-ab"), "{why}");
        let why = parse_args(&args("parts blink --blocks")).unwrap_err();
        assert!(why.contains("--blocks needs a value"), "{why}");
        let why = parse_args(&args("--variants echo")).unwrap_err();
        assert!(why.contains("the default run"), "{why}");
        assert!(parse_args(&args("parts mps --blocks 16,32 --sizes 1M")).is_ok());
    }
}
