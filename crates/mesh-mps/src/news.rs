//! What workers say unasked: their news (a kernel ended, a garbled line, output gone), the reader thread that hands it to the backend and wakes it, and when each was last heard.

use std::io::{BufRead, BufReader};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use mesh_mps_worker::{Event, Incoming, KernelState, Reply, decode};

/// What a worker said without being asked, or what its reader found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum News {
    /// Its kernel of launch `launch` is no longer running (`idle`: returned; `failed`: the driver's error).
    KernelEnded {
        /// Which launch (counted from 1 in that worker).
        launch: u64,
        /// How it ended.
        state: KernelState,
        /// When the worker saw it (ns since the Unix epoch).
        seen_unix_ns: u64,
    },
    /// A line that is no reply or event (the worker is broken).
    Garbled(String),
    /// Its output ended or cannot be read: it exited or is exiting.
    Gone(String),
}

/// News of worker `pid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerNews {
    /// The worker.
    pub pid: u32,
    /// What happened.
    pub news: News,
}

/// Called when news arrives: wakes meshd's backend thread (see `Backend::set_waker`).
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// Called by a reader thread the moment its worker says its kernel failed (pid, the driver's error),
/// before meshd's backend thread hears of it: marks a recovery as begun (see `Backend::set_recovery_board`).
pub type OnFailure = Arc<dyn Fn(u32, &str) + Send + Sync>;

/// Where every worker's reader thread hands its news: one channel, and a wake-up once one is set.
#[derive(Clone)]
pub struct NewsSender {
    tx: Sender<WorkerNews>,
    wake: Arc<OnceLock<Wake>>,
    on_failure: Arc<OnceLock<OnFailure>>,
}

impl std::fmt::Debug for NewsSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewsSender").field("wake_set", &self.wake.get().is_some()).finish_non_exhaustive()
    }
}

impl NewsSender {
    /// A channel for news: the sender (cloned into each reader) and the receiver the backend drains.
    pub fn channel() -> (Self, Receiver<WorkerNews>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        (Self { tx, wake: Arc::new(OnceLock::new()), on_failure: Arc::new(OnceLock::new()) }, rx)
    }

    /// Calls `hook` from the reader thread of any worker that says its kernel failed, from now on
    /// (the first call wins): the only path that does not wait for the backend thread.
    pub fn set_on_failure(&self, hook: OnFailure) {
        let _ = self.on_failure.set(hook);
    }

    /// Calls `wake` on every piece of news from now on (the first call wins).
    pub fn set_wake(&self, wake: Wake) {
        let _ = self.wake.set(wake);
    }

    fn send(&self, pid: u32, news: News) {
        if let News::KernelEnded { state: KernelState::Failed { reason }, .. } = &news
            && let Some(hook) = self.on_failure.get()
        {
            hook(pid, reason);
        }
        // The receiver gone means the backend is gone: nobody to tell.
        if self.tx.send(WorkerNews { pid, news }).is_ok()
            && let Some(wake) = self.wake.get()
        {
            wake();
        }
    }
}

/// When a worker's reader last heard a line from it: ns since [`epoch`], written by the reader,
/// read by the watchdog (a plain timestamp: nothing is ordered by it).
#[derive(Debug, Clone)]
pub(crate) struct Heard(Arc<AtomicU64>);

/// The clock [`Heard`] counts from (the first use in this process).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Heard {
    pub(crate) fn now() -> Self {
        let h = Self(Arc::new(AtomicU64::new(0)));
        h.mark();
        h
    }

    fn mark(&self) {
        let ns = u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.0.store(ns, Ordering::Relaxed);
    }

    /// How long before `now` the last line came.
    pub(crate) fn silent_for(&self, now: Instant) -> Duration {
        let at = epoch() + Duration::from_nanos(self.0.load(Ordering::Relaxed));
        now.saturating_duration_since(at)
    }
}

/// Whether the watchdog may judge the workers' silence at its tick: only once meshd itself has run
/// without a stall for longer than the bound. A gap between ticks of half the bound or more means
/// meshd did not run (stopped, starved, frozen with its cgroup), and then neither did the reader
/// threads that note the workers' lines: a worker's silence is only measured over time meshd was
/// seen running. One skipped tick is not enough: a reader that wakes first sends news, whose wake-up
/// brings the next tick at once, before the other readers have read what their workers said meanwhile.
#[derive(Debug, Clone, Default)]
pub struct SilenceClock {
    /// The last tick.
    last: Option<Instant>,
    /// The first tick after meshd's last stall (or its first tick): silence counts from there.
    since: Option<Instant>,
}

impl SilenceClock {
    /// A clock that has seen no tick yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Notes a watchdog tick at `now` (monotonic); returns whether a silence past `limit` may be judged at it.
    pub fn tick(&mut self, now: Instant, limit: Duration) -> bool {
        let stalled = self.last.is_none_or(|t| now.saturating_duration_since(t) >= limit / 2);
        self.last = Some(now);
        if stalled {
            self.since = Some(now);
        }
        self.since.is_some_and(|t| now.saturating_duration_since(t) > limit)
    }
}

/// The reader thread of worker `pid`: replies to `replies` (a garbled line as its error), events and
/// its end to `news`; the time of every line read into `heard`.
pub(crate) fn read_output(
    pid: u32,
    out: impl std::io::Read,
    replies: &Sender<Result<Reply, String>>,
    own: &Sender<News>,
    news: &NewsSender,
    heard: &Heard,
) {
    // Each piece goes to the worker's own queue (never lost, wherever the worker is kept meanwhile)
    // and to the shared channel (which says that there is news, and wakes meshd).
    let tell = |n: News| {
        let _ = own.send(n.clone());
        news.send(pid, n);
    };
    let mut lines = BufReader::new(out).lines();
    let end = loop {
        match lines.next() {
            None => break "its output ended (EOF)".to_string(),
            // A line that is not UTF-8 is a garbled line from a live worker, not its end.
            Some(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                let why = format!("garbled line: {e}");
                let _ = replies.send(Err(why.clone()));
                tell(News::Garbled(why));
                return;
            }
            Some(Err(e)) => break format!("reading its output: {e}"),
            Some(Ok(line)) => match decode(&line) {
                Ok(Incoming::Reply(r)) => {
                    heard.mark();
                    let _ = replies.send(Ok(r));
                }
                Ok(Incoming::Event(Event::KernelEnded { launch, state, seen_unix_ns })) => {
                    heard.mark();
                    tell(News::KernelEnded { launch, state, seen_unix_ns });
                }
                // Only noted: the watchdog reads the time at its own tick.
                Ok(Incoming::Event(Event::Alive)) => heard.mark(),
                Err(e) => {
                    let why = format!("garbled line: {e}");
                    let _ = replies.send(Err(why.clone()));
                    tell(News::Garbled(why));
                    // The worker is broken from now on (never spoken to again, then killed): what
                    // else it writes is not read, so that one spewing lines cannot queue a wake-up
                    // and a copy of each in meshd until it is killed. Its output is closed here: a
                    // further write fails (EPIPE) rather than blocking it.
                    return;
                }
            },
        }
    };
    tell(News::Gone(end));
}
