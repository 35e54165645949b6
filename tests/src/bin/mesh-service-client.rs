//! `mesh-service-client`: one client process of a meshd service, for the GPU test
//! (`tests/service.rs`) and the benchmark (`mesh-gpu-bench service`). Every reply is checked
//! (`mesh_gpu_tests::service`: word 0 its request's sequence number, word 1 the sent value + 1, words 2-3
//! this client's pid and nonce, the body as sent); a mismatch is printed on stderr and the exit code is 1.
//!
//! ```text
//! mesh-service-client --socket PATH --service NAME [--mode run|latency|stream] [--inflight K]
//!                     [--count N] [--warmup W] [--secs S] [--out FILE] [--attach-for-ms MS]
//!                     [--timeout-ms MS] [--progress-ms MS]
//! ```
//!
//! Attaches (retrying for `--attach-for-ms`, default 10000, while meshd refuses: every entry bound or
//! awaiting the program's acknowledgement), prints `ready pid=P id=ID attempts=A msg=B reply=B`, then:
//!
//! * `run` (the test's): keeps up to K requests in flight (default 4; at most the reply ring's capacity,
//!   so the program never finds this client's ring full) until its stdin says `stop` or closes; then
//!   receives every reply it is owed and detaches. Prints `progress replies=N` every `--progress-ms`
//!   (default 200).
//! * `latency`: after a `go` line, W (default 1000) then N (default 10000) requests one at a time
//!   (`request`), each timed from the send to its reply; the N times go to FILE as little-endian u64
//!   nanoseconds.
//! * `stream`: after a `go` line, for S seconds (default 2): send K, then receive K.
//! * `raw` (the benchmark's baseline for N processes at once; no service, no attach: `--service` names
//!   a host channel and `--shm PATH` the mailbox): round trips through two words of that channel's
//!   slots, `--index C`'s (the 8-byte word at slot byte C x 128, which the client stores, and the one 64
//!   bytes after it, which `raw_pingpong_many.cu`'s thread C stores back), waiting between polls as the
//!   service clients wait ([`mesh_shm::PollPause`]); after a `go` line, W then N of them, the N times to
//!   FILE as in `latency`.
//!
//! Last, on stdout: `done pid=P mode=M sent=S replies=R repeats=D max_gap_us=G max_gap_at_ms=T
//! max_latency_us=L elapsed_us=E errors=X` (`max_gap_us`: the longest wait for a reply while one was
//! owed; `max_gap_at_ms`: when it ended, Unix ms; `repeats`: replies to a request answered before,
//! dropped: see the module doc of `mesh_gpu_tests::service`). A reply not received within
//! `--timeout-ms` (default 60000) is an error. Exit codes: 0 every reply in order, 1 a mismatch or a
//! timeout, 2 bad usage or no attach.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mesh_gpu_tests::service::{ServiceClient, Verdict, check_reply, fill_request};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Run,
    Latency,
    Stream,
    Raw,
}

#[derive(Debug)]
struct Args {
    socket: PathBuf,
    service: String,
    mode: Mode,
    inflight: usize,
    count: u64,
    warmup: u64,
    secs: f64,
    out: Option<PathBuf>,
    attach_for: Duration,
    timeout: Duration,
    progress: Duration,
    shm: Option<PathBuf>,
    index: u64,
}

fn usage(why: &str) -> ! {
    eprintln!("mesh-service-client: {why}");
    eprintln!(
        "usage: mesh-service-client --socket PATH --service NAME [--mode run|latency|stream] [--inflight K] \
         [--count N] [--warmup W] [--secs S] [--out FILE] [--attach-for-ms MS] [--timeout-ms MS] [--progress-ms MS] \
         [--shm PATH --index C (raw)]"
    );
    std::process::exit(2)
}

