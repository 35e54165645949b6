//! The chaos test's pieces (tests/tests/chaos.rs): its seed and schedule generator, meshd started by
//! the systemd unit's command and killed with -9, the host ends of its sequence-checked streams, and
//! the process, descriptor and GPU-memory accounting it ends with.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mesh_shm::{Consumer, Mailbox, Producer};

use crate::harness::meshd_bin;
use crate::{stress, wait_until};

/// A generator whose sequence is fixed by its seed for good (splitmix64, Steele et al. 2014): a seed
/// printed by a failed run replays the same schedule in any later build.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// One of `from`, if any.
    pub fn pick<'a, T>(&mut self, from: &'a [T]) -> Option<&'a T> {
        let n = u64::try_from(from.len()).ok()?;
        (n > 0).then(|| &from[usize::try_from(self.below(n)).unwrap_or(0)])
    }
}

/// `MESH_CHAOS_SEED` (decimal or 0x-hex), else a fresh one from the clock and the pid.
pub fn seed() -> u64 {
    match std::env::var("MESH_CHAOS_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("MESH_CHAOS_SEED={s}: not a number ({e})"))
        }
        Err(_) => {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            Rng(u64::from(t.subsec_nanos()) ^ t.as_secs() ^ (u64::from(std::process::id()) << 32)).next_u64()
        }
    }
}

/// How long each mode runs: `MESH_CHAOS_SECS`, default 240 (4 minutes).
pub fn duration() -> Duration {
    let secs = std::env::var("MESH_CHAOS_SECS").ok().map(|s| {
        s.trim().parse::<u64>().unwrap_or_else(|e| panic!("MESH_CHAOS_SECS={s}: not a whole number of seconds ({e})"))
    });
    Duration::from_secs(secs.unwrap_or(240))
}

/// meshd as `deploy/meshd@.service` starts it on GPU 0 (`meshd run --device 0 --keep-shm
/// $MESHD_ARGS`: the mailbox and MPS directory derived from the GPU's UUID), plus `--socket` and
/// `--state-dir` inside the test's directory; every restart runs exactly this command again.
#[derive(Debug)]
pub struct UnitMeshd {
    /// The daemon process.
    pub child: Child,
    /// Every meshd pid this test started (each restart after a kill -9 is a new one).
    pub pids: Vec<u32>,
    /// `$MESHD_ARGS`.
    args: Vec<String>,
    socket: PathBuf,
    state: PathBuf,
    log: PathBuf,
}

impl UnitMeshd {
    /// The unit's command line, `--fresh` added on the first start only.
    fn command(&self, fresh: bool) -> Command {
        let mut cmd = Command::new(meshd_bin());
        cmd.arg("--socket").arg(&self.socket).args(["run", "--device", "0", "--keep-shm"]);
        cmd.arg("--state-dir").arg(&self.state).args(&self.args);
        if fresh {
            cmd.arg("--fresh");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("meshd's log"));
        cmd
    }

    /// Starts it in `dir` with `$MESHD_ARGS` = `args`; the first start adds `--fresh`, so that a
    /// mailbox an earlier run left at the derived path is replaced. Waits until it answers.
    pub fn start(dir: &Path, args: &[&str]) -> Self {
        let (socket, state, log) = (dir.join("sock"), dir.join("state"), dir.join("meshd.log"));
        let args: Vec<String> = args.iter().map(|s| (*s).to_string()).collect();
        let mut first = Self { child: Self::placeholder(), pids: Vec::new(), args, socket, state, log };
        let child = first.command(true).spawn().expect("start meshd");
        let mut placeholder = std::mem::replace(&mut first.child, child);
        let _ = placeholder.wait();
        first.pids.push(first.child.id());
        first.wait_up();
        first
    }

    /// A child that has already ended, until the first meshd is spawned from the fields it needs.
    fn placeholder() -> Child {
        Command::new("true").spawn().expect("a placeholder child (`true`)")
    }

    fn wait_up(&self) {
        let up = wait_until(Duration::from_secs(60), || self.cli(&["ps"]).status.success());
        assert!(up, "meshd did not come up:\n{}", self.log_tail(60));
    }

