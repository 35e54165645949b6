//! A service of many clients (`mesh-gpu-bench service [blink|mps]`) beside the single-client
//! SPSC round trip, in one meshd and one run.
//!
//! * baseline: `echo_warp` on two LL host channels of 64-byte messages (capacity 64), this process the
//!   host end (spinning on `try_send` / `try_recv`): round-trip median and p99 of 20,000 after 1,000,
//!   and a stream of windows of 16 (send 16, receive 16) for 2 s;
//! * the service: `meshd service create svc --clients 64 --msg-size 64 --capacity 256 --reply-size 64
//!   --reply-capacity 16`, `service.cu` loaded on it (the header's batched loop), then
//!   `service_x_serial.cu` (its one-request-at-a-time loop); `mesh-service-client` processes (meshd's client
//!   API, waiting as it waits: spin, yield, then sleep) with every reply checked:
//!   * latency with 1, 8 and 64 clients, each one request in flight (`request`), timed from the send to
//!     the reply in each client: median and p99 over every client's requests together;
//!   * aggregate requests/s with 1, 8 and 64 clients streaming for 2 s, each in windows of
//!     min(16, 256 / clients) (send the window, then receive it; the fan-in ring holds 256, a reply
//!     ring 16): the sum of the replies over the longest client's time.
//!
//! `--shards P` makes the service's fan-in channel P shards (each of the same capacity; the windows stay
//! as for one); the heading and every service row say so. `--shards` (default 32), `--block` (default
//! 256) and `--grid` (default 4: the README's 64-client recipe) are the service's shards and the block
//! and grid every program is loaded with (handed to the helpers shared with the GPU test through
//! MESH_SERVICE_SHARDS, MESH_SERVICE_BLOCK and MESH_SERVICE_GRID, which that test reads): service.cu
//! serves with every warp of every block, each warp its part of the shards (8 shards and 256 threads: a
//! warp a shard; a block of 32: one warp serves all; 32 shards and a grid of 4: 32 warps, a shard each).
//!
//! * the raw baseline for N processes at once (`raw_pingpong_many.cu`, a GPU thread per client, each
//!   client process in its own relaxed mapped-word round trip, waiting as the service clients wait):
//!   median and p99 with as many processes as each latency row has clients, before the service is made;
//!   the true limit beside the N-client rows, where the SPSC row is one process alone.
//!
//! The goals, for reading the table (not asserted): 64-client p99 ≤ 3× the SPSC round trip;
//! 64 streaming clients ≥ 8× one client's rate. More client processes than cores share the CPUs: the
//! machine's count is printed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::service::{ClientProcess, field, raw_words, service_grid, service_shape, service_shards};
use mesh_gpu_tests::{programs_dir, stress};
use mesh_shm::{Consumer, Producer};

use crate::{percentiles, us};

const SIZE: u32 = 64;
const ROUNDS: usize = 20_000;
const WARMUP: usize = 1_000;
/// Client counts of the rows (1, 8 and 64); `--clients` overrides them (comma-separated, each 1-64: the
/// service is created for 64), e.g. "1,8,16,32,64" to see where the host's CPUs stop keeping up.
fn client_counts() -> Vec<usize> {
    let given = crate::opt_list("clients").unwrap_or_default();
    let counts: Vec<usize> = given.iter().filter_map(|w| w.parse().ok()).filter(|n| (1..=64).contains(n)).collect();
    if counts.is_empty() { vec![1, 8, 64] } else { counts }
}
const FANIN_CAPACITY: usize = 256;
/// The raw baseline's channel: its LL slots (64-byte messages, capacity 64: 8 KiB) hold a pair of
/// words for each of 64 clients, 128 bytes apart.
const RAW_CHANNEL: &str = "raw-many";
/// Clients the raw baseline serves at most: `raw_pingpong_many`'s block, a thread each (the most
/// `--clients` asks for).
const RAW_CLIENTS: u64 = 64;
/// Each client's reply ring: `--reply-capacity` (a power of two, 1-1024), else 16. The program
/// reads a client's tail once per this many of its replies (a PCIe round trip inside the batch's reply),
/// so a larger ring makes that read rarer; the streaming windows stay min(16, 256 / clients).
fn reply_capacity() -> usize {
    crate::opt("reply-capacity")
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|c| c.is_power_of_two() && *c <= 1024)
        .unwrap_or(16)
}
const REPLY_CAPACITY: usize = 16;
const STREAM_SECS: f64 = 2.0;

fn ptx(name: &str) -> String {
    let p = programs_dir().join(format!("{name}.ptx"));
    assert!(
        p.is_file(),
        "{}: no PTX (the bundle's ./run compiles every program; by hand `cargo xtask ptx`)",
        p.display()
    );
    p.display().to_string()
}

