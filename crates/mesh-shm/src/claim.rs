//! Ownership of a ring's end across processes: a claim word naming a live process, reclaimable once it dies.
//!
//! A claim is `pid | start_time << 32`, the start time being the low 32 bits of
//! field 22 of `/proc/PID/stat` (clock ticks since boot), so that a reused pid
//! does not pass for the process that died. The word is host-only: CPU
//! compare-and-swap is fine here, unlike on words the GPU shares.
//!
//! A zombie holds nothing (it runs no code), and a holder that is exiting (a SIGKILL sent and not
//! yet delivered, or the kernel's exit begun: a process killed inside a CUDA driver call sits in D
//! state for up to seconds while the driver tears its context down) is waited for, up to
//! [`DYING_HOLDER_WAIT`], rather than refused: a process restarted right after its predecessor was
//! killed (a native worker after `kill -9` of meshd, whose PDEATHSIG killed the old one) would
//! otherwise be refused for an end no live code holds.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a claim waits for an exiting holder to be gone before it is refused.
pub const DYING_HOLDER_WAIT: Duration = Duration::from_secs(5);

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

    /// Process `pid` as a holder, with its start time read now (0 where `/proc` could not say): what
    /// meshd records for a client it knows by its socket's peer credentials.
    pub fn of_pid(pid: u32) -> Self {
        Self { pid, start: start_time(pid).unwrap_or(0) }
    }

    /// Whether the process this names still runs (the same process, not a reuse of its pid, and not
    /// a zombie: a process that has exited stores nothing more, whether or not it was reaped).
    pub fn alive(self) -> bool {
        let Some(pid) = pid_of(self.pid) else { return false };
        if rustix::process::test_kill_process(pid).is_err_and(|e| e == rustix::io::Errno::SRCH) {
            return false;
        }
        match stat_fields(self.pid) {
            Some(stat) => !stat.exited && (self.start == 0 || stat.start == self.start),
            // Exists (kill said so) but /proc is unreadable: assume alive rather than steal the end.
            None => rustix::process::test_kill_process(pid).is_ok() || self.start == 0,
        }
    }
}

/// The process id `raw` names, `None` for 0 and for a value above `i32::MAX` (no pid: a claim or
/// lock word a peer wrote at random; `Pid::from_raw` asserts on a negative one, so never cast).
pub(crate) fn pid_of(raw: u32) -> Option<rustix::process::Pid> {
    rustix::process::Pid::from_raw(i32::try_from(raw).ok()?)
}

/// What a claim needs from `/proc/PID/stat`.
struct StatFields {
    /// Low 32 bits of the start time (field 22).
    start: u32,
    /// A zombie or a dead task (state `Z`, `X` or `x`): it has exited.
    exited: bool,
    /// The kernel's `PF_EXITING` flag (field 9): its exit has begun.
    exiting: bool,
}

fn stat_fields(pid: u32) -> Option<StatFields> {
    /// The kernel's flag for a task in `do_exit` (include/linux/sched.h).
    const PF_EXITING: u64 = 0x4;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the fields after the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_ascii_whitespace().collect();
    let exited = matches!(*fields.first()?, "Z" | "X" | "x");
    let flags = fields.get(6)?.parse::<u64>().ok()?;
    #[allow(clippy::cast_possible_truncation, reason = "the claim word keeps the low 32 bits, on purpose")]
    let start = fields.get(19)?.parse::<u64>().ok()? as u32;
    Some(StatFields { start, exited, exiting: flags & PF_EXITING != 0 })
}

/// Low 32 bits of a process's start time, from `/proc/PID/stat`.
fn start_time(pid: u32) -> Option<u32> {
    stat_fields(pid).map(|s| s.start)
}