    /// `kill -9` of meshd, then the same command at once (what `Restart=on-failure` does, without
    /// its `RestartSec`); waits until it answers.
    pub fn kill9_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = self.command(false).spawn().expect("restart meshd");
        self.pids.push(self.child.id());
        self.wait_up();
    }

    /// `meshd shutdown`, then waits for the process to end; returns its exit status.
    pub fn shutdown(&mut self) -> std::process::ExitStatus {
        self.ok(&["shutdown"]);
        let ended = wait_until(Duration::from_secs(60), || self.child.try_wait().is_ok_and(|s| s.is_some()));
        assert!(ended, "meshd did not end after shutdown:\n{}", self.log_tail(60));
        self.child.wait().expect("meshd's exit status")
    }

    /// Runs a client subcommand against this meshd.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(meshd_bin())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run the meshd client")
    }

    /// A client command that must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "meshd {args:?} failed: {}\nlog:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_tail(60)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `ps --json`; empty while nobody answers (meshd restarting, or being replaced).
    pub fn ps(&self) -> Vec<serde_json::Value> {
        let out = self.cli(&["ps", "--json"]);
        if !out.status.success() {
            return Vec::new();
        }
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    }

    /// `info`, if meshd answers.
    pub fn info(&self) -> Option<serde_json::Value> {
        let out = self.cli(&["info"]);
        out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
    }

    /// meshd's log file (every start appends to it).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The whole log so far (every start appends to it).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log's last `n` lines.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for UnitMeshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The replay bounds meshd logged in `log` for `channel` after a crash: the sum of each start's "may
/// receive again up to N message(s)"; `None` when no line names it.
pub fn logged_replay(log: &str, channel: &str) -> Option<u64> {
    let prefix = format!("channel {channel}: a GPU consumer may receive again up to ");
    let found: Vec<u64> = log
        .lines()
        .filter_map(|l| l.split_once(&prefix).map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect();
    (!found.is_empty()).then(|| found.iter().sum())
}

/// Pids of live processes whose command name starts with `prefix` (zombies left out).
pub fn processes(prefix: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim().starts_with(prefix) && alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// Whether `pid` runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// meshd, its MPS workers and MPS daemons still running (comm is cut to 15 characters:
/// "nvidia-cuda-mps" covers the control daemon and the server).
pub fn leftovers() -> Vec<(String, u32)> {
    ["meshd", "mesh-mps-worker", "nvidia-cuda-mps"]
        .iter()
        .flat_map(|p| processes(p).into_iter().map(|pid| ((*p).to_string(), pid)))
        .collect()
}

/// (descriptors, threads) of `pid` once they have stayed the same for 200 ms (connection threads
/// end after their request).
pub fn settled_counts(pid: u32) -> (usize, usize) {
    let now = || {
        let n = |d: String| std::fs::read_dir(d).map(|d| d.count()).unwrap_or(0);
        (n(format!("/proc/{pid}/fd")), n(format!("/proc/{pid}/task")))
    };
    let mut last = now();
    let mut same = 0;
    wait_until(Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(10));
        let n = now();
        same = if n == last { same + 1 } else { 0 };
        last = n;
        same >= 20
    });
    last
}

/// The GPU's memory in use, MiB, as nvidia-smi reports it (the test process holds no context of its
/// own to ask cuMemGetInfo with: one would be another MPS client, or time-slice with meshd's).
pub fn gpu_memory_mib() -> Option<u64> {
    let out =
        Command::new("nvidia-smi").args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().next()?.trim().parse().ok()
}

/// Slack on top of the 1% that the GPU's memory in use may grow by over a run without counting as a
/// leak (nvidia-smi's figure moves by a few MiB with the driver's own allocations).
pub const MEMORY_SLACK_MIB: u64 = 16;

/// Whether the GPU's memory in use grew from `before` to `after` (MiB) by more than 1% plus
/// [`MEMORY_SLACK_MIB`]: a leak. Less memory in use at the end is never one.
pub fn memory_leaked(before: u64, after: u64) -> bool {
    after > before + before / 100 + MEMORY_SLACK_MIB
}

