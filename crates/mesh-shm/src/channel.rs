//! Host ends of a channel: a claimed producer or consumer over the ring (protocol ll or index, chosen per channel), with try, deadline and batch calls.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use crate::claim::{self, Holder};
use crate::error::{End, Result, ShmError};
use crate::index_ring::{IndexConsumerCore, IndexProducerCore};
use crate::mailbox::{ChannelInfo, Mailbox, Protocol};
use crate::ring::{ConsumerCore, Corrupt, ProducerCore};
use crate::wait::{WaitConfig, poll_until};

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
        Self::take_of(mailbox, &mailbox.channel(name)?, end)
    }

    /// Claims `end` of channel `info` as it was looked up: refused ([`ShmError::Deleted`]) if it
    /// has been deleted or replaced since, so that an end built over `info`'s ring claims that ring.
    pub(crate) fn take_of(mailbox: &Mailbox, info: &ChannelInfo, end: End) -> Result<Self> {
        let me = Holder::current();
        let ring = mailbox.ring_header(info.ring_offset);
        let word = match end {
            End::Producer => &ring.claims.producer,
            End::Consumer => &ring.claims.consumer,
        };
        // Under the table lock, the descriptor read again first: never a claim on a deleted ring.
        mailbox.claim_word(info, word, me, &info.name, end)?;
        let channel = info.name.clone();
        Ok(Self { mailbox: mailbox.clone(), ring_offset: info.ring_offset, end, holder: me, channel })
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
    wait: WaitConfig,
    _claim: EndClaim,
}

impl Producer {
    /// Claims the producer end of `name` (protocol ll or index; a bulk channel's ends are
    /// [`crate::BulkProducer`] and [`crate::BulkConsumer`]).
    pub fn claim(mailbox: &Mailbox, name: &str) -> Result<Self> {
        let info = mailbox.channel(name)?;
        let memory = Memory::of(mailbox, &info)?;
        // Claimed before the core resumes: a live holder must refuse before this end publishes a head.
        let claim = EndClaim::take_of(mailbox, &info, End::Producer)?;
        let core = match memory {
            Memory::Ll(ring) => ProducerRing::Ll(ProducerCore::new(ring)),
            Memory::Index(ring) => ProducerRing::Index(IndexProducerCore::new(ring)),
        };
        Ok(Self { core, info, wait: mailbox.wait_config(), _claim: claim })
    }

    /// The channel.
    pub fn info(&self) -> &ChannelInfo {
        &self.info
    }

    /// How this end's blocking calls wait: its mailbox handle's setting when it was claimed, unless
    /// set since ([`set_wait_config`](Self::set_wait_config)).
    pub fn wait_config(&self) -> WaitConfig {
        self.wait
    }

    /// Sets how this end's blocking calls wait from now on (how long they spin before they yield).
    pub fn set_wait_config(&mut self, wait: WaitConfig) {
        self.wait = wait;
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
        match poll_until(deadline, self.wait, || Ok(self.try_send(msg)?.then_some(())))? {
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
        let finished = poll_until(deadline, self.wait, || {
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
    wait: WaitConfig,
    _claim: EndClaim,
}

impl Consumer {
    /// Claims the consumer end of `name` (protocol ll or index).
    pub fn claim(mailbox: &Mailbox, name: &str) -> Result<Self> {
        let info = mailbox.channel(name)?;
        let memory = Memory::of(mailbox, &info)?;
        let claim = EndClaim::take_of(mailbox, &info, End::Consumer)?;
        let core = match memory {
            Memory::Ll(ring) => ConsumerCore::new(ring).map(ConsumerRing::Ll),
            Memory::Index(ring) => IndexConsumerCore::new(ring).map(ConsumerRing::Index),
        }
        .map_err(|c| corrupt(&info, c))?;
        Ok(Self { core, info, wait: mailbox.wait_config(), _claim: claim })
    }

    /// The channel.
    pub fn info(&self) -> &ChannelInfo {
        &self.info
    }

    /// How this end's blocking calls wait: its mailbox handle's setting when it was claimed, unless
    /// set since ([`set_wait_config`](Self::set_wait_config)).
    pub fn wait_config(&self) -> WaitConfig {
        self.wait
    }

    /// Sets how this end's blocking calls wait from now on (how long they spin before they yield).
    pub fn set_wait_config(&mut self, wait: WaitConfig) {
        self.wait = wait;
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
        match poll_until(deadline, self.wait, || Ok(self.try_recv(out)?.then_some(())))? {
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
        match poll_until(deadline, self.wait, || {
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