fn parse() -> Args {
    let mut a = Args {
        socket: PathBuf::new(),
        service: String::new(),
        mode: Mode::Run,
        inflight: 4,
        count: 10_000,
        warmup: 1_000,
        secs: 2.0,
        out: None,
        attach_for: Duration::from_secs(10),
        timeout: Duration::from_secs(60),
        progress: Duration::from_millis(200),
        shm: None,
        index: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let num = |v: &str| v.parse::<u64>().unwrap_or_else(|_| usage(&format!("{flag} {v}: not a whole number")));
        match flag.as_str() {
            "--socket" => a.socket = PathBuf::from(value),
            "--service" => a.service = value,
            "--mode" => {
                a.mode = match value.as_str() {
                    "run" => Mode::Run,
                    "latency" => Mode::Latency,
                    "stream" => Mode::Stream,
                    "raw" => Mode::Raw,
                    other => usage(&format!("--mode {other}: expected run, latency, stream or raw")),
                }
            }
            "--inflight" => a.inflight = usize::try_from(num(&value).max(1)).unwrap_or(1),
            "--count" => a.count = num(&value),
            "--warmup" => a.warmup = num(&value),
            "--secs" => a.secs = value.parse().unwrap_or_else(|_| usage(&format!("--secs {value}: not a number"))),
            "--out" => a.out = Some(PathBuf::from(value)),
            "--attach-for-ms" => a.attach_for = Duration::from_millis(num(&value)),
            "--timeout-ms" => a.timeout = Duration::from_millis(num(&value)),
            "--progress-ms" => a.progress = Duration::from_millis(num(&value).max(1)),
            "--shm" => a.shm = Some(PathBuf::from(value)),
            "--index" => a.index = num(&value),
            other => usage(&format!("unknown option {other}")),
        }
    }
    if a.socket.as_os_str().is_empty() || a.service.is_empty() {
        usage("--socket and --service are required");
    }
    a
}

/// What stdin said: nothing yet, `go`, or `stop` / closed.
const QUIET: u8 = 0;
const GO: u8 = 1;
const STOP: u8 = 2;

fn unix_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// The client's counts and checks.
struct Client {
    svc: ServiceClient,
    pid: u32,
    nonce: u32,
    msg: Vec<u8>,
    reply: Vec<u8>,
    /// The next request to send, and the next reply expected.
    next: u64,
    expected: u64,
    /// Send times of the requests in flight, oldest first.
    sent_at: VecDeque<Instant>,
    repeats: u64,
    errors: u64,
    /// Since when a reply is owed and none came (the last reply, or the send that made one owed).
    waiting_since: Option<Instant>,
    max_gap: Duration,
    max_gap_at_ms: u128,
    max_latency: Duration,
}

impl Client {
    fn new(svc: ServiceClient) -> Self {
        let pid = std::process::id();
        let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let nonce = (t.subsec_nanos() ^ pid.rotate_left(16)).wrapping_mul(0x9E37_79B1) | 1;
        let msg = vec![0u8; svc.msg_size()];
        let reply = vec![0u8; svc.reply_size()];
        Self {
            svc,
            pid,
            nonce,
            msg,
            reply,
            next: 0,
            expected: 0,
            sent_at: VecDeque::new(),
            repeats: 0,
            errors: 0,
            waiting_since: None,
            max_gap: Duration::ZERO,
            max_gap_at_ms: 0,
            max_latency: Duration::ZERO,
        }
    }

    fn fail(&mut self, what: &str) {
        self.errors += 1;
        eprintln!("mesh-service-client {}: ERROR {what}", self.pid);
    }

    /// Tries to send the next request; whether it went.
    fn try_send(&mut self) -> bool {
        fill_request(&mut self.msg, self.next, self.pid, self.nonce);
        match self.svc.try_send(&self.msg) {
            Ok(true) => {
                let now = Instant::now();
                if self.sent_at.is_empty() {
                    self.waiting_since = Some(now);
                }
                self.sent_at.push_back(now);
                self.next += 1;
                true
            }
            Ok(false) => false,
            Err(e) => {
                let seq = self.next;
                self.fail(&format!("send of request {seq}: {e}"));
                false
            }
        }
    }