/// The monitoring endpoint meshd's log announced last (`monitoring endpoint: http://ADDR/metrics`,
/// logged once it serves; with `--metrics-addr 127.0.0.1:0` every start picks its own port), and how
/// many starts announced one.
pub fn endpoint_in_log(log: &str) -> (Option<SocketAddr>, usize) {
    let found: Vec<SocketAddr> = log
        .lines()
        .filter_map(|l| l.split_once("monitoring endpoint: http://").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_once('/')?.0.parse().ok())
        .collect();
    (found.last().copied(), found.len())
}

/// One GET's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Got {
    /// An answer with this status.
    Status(u16),
    /// Nothing listens (meshd restarting or being replaced), or the connection was cut before any
    /// answer (the process ended under it).
    Unreachable(String),
    /// Connected, but no whole answer within the timeout, or one that is not HTTP.
    Failed(String),
}

/// `GET path` on `addr` with `Connection: close`, waiting at most `timeout` for the answer.
pub fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Got {
    let mut c = match TcpStream::connect_timeout(&addr, timeout) {
        Ok(c) => c,
        Err(e) => return Got::Unreachable(format!("connect: {e}")),
    };
    let _ = c.set_read_timeout(Some(timeout));
    let _ = c.set_write_timeout(Some(timeout));
    // One write: write! would send the pieces of its format separately.
    let request = format!("GET {path} HTTP/1.1\r\nHost: chaos\r\nConnection: close\r\n\r\n");
    if let Err(e) = c.write_all(request.as_bytes()) {
        return Got::Unreachable(format!("send: {e}"));
    }
    let mut raw = Vec::new();
    match c.read_to_end(&mut raw) {
        Ok(_) => {}
        Err(e)
            if raw.is_empty() && matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
        {
            return Got::Failed(format!("no answer within {timeout:?}"));
        }
        Err(e) if raw.is_empty() => return Got::Unreachable(format!("read: {e}")),
        // Cut off after the status line came (a reset as the server closes): the status stands.
        Err(_) if raw.starts_with(b"HTTP/1.") && raw.len() >= 12 => {}
        Err(e) => return Got::Failed(format!("read after {} bytes: {e}", raw.len())),
    }
    if raw.is_empty() {
        return Got::Unreachable("closed without an answer".into());
    }
    let head = String::from_utf8_lossy(&raw);
    let status = head.strip_prefix("HTTP/1.").and_then(|r| r.get(2..5)).and_then(|c| c.parse().ok());
    status.map_or_else(|| Got::Failed(format!("not HTTP: {:?}", head.lines().next())), Got::Status)
}

/// The first failure a thread of the test reports (later ones are dropped: the first is the cause).
#[derive(Debug, Default)]
pub struct FirstFailure(Mutex<Option<String>>);

impl FirstFailure {
    /// Keeps `why` unless a failure is kept already.
    pub fn set(&self, why: String) {
        let mut f = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if f.is_none() {
            *f = Some(why);
        }
    }

    /// The failure kept, if any.
    pub fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

/// What [`Scraper`] saw.
#[derive(Debug, Default)]
pub struct ScrapeStats {
    /// Answers 200.
    pub ok: AtomicU64,
    /// Answers 503 (/readyz while a program is not running, or a recovery is under way).
    pub unavailable: AtomicU64,
    /// Tries that found nothing listening (meshd restarting).
    pub unreachable: AtomicU64,
    /// The slowest answer, µs.
    pub slowest_us: AtomicU64,
    /// The first failure: an answer slower than the limit, a status other than 200 and 503, no answer
    /// on an open connection, or no endpoint reachable for a minute.
    pub failure: FirstFailure,
}

impl ScrapeStats {
    fn fail(&self, why: String) {
        self.failure.set(why);
    }

