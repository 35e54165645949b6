//! The worker pool's policy and counters: a load never creates an MPS client unannounced.
//!
//! Creating an MPS client stalls every running program once (measured on the H200: a running
//! program's largest gap went from 14 µs to 526 µs). So the pool (`--pool N`) is made before any
//! program runs, and a load or upgrade that finds it empty is refused with the reason, unless the
//! operator allowed growth (`--pool-grow`): then the client is created, and the stall is counted
//! here, logged, and shown by `info`, `ps` and the request's own reply. Growing the pool back to N
//! after workers were discarded needs the same permission. A fault recovery recreates clients
//! regardless (every client was dead anyway) and is not counted.
//!
//! The counters are process-wide (one backend per meshd) and read without the backend's lock, so
//! `info` answers while a change or a recovery runs.

use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

/// MPS client contexts per device on Volta and later (NVIDIA's MPS documentation).
pub const MAX_CLIENTS: u32 = 48;
/// The same from CUDA 13.1.
pub const MAX_CLIENTS_13_1: u32 = 60;

/// How many growths `info` keeps.
const RECENT: usize = 16;

/// The client limit for a driver reporting `cuDriverGetVersion` = `version` (13010 for 13.1),
/// and where the figure comes from, for `info`.
pub fn client_limit(version: Option<i32>) -> (u32, String) {
    match version {
        Some(v) if v >= 13010 => {
            (MAX_CLIENTS_13_1, format!("CUDA {}.{} driver: 60 from CUDA 13.1", v / 1000, v % 1000 / 10))
        }
        Some(v) => (MAX_CLIENTS, format!("CUDA {}.{} driver: 48 before CUDA 13.1", v / 1000, v % 1000 / 10)),
        None => (MAX_CLIENTS, "driver version unknown: 48 assumed".into()),
    }
}

/// One MPS client created while programs ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Growth {
    /// 1 for the first since start.
    pub seq: u64,
    /// The program it was created for (for a refill: the program whose unload or upgrade discarded a worker).
    pub program: String,
    /// `load`, `upgrade` or `refill`.
    pub op: &'static str,
    /// Programs running when it was created: each stalled once.
    pub stalled: u32,
    /// When, milliseconds since the Unix epoch.
    pub unix_ms: u64,
}

/// The pool as `info` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolSnapshot {
    /// `--pool`: workers made at start, and what growing back restores.
    pub size: u32,
    /// Idle workers now.
    pub idle: u32,
    /// Workers running a program now.
    pub in_use: u32,
    /// MPS clients the device takes.
    pub limit: u32,
    /// Where that limit comes from.
    pub limit_source: String,
    /// `--pool-grow`: whether a load past the pool may create a client.
    pub grow: bool,
    /// Clients created while programs ran (each stalled them), since start.
    pub stalls: u64,
    /// The last few of those.
    pub recent: Vec<Growth>,
}

static POOL: Mutex<Option<PoolSnapshot>> = Mutex::new(None);

/// The running MPS backend's pool; `None` in blink mode.
pub fn snapshot() -> Option<PoolSnapshot> {
    POOL.lock().clone()
}

/// At the backend's start.
pub(crate) fn open(size: u32, grow: bool, limit: u32, limit_source: String) {
    *POOL.lock() = Some(PoolSnapshot { size, limit, limit_source, grow, ..PoolSnapshot::default() });
}

/// At its shutdown.
pub(crate) fn close() {
    *POOL.lock() = None;
}

/// The backend's counts now.
pub(crate) fn publish(idle: usize, in_use: usize) {
    if let Some(p) = POOL.lock().as_mut() {
        p.idle = idle as u32;
        p.in_use = in_use as u32;
    }
}

/// A client created while `stalled` programs ran; returns the stall's number.
pub(crate) fn record_growth(program: &str, op: &'static str, stalled: u32) -> u64 {
    let unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let mut guard = POOL.lock();
    let Some(p) = guard.as_mut() else { return 0 };
    p.stalls += 1;
    p.recent.push(Growth { seq: p.stalls, program: program.to_string(), op, stalled, unix_ms });
    if p.recent.len() > RECENT {
        p.recent.remove(0);
    }
    p.stalls
}

/// Why a load or upgrade that found no idle worker is refused (growth not allowed).
pub fn refusal(op: &str, program: &str, sms: Option<u32>, idle_sms: &[u32], in_use: usize, size: u32) -> String {
    let what = match op {
        "upgrade" => format!(
            "upgrade of {program:?} refused: an MPS upgrade loads the new image in another (idle) worker while the \
             old one runs, and"
        ),
        _ => format!("load of {program:?} refused:"),
    };
    let found = match (sms, idle_sms.is_empty()) {
        (_, true) => format!("the pool is empty ({in_use} workers in use, --pool {size})"),
        (Some(n), false) => format!("no idle worker has {n} SMs (idle workers' SMs: {idle_sms:?})"),
        (None, false) => "no idle worker fits".into(),
    };
    format!(
        "{what} {found}; creating an MPS client now would stall every running program (measured: a running \
         program's largest gap went from 14 µs to 526 µs). Unload a program, start meshd with a larger --pool, \
         or allow growth with --pool-grow (the stall is then counted in info and ps)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_follows_the_driver() {
        assert_eq!(client_limit(Some(13000)).0, 48);
        assert!(client_limit(Some(13000)).1.contains("CUDA 13.0"));
        assert_eq!(client_limit(Some(13010)).0, 60);
        assert_eq!(client_limit(Some(12080)).0, 48);
        assert_eq!(client_limit(None), (48, "driver version unknown: 48 assumed".into()));
    }

    #[test]
    fn refusals_say_why_and_what_to_do() {
        let load = refusal("load", "p", None, &[], 2, 2);
        assert!(load.contains("load of \"p\" refused: the pool is empty (2 workers in use, --pool 2)"), "{load}");
        assert!(load.contains("stall every running program") && load.contains("--pool-grow"), "{load}");
        let up = refusal("upgrade", "p", None, &[], 1, 1);
        assert!(up.contains("upgrade of \"p\" refused: an MPS upgrade loads the new image in another (idle) worker"));
        assert!(up.contains("--pool-grow"), "{up}");
        let sms = refusal("load", "q", Some(16), &[132], 0, 1);
        assert!(sms.contains("no idle worker has 16 SMs (idle workers' SMs: [132])"), "{sms}");
    }

    #[test]
    fn growths_are_counted_and_the_last_few_kept() {
        open(2, true, 48, "test".into());
        for i in 0..20 {
            assert_eq!(record_growth(&format!("p{i}"), "load", 3), i + 1);
        }
        publish(1, 5);
        let s = snapshot().unwrap();
        assert_eq!((s.stalls, s.recent.len(), s.idle, s.in_use), (20, RECENT, 1, 5));
        assert_eq!(s.recent.last().unwrap().program, "p19");
        close();
        assert!(snapshot().is_none());
    }
}
