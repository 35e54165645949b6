//! Ownership of a ring's end across processes: a claim word naming a live process, reclaimable once it dies.
//!
//! A claim is `pid | start_time << 32`, the start time being the low 32 bits of
//! field 22 of `/proc/PID/stat` (clock ticks since boot), so that a reused pid
//! does not pass for the process that died. The word is host-only: CPU
//! compare-and-swap is fine here, unlike on words the GPU shares.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// A process identity as stored in a claim word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The process id.
    pub pid: u32,
    /// Low 32 bits of its start time, 0 where it could not be read.
    pub start: u32,
}

impl Holder {
    /// Decodes a claim word; `None` for a free end.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the word packs the pid in its low half, the start time in its high half"
    )]
    pub fn from_word(word: u64) -> Option<Self> {
        (word != 0).then_some(Self { pid: word as u32, start: (word >> 32) as u32 })
    }

    /// Encodes this holder as a claim word (never 0: pids are positive).
    pub fn word(self) -> u64 {
        u64::from(self.pid) | (u64::from(self.start) << 32)
    }

    /// This process.
    pub fn current() -> Self {
        static ME: OnceLock<Holder> = OnceLock::new();
        *ME.get_or_init(|| {
            let pid = std::process::id();
            Self { pid, start: start_time(pid).unwrap_or(0) }
        })
    }

    /// Whether the process this names still runs (the same process, not a reuse of its pid).
    pub fn alive(self) -> bool {
        let Some(pid) = rustix::process::Pid::from_raw(self.pid as i32) else { return false };
        if rustix::process::test_kill_process(pid).is_err_and(|e| e == rustix::io::Errno::SRCH) {
            return false;
        }
        match start_time(self.pid) {
            Some(start) => self.start == 0 || start == self.start,
            // Exists (kill said so) but /proc is unreadable: assume alive rather than steal the end.
            None => rustix::process::test_kill_process(pid).is_ok() || self.start == 0,
        }
    }
}

/// Low 32 bits of a process's start time, from `/proc/PID/stat`.
fn start_time(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let field22 = rest.split_ascii_whitespace().nth(19)?;
    #[allow(clippy::cast_possible_truncation, reason = "the claim word keeps the low 32 bits, on purpose")]
    let low = field22.parse::<u64>().ok()? as u32;
    Some(low)
}

/// Outcome of a claim attempt that did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimRefused {
    /// A live process holds the end.
    HeldBy(Holder),
}

/// Claims `word` for `me`, taking it over from a holder that has died.
/// Returns the dead holder that was replaced, if any.
pub fn claim(word: &AtomicU64, me: Holder) -> Result<Option<Holder>, ClaimRefused> {
    let mut current = word.load(Ordering::Acquire);
    loop {
        let replaced = match Holder::from_word(current) {
            None => None,
            Some(h) if h.alive() => return Err(ClaimRefused::HeldBy(h)),
            Some(h) => Some(h),
        };
        match word.compare_exchange(current, me.word(), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Ok(replaced),
            Err(now) => current = now,
        }
    }
}

/// Releases `word` if `me` still holds it (a reclaimed end is left to its new holder).
pub fn release(word: &AtomicU64, me: Holder) {
    let _ = word.compare_exchange(me.word(), 0, Ordering::AcqRel, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_process_is_alive_and_has_a_start_time() {
        let me = Holder::current();
        assert_eq!(me.pid, std::process::id());
        assert_ne!(me.start, 0, "/proc/self/stat gave no start time");
        assert!(me.alive());
        assert!(!Holder { start: me.start.wrapping_add(1), ..me }.alive(), "a reused pid is not the holder");
    }

    #[test]
    fn second_claim_is_refused_and_release_frees() {
        let word = AtomicU64::new(0);
        let me = Holder::current();
        assert_eq!(claim(&word, me), Ok(None));
        assert_eq!(claim(&word, me), Err(ClaimRefused::HeldBy(me)));
        release(&word, me);
        assert_eq!(claim(&word, me), Ok(None));
    }

    #[test]
    fn dead_holder_is_replaced() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let dead = Holder { pid, start: start_time(pid).unwrap_or(1) };
        child.wait().unwrap();
        let word = AtomicU64::new(dead.word());
        assert_eq!(claim(&word, Holder::current()), Ok(Some(dead)));
        assert_eq!(Holder::from_word(word.load(Ordering::Relaxed)), Some(Holder::current()));
    }
}