    /// The first failure, if any.
    pub fn failed(&self) -> Option<String> {
        self.failure.get()
    }
}

/// A thread scraping `/metrics` and `/readyz` of the endpoint meshd's log names, every `period`,
/// until dropped or [`Scraper::finish`]ed.
#[derive(Debug)]
pub struct Scraper {
    /// What it saw.
    pub stats: Arc<ScrapeStats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Scraper {
    /// How long an answer may take (meshd answers both from its snapshot, within milliseconds).
    pub const LIMIT: Duration = Duration::from_secs(3);
    /// How long no endpoint may be reachable (a restart or a replacement takes seconds).
    pub const DOWN_LIMIT: Duration = Duration::from_secs(60);

    /// Starts scraping the endpoint announced in `log` (the log file meshd appends to).
    pub fn start(log: PathBuf, period: Duration) -> Self {
        let stats = Arc::new(ScrapeStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (stats.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut reached = Instant::now();
            while !sp.load(Ordering::Relaxed) {
                std::thread::sleep(period);
                let (addr, starts) = endpoint_in_log(&std::fs::read_to_string(&log).unwrap_or_default());
                let Some(addr) = addr else {
                    reached = Instant::now(); // not announced yet: meshd's first start
                    continue;
                };
                for path in ["/metrics", "/readyz"] {
                    let t = Instant::now();
                    let got = http_get(addr, path, Self::LIMIT * 3);
                    let took = t.elapsed();
                    // A start announced during the scrape: the port may have been reused by a process
                    // still starting (its listener bound, not yet served). Not judged.
                    let restarted = endpoint_in_log(&std::fs::read_to_string(&log).unwrap_or_default()).1 != starts;
                    match got {
                        Got::Status(code) => {
                            reached = Instant::now();
                            st.slowest_us
                                .fetch_max(u64::try_from(took.as_micros()).unwrap_or(u64::MAX), Ordering::AcqRel);
                            let counter = match code {
                                200 => &st.ok,
                                503 => &st.unavailable,
                                other => {
                                    st.fail(format!("GET {path} on {addr}: status {other}"));
                                    continue;
                                }
                            };
                            counter.fetch_add(1, Ordering::AcqRel);
                            if took > Self::LIMIT && !restarted {
                                st.fail(format!(
                                    "GET {path} on {addr}: answered {code} in {took:?} (limit {:?})",
                                    Self::LIMIT
                                ));
                            }
                        }
                        Got::Unreachable(_) => {
                            st.unreachable.fetch_add(1, Ordering::AcqRel);
                            if reached.elapsed() > Self::DOWN_LIMIT {
                                st.fail(format!(
                                    "no monitoring endpoint reachable for {:?} (last {addr})",
                                    Self::DOWN_LIMIT
                                ));
                            }
                        }
                        Got::Failed(why) if !restarted => {
                            st.fail(format!("GET {path} on {addr}: {why} after {took:?}"))
                        }
                        Got::Failed(_) => {
                            st.unreachable.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                }
            }
        });
        Self { stats, stop, thread: Some(thread) }
    }

    /// Stops the thread and returns what it saw.
    pub fn finish(mut self) -> Arc<ScrapeStats> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("the scraper");
        }
        self.stats.clone()
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What a host end of a stream counted. A failure (a lost, torn or reordered message) is kept with
/// its text and stops the thread; repeats are counted (allowed only after a crash, within a bound).
#[derive(Debug, Default)]
pub struct Tally {
    /// Messages sent by a host producer.
    pub sent: AtomicU64,
    /// Messages received by a host consumer (repeats included).
    pub received: AtomicU64,
    /// Distinct messages delivered in order to a host consumer: every sequence number below it came.
    pub delivered: AtomicU64,
    /// Messages that came again (sequence numbers already received).
    pub repeated: AtomicU64,
    /// The first failure.
    pub failure: FirstFailure,
}

impl Tally {
    fn fail(&self, why: String) {
        self.failure.set(why);
    }

    /// The first failure, if any.
    pub fn failed(&self) -> Option<String> {
        self.failure.get()
    }

    /// Reads one counter.
    pub fn get(a: &AtomicU64) -> u64 {
        a.load(Ordering::Acquire)
    }
}

/// A host thread of a stream: stops when `stop` is set (a producer at once; a consumer once it has
/// everything its producer sent, or after `drain`).
#[derive(Debug)]
pub struct HostEnd {
    /// What it counted.
    pub tally: Arc<Tally>,
    /// The threads.
    pub threads: Vec<JoinHandle<()>>,
}

/// Host → GPU: stress message `seq` at ring position `seq` (the GPU `sink` checks each).
pub fn host_producer(mb: &Mailbox, channel: &str, size: usize, stop: &Arc<AtomicBool>) -> HostEnd {
    let tally = Arc::new(Tally::default());
    let mut tx = Producer::claim(mb, channel).expect("the host end of the host→GPU channel");
    let (t, stop) = (tally.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        let mut msg = vec![0u8; size];
        let mut seq = 0u64;
        while !stop.load(Ordering::Relaxed) {
            stress::fill(&mut msg, seq);
            match tx.try_send(&msg) {
                Ok(true) => {
                    seq += 1;
                    t.sent.store(seq, Ordering::Release);
                }
                Ok(false) => std::thread::sleep(Duration::from_micros(50)),
                Err(e) => return t.fail(format!("send {seq}: {e}")),
            }
        }
    });
    HostEnd { tally, threads: vec![thread] }
}

/// GPU → host: the `source`'s stress messages, each checked against the host's own count: exactly
/// once, in order and whole, whatever happens to meshd (a GPU producer resumes at its published head).
pub fn host_consumer(mb: &Mailbox, channel: &str, size: usize, stop: &Arc<AtomicBool>) -> HostEnd {
    let tally = Arc::new(Tally::default());
    let mut rx = Consumer::claim(mb, channel).expect("the host end of the GPU→host channel");
    let (t, stop) = (tally.clone(), stop.clone());
    let thread = std::thread::spawn(move || {
        let mut msg = vec![0u8; size];
        let mut seq = 0u64;
        loop {
            match rx.try_recv(&mut msg) {
                Ok(true) => {
                    if let Err(e) = stress::check(&msg, seq) {
                        return t.fail(format!("GPU→host: {e}"));
                    }
                    seq += 1;
                    t.received.store(seq, Ordering::Release);
                    t.delivered.store(seq, Ordering::Release);
                }
                Ok(false) if stop.load(Ordering::Relaxed) => return,
                Ok(false) => std::thread::sleep(Duration::from_micros(50)),
                Err(e) => return t.fail(format!("recv {seq}: {e}")),
            }
        }
    });
    HostEnd { tally, threads: vec![thread] }
}

/// Host → GPU echo → host: 16-byte messages (`seq`, `!seq`), at most `window` in flight. A reply
/// ahead of the next one expected is a loss (a failure); one behind it a repeat (counted).
pub fn host_round_trip(mb: &Mailbox, to: &str, from: &str, window: u64, stop: &Arc<AtomicBool>) -> HostEnd {
    let tally = Arc::new(Tally::default());
    let mut tx = Producer::claim(mb, to).expect("the host end of the echo's input");
    let mut rx = Consumer::claim(mb, from).expect("the host end of the echo's output");
    let next = Arc::new(AtomicU64::new(0));
    let sender = {
        let (t, stop, next) = (tally.clone(), stop.clone(), next.clone());
        std::thread::spawn(move || {
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if seq >= next.load(Ordering::Acquire) + window {
                    std::thread::sleep(Duration::from_micros(50));
                    continue;
                }
                let mut m = [0u8; 16];
                m[..8].copy_from_slice(&seq.to_le_bytes());
                m[8..].copy_from_slice(&(!seq).to_le_bytes());
                match tx.try_send(&m) {
                    Ok(true) => {
                        seq += 1;
                        t.sent.store(seq, Ordering::Release);
                    }
                    Ok(false) => std::thread::sleep(Duration::from_micros(50)),
                    Err(e) => return t.fail(format!("send {seq}: {e}")),
                }
            }
        })
    };
    let receiver = {
        let (t, stop) = (tally.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut m = [0u8; 16];
            loop {
                match rx.try_recv(&mut m) {
                    Ok(true) => {
                        t.received.fetch_add(1, Ordering::AcqRel);
                        let a = u64::from_le_bytes(m[..8].try_into().expect("8 bytes"));
                        let b = u64::from_le_bytes(m[8..].try_into().expect("8 bytes"));
                        let want = next.load(Ordering::Acquire);
                        if b != !a {
                            return t.fail(format!("echo: reply {a} is torn ({b:#x})"));
                        } else if a > want {
                            return t.fail(format!("echo: reply {a} came while {want} was expected: lost"));
                        } else if a < want {
                            t.repeated.fetch_add(1, Ordering::AcqRel);
                        } else {
                            next.store(want + 1, Ordering::Release);
                            t.delivered.store(want + 1, Ordering::Release);
                        }
                    }
                    Ok(false) => {
                        if stop.load(Ordering::Relaxed)
                            && next.load(Ordering::Acquire) >= t.sent.load(Ordering::Acquire)
                        {
                            return;
                        }
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    Err(e) => return t.fail(format!("recv: {e}")),
                }
            }
        })
    };
    HostEnd { tally, threads: vec![sender, receiver] }
}

#[cfg(test)]
mod tests {
    use mesh_shm::{CreateMode, MailboxConfig};