/// The SPSC baseline through `echo_warp`: (median µs, p99 µs, requests/s streaming in windows of 16).
fn spsc(d: &Meshd) -> (f64, f64, f64) {
    let size = SIZE.to_string();
    for ch in ["to-echo", "from-echo"] {
        d.ok(&["channel", "create", ch, "--msg-size", &size, "--capacity", "64"]);
    }
    d.ok(&["load", "echo", &ptx("echo_warp"), "--bind", "to-echo", "--bind", "from-echo"]);
    let mb = d.mailbox();
    let mut tx = Producer::claim(&mb, "to-echo").unwrap();
    let mut rx = Consumer::claim(&mb, "from-echo").unwrap();
    let (mut msg, mut back) = (vec![0u8; SIZE as usize], vec![0u8; SIZE as usize]);
    let mut times = Vec::with_capacity(ROUNDS);
    let mut seq = 0u64;
    for i in 0..ROUNDS + WARMUP {
        stress::fill(&mut msg, seq);
        let t = Instant::now();
        while !tx.try_send(&msg).unwrap() {}
        while !rx.try_recv(&mut back).unwrap() {
            std::hint::spin_loop();
        }
        let took = t.elapsed();
        stress::check(&back, seq).unwrap_or_else(|e| panic!("echo_warp: {e}"));
        seq += 1;
        if i >= WARMUP {
            times.push(took);
        }
    }
    let (median, p99, _) = percentiles(times);
    // Streaming: windows of 16.
    let t = Instant::now();
    let mut done = 0u64;
    while t.elapsed().as_secs_f64() < STREAM_SECS {
        for k in 0..16 {
            stress::fill(&mut msg, seq + k);
            while !tx.try_send(&msg).unwrap() {}
        }
        for k in 0..16 {
            while !rx.try_recv(&mut back).unwrap() {
                std::hint::spin_loop();
            }
            stress::check(&back, seq + k).unwrap_or_else(|e| panic!("echo_warp stream: {e}"));
        }
        seq += 16;
        done += 16;
    }
    let rate = done as f64 / t.elapsed().as_secs_f64();
    drop((tx, rx));
    d.ok(&["unload", "echo"]);
    (us(median), us(p99), rate)
}

/// Starts `n` clients with `args`, waits for them to attach, says `go`, waits for their `done` lines.
fn clients(d: &Meshd, dir: &std::path::Path, tag: &str, n: usize, args: impl Fn(usize) -> Vec<String>) -> Vec<String> {
    clients_of(d, dir, "svc", tag, n, args)
}

/// [`clients`] with `--service NAME` (the raw baseline's clients name its channel there).
fn clients_of(
    d: &Meshd,
    dir: &std::path::Path,
    service: &str,
    tag: &str,
    n: usize,
    args: impl Fn(usize) -> Vec<String>,
) -> Vec<String> {
    let mut procs: Vec<ClientProcess> = (0..n)
        .map(|i| ClientProcess::spawn(&d.socket, service, &args(i), dir.join(format!("{tag}-{i}.log"))))
        .collect();
    for (i, p) in procs.iter_mut().enumerate() {
        p.wait_ready(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{tag} client {i}: {e}\nmeshd:\n{}", d.log_text()));
    }
    // Every client runs its count or its seconds, then exits: stdin stays open (a close means stop).
    for p in &mut procs {
        p.say("go");
    }
    procs
        .iter_mut()
        .enumerate()
        .map(|(i, p)| {
            let (code, done) =
                p.wait_done(Duration::from_secs(300)).unwrap_or_else(|e| panic!("{tag} client {i}: {e}"));
            let done = done.unwrap_or_default();
            assert_eq!(code, Some(0), "{tag} client {i} exited {code:?}: {done} {}", p.said());
            done
        })
        .collect()
}

/// Latency with `n` clients, one request in flight each: (median µs, p99 µs, requests measured).
fn latency(d: &Meshd, dir: &std::path::Path, n: usize) -> (f64, f64, usize) {
    timed_clients(d, dir, "svc", &format!("lat{n}"), n, |_| vec!["--mode".into(), "latency".into()])
}

/// The raw baseline for `n` processes at once: `n` clients in `--mode raw`, client i round-tripping
/// with `raw_pingpong_many`'s thread i through two words of channel `raw-many`: (median µs, p99 µs,
/// round trips measured).
fn raw_latency(d: &Meshd, dir: &std::path::Path, shm: &str, n: usize) -> (f64, f64, usize) {
    timed_clients(d, dir, RAW_CHANNEL, &format!("raw{n}"), n, |i| {
        vec!["--mode".into(), "raw".into(), "--shm".into(), shm.into(), "--index".into(), i.to_string()]
    })
}

/// `n` clients of `service`, each with `mode_args(i)` plus its count, warm-up and times file, one round
/// trip at a time: the median and p99 over every client's times, and how many.
fn timed_clients(
    d: &Meshd,
    dir: &std::path::Path,
    service: &str,
    tag: &str,
    n: usize,
    mode_args: impl Fn(usize) -> Vec<String>,
) -> (f64, f64, usize) {
    let count = (ROUNDS / n).max(2_000);
    let files: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("{tag}-{i}.bin"))).collect();
    clients_of(d, dir, service, tag, n, |i| {
        let mut args = mode_args(i);
        args.extend([
            "--count".into(),
            count.to_string(),
            "--warmup".into(),
            (WARMUP / 2).to_string(),
            "--out".into(),
            files[i].display().to_string(),
        ]);
        args
    });
    let mut all = Vec::with_capacity(count * n);
    for f in &files {
        let bytes = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        all.extend(bytes.chunks_exact(8).map(|b| Duration::from_nanos(u64::from_le_bytes(b.try_into().unwrap()))));
    }
    let measured = all.len();
    let (median, p99, _) = percentiles(all);
    (us(median), us(p99), measured)
}