/// Whether process `pid` is dying: it has exited (a zombie) or is gone, the kernel began its exit
/// (`PF_EXITING`), or a SIGKILL waits to be delivered to it (`SigPnd`/`ShdPnd` in
/// `/proc/PID/status`: one sent while it sat in an uninterruptible driver call). Such a process runs no more user code.
pub fn process_dying(pid: u32) -> bool {
    /// SIGKILL's bit in a signal mask (signal 9: bit 8).
    const SIGKILL_BIT: u64 = 1 << 8;
    let Some(stat) = stat_fields(pid) else { return true };
    if stat.exited || stat.exiting {
        return true;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return true };
    status.lines().filter(|l| l.starts_with("SigPnd:") || l.starts_with("ShdPnd:")).any(|l| {
        l.split_once(':')
            .and_then(|(_, mask)| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(|mask| mask & SIGKILL_BIT != 0)
    })
}

/// Outcome of a claim attempt that did not succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimRefused {
    /// A live process holds the end.
    HeldBy(Holder),
}

/// What one attempt at a claim found ([`claim_once`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Claimed; the dead holder replaced, if there was one.
    Claimed(Option<Holder>),
    /// A live process holds it and is not exiting: refused.
    Held(Holder),
    /// A live process holds it but is exiting: worth trying again shortly, up to [`DYING_HOLDER_WAIT`].
    Dying(Holder),
}

/// One attempt to claim `word` for `me`: a free end or a dead holder's is taken (a CAS, retried
/// while the word moves); a live holder's is not, and whether it is exiting is said. What a caller
/// that must check something under a lock before each try (the mailbox: that the channel is still
/// the one looked up) uses; [`claim`] is this in a loop.
pub fn claim_once(word: &AtomicU64, me: Holder) -> Attempt {
    let mut current = word.load(Ordering::Acquire);
    loop {
        let replaced = match Holder::from_word(current) {
            None => None,
            Some(h) if h.alive() => {
                return if h != me && process_dying(h.pid) { Attempt::Dying(h) } else { Attempt::Held(h) };
            }
            Some(h) => Some(h),
        };
        match word.compare_exchange(current, me.word(), Ordering::SeqCst, Ordering::Acquire) {
            Ok(_) => return Attempt::Claimed(replaced),
            Err(now) => current = now,
        }
    }
}

/// Claims `word` for `me`, taking it over from a holder that has died (waiting up to
/// [`DYING_HOLDER_WAIT`] for one that is exiting). Returns the dead holder that was replaced, if any.
pub fn claim(word: &AtomicU64, me: Holder) -> Result<Option<Holder>, ClaimRefused> {
    let mut dying_since: Option<Instant> = None;
    loop {
        match claim_once(word, me) {
            Attempt::Claimed(replaced) => return Ok(replaced),
            Attempt::Dying(_) if dying_since.get_or_insert_with(Instant::now).elapsed() < DYING_HOLDER_WAIT => {
                std::thread::sleep(DYING_HOLDER_POLL);
            }
            Attempt::Dying(h) | Attempt::Held(h) => return Err(ClaimRefused::HeldBy(h)),
        }
    }
}

/// How often a claim looks again at an exiting holder.
pub const DYING_HOLDER_POLL: Duration = Duration::from_millis(2);

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
    fn a_zombie_holds_nothing_and_a_killed_holder_is_waited_for() {
        // A child killed and not yet reaped is a zombie: its end is free at once.
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let zombie = Holder { pid: child.id(), start: start_time(child.id()).unwrap() };
        assert!(zombie.alive() && !process_dying(zombie.pid));
        child.kill().unwrap();
        let t = Instant::now();
        while zombie.alive() {
            assert!(t.elapsed() < Duration::from_secs(5), "a killed child never showed as exited");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(process_dying(zombie.pid), "a zombie is dying");
        let word = AtomicU64::new(zombie.word());
        assert_eq!(claim(&word, Holder::current()), Ok(Some(zombie)));
        child.wait().unwrap();

        // A live holder that is not dying is refused at once, without the wait.
        let mut live = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let holder = Holder { pid: live.id(), start: start_time(live.id()).unwrap() };
        let word = AtomicU64::new(holder.word());
        let t = Instant::now();
        assert_eq!(claim(&word, Holder::current()), Err(ClaimRefused::HeldBy(holder)));
        assert!(t.elapsed() < DYING_HOLDER_WAIT / 2, "a live holder was waited for");
        live.kill().unwrap();
        live.wait().unwrap();
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
