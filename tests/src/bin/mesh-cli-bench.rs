//! The control plane through the CLI on a GPU: `meshd ps` round trip and a cached load's request-to-running, beside the backend's own figure; prints a markdown table.
//!
//! Gated like the other GPU benchmarks (`MESH_GPU_TESTS=1`). Eight heartbeat programs run; `ps`
//! is timed 50 times, then `unload p7` + `load p7` (the image cached by the JIT) 20 times. Each
//! figure is a whole `meshd` client process: spawn, connect, request, answer, exit.
//!
//! Then what scraping costs: a meshd with `--metrics-addr`, eight heartbeat programs
//! and the echo program; host→GPU→host round trips and heartbeat rates measured in windows of 2 s,
//! alternately without and with a scraper asking `/metrics` every 100 ms (three of each, in one run).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::{gpu_enabled, programs_dir};
use mesh_shm::{Consumer, Producer};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// (median, p99) of `xs`, in ms.
fn median_p99(xs: &mut [f64]) -> (f64, f64) {
    xs.sort_by(f64::total_cmp);
    // q is in [0, 1], so the rounded position lies in 0..xs.len().
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a position in 0..xs.len()")]
    let at = |q: f64| xs[((xs.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99))
}

/// The `(backend X ms)` figure meshd reports for a change, if any.
fn backend_ms(stdout: &str) -> Option<f64> {
    let rest = &stdout[stdout.find("(backend ")? + "(backend ".len()..];
    rest[..rest.find(" ms")?].parse().ok()
}

fn main() {
    if !gpu_enabled("mesh-cli-bench") {
        return;
    }
    let heartbeat = programs_dir().join("heartbeat.ptx").display().to_string();
    let d = Meshd::start(&[]);
    for i in 0..8 {
        d.ok(&["load", &format!("p{i}"), &heartbeat]);
    }
    // Warm the client path (page cache, the binary) before timing.
    for _ in 0..5 {
        d.ok(&["ps"]);
    }
    let mut ps: Vec<f64> = (0..50).map(|_| ms(d.timed_ok(&["ps"]).0)).collect();
    let (mut load, mut backend) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        d.ok(&["unload", "p7"]);
        let (took, out) = d.timed_ok(&["load", "p7", &heartbeat]);
        assert!(out.contains("loaded p7"), "{out}");
        load.push(ms(took));
        if let Some(b) = backend_ms(&out) {
            backend.push(b);
        }
    }
    let rows = d.heartbeats();
    assert_eq!(rows.len(), 8);
    assert!(rows.iter().all(|(_, _, state)| state == "running"), "{rows:?}");
    d.ok(&["shutdown"]);
    let (ps_med, ps_p99) = median_p99(&mut ps);
    let (load_med, load_p99) = median_p99(&mut load);
    println!("\n## meshd through the CLI (8 heartbeat programs, blink mode)\n");
    println!("| what | n | median ms | p99 ms |");
    println!("| --- | --- | --- | --- |");
    println!("| `meshd ps` round trip | {} | {ps_med:.3} | {ps_p99:.3} |", ps.len());
    println!("| `meshd load` (cached image) request to running | {} | {load_med:.3} | {load_p99:.3} |", load.len());
    if backend.is_empty() {
        println!("| backend's own time for that load | - | (not reported) | |");
    } else {
        let (b_med, b_p99) = median_p99(&mut backend);
        println!("| backend's own time for that load | {} | {b_med:.3} | {b_p99:.3} |", backend.len());
    }
    scrape_cost(&heartbeat);
}

/// One window: host round trips through echo (µs each), the mean heartbeat rate of the eight
/// programs (beats/s), and, when scraping, each scrape's time (ms).
struct Window {
    round_trips: Vec<f64>,
    beat_rate: f64,
    scrapes: Vec<f64>,
}

fn beat_sum(d: &Meshd) -> u64 {
    d.heartbeats().iter().filter(|(n, _, _)| n.starts_with('p')).map(|(_, b, _)| b).sum()
}