/// Aggregate requests/s of `n` clients streaming in windows of `window`.
fn streaming(d: &Meshd, dir: &std::path::Path, n: usize, window: usize) -> f64 {
    let done = clients(d, dir, &format!("stream{n}"), n, |_| {
        vec![
            "--mode".into(),
            "stream".into(),
            "--inflight".into(),
            window.to_string(),
            "--secs".into(),
            STREAM_SECS.to_string(),
        ]
    });
    let replies: u64 = done.iter().map(|l| field(l, "replies").unwrap_or(0)).sum();
    let longest = done.iter().map(|l| field(l, "elapsed_us").unwrap_or(0)).max().unwrap_or(1).max(1);
    replies as f64 / (longest as f64 / 1e6)
}

/// The raw baseline for many processes (the true limit beside the service's N-client latency rows):
/// `raw_pingpong_many.cu` resident with a thread per client, and for each client count N that many
/// processes at once, each in its own relaxed mapped-word round trip with its thread, waiting as the
/// service clients wait (spin, yield, sleep: `mesh_shm::PollPause`). What is left between the service's
/// row and this one is the service's; what is between this one and the SPSC row is the host's N
/// processes on its CPUs and PCIe. Ends the program (a ~0 into every word) and unloads it before the
/// service is made: it never looks at meshd's stop.
fn raw_many(d: &Meshd, dir: &std::path::Path) -> Vec<(usize, (f64, f64, usize))> {
    d.ok(&["channel", "create", RAW_CHANNEL, "--msg-size", "64", "--capacity", "64"]);
    d.ok(&["load", "raw-many", &ptx("raw_pingpong_many"), "--block", &RAW_CLIENTS.to_string(), "--bind", RAW_CHANNEL]);
    let shm = d.mailbox_path();
    let rows: Vec<_> = client_counts().into_iter().map(|n| (n, raw_latency(d, dir, &shm, n))).collect();
    let mb = mesh_shm::Mailbox::open(&shm).unwrap();
    for i in 0..RAW_CLIENTS {
        // No client runs any more: every GPU thread ends on its word's ~0.
        let (ping, _) = raw_words(&mb, RAW_CHANNEL, i).unwrap();
        ping.store(u64::MAX, std::sync::atomic::Ordering::Release);
    }
    d.ok(&["unload", "raw-many"]);
    rows
}

