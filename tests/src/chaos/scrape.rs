//! The monitoring endpoint under chaos: where meshd's log says it listens, one GET, and a thread scraping it throughout.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::failure::FirstFailure;

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
    /// meshd is down on purpose (the test waits out the orphan grace): no endpoint reachable is
    /// counted, never judged.
    down: Arc<AtomicBool>,
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
        let down = Arc::new(AtomicBool::new(false));
        let (st, sp, dn) = (stats.clone(), stop.clone(), down.clone());
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
                            if dn.load(Ordering::Relaxed) {
                                reached = Instant::now();
                            } else if reached.elapsed() > Self::DOWN_LIMIT {
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
        Self { stats, stop, down, thread: Some(thread) }
    }

    /// Says that meshd is down on purpose (`true`) or should answer again (`false`): while down, no
    /// endpoint reachable is no failure however long it lasts.
    pub fn meshd_down(&self, down: bool) {
        self.down.store(down, Ordering::Relaxed);
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