/// GET /metrics, whole; its time in ms.
fn scrape_once(addr: SocketAddr) -> f64 {
    let t = Instant::now();
    let mut c = TcpStream::connect(addr).expect("the metrics endpoint answers");
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n").unwrap();
    let mut body = Vec::new();
    c.read_to_end(&mut body).unwrap();
    assert!(body.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&body[..body.len().min(200)]));
    ms(t.elapsed())
}

fn window(d: &Meshd, tx: &mut Producer, rx: &mut Consumer, addr: Option<SocketAddr>) -> Window {
    let stop = Arc::new(AtomicBool::new(false));
    let scraper = addr.map(|addr| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut times = Vec::new();
            while !stop.load(Ordering::Acquire) {
                times.push(scrape_once(addr));
                std::thread::sleep(Duration::from_millis(100));
            }
            times
        })
    });
    let (b0, t0) = (beat_sum(d), Instant::now());
    let mut round_trips = Vec::new();
    let (msg, mut back) = ([7u8; 8], [0u8; 8]);
    while t0.elapsed() < Duration::from_secs(2) {
        let t = Instant::now();
        let limit = t + Duration::from_secs(1);
        while !tx.try_send(&msg).unwrap() {
            assert!(Instant::now() < limit, "to-gpu stayed full");
        }
        while !rx.try_recv(&mut back).unwrap() {
            assert!(Instant::now() < limit, "echo did not answer within 1 s");
        }
        round_trips.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let beat_rate = (beat_sum(d) - b0) as f64 / t0.elapsed().as_secs_f64() / 8.0;
    stop.store(true, Ordering::Release);
    let scrapes = scraper.map(|h| h.join().unwrap()).unwrap_or_default();
    Window { round_trips, beat_rate, scrapes }
}

fn scrape_cost(heartbeat: &str) {
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let d = Meshd::start(&["--metrics-addr", &port.to_string()]);
    d.ok(&["channel", "create", "to-gpu", "--msg-size", "8", "--capacity", "16"]);
    d.ok(&["channel", "create", "from-gpu", "--msg-size", "8", "--capacity", "16"]);
    let echo = programs_dir().join("echo.ptx").display().to_string();
    d.ok(&["load", "echo", &echo, "--bind", "to-gpu", "--bind", "from-gpu"]);
    for i in 0..8 {
        d.ok(&["load", &format!("p{i}"), heartbeat]);
    }
    let mailbox = d.mailbox();
    let mut tx = Producer::claim(&mailbox, "to-gpu").unwrap();
    let mut rx = Consumer::claim(&mailbox, "from-gpu").unwrap();
    let _ = window(&d, &mut tx, &mut rx, None); // warm-up
    let (mut quiet, mut scraped) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        quiet.push(window(&d, &mut tx, &mut rx, None));
        scraped.push(window(&d, &mut tx, &mut rx, Some(addr)));
    }
    drop((tx, rx));
    d.ok(&["shutdown"]);
    println!(
        "\n## What scraping /metrics every 100 ms costs (blink mode, echo + 8 heartbeat programs, 3 × 2 s each)\n"
    );
    println!(
        "| scraping | round trips | round trip median µs | p99 µs | heartbeats/s per program | scrapes | scrape median ms |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for (label, ws) in [("no", &quiet), ("every 100 ms", &scraped)] {
        let mut rt: Vec<f64> = ws.iter().flat_map(|w| w.round_trips.iter().copied()).collect();
        let (rt_med, rt_p99) = median_p99(&mut rt);
        let rate = ws.iter().map(|w| w.beat_rate).sum::<f64>() / ws.len() as f64;
        let mut sc: Vec<f64> = ws.iter().flat_map(|w| w.scrapes.iter().copied()).collect();
        let sc_med = if sc.is_empty() { f64::NAN } else { median_p99(&mut sc).0 };
        println!("| {label} | {} | {rt_med:.2} | {rt_p99:.2} | {rate:.0} | {} | {sc_med:.3} |", rt.len(), sc.len());
    }
    let per_window = |ws: &[Window]| ws.iter().map(|w| format!("{:.0}", w.beat_rate)).collect::<Vec<_>>().join(", ");
    println!("\nheartbeats/s per program by window: without {}; with {}", per_window(&quiet), per_window(&scraped));
}