/// `mesh-gpu-bench service [blink|mps]`.
pub fn service_benches(mps: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mps_dir = dir.path().join("mps");
    let mut args = vec!["--channels", "64"];
    if mps {
        args.extend(["--isolation", "mps", "--pool", "2", "--mps-dir", mps_dir.to_str().unwrap()]);
    }
    let mode = if mps { "mps" } else { "blink" };
    let d = Meshd::start(&args);
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);

    let (spsc_median, spsc_p99, spsc_rate) = spsc(&d);
    let raw = raw_many(&d, dir.path());

    let size = SIZE.to_string();
    // `--shards P`: the fan-in channel in P shards of FANIN_CAPACITY each (the windows stay
    // as for one, so that the rows compare).
    let shards = service_shards();
    let shards_arg = shards.to_string();
    d.ok(&[
        "service",
        "create",
        "svc",
        "--clients",
        "64",
        "--msg-size",
        &size,
        "--capacity",
        &FANIN_CAPACITY.to_string(),
        "--reply-size",
        &size,
        "--reply-capacity",
        &reply_capacity().to_string(),
        "--shards",
        &shards_arg,
    ]);
    // Both loops of the header on the same service, one after the other: the batched one (service.cu)
    // and the one-request-at-a-time one (service_x_serial.cu), each warmed up by one client's stream.
    // `--programs` (names in programs/, comma-separated) measures others the same way.
    let programs = crate::opt_list("programs").unwrap_or_else(|| vec!["service".into(), "service_x_serial".into()]);
    let shape = service_shape();
    let grid = service_grid();
    let mut loops = Vec::new();
    for program in programs.iter().map(String::as_str) {
        let path = match program {
            "service" => "service".to_string(),
            "service_x_serial" => "service, one at a time".to_string(),
            other => other.to_string(),
        };
        let path = if shards > 1 { format!("{path}, {shards} shards") } else { path };
        let path = if grid.trim() != "1" { format!("{path}, {} blocks", grid.trim()) } else { path };
        // Every warp of the block serves its part of the shards (a block of 32: one warp serves all).
        let image = ptx(program);
        let mut load = vec!["load", "svc", image.as_str(), "--bind", "svc", "--bind", "svc.replies"];
        load.extend(shape.iter().map(String::as_str));
        d.ok(&load);
        let _ = streaming(&d, dir.path(), 1, 4);
        let mut lat = Vec::new();
        for &n in &client_counts() {
            lat.push((n, latency(&d, dir.path(), n)));
        }
        let mut rates = Vec::new();
        for &n in &client_counts() {
            let window = (FANIN_CAPACITY / n).clamp(1, REPLY_CAPACITY);
            rates.push((n, window, streaming(&d, dir.path(), n, window)));
        }
        d.ok(&["unload", "svc"]);
        loops.push((path, lat, rates));
    }

    println!();
    println!(
        "Service, {mode} mode, {SIZE}-byte requests and replies, {cores} host cores, {shards} fan-in \
         shard(s) (--shards): service.cu loaded with `{}` (--grid, --block), with",
        shape.join(" ")
    );
    println!(
        "mesh-service-client processes (meshd's client API; each waits as it does: spin, yield, then sleep; a receive \
         with several requests in flight yields at once),"
    );
    println!(
        "beside the single-client SPSC round trip through echo_warp (this process spinning), same meshd, same run."
    );
    println!("Latency: one request in flight per client, µs over every client's requests. Streaming: {STREAM_SECS} s,");
    println!(
        "windows of min({REPLY_CAPACITY}, {FANIN_CAPACITY} / clients) per client; aggregate replies/s. Reply rings of \
         {} (--reply-capacity).",
        reply_capacity()
    );
    println!();
    println!(
        "| mode | path | clients | median µs | p99 µs | p99 / SPSC median | p99 / raw p99, as many processes | window | \
         requests/s | × 1 client |"
    );
    println!(
        "|------|------|--------:|----------:|-------:|------------------:|------:|-------:|-----------:|-----------:|"
    );
    println!(
        "| {mode} | SPSC echo_warp | 1 | {spsc_median:.2} | {spsc_p99:.2} | {:.2} | | 16 | {spsc_rate:.0} | |",
        spsc_p99 / spsc_median
    );
    for (n, (median, p99, _)) in &raw {
        println!(
            "| {mode} | raw mapped word, {n} processes at once | {n} | {median:.2} | {p99:.2} | {:.2} | 1.00 | 1 | | |",
            p99 / spsc_median
        );
    }
    // The raw row of the same client count: the true limit for that many processes on this machine.
    let raw_p99 = |n: usize| raw.iter().find(|(m, _)| *m == n).map(|(_, (_, p99, _))| *p99);
    for (path, lat, rates) in &loops {
        let one = rates.first().map_or(1.0, |r| r.2);
        for ((n, (median, p99, _)), (_, window, rate)) in lat.iter().zip(rates) {
            let to_raw = raw_p99(*n).map_or_else(String::new, |r| format!("{:.2}", p99 / r));
            println!(
                "| {mode} | {path} | {n} | {median:.2} | {p99:.2} | {:.2} | {to_raw} | {window} | {rate:.0} | {:.2} |",
                p99 / spsc_median,
                rate / one
            );
            let spsc = Some(("SPSC echo_warp median", spsc_median));
            let figure = |what: &str| format!("{path}, {mode}, {n} clients, {what}");
            crate::results::record("service", &figure("median"), *median, "µs", spsc, None);
            crate::results::record("service", &figure("p99"), *p99, "µs", spsc, None);
            let alone = (*n > 1).then_some(("the same, 1 client", one));
            crate::results::record("service", &figure("streaming"), *rate, "requests/s", alone, None);
        }
    }
    if let Some((_, lat, _)) = loops.first() {
        println!(
            "(latency: {} requests measured per row; goals: 64-client p99 ≤ 3× the SPSC round trip, 64 streaming ≥ 8× one)",
            lat.iter().map(|(n, l)| format!("{n}: {}", l.2)).collect::<Vec<_>>().join(", ")
        );
    }
    d.ok(&["shutdown"]);
}
