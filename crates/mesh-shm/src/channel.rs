//! Host ends of a channel: a claimed producer or consumer over the ring (protocol ll or index, chosen per channel), with try, deadline and batch calls.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use crate::claim::{self, ClaimRefused, Holder};
use crate::error::{End, Result, ShmError};
use crate::index_ring::{IndexConsumerCore, IndexProducerCore};
use crate::mailbox::{ChannelInfo, Mailbox, Protocol};
use crate::ring::{ConsumerCore, Corrupt, ProducerCore};

/// A claim on one end of a channel, released on drop. meshd holds these for ends a GPU program binds.
#[derive(Debug)]
pub struct EndClaim {
    mailbox: Mailbox,
    ring_offset: u64,
    end: End,
    holder: Holder,
    channel: String,
}

impl EndClaim {
    /// Claims `end` of channel `name` for this process. A live holder refuses; a dead one is replaced.
    pub fn take(mailbox: &Mailbox, name: &str, end: End) -> Result<Self> {
        let info = mailbox.channel(name)?;
        let me = Holder::current();
        let ring = mailbox.ring_header(info.ring_offset);
        let word = match end {
            End::Producer => &ring.claims.producer,
            End::Consumer => &ring.claims.consumer,
        };
        match claim::claim(word, me) {
            Ok(_) => Ok(Self {
                mailbox: mailbox.clone(),
                ring_offset: info.ring_offset,
                end,
                holder: me,
                channel: info.name,
            }),
            Err(ClaimRefused::HeldBy(h)) => Err(ShmError::Claimed { channel: name.to_string(), end, pid: h.pid }),
        }
    }

    fn word(&self) -> &AtomicU64 {
        let ring = self.mailbox.ring_header(self.ring_offset);
        match self.end {
            End::Producer => &ring.claims.producer,
            End::Consumer => &ring.claims.consumer,
        }
    }

    /// The channel's name.
    pub fn channel(&self) -> &str {
        &self.channel
    }
}

impl Drop for EndClaim {
    fn drop(&mut self) {
        claim::release(self.word(), self.holder);
    }
}

#[cold]
#[inline(never)]
fn corrupt(info: &ChannelInfo, c: Corrupt) -> ShmError {
    ShmError::Corrupt { channel: info.name.clone(), head: c.head, tail: c.tail, capacity: u64::from(info.capacity) }
}

/// A message (or buffer) of `got` bytes where the channel's message size is wanted.
#[cold]
#[inline(never)]
fn size_error(info: &ChannelInfo, got: usize) -> ShmError {
    ShmError::MessageSize { channel: info.name.clone(), size: info.msg_size as usize, got }
}

/// How long a blocking call spins on the CPU before it starts yielding it between polls, unless
/// `MESH_SPIN_US` says otherwise (see [`spin`]).
const SPIN: Duration = Duration::from_micros(20);
/// The spin of every blocking call in this process: `MESH_SPIN_US` microseconds (0 to 1,000,000: 0
/// yields from the first poll, for hosts with more waiting processes than CPUs), else [`SPIN`]. Read
/// once; a value that is not such a number is ignored (the default is a safe choice, and a wait is
/// no place to fail).
fn spin() -> Duration {
    static SPIN_FOR: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN_FOR.get_or_init(|| spin_from(std::env::var("MESH_SPIN_US").ok().as_deref()))
}

/// [`spin`] for a given `MESH_SPIN_US` value.
fn spin_from(value: Option<&str>) -> Duration {
    value.and_then(|v| v.trim().parse::<u64>().ok()).filter(|us| *us <= 1_000_000).map_or(SPIN, Duration::from_micros)
}

/// How long it yields between polls before it starts sleeping.
const YIELD: Duration = Duration::from_millis(1);
/// The first sleep (Linux's timer slack makes any shorter one about this long anyway), doubled up
/// to [`MAX_NAP`].
const FIRST_NAP: Duration = Duration::from_micros(50);
/// The longest sleep between two polls.
const MAX_NAP: Duration = Duration::from_millis(1);

