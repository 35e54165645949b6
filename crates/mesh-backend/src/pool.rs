//! The MPS worker pool's figures for `info` and `ps`: its size and use, and the MPS clients created
//! while programs ran (each stalled them). The policy that produces them is mesh-mps's.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

/// How many growths `info` keeps.
const RECENT: usize = 16;

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

/// The pool's figures, shared between the backend that counts and meshd's `info`, which reads them
/// without waiting for the backend. Cheap to clone; `None` inside until opened and after shutdown.
#[derive(Debug, Clone, Default)]
pub struct PoolFigures(Arc<Mutex<Option<PoolSnapshot>>>);

impl PoolFigures {
    /// The pool now; `None` before the backend opened it or after its shutdown.
    pub fn snapshot(&self) -> Option<PoolSnapshot> {
        self.0.lock().clone()
    }

    /// At the backend's start.
    pub fn open(&self, size: u32, grow: bool, limit: u32, limit_source: String) {
        *self.0.lock() = Some(PoolSnapshot { size, limit, limit_source, grow, ..PoolSnapshot::default() });
    }

    /// At its shutdown.
    pub fn close(&self) {
        *self.0.lock() = None;
    }

    /// The backend's counts now.
    pub fn publish(&self, idle: usize, in_use: usize) {
        if let Some(p) = self.0.lock().as_mut() {
            p.idle = u32::try_from(idle).unwrap_or(u32::MAX);
            p.in_use = u32::try_from(in_use).unwrap_or(u32::MAX);
        }
    }

    /// A client created while `stalled` programs ran; returns the stall's number.
    pub fn record_growth(&self, program: &str, op: &'static str, stalled: u32) -> u64 {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let mut guard = self.0.lock();
        let Some(p) = guard.as_mut() else { return 0 };
        p.stalls += 1;
        p.recent.push(Growth { seq: p.stalls, program: program.to_string(), op, stalled, unix_ms });
        if p.recent.len() > RECENT {
            p.recent.remove(0);
        }
        p.stalls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growths_are_counted_and_the_last_few_kept() {
        let pool = PoolFigures::default();
        pool.open(2, true, 48, "test".into());
        for i in 0..20 {
            assert_eq!(pool.record_growth(&format!("p{i}"), "load", 3), i + 1);
        }
        pool.publish(1, 5);
        let s = pool.snapshot().unwrap();
        assert_eq!((s.stalls, s.recent.len(), s.idle, s.in_use), (20, RECENT, 1, 5));
        assert_eq!(s.recent.last().unwrap().program, "p19");
        pool.close();
        assert!(pool.snapshot().is_none());
    }
}