    /// Sends the next request, waiting for room.
    fn send(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.try_send() {
                return true;
            }
            if self.errors > 0 {
                return false;
            }
            if Instant::now() >= deadline {
                let seq = self.next;
                self.fail(&format!("no room for request {seq} within {timeout:?}"));
                return false;
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Checks a reply just received into `self.reply`.
    fn took(&mut self) {
        let now = Instant::now();
        match check_reply(&self.reply, self.expected, self.pid, self.nonce) {
            Ok(Verdict::Expected) => {
                if let Some(since) = self.waiting_since {
                    let gap = now - since;
                    if gap > self.max_gap {
                        self.max_gap = gap;
                        self.max_gap_at_ms = unix_ms();
                    }
                }
                if let Some(sent) = self.sent_at.pop_front() {
                    self.max_latency = self.max_latency.max(now - sent);
                }
                self.expected += 1;
                self.waiting_since = (!self.sent_at.is_empty()).then_some(now);
            }
            Ok(Verdict::Repeat(_)) => self.repeats += 1,
            Err(e) => {
                let ahead = self.expected >= self.next;
                self.fail(&format!("{e}{}", if ahead { " (no request is in flight)" } else { "" }));
            }
        }
    }

    /// Receives one reply if one is there.
    fn try_recv(&mut self) -> bool {
        match self.svc.try_recv(&mut self.reply) {
            Ok(true) => {
                self.took();
                true
            }
            Ok(false) => false,
            Err(e) => {
                self.fail(&format!("receive: {e}"));
                false
            }
        }
    }

    /// Receives one reply, waiting.
    fn recv(&mut self, timeout: Duration) -> bool {
        match self.svc.recv(&mut self.reply, timeout) {
            Ok(()) => {
                self.took();
                true
            }
            Err(e) => {
                let seq = self.expected;
                self.fail(&format!("the reply to request {seq}: {e}"));
                false
            }
        }
    }

    fn owed(&self) -> usize {
        self.sent_at.len()
    }
}

/// Waits with a growing pause while nothing happens: spins first (a round trip is microseconds), then
/// sleeps up to 1 ms, so that 64 clients on fewer cores leave the CPUs to whoever has work.
struct Backoff(u32);

impl Backoff {
    fn idle(&mut self) {
        self.0 = self.0.saturating_add(1);
        if self.0 < 200 {
            std::hint::spin_loop();
        } else {
            let us = 1u64 << (self.0 - 200).min(10);
            std::thread::sleep(Duration::from_micros(us.min(1000)));
        }
    }
    fn reset(&mut self) {
        self.0 = 0;
    }
}

fn attach(a: &Args) -> (ServiceClient, u32) {
    let deadline = Instant::now() + a.attach_for;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match ServiceClient::connect(&a.socket, &a.service) {
            Ok(svc) => return (svc, attempts),
            Err(e) if Instant::now() >= deadline => {
                eprintln!(
                    "mesh-service-client {}: could not attach to {} in {attempts} attempts: {e}",
                    std::process::id(),
                    a.service
                );
                std::process::exit(2);
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn run(c: &mut Client, a: &Args, said: &AtomicU8) {
    let mut backoff = Backoff(0);
    let mut last_progress = Instant::now();
    let mut last_reply = Instant::now();
    loop {
        let stopping = said.load(Ordering::Acquire) == STOP;
        if stopping && c.owed() == 0 {
            break;
        }
        let mut moved = false;
        while !stopping && c.owed() < a.inflight && c.errors == 0 && c.try_send() {
            moved = true;
        }
        while c.try_recv() {
            moved = true;
            last_reply = Instant::now();
        }
        if c.errors > 0 {
            break;
        }
        if moved {
            backoff.reset();
        } else {
            if c.owed() > 0 && last_reply.elapsed() > a.timeout {
                let seq = c.expected;
                c.fail(&format!("no reply to request {seq} within {:?}", a.timeout));
                break;
            }
            if c.owed() == 0 {
                last_reply = Instant::now();
            }
            backoff.idle();
        }
        if last_progress.elapsed() >= a.progress {
            last_progress = Instant::now();
            println!("progress replies={} sent={} repeats={}", c.expected, c.next, c.repeats);
            let _ = std::io::stdout().flush();
        }
    }
}

fn latency(c: &mut Client, a: &Args) -> Result<(), String> {
    let mut times = Vec::with_capacity(usize::try_from(a.count).unwrap_or(0));
    for i in 0..a.warmup + a.count {
        fill_request(&mut c.msg, c.next, c.pid, c.nonce);
        let t = Instant::now();
        if let Err(e) = c.svc.request(&c.msg, &mut c.reply, a.timeout) {
            let seq = c.next;
            c.fail(&format!("request {seq}: {e}"));
            break;
        }
        let took = t.elapsed();
        c.sent_at.push_back(t);
        c.next += 1;
        c.took();
        if c.errors > 0 {
            break;
        }
        if i >= a.warmup {
            times.push(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        }
    }
    if let Some(out) = &a.out {
        write_times(out, &times)?;
    }
    Ok(())
}

fn stream(c: &mut Client, a: &Args, said: &AtomicU8) {
    let until = Instant::now() + Duration::from_secs_f64(a.secs.max(0.0));
    while Instant::now() < until && said.load(Ordering::Acquire) != STOP && c.errors == 0 {
        for _ in 0..a.inflight {
            if !c.send(a.timeout) {
                break;
            }
        }
        while c.owed() > 0 && c.errors == 0 {
            if !c.recv(a.timeout) {
                break;
            }
        }
    }
}

fn main() {
    let a = parse();
    if a.mode == Mode::Raw {
        raw(&a);
    }
    let (svc, attempts) = attach(&a);
    let id = svc.id();
    let mut c = Client::new(svc);
    if c.msg.len() < mesh_gpu_tests::service::MIN_MSG || c.reply.len() != c.msg.len() {
        eprintln!(
            "mesh-service-client: requests of {} bytes and replies of {}: this client needs equal sizes of at least {}",
            c.msg.len(),
            c.reply.len(),
            mesh_gpu_tests::service::MIN_MSG
        );
        std::process::exit(2);
    }
    println!("ready pid={} id={id:#x} attempts={attempts} msg={} reply={}", c.pid, c.msg.len(), c.reply.len());
    let _ = std::io::stdout().flush();

    let said = Arc::new(AtomicU8::new(QUIET));
    {
        let said = Arc::clone(&said);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line.as_deref().map(str::trim) {
                    Ok("go") => said.store(GO, Ordering::Release),
                    Ok("stop") | Err(_) => break,
                    Ok(_) => {}
                }
            }
            said.store(STOP, Ordering::Release);
        });
    }
    if a.mode != Mode::Run {
        while said.load(Ordering::Acquire) == QUIET {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    let started = Instant::now();
    let mut failed = None;
    match a.mode {
        Mode::Run => run(&mut c, &a, &said),
        Mode::Latency => failed = latency(&mut c, &a).err(),
        Mode::Stream => stream(&mut c, &a, &said),
        Mode::Raw => unreachable!("raw mode returns from main before the attach"),
    }
    let elapsed = started.elapsed();
    if let Some(e) = failed {
        c.fail(&e);
    }
    let mode = format!("{:?}", a.mode).to_lowercase();
    let (sent, replies, repeats, errors) = (c.next, c.expected, c.repeats, c.errors);
    let (gap, gap_at, lat) = (c.max_gap.as_micros(), c.max_gap_at_ms, c.max_latency.as_micros());
    let pid = c.pid;
    if errors == 0
        && let Err(e) = c.svc.detach()
    {
        eprintln!("mesh-service-client {pid}: detach: {e}");
    }
    println!(
        "done pid={pid} mode={mode} sent={sent} replies={replies} repeats={repeats} max_gap_us={gap} max_gap_at_ms={gap_at} \
         max_latency_us={lat} elapsed_us={} errors={errors}",
        elapsed.as_micros()
    );
    let _ = std::io::stdout().flush();
    std::process::exit(i32::from(errors > 0));
}

/// Writes round-trip times (nanoseconds) to `out` as little-endian u64s: what the benchmark reads.
fn write_times(out: &std::path::Path, times: &[u64]) -> Result<(), String> {
    let bytes: Vec<u8> = times.iter().flat_map(|t| t.to_le_bytes()).collect();
    std::fs::write(out, bytes).map_err(|e| format!("{}: {e}", out.display()))
}

/// `--mode raw`: the N-processes raw baseline (module doc). Exits: 0 every round trip came back, 1 one
/// did not within `--timeout-ms`, 2 bad usage.
fn raw(a: &Args) -> ! {
    let pid = std::process::id();
    let shm = a.shm.as_ref().unwrap_or_else(|| usage("--mode raw needs --shm PATH"));
    let mb = mesh_shm::Mailbox::open(shm).unwrap_or_else(|e| usage(&format!("--shm {}: {e}", shm.display())));
    let (ping, pong) = mesh_gpu_tests::service::raw_words(&mb, &a.service, a.index).unwrap_or_else(|e| usage(&e));
    println!("ready pid={pid} id=raw{} attempts=0 msg=8 reply=8", a.index);
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    while std::io::stdin().lock().read_line(&mut line).is_ok_and(|n| n > 0) && line.trim() != "go" {
        line.clear();
    }
    let started = Instant::now();
    let mut times = Vec::with_capacity(usize::try_from(a.count).unwrap_or(0));
    let mut errors = 0u64;
    for i in 1..=a.warmup + a.count {
        let t = Instant::now();
        let deadline = t + a.timeout;
        ping.store(i, Ordering::Release);
        let mut pause = mesh_shm::PollPause::new();
        while pong.load(Ordering::Acquire) != i {
            if Instant::now() >= deadline {
                eprintln!("mesh-service-client {pid}: ERROR raw round trip {i} not back within {:?}", a.timeout);
                errors += 1;
                break;
            }
            pause.pause(deadline);
        }
        if errors > 0 {
            break;
        }
        if i > a.warmup {
            times.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
    }
    if let Some(out) = &a.out
        && let Err(e) = write_times(out, &times)
    {
        eprintln!("mesh-service-client {pid}: ERROR {e}");
        errors += 1;
    }
    let n = times.len();
    println!(
        "done pid={pid} mode=raw sent={n} replies={n} repeats=0 max_gap_us=0 max_gap_at_ms=0 max_latency_us={} elapsed_us={} errors={errors}",
        times.iter().max().map_or(0, |ns| ns / 1000),
        started.elapsed().as_micros()
    );
    let _ = std::io::stdout().flush();
    std::process::exit(i32::from(errors > 0))
}