/// How every blocking call of the host ends waits between two polls: spin first (latency), then
/// yield the CPU, then back off with sleeps (CPU). Public so that other bindings (the Python
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
    /// How long this wait spins ([`spin`], looked up once per wait, not once per poll).
    spin: Duration,
}

impl Default for PollPause {
    fn default() -> Self {
        Self::new()
    }
}

impl PollPause {
    /// A wait that starts now (its first pauses spin).
    pub fn new() -> Self {
        Self { start: Instant::now(), nap: FIRST_NAP, spin: spin() }
    }

    /// A wait that starts now and never spins: it yields the CPU from its first pause. For a waiter
    /// with other work in flight, whose throughput a quicker wake-up does not raise but whose spin
    /// takes a CPU from processes that need one (a streaming service client: see
    /// [`for_replies`](Self::for_replies)).
    pub fn yielding() -> Self {
        Self { start: Instant::now(), nap: FIRST_NAP, spin: Duration::ZERO }
    }

    /// The wait of a service client's receive with `unanswered` requests in flight: with at most one
    /// it is waiting on its only request, whose latency a spin shortens ([`new`](Self::new)); with
    /// more it is streaming, and [`yielding`](Self::yielding). Why (BENCHMARKS.md, session 12, every
    /// client of a run waiting one way): 64 streaming clients on the H200 host's 16 CPUs made 4.9 M
    /// replies/s spinning first and 9.4 M yielding at once, while a lone client waiting on one
    /// request took 5.0 µs spinning and 7.3 µs yielding. This split of the two has not been measured
    /// on the GPU yet (docs/gpu-runs/PENDING.md).
    pub fn for_replies(unanswered: u64) -> Self {
        if unanswered > 1 { Self::yielding() } else { Self::new() }
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

/// Polls `attempt` until it yields or `deadline` passes, pausing between tries as [`PollPause`] says.
pub(crate) fn poll_until<T>(deadline: Instant, attempt: impl FnMut() -> Result<Option<T>>) -> Result<Option<T>> {
    poll_until_pausing(deadline, PollPause::new(), attempt)
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

/// A channel's ring memory in its format, found before the end is claimed.
enum Memory {
    Ll(crate::ring::RingMemory),
    Index(crate::index_ring::IndexMemory),
}

impl Memory {
    /// The ring of host channel `info`: protocol ll or index (a channel of any other protocol is
    /// refused, naming the ends that speak it).
    fn of(mailbox: &Mailbox, info: &ChannelInfo) -> Result<Self> {
        Ok(match info.protocol {
            Protocol::Index => Memory::Index(mailbox.index_memory(info)?),
            Protocol::Ll => Memory::Ll(mailbox.ring_memory(info)?),
            protocol @ (Protocol::Bulk | Protocol::FanIn | Protocol::Group) => {
                return Err(ShmError::Protocol { channel: info.name.clone(), protocol, wanted: Protocol::Ll });
            }
        })
    }
}

/// A producer's ring, in its channel's format: one match per call, on a value that never changes,
/// so the branch predictor takes it for free (measured: BENCHMARKS.md, protocol index).
#[derive(Debug)]
enum ProducerRing {
    /// Protocol ll (`ring`): GPU programs may be the other end.
    Ll(ProducerCore),
    /// Protocol index (`index_ring`): both ends host processes.
    Index(IndexProducerCore),
}

/// The sending end of a channel of protocol ll or index.
#[derive(Debug)]
pub struct Producer {
    core: ProducerRing,
    info: ChannelInfo,
    _claim: EndClaim,
}

impl Producer {
    /// Claims the producer end of `name` (protocol ll or index; a bulk channel's ends are
    /// [`crate::BulkProducer`] and [`crate::BulkConsumer`]).
    pub fn claim(mailbox: &Mailbox, name: &str) -> Result<Self> {
        let info = mailbox.channel(name)?;
        let memory = Memory::of(mailbox, &info)?;
        // Claimed before the core resumes: a live holder must refuse before this end publishes a head.
        let claim = EndClaim::take(mailbox, name, End::Producer)?;
        let core = match memory {
            Memory::Ll(ring) => ProducerRing::Ll(ProducerCore::new(ring)),
            Memory::Index(ring) => ProducerRing::Index(IndexProducerCore::new(ring)),
        };
        Ok(Self { core, info, _claim: claim })
    }

    /// The channel.
    pub fn info(&self) -> &ChannelInfo {
        &self.info
    }

    #[inline]
    fn check_len(&self, len: usize) -> Result<()> {
        if len > self.info.msg_size as usize {
            return Err(size_error(&self.info, len));
        }
        Ok(())
    }

    /// Sends one message (at most the message size; shorter ones are zero-padded). `Ok(false)`: full.
    #[inline(always)]
    pub fn try_send(&mut self, msg: &[u8]) -> Result<bool> {
        self.check_len(msg.len())?;
        // The errors are built out of line (cold) so that this call stays small enough to inline.
        match &mut self.core {
            ProducerRing::Ll(core) => core.try_push(msg),
            ProducerRing::Index(core) => core.try_push(msg),
        }
        .map_err(|c| corrupt(&self.info, c))
    }

    /// Sends one message, waiting for room until `timeout` passes.
    pub fn send(&mut self, msg: &[u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        match poll_until(deadline, || Ok(self.try_send(msg)?.then_some(())))? {
            Some(()) => Ok(()),
            None => {
                Err(ShmError::Timeout { channel: self.info.name.clone(), op: "send", waited_ms: timeout.as_millis() })
            }
        }
    }

    /// Sends as many whole messages of `msgs` (a concatenation of message-size records) as fit, publishing once.
    /// Returns how many were sent.
    #[inline]
    pub fn try_send_batch(&mut self, msgs: &[u8]) -> Result<usize> {
        let size = self.info.msg_size as usize;
        if !msgs.len().is_multiple_of(size) {
            return Err(ShmError::MessageSize { channel: self.info.name.clone(), size, got: msgs.len() % size });
        }
        let count = (msgs.len() / size) as u64;
        #[allow(
            clippy::cast_possible_truncation,
            reason = "message indices and counts are at most msgs.len() / size, a usize"
        )]
        let (msg, usize_of) = (|i: u64| &msgs[i as usize * size..(i as usize + 1) * size], |n: u64| n as usize);
        let sent = match &mut self.core {
            ProducerRing::Ll(core) => core.push_with(count, msg),
            ProducerRing::Index(core) => core.push_with(count, msg),
        }
        .map_err(|c| corrupt(&self.info, c))?;
        Ok(usize_of(sent))
    }

    /// Sends every message of `msgs`, waiting for room until `timeout` passes.
    pub fn send_batch(&mut self, msgs: &[u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut done = 0;
        let size = self.info.msg_size as usize;
        let finished = poll_until(deadline, || {
            done += self.try_send_batch(&msgs[done * size..])?;
            Ok((done * size == msgs.len()).then_some(()))
        })?;
        finished.ok_or_else(|| ShmError::Timeout {
            channel: self.info.name.clone(),
            op: "send",
            waited_ms: timeout.as_millis(),
        })
    }
}

/// A consumer's ring, in its channel's format (see [`ProducerRing`]).
#[derive(Debug)]
enum ConsumerRing {
    /// Protocol ll.
    Ll(ConsumerCore),
    /// Protocol index.
    Index(IndexConsumerCore),
}

/// The receiving end of a channel of protocol ll or index.
#[derive(Debug)]
pub struct Consumer {
    core: ConsumerRing,
    info: ChannelInfo,
    _claim: EndClaim,
}

impl Consumer {
    /// Claims the consumer end of `name` (protocol ll or index).
    pub fn claim(mailbox: &Mailbox, name: &str) -> Result<Self> {
        let info = mailbox.channel(name)?;
        let memory = Memory::of(mailbox, &info)?;
        let claim = EndClaim::take(mailbox, name, End::Consumer)?;
        let core = match memory {
            Memory::Ll(ring) => ConsumerCore::new(ring).map(ConsumerRing::Ll),
            Memory::Index(ring) => IndexConsumerCore::new(ring).map(ConsumerRing::Index),
        }
        .map_err(|c| corrupt(&info, c))?;
        Ok(Self { core, info, _claim: claim })
    }

    /// The channel.
    pub fn info(&self) -> &ChannelInfo {
        &self.info
    }

    #[inline]
    fn check_len(&self, len: usize) -> Result<()> {
        if len != self.info.msg_size as usize {
            return Err(size_error(&self.info, len));
        }
        Ok(())
    }

    /// Receives one message into `out` (exactly the message size). `Ok(false)`: no whole message yet
    /// (`out` may then hold part of one that is still arriving).
    #[inline(always)]
    pub fn try_recv(&mut self, out: &mut [u8]) -> Result<bool> {
        self.check_len(out.len())?;
        match &mut self.core {
            ConsumerRing::Ll(core) => Ok(core.try_pop(out)),
            ConsumerRing::Index(core) => core.try_pop(out).map_err(|c| corrupt(&self.info, c)),
        }
    }

    /// Receives one message, waiting until `timeout` passes.
    pub fn recv(&mut self, out: &mut [u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        match poll_until(deadline, || Ok(self.try_recv(out)?.then_some(())))? {
            Some(()) => Ok(()),
            None => {
                Err(ShmError::Timeout { channel: self.info.name.clone(), op: "recv", waited_ms: timeout.as_millis() })
            }
        }
    }

    /// Receives as many whole messages as are waiting and fit in `out` (a multiple of the message size).
    /// Returns how many were received.
    #[inline]
    pub fn try_recv_batch(&mut self, out: &mut [u8]) -> Result<usize> {
        let size = self.info.msg_size as usize;
        if !out.len().is_multiple_of(size) {
            return Err(ShmError::MessageSize { channel: self.info.name.clone(), size, got: out.len() % size });
        }
        let got = match &mut self.core {
            ConsumerRing::Ll(core) => core.pop_into(out),
            ConsumerRing::Index(core) => core.pop_into(out).map_err(|c| corrupt(&self.info, c))?,
        };
        #[allow(clippy::cast_possible_truncation, reason = "at most out.len() / size messages, a usize")]
        Ok(got as usize)
    }

    /// Receives at least one message into `out`, waiting until `timeout` passes; returns how many.
    pub fn recv_batch(&mut self, out: &mut [u8], timeout: Duration) -> Result<usize> {
        let deadline = Instant::now() + timeout;
        match poll_until(deadline, || {
            let n = self.try_recv_batch(out)?;
            Ok((n > 0).then_some(n))
        })? {
            Some(n) => Ok(n),
            None => {
                Err(ShmError::Timeout { channel: self.info.name.clone(), op: "recv", waited_ms: timeout.as_millis() })
            }
        }
    }
}

#[cfg(test)]
mod spin_tests {
    use super::{PollPause, SPIN, spin, spin_from};
    use std::time::Duration;

    #[test]
    fn a_reply_wait_spins_for_one_request_in_flight_and_yields_at_once_for_more() {
        for unanswered in [0, 1] {
            assert_eq!(PollPause::for_replies(unanswered).spin, spin(), "{unanswered} in flight");
        }
        for unanswered in [2, 16, u64::MAX] {
            assert_eq!(PollPause::for_replies(unanswered).spin, Duration::ZERO, "{unanswered} in flight");
        }
    }

    #[test]
    fn mesh_spin_us_sets_the_spin_and_anything_else_keeps_the_default() {
        assert_eq!(spin_from(Some("0")), Duration::ZERO);
        assert_eq!(spin_from(Some(" 5 ")), Duration::from_micros(5));
        assert_eq!(spin_from(Some("1000000")), Duration::from_secs(1));
        for bad in [None, Some(""), Some("-1"), Some("2.5"), Some("1000001"), Some("ten")] {
            assert_eq!(spin_from(bad), SPIN, "{bad:?}");
        }
    }
}
