//! How the host ends wait in their blocking calls: spin, then yield the CPU, then sleep between polls; how long they spin is a setting of each end ([`WaitConfig`]), its default the process's.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::error::Result;

/// How long a blocking call spins on the CPU before it starts yielding it between polls, unless
/// its end's [`WaitConfig`] or the process's `MESH_SPIN_US` says otherwise.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);
/// The longest spin `MESH_SPIN_US` may set, in microseconds (one second).
const MAX_SPIN_US: u64 = 1_000_000;
/// How long a wait yields between polls before it starts sleeping.
const YIELD: Duration = Duration::from_millis(1);
/// The first sleep (Linux's timer slack makes any shorter one about this long anyway), doubled up
/// to [`MAX_NAP`].
const FIRST_NAP: Duration = Duration::from_micros(50);
/// The longest sleep between two polls.
const MAX_NAP: Duration = Duration::from_millis(1);

/// How a host end waits in its blocking calls (`send`, `recv`, `take`, …): it spins on the CPU
/// for `spin` (the lowest wake-up latency, for a waiter that has a CPU to itself), then yields the
/// CPU between polls up to 1 ms, then sleeps with back-off.
///
/// Every end takes its [`Mailbox`](crate::Mailbox)'s setting when it is claimed
/// ([`Mailbox::set_wait_config`](crate::Mailbox::set_wait_config)) and can be given its own
/// (`set_wait_config` on each end). The default ([`WaitConfig::default`]) is the process's:
/// [`DEFAULT_SPIN`] (20 µs), unless the environment variable `MESH_SPIN_US` holds a number of
/// microseconds from 0 to 1,000,000, which then sets the default of every end of the process (read
/// once, at the first default made; any other value is ignored, since a wait is no place to fail).
/// A spin of 0 yields from the first poll: for hosts with more waiting processes than CPUs, where a
/// spinning waiter holds a CPU that a process whose message has landed needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitConfig {
    /// How long a wait spins before it yields the CPU.
    pub spin: Duration,
}

impl Default for WaitConfig {
    /// The process's default: `MESH_SPIN_US` if it is set to a valid number, else [`DEFAULT_SPIN`].
    fn default() -> Self {
        static SPIN: OnceLock<Duration> = OnceLock::new();
        Self { spin: *SPIN.get_or_init(|| spin_from_env(std::env::var("MESH_SPIN_US").ok().as_deref())) }
    }
}

impl WaitConfig {
    /// Waits that spin `spin` first.
    pub const fn spinning(spin: Duration) -> Self {
        Self { spin }
    }

    /// Waits that never spin: they yield the CPU from the first poll.
    pub const fn yielding() -> Self {
        Self { spin: Duration::ZERO }
    }

    /// The pauses of one wait that starts now.
    pub fn pause(&self) -> PollPause {
        PollPause { start: Instant::now(), nap: FIRST_NAP, spin: self.spin }
    }

    /// The pauses of a service client's receive with `unanswered` requests in flight: with at most
    /// one it waits on its only request, whose latency a spin shortens ([`pause`](Self::pause));
    /// with more it is streaming, and yields from the first poll, since a quicker wake-up does not
    /// raise its throughput while its spin takes a CPU from processes that need one. Measured on
    /// a host of 16 CPUs (BENCHMARKS.md, the service's clients): 64 streaming clients made 4.9 M
    /// replies/s spinning first and 9.4 M yielding at once, while a lone client waiting on one
    /// request took 5.0 µs spinning and 7.3 µs yielding.
    pub fn pause_for_replies(&self, unanswered: u64) -> PollPause {
        if unanswered > 1 { Self::yielding().pause() } else { self.pause() }
    }
}

/// The default spin for a given `MESH_SPIN_US` value: that many microseconds when it is a number
/// from 0 to [`MAX_SPIN_US`], else [`DEFAULT_SPIN`].
fn spin_from_env(value: Option<&str>) -> Duration {
    value
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|us| *us <= MAX_SPIN_US)
        .map_or(DEFAULT_SPIN, Duration::from_micros)
}

/// How one blocking call waits between two polls: spin first (latency), then yield the CPU, then
/// back off with sleeps (CPU), as its [`WaitConfig`] says. Public so that other bindings (the Python
/// package) wait exactly as the Rust ends they are measured against.
///
/// The middle phase is for hosts with more waiting processes than CPUs (64 service clients on 16
/// CPUs in the service bench): a spinning waiter would hold its CPU for a whole time slice while a
/// process whose reply has landed waits to run, and a sleep is no way out, since Linux's default
/// timer slack turns the shortest one into ~55 µs. `sched_yield` hands the CPU to whoever is
/// runnable and returns at once when nobody is, so on an idle host it costs a system call per poll.
#[derive(Debug, Clone)]
pub struct PollPause {
    start: Instant,
    nap: Duration,
    spin: Duration,
}