    use super::*;

    fn mailbox(dir: &Path) -> Mailbox {
        let config = MailboxConfig { size: 1 << 20, slots: 2, channels: 8 };
        Mailbox::create(dir.join("mb"), &config, CreateMode::Exclusive).expect("a mailbox")
    }

    fn join(end: HostEnd) -> Arc<Tally> {
        for t in end.threads {
            t.join().expect("a host end");
        }
        end.tally
    }

    #[test]
    fn host_to_host_through_the_stream_ends_is_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        let mb = mailbox(dir.path());
        mb.create_channel("s", 64, 16).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = (host_producer(&mb, "s", 64, &stop), host_consumer(&mb, "s", 64, &stop));
        assert!(wait_until(Duration::from_secs(20), || Tally::get(&rx.tally.delivered) >= 5000));
        stop.store(true, Ordering::Relaxed);
        let (tx, rx) = (join(tx), join(rx));
        assert_eq!((tx.failed(), rx.failed()), (None, None));
        assert_eq!(Tally::get(&rx.delivered), Tally::get(&tx.sent), "every message, once");
    }

    /// A host echo standing in for the GPU one: after 1000 messages it sends its last 3 replies again
    /// (what a GPU consumer does after a crash), after 2000 it drops one (message 1999).
    fn faulty_echo(mb: &Mailbox, stop: &Arc<AtomicBool>) -> JoinHandle<()> {
        let mut rx = Consumer::claim(mb, "to").unwrap();
        let mut tx = Producer::claim(mb, "from").unwrap();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut m, mut n, mut last) = ([0u8; 16], 0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                if !rx.try_recv(&mut m).unwrap() {
                    std::thread::sleep(Duration::from_micros(20));
                    continue;
                }
                n += 1;
                if n == 2000 {
                    continue;
                }
                tx.send(&m, Duration::from_secs(5)).unwrap();
                last.push(m);
                if n == 1000 {
                    for again in &last[last.len() - 3..] {
                        tx.send(again, Duration::from_secs(5)).unwrap();
                    }
                }
            }
        })
    }

    #[test]
    fn the_round_trip_counts_repeats_and_fails_on_a_loss() {
        let dir = tempfile::tempdir().unwrap();
        let mb = mailbox(dir.path());
        mb.create_channel("to", 16, 64).unwrap();
        mb.create_channel("from", 16, 64).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let echo = faulty_echo(&mb, &stop);
        let end = host_round_trip(&mb, "to", "from", 48, &stop);
        assert!(wait_until(Duration::from_secs(20), || end.tally.failed().is_some()), "the loss is caught");
        stop.store(true, Ordering::Relaxed);
        echo.join().unwrap();
        let tally = join(end);
        let why = tally.failed().unwrap();
        assert!(why.contains("reply 2000 came while 1999 was expected: lost"), "{why}");
        assert_eq!(Tally::get(&tally.repeated), 3, "the three replies sent again");
        assert_eq!(Tally::get(&tally.delivered), 1999, "messages 0..1999 came in order");
    }

    #[test]
    fn a_seed_replays_the_same_schedule() {
        let (mut a, mut b) = (Rng(42), Rng(42));
        let xs: Vec<u64> = (0..100).map(|_| a.below(1000)).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.below(1000)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().any(|&x| x != xs[0]), "not constant");
        // splitmix64's published first output for seed 0.
        assert_eq!(Rng(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn replay_bounds_are_read_off_the_log() {
        let log = "x WARN channel to-echo: a GPU consumer may receive again up to 12 message(s) from position 7 (it \
                   had published)\ny WARN channel other: a GPU consumer may receive again up to 3 message(s) from \
                   position 0\nz WARN channel to-echo: a GPU consumer may receive again up to 5 message(s) from \
                   position 90";
        assert_eq!(logged_replay(log, "to-echo"), Some(17));
        assert_eq!(logged_replay(log, "other"), Some(3));
        assert_eq!(logged_replay(log, "h2g"), None);
    }

    #[test]
    fn memory_is_a_leak_only_when_it_grows() {
        assert!(!memory_leaked(1, 0), "a decrease (the GPU run's 1 -> 0 MiB) is no leak");
        assert!(!memory_leaked(1000, 10), "nor a large one");
        assert!(!memory_leaked(0, MEMORY_SLACK_MIB), "the slack");
        assert!(memory_leaked(0, MEMORY_SLACK_MIB + 1));
        assert!(!memory_leaked(10_000, 10_000 + 100 + MEMORY_SLACK_MIB), "1% and the slack");
        assert!(memory_leaked(10_000, 10_000 + 101 + MEMORY_SLACK_MIB));
    }

    #[test]
    fn the_endpoint_is_read_off_the_log_last_start_wins() {
        let log = "2026-12-03T17:27:21Z  INFO meshd::http: monitoring endpoint: http://127.0.0.1:40001/metrics, /livez, \
                   /readyz\nx WARN other\n2026-12-03T17:28:00Z  INFO meshd::http: monitoring endpoint: \
                   http://127.0.0.1:40002/metrics, /livez, /readyz";
        assert_eq!(endpoint_in_log(log), (Some("127.0.0.1:40002".parse().unwrap()), 2));
        assert_eq!(endpoint_in_log("nothing"), (None, 0));
    }

    /// A one-connection-at-a-time HTTP server answering `status` after `delay`.
    fn server(status: u16, delay: Duration) -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let (mut buf, mut got) = ([0u8; 1024], Vec::new());
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut buf) {
                        Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                        _ => break,
                    }
                }
                std::thread::sleep(delay);
                let _ = write!(c, "HTTP/1.1 {status} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
            }
        });
        addr
    }

    #[test]
    fn a_get_tells_answers_from_nothing_listening_and_from_silence() {
        let short = Duration::from_millis(300);
        assert_eq!(http_get(server(200, Duration::ZERO), "/metrics", short), Got::Status(200));
        assert_eq!(http_get(server(503, Duration::ZERO), "/readyz", short), Got::Status(503));
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        assert!(matches!(http_get(free, "/metrics", short), Got::Unreachable(_)), "a closed port");
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let got = http_get(silent.local_addr().unwrap(), "/metrics", short);
        assert!(matches!(got, Got::Failed(ref w) if w.contains("no answer")), "{got:?}");
    }

    #[test]
    fn the_scraper_counts_503s_and_fails_on_other_statuses() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("meshd.log");
        let announce =
            |addr: SocketAddr| format!("INFO meshd::http: monitoring endpoint: http://{addr}/metrics, /livez\n");
        std::fs::write(&log, announce(server(503, Duration::ZERO))).unwrap();
        let s = Scraper::start(log.clone(), Duration::from_millis(10));
        assert!(wait_until(Duration::from_secs(10), || Tally::get(&s.stats.unavailable) >= 4));
        assert_eq!(s.stats.failed(), None, "503 is an answer");
        // A restart announces another endpoint, which answers 500.
        let mut text = std::fs::read_to_string(&log).unwrap();
        text.push_str(&announce(server(500, Duration::ZERO)));
        std::fs::write(&log, text).unwrap();
        assert!(wait_until(Duration::from_secs(10), || s.stats.failed().is_some()));
        let stats = s.finish();
        assert!(stats.failed().unwrap().contains("status 500"), "{:?}", stats.failed());
    }
}