impl Default for PollPause {
    fn default() -> Self {
        Self::new()
    }
}

impl PollPause {
    /// A wait that starts now, as the process's default [`WaitConfig`] says.
    pub fn new() -> Self {
        WaitConfig::default().pause()
    }

    /// A wait that starts now and never spins: it yields the CPU from its first pause.
    pub fn yielding() -> Self {
        WaitConfig::yielding().pause()
    }

    /// A service client's receive with `unanswered` requests in flight, as the process's default
    /// [`WaitConfig`] says ([`WaitConfig::pause_for_replies`]).
    pub fn for_replies(unanswered: u64) -> Self {
        WaitConfig::default().pause_for_replies(unanswered)
    }

    /// How long this wait spins before it yields.
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// Pauses before the next poll as the time waited so far says, never past `until`.
    pub fn pause(&mut self, until: Instant) {
        let now = Instant::now();
        let waited = now - self.start;
        if waited < self.spin {
            std::hint::spin_loop();
        } else if waited < YIELD {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.nap.min(until.saturating_duration_since(now)));
            self.nap = (self.nap * 2).min(MAX_NAP);
        }
    }
}

/// Polls `attempt` until it yields or `deadline` passes, pausing between tries as `wait` says.
pub(crate) fn poll_until<T>(
    deadline: Instant,
    wait: WaitConfig,
    attempt: impl FnMut() -> Result<Option<T>>,
) -> Result<Option<T>> {
    poll_until_pausing(deadline, wait.pause(), attempt)
}

/// [`poll_until`] with the pauses of `pause`.
pub(crate) fn poll_until_pausing<T>(
    deadline: Instant,
    mut pause: PollPause,
    mut attempt: impl FnMut() -> Result<Option<T>>,
) -> Result<Option<T>> {
    loop {
        if let Some(v) = attempt()? {
            return Ok(Some(v));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        pause.pause(deadline);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_spin_us_sets_the_default_and_anything_else_keeps_20_us() {
        assert_eq!(spin_from_env(Some("0")), Duration::ZERO);
        assert_eq!(spin_from_env(Some(" 5 ")), Duration::from_micros(5));
        assert_eq!(spin_from_env(Some("1000000")), Duration::from_secs(1));
        for bad in [None, Some(""), Some("-1"), Some("2.5"), Some("1000001"), Some("ten")] {
            assert_eq!(spin_from_env(bad), DEFAULT_SPIN, "{bad:?}");
        }
    }

    #[test]
    fn a_reply_wait_spins_as_configured_for_one_request_in_flight_and_yields_at_once_for_more() {
        let config = WaitConfig::spinning(Duration::from_micros(7));
        for unanswered in [0, 1] {
            assert_eq!(config.pause_for_replies(unanswered).spin(), Duration::from_micros(7), "{unanswered}");
            assert_eq!(PollPause::for_replies(unanswered).spin(), WaitConfig::default().spin, "{unanswered}");
        }
        for unanswered in [2, 16, u64::MAX] {
            assert_eq!(config.pause_for_replies(unanswered).spin(), Duration::ZERO, "{unanswered} in flight");
        }
    }

    #[test]
    fn a_wait_that_spins_a_long_time_does_not_sleep_and_one_that_yields_at_once_does_not_spin() {
        // A pause inside the spin returns at once; one of a yielding wait past its yield phase sleeps.
        let mut spinning = WaitConfig::spinning(Duration::from_secs(60)).pause();
        let start = Instant::now();
        for _ in 0..1000 {
            spinning.pause(start + Duration::from_secs(60));
        }
        assert!(start.elapsed() < Duration::from_secs(1), "a spinning pause slept: {:?}", start.elapsed());
        let mut yielding = WaitConfig::yielding().pause();
        assert_eq!(yielding.spin(), Duration::ZERO);
        std::thread::sleep(YIELD);
        let before = Instant::now();
        yielding.pause(before + Duration::from_secs(1));
        assert!(before.elapsed() >= FIRST_NAP / 2, "past its yield phase a wait sleeps: {:?}", before.elapsed());
    }
}
