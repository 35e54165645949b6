//! Host ends of a bulk channel (protocol bulk): claimed producer and consumer that copy large messages with wide stores, on several threads where it pays.
//!
//! `claim` picks how to copy from the channel's message size (a producer [`CopyConfig::for_producer`],
//! a consumer [`CopyConfig::for_msg_size`]: one thread and streaming stores for 64 KiB; four
//! streaming threads for a producer of 1 MiB messages, two for a consumer; eight threads from 4 MiB);
//! `claim_with` takes an explicit [`CopyConfig`]. Either way the end maps every page of
//! its ring into this process when it is claimed, so that the first lap of a 16 MiB ring does not
//! take a page fault every 4 KiB inside the copy.
//!
//! **Split calls.** Besides the whole-message calls (`try_send`, `try_recv`) and the closures that
//! lend a slot in place (`try_send_with`, `try_recv_with`, built on these), an end lends a slot
//! for as long as its caller wants: [`BulkProducer::try_reserve`] then [`BulkProducer::publish`] or
//! [`BulkProducer::discard`]; [`BulkConsumer::try_peek`] then [`BulkConsumer::release`] or
//! [`BulkConsumer::unpeek`]. One slot at a time: while one is out, the calls that would take
//! another (a reserve, a send, a receive) fail with [`ShmError::SlotLent`], as do the calls that give
//! one back when none is out. The [`Reserved`] and [`Peeked`] they hand out carry the slot's raw
//! address and length for holders that outlive a borrow (FFI, Python's buffer protocol); their
//! safety contract is on the types. An end dropped with a slot out gives it back unpublished (a
//! reserved slot is discarded) or unreleased (a peeked message is read again by the next consumer).
//!
//! **Parts.** A channel created with `parts` P > 1 ([`Mailbox::create_channel_parts`]) lets P GPU
//! blocks serve one end, block `p` moving part `p` of every message. A host end serves all P parts
//! at once and keeps every call above as it is: a reserved or peeked slot is the whole message (its
//! parts are contiguous, part `p` at `p × msg_size / P`); `publish` stores the P flags after the
//! copy, `release` the P tails. The copy is this end's [`Copier`] over the whole message: its
//! threads take contiguous shares, each P / T adjacent parts when the thread count T divides P,
//! rather than part `p` on thread `p mod T`: the same work per thread, with longer runs for the
//! prefetchers, and no part is published before every share is done, so which thread copied which
//! part changes nothing the other end sees.

use std::time::{Duration, Instant};

use crate::bulk::{BulkConsumerCore, BulkMemory, BulkProducerCore, Corrupt};
use crate::channel::EndClaim;
use crate::copy::{Copier, CopyConfig};
use crate::error::{End, Result, ShmError};
use crate::mailbox::{ChannelInfo, Mailbox};
use crate::wait::{WaitConfig, poll_until};

fn corrupt(info: &ChannelInfo, c: Corrupt) -> ShmError {
    ShmError::Corrupt { channel: info.name.clone(), head: c.head, tail: c.tail, capacity: u64::from(info.capacity) }
}

fn copier(mailbox: &Mailbox, config: CopyConfig) -> Result<Copier> {
    Copier::new(config).map_err(|source| ShmError::Io {
        path: mailbox.path().to_path_buf(),
        op: "start a copy thread",
        source,
    })
}

/// Maps every page of `ring`'s flags, index lines and payloads into this process's page tables: one
/// read per page (the kernel maps its neighbours around it too). A /dev/shm mapping is otherwise
/// filled in one fault per 4 KiB page on first touch, inside the first lap's copies: 4096 faults per
/// 16 MiB slot.
fn prefault(ring: &BulkMemory) {
    const PAGE: usize = 4096;
    let (start, len) = ring.slots_raw();
    let mut at = 0;
    while at < len {
        // SAFETY: inside the ring's slots (flags, lines, then payloads), mapped for the mailbox's life;
        // a volatile read of one byte, whose value is dropped, cannot disturb the other end's data.
        unsafe { core::ptr::read_volatile(start.add(at)) };
        at += PAGE;
    }
}

fn timeout(info: &ChannelInfo, op: &'static str, waited: Duration) -> ShmError {
    ShmError::Timeout { channel: info.name.clone(), op, waited_ms: waited.as_millis() }
}

/// A slot a [`BulkProducer`] reserved ([`BulkProducer::try_reserve`]) and has not yet published or
/// discarded: its address, its length (the channel's message size) and the message it will be.
///
/// It describes the slot and borrows nothing: the safe way in is [`BulkProducer::reserved_mut`].
/// **Safety contract** of its pointer, for `unsafe` writers (FFI, a buffer lent to Python): the
/// `len()` bytes at `as_mut_ptr()` may be written (and read back) only while all of these hold —
/// the end that reserved it lives, the mailbox's mapping lives (a clone of its [`Mailbox`] held), and
/// that end has not published or discarded the slot since. Until then the slot is this end's alone
/// (the consumer reads it only once it is published); after, it is the consumer's or the next
/// reservation's, and any access through the pointer is a data race. A write with non-temporal
/// (streaming) stores must be followed by an `sfence` before [`BulkProducer::publish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    ptr: *mut u8,
    len: usize,
    seq: u64,
}

// SAFETY: an address and a length: moving or sharing the description between threads reads and
// writes nothing, and every access through the pointer is `unsafe`, under the contract above.
unsafe impl Send for Reserved {}
// SAFETY: as for Send: `&Reserved` gives only copies of the address, the length and the sequence.
unsafe impl Sync for Reserved {}

impl Reserved {
    /// The slot's first byte (16-byte aligned). See the type's safety contract.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The slot's length in bytes: the channel's message size.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a slot holds at least 16 bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sequence number the message gets when published.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// `(as_mut_ptr(), len())`, for holders across an FFI boundary.
    pub fn raw_parts(&self) -> (*mut u8, usize) {
        (self.ptr, self.len)
    }
}

/// A message a [`BulkConsumer`] peeked ([`BulkConsumer::try_peek`]) and has not yet released or
/// unpeeked: its address, its length (the channel's message size) and its sequence number.
///
/// It describes the slot and borrows nothing: the safe way in is [`BulkConsumer::peeked`].
/// **Safety contract** of its pointer, for `unsafe` readers: the `len()` bytes at `as_ptr()` may be
/// read (never written) only while all of these hold — the end that peeked it lives, the mailbox's
/// mapping lives, and that end has not released or unpeeked the message since. Until then the
/// producer does not touch the slot; after, it may rewrite it at any moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peeked {
    ptr: *const u8,
    len: usize,
    seq: u64,
}

// SAFETY: an address and a length: moving or sharing the description between threads reads and
// writes nothing, and every access through the pointer is `unsafe`, under the contract above.
unsafe impl Send for Peeked {}
// SAFETY: as for Send: `&Peeked` gives only copies of the address, the length and the sequence.
unsafe impl Sync for Peeked {}

impl Peeked {
    /// The message's first byte (16-byte aligned). See the type's safety contract.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// The message's length in bytes: the channel's message size.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a slot holds at least 16 bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The message's sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// `(as_ptr(), len())`, for holders across an FFI boundary.
    pub fn raw_parts(&self) -> (*const u8, usize) {
        (self.ptr, self.len)
    }
}

fn lent(info: &ChannelInfo, end: End, op: &'static str, lent: Option<u64>) -> ShmError {
    ShmError::SlotLent { channel: info.name.clone(), end, op, lent }
}

/// The sending end of a bulk channel.
#[derive(Debug)]
pub struct BulkProducer {
    core: BulkProducerCore,
    copier: Copier,
    info: ChannelInfo,
    /// The slot `try_reserve` lent, until `publish` or `discard`.
    reserved: Option<Reserved>,
    wait: WaitConfig,
    _claim: EndClaim,
}

/// Holds a producer's reservation for `try_send_with`'s `fill`: discards it if `fill` unwinds.
struct Unwinding<'a>(&'a mut BulkProducer);

impl Drop for Unwinding<'_> {
    fn drop(&mut self) {
        self.0.reserved = None;
    }
}

impl BulkProducer {
    /// Claims the producer end of `name`, a host channel of protocol bulk, copying as
    /// [`CopyConfig::for_producer`] says for its message size.
    pub fn claim(mailbox: &Mailbox, name: &str) -> Result<Self> {
        let info = mailbox.channel(name)?;
        Self::claim_with(mailbox, name, CopyConfig::for_producer(info.msg_size as usize))
    }

    /// Claims the producer end of `name`, copying as `config` says (threads, non-temporal stores).
    pub fn claim_with(mailbox: &Mailbox, name: &str, config: CopyConfig) -> Result<Self> {
        let info = mailbox.channel(name)?;
        let ring = mailbox.bulk_memory(&info)?;
        let claim = EndClaim::take_of(mailbox, &info, End::Producer)?;
        let copier = copier(mailbox, config)?;
        prefault(&ring);
        let wait = mailbox.wait_config();
        Ok(Self { core: BulkProducerCore::new(ring), copier, info, reserved: None, wait, _claim: claim })
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

    /// How this end copies.
    pub fn copy_config(&self) -> CopyConfig {
        self.copier.config()
    }

    /// Refuses a message longer than the channel's message size (what `try_send` sends).
    pub fn check_len(&self, len: usize) -> Result<()> {
        let size = self.info.msg_size as usize;
        if len > size {
            return Err(ShmError::MessageSize { channel: self.info.name.clone(), size, got: len });
        }
        Ok(())
    }

    /// Reserves the next slot when there is room (`Ok(None)`: full), lending it until
    /// [`BulkProducer::publish`] or [`BulkProducer::discard`]: write it through
    /// [`BulkProducer::reserved_mut`] or [`BulkProducer::write_reserved`], or through the returned
    /// [`Reserved`]'s pointer under its safety contract. Its bytes are those of the message sent a lap
    /// ago. [`ShmError::SlotLent`] while a slot is already reserved.
    pub fn try_reserve(&mut self) -> Result<Option<Reserved>> {
        if let Some(r) = self.reserved {
            return Err(lent(&self.info, End::Producer, "reserve", Some(r.seq)));
        }
        let Some(ptr) = self.core.reserve().map_err(|c| corrupt(&self.info, c))? else { return Ok(None) };
        let r = Reserved { ptr, len: self.info.msg_size as usize, seq: self.core.head() };
        self.reserved = Some(r);
        Ok(Some(r))
    }

    /// The slot reserved and not yet published or discarded, if any.
    pub fn reservation(&self) -> Option<Reserved> {
        self.reserved
    }

    /// The reserved slot's bytes (exactly the message size), if a slot is reserved.
    pub fn reserved_mut(&mut self) -> Option<&mut [u8]> {
        let r = self.reserved?;
        // SAFETY: `try_reserve` lent the slot's `len` bytes to this end alone until publish/discard,
        // both of which take `&mut self`, as does anything else handing out the slot; the mapping
        // lives as long as this end (its `EndClaim` holds the mailbox).
        Some(unsafe { core::slice::from_raw_parts_mut(r.ptr, r.len) })
    }

    /// Copies `msg` (at most the message size) into the reserved slot with this end's copier, the
    /// rest of the slot zeroed. [`ShmError::SlotLent`] when no slot is reserved.
    pub fn write_reserved(&mut self, msg: &[u8]) -> Result<()> {
        let Some(r) = self.reserved else { return Err(lent(&self.info, End::Producer, "write", None)) };
        self.check_len(msg.len())?;
        // SAFETY: `try_reserve` lent the slot's `r.len` bytes to this end until publish/discard;
        // `msg` (at most `r.len` bytes, checked) is a shared borrow and so not the slot, which only
        // `&mut self` hands out; the copier waits for its helpers before returning.
        unsafe {
            self.copier.copy(r.ptr, msg.as_ptr(), msg.len(), true);
            if msg.len() < r.len {
                core::ptr::write_bytes(r.ptr.add(msg.len()), 0, r.len - msg.len());
            }
        }
        Ok(())
    }

    /// Publishes the reserved slot as the next message; returns its sequence number. Every store to
    /// the slot must be visible to this thread's Release store (plain stores of this thread, or of
    /// threads joined since; streaming stores followed by an `sfence`). [`ShmError::SlotLent`] when
    /// no slot is reserved.
    pub fn publish(&mut self) -> Result<u64> {
        let Some(r) = self.reserved.take() else { return Err(lent(&self.info, End::Producer, "publish", None)) };
        self.core.publish();
        Ok(r.seq)
    }

    /// Gives the reserved slot back unpublished: the next reservation (or send) gets the same slot.
    /// [`ShmError::SlotLent`] when no slot is reserved.
    pub fn discard(&mut self) -> Result<()> {
        match self.reserved.take() {
            Some(_) => Ok(()),
            None => Err(lent(&self.info, End::Producer, "discard", None)),
        }
    }

    /// Sends one message (at most the message size; a shorter one is zero-padded). `Ok(false)`: full.
    /// [`ShmError::SlotLent`] while a slot is reserved.
    pub fn try_send(&mut self, msg: &[u8]) -> Result<bool> {
        if let Some(r) = self.reserved {
            return Err(lent(&self.info, End::Producer, "send", Some(r.seq)));
        }
        self.check_len(msg.len())?;
        if self.try_reserve()?.is_none() {
            return Ok(false);
        }
        self.write_reserved(msg)?;
        self.publish()?;
        Ok(true)
    }

    /// Sends one message written in place: `fill` gets the slot (exactly the message size, its bytes
    /// those of a message sent a lap ago) and writes the message into it. `Ok(false)`: full (`fill`
    /// not called). A `fill` that writes with non-temporal (streaming) stores must end with an
    /// `sfence` (`core::arch::x86_64::_mm_sfence`): the publish that follows is a release, which
    /// orders ordinary stores only. A `fill` that panics leaves the slot discarded.
    /// [`ShmError::SlotLent`] while a slot is reserved.
    pub fn try_send_with(&mut self, fill: impl FnOnce(&mut [u8])) -> Result<bool> {
        if self.try_reserve()?.is_none() {
            return Ok(false);
        }
        let end = Unwinding(self);
        let Some(slot) = end.0.reserved_mut() else { unreachable!("a slot was just reserved") };
        fill(slot);
        end.0.publish()?;
        Ok(true)
    }

    /// Sends one message, waiting for room until `timeout` passes.
    pub fn send(&mut self, msg: &[u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        poll_until(deadline, self.wait, || Ok(self.try_send(msg)?.then_some(())))?
            .ok_or_else(|| self::timeout(&self.info, "send", timeout))
    }
}

/// The receiving end of a bulk channel.
#[derive(Debug)]
pub struct BulkConsumer {
    core: BulkConsumerCore,
    copier: Copier,
    info: ChannelInfo,
    /// The message `try_peek` lent, until `release` or `unpeek`.
    peeked: Option<Peeked>,
    wait: WaitConfig,
    _claim: EndClaim,
}

/// Holds a consumer's peek for `try_recv_with`'s `read`: unpeeks it if `read` unwinds.
struct Unpeeking<'a>(&'a mut BulkConsumer);

impl Drop for Unpeeking<'_> {
    fn drop(&mut self) {
        self.0.peeked = None;
    }
}

impl BulkConsumer {
    /// Claims the consumer end of `name`, a host channel of protocol bulk, copying out as
    /// [`CopyConfig::for_msg_size`] says for its message size (its threads; the stores are plain).
    pub fn claim(mailbox: &Mailbox, name: &str) -> Result<Self> {
        let info = mailbox.channel(name)?;
        Self::claim_with(mailbox, name, CopyConfig::for_msg_size(info.msg_size as usize))
    }

    /// Claims the consumer end of `name`, copying out with `config.threads` threads.
    pub fn claim_with(mailbox: &Mailbox, name: &str, config: CopyConfig) -> Result<Self> {
        let info = mailbox.channel(name)?;
        let ring = mailbox.bulk_memory(&info)?;
        let claim = EndClaim::take_of(mailbox, &info, End::Consumer)?;
        let core = BulkConsumerCore::new(ring).map_err(|c| corrupt(&info, c))?;
        let copier = copier(mailbox, config)?;
        prefault(&ring);
        Ok(Self { core, copier, info, peeked: None, wait: mailbox.wait_config(), _claim: claim })
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

    /// How this end copies.
    pub fn copy_config(&self) -> CopyConfig {
        self.copier.config()
    }

    /// Refuses a buffer that is not exactly the channel's message size (what `try_recv` fills).
    pub fn check_len(&self, len: usize) -> Result<()> {
        let size = self.info.msg_size as usize;
        if len != size {
            return Err(ShmError::MessageSize { channel: self.info.name.clone(), size, got: len });
        }
        Ok(())
    }

    /// The next message if it is whole (`Ok(None)`: none yet), lent in place until
    /// [`BulkConsumer::release`] or [`BulkConsumer::unpeek`]: read it through
    /// [`BulkConsumer::peeked`] or [`BulkConsumer::read_peeked`], or through the returned
    /// [`Peeked`]'s pointer under its safety contract. While one is out, `try_peek` returns it again.
    pub fn try_peek(&mut self) -> Result<Option<Peeked>> {
        if self.peeked.is_some() {
            return Ok(self.peeked);
        }
        let Some(ptr) = self.core.peek() else { return Ok(None) };
        let p = Peeked { ptr, len: self.info.msg_size as usize, seq: self.core.tail() };
        self.peeked = Some(p);
        Ok(Some(p))
    }

    /// The message peeked and not yet released or unpeeked, if any.
    pub fn current_peek(&self) -> Option<Peeked> {
        self.peeked
    }

    /// The peeked message's bytes (exactly the message size), if one is peeked.
    pub fn peeked(&self) -> Option<&[u8]> {
        let p = self.peeked?;
        // SAFETY: `try_peek` lent the message's `len` bytes to this end until release/unpeek (the
        // producer rewrites the slot only after), both of which take `&mut self`; the mapping lives
        // as long as this end (its `EndClaim` holds the mailbox).
        Some(unsafe { core::slice::from_raw_parts(p.ptr, p.len) })
    }

    /// Copies the peeked message into `out` (exactly the message size) with this end's copier.
    /// [`ShmError::SlotLent`] when no message is peeked.
    pub fn read_peeked(&mut self, out: &mut [u8]) -> Result<()> {
        let Some(p) = self.peeked else { return Err(lent(&self.info, End::Consumer, "read", None)) };
        self.check_len(out.len())?;
        // SAFETY: `try_peek` lent the message's `p.len` bytes to this end until release/unpeek (the
        // producer rewrites it only after); `out` is an exclusive borrow of `p.len` bytes (checked),
        // so not the slot, which is only lent shared; the copier waits for its helpers.
        unsafe { self.copier.copy(out.as_mut_ptr(), p.ptr, p.len, false) };
        Ok(())
    }

    /// Hands the peeked message's slot back to the producer (the message is consumed); returns its
    /// sequence number. Reads of it by other threads must be joined first. [`ShmError::SlotLent`]
    /// when no message is peeked.
    pub fn release(&mut self) -> Result<u64> {
        let Some(p) = self.peeked.take() else { return Err(lent(&self.info, End::Consumer, "release", None)) };
        self.core.release();
        Ok(p.seq)
    }

    /// Gives the peeked message back unreleased: the next peek (or receive) gets it again.
    /// [`ShmError::SlotLent`] when no message is peeked.
    pub fn unpeek(&mut self) -> Result<()> {
        match self.peeked.take() {
            Some(_) => Ok(()),
            None => Err(lent(&self.info, End::Consumer, "unpeek", None)),
        }
    }

    /// Receives one message into `out` (exactly the message size). `Ok(false)`: none is whole yet.
    /// [`ShmError::SlotLent`] while a message is peeked.
    pub fn try_recv(&mut self, out: &mut [u8]) -> Result<bool> {
        if let Some(p) = self.peeked {
            return Err(lent(&self.info, End::Consumer, "recv", Some(p.seq)));
        }
        self.check_len(out.len())?;
        if self.try_peek()?.is_none() {
            return Ok(false);
        }
        self.read_peeked(out)?;
        self.release()?;
        Ok(true)
    }

    /// Receives one message in place: `read` gets the message (exactly the message size) and returns
    /// what the caller wants of it; the slot goes back to the producer after it returns. `Ok(None)`:
    /// none is whole yet (`read` not called). A `read` that panics leaves the message unreleased
    /// (read again next time). [`ShmError::SlotLent`] while a message is peeked.
    pub fn try_recv_with<R>(&mut self, read: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        if let Some(p) = self.peeked {
            return Err(lent(&self.info, End::Consumer, "recv", Some(p.seq)));
        }
        if self.try_peek()?.is_none() {
            return Ok(None);
        }
        let end = Unpeeking(self);
        let Some(msg) = end.0.peeked() else { unreachable!("a message was just peeked") };
        let r = read(msg);
        end.0.release()?;
        Ok(Some(r))
    }

    /// Receives one message, waiting until `timeout` passes.
    pub fn recv(&mut self, out: &mut [u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        poll_until(deadline, self.wait, || Ok(self.try_recv(out)?.then_some(())))?
            .ok_or_else(|| self::timeout(&self.info, "recv", timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mailbox::{CreateMode, MailboxConfig, Placement, Protocol};

    const SIZE: u32 = 4096;

    /// A mailbox with one bulk channel "b" of `capacity` 4 KiB messages, its ends claimed.
    fn ends(dir: &tempfile::TempDir, capacity: u32) -> (Mailbox, BulkProducer, BulkConsumer) {
        let config = MailboxConfig { size: 1 << 20, slots: 2, channels: 4 };
        let mb = Mailbox::create(dir.path().join("mb"), &config, CreateMode::Exclusive).unwrap();
        mb.create_channel_with("b", SIZE, capacity, Placement::Host, Protocol::Bulk).unwrap();
        let tx = BulkProducer::claim_with(&mb, "b", CopyConfig::default()).unwrap();
        let rx = BulkConsumer::claim_with(&mb, "b", CopyConfig::default()).unwrap();
        (mb, tx, rx)
    }

    fn recv(rx: &mut BulkConsumer) -> Option<Vec<u8>> {
        let mut out = vec![0; SIZE as usize];
        rx.try_recv(&mut out).unwrap().then_some(out)
    }

    #[test]
    fn reserve_then_publish_sends_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let (_mb, mut tx, mut rx) = ends(&dir, 2);
        let r = tx.try_reserve().unwrap().unwrap();
        assert_eq!((r.len(), r.seq()), (SIZE as usize, 0));
        assert_eq!(tx.reservation(), Some(r));
        assert_eq!(tx.reserved_mut().unwrap().as_ptr(), r.as_mut_ptr().cast_const());
        tx.reserved_mut().unwrap().fill(7);
        assert!(recv(&mut rx).is_none(), "a reserved slot is not a message until published");
        assert_eq!(tx.publish().unwrap(), 0);
        assert_eq!(tx.reservation(), None);
        assert_eq!(recv(&mut rx).unwrap(), vec![7; SIZE as usize]);
        // Through the raw parts, as an FFI holder writes.
        let r = tx.try_reserve().unwrap().unwrap();
        let (ptr, len) = r.raw_parts();
        // SAFETY: the slot is reserved and not published; the end and the mailbox live.
        unsafe { core::ptr::write_bytes(ptr, 9, len) };
        assert_eq!(tx.publish().unwrap(), 1);
        assert_eq!(recv(&mut rx).unwrap(), vec![9; SIZE as usize]);
    }

    #[test]
    fn a_discarded_slot_is_reused_by_the_next_send() {
        let dir = tempfile::tempdir().unwrap();
        let (_mb, mut tx, mut rx) = ends(&dir, 2);
        let r = tx.try_reserve().unwrap().unwrap();
        tx.write_reserved(&[1; 100]).unwrap();
        tx.discard().unwrap();
        assert!(recv(&mut rx).is_none(), "a discarded slot is not published");
        let again = tx.try_reserve().unwrap().unwrap();
        assert_eq!(again, r, "the same slot, the same sequence number");
        tx.discard().unwrap();
        assert!(tx.try_send(&[2; 64]).unwrap());
        let mut want = vec![0; SIZE as usize];
        want[..64].fill(2);
        assert_eq!(recv(&mut rx).unwrap(), want, "message 0 is the send's, zero-padded");
        assert!(matches!(tx.discard(), Err(ShmError::SlotLent { op: "discard", lent: None, .. })));
        assert!(matches!(tx.publish(), Err(ShmError::SlotLent { op: "publish", lent: None, .. })));
    }

    #[test]
    fn a_second_reservation_is_refused_while_one_is_out() {
        let dir = tempfile::tempdir().unwrap();
        let (_mb, mut tx, mut rx) = ends(&dir, 4);
        tx.try_reserve().unwrap().unwrap();
        let err = tx.try_reserve().unwrap_err();
        assert!(matches!(err, ShmError::SlotLent { op: "reserve", lent: Some(0), end: End::Producer, .. }), "{err}");
        assert!(err.to_string().contains("message 0's slot is still lent"), "{err}");
        assert!(matches!(tx.try_send(&[1]), Err(ShmError::SlotLent { op: "send", lent: Some(0), .. })));
        assert!(matches!(tx.try_send_with(|_| ()), Err(ShmError::SlotLent { op: "reserve", .. })));
        tx.publish().unwrap();
        assert!(tx.try_send(&[1]).unwrap());
        assert_eq!(recv(&mut rx).unwrap()[0], 0, "message 0: the reserved slot's bytes (zeros)");
        assert_eq!(recv(&mut rx).unwrap()[0], 1);
    }

    #[test]
    fn a_full_ring_reserves_nothing_and_lends_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (_mb, mut tx, mut rx) = ends(&dir, 1);
        assert!(tx.try_send(&[1]).unwrap());
        assert_eq!(tx.try_reserve().unwrap(), None);
        assert_eq!(tx.reservation(), None);
        assert!(tx.reserved_mut().is_none());
        assert!(matches!(tx.write_reserved(&[1]), Err(ShmError::SlotLent { op: "write", .. })));
        assert_eq!(recv(&mut rx).unwrap()[0], 1);
        assert_eq!(tx.try_reserve().unwrap().unwrap().seq(), 1);
        let big = vec![0; SIZE as usize + 1];
        assert!(matches!(tx.write_reserved(&big), Err(ShmError::MessageSize { .. })));
        assert!(tx.reservation().is_some(), "a refused write leaves the slot reserved");
    }

    #[test]
    fn peek_then_release_consumes_and_peeking_twice_gives_the_same_message() {
        let dir = tempfile::tempdir().unwrap();
        let (_mb, mut tx, mut rx) = ends(&dir, 4);
        assert_eq!(rx.try_peek().unwrap(), None);
        assert!(tx.try_send(&[5; 10]).unwrap());
        assert!(tx.try_send(&[6; 10]).unwrap());
        let p = rx.try_peek().unwrap().unwrap();
        assert_eq!((p.seq(), p.len()), (0, SIZE as usize));
        assert_eq!(rx.try_peek().unwrap(), Some(p), "a second peek gives the same message");
        assert_eq!(rx.current_peek(), Some(p));
        assert_eq!(&rx.peeked().unwrap()[..11], &[5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 0]);
        let (ptr, len) = p.raw_parts();
        // SAFETY: the message is peeked and not released; the end and the mailbox live.
        assert_eq!(unsafe { core::slice::from_raw_parts(ptr, len) }, rx.peeked().unwrap());
        let mut out = vec![0; SIZE as usize];
        rx.read_peeked(&mut out).unwrap();
        assert_eq!(out[0], 5);
        let err = rx.try_recv(&mut out).unwrap_err();
        assert!(matches!(err, ShmError::SlotLent { op: "recv", lent: Some(0), end: End::Consumer, .. }), "{err}");
        assert!(matches!(rx.try_recv_with(|_| ()), Err(ShmError::SlotLent { op: "recv", .. })));
        assert_eq!(rx.release().unwrap(), 0);
        assert!(matches!(rx.release(), Err(ShmError::SlotLent { op: "release", lent: None, .. })));
        // Unpeeked: the same message again.
        assert_eq!(rx.try_peek().unwrap().unwrap().seq(), 1);
        rx.unpeek().unwrap();
        assert!(matches!(rx.unpeek(), Err(ShmError::SlotLent { op: "unpeek", .. })));
        assert_eq!(rx.try_recv_with(|m| m[0]).unwrap(), Some(6));
        assert_eq!(rx.try_peek().unwrap(), None);
    }

    #[test]
    fn dropping_an_end_with_a_slot_out_gives_it_back_unpublished_or_unreleased() {
        let dir = tempfile::tempdir().unwrap();
        let (mb, mut tx, mut rx) = ends(&dir, 2);
        tx.try_reserve().unwrap().unwrap().as_mut_ptr();
        tx.write_reserved(&[3; 16]).unwrap();
        drop(tx);
        assert!(recv(&mut rx).is_none(), "the reserved slot was not published");
        let mut tx = BulkProducer::claim(&mb, "b").unwrap();
        assert_eq!(tx.try_reserve().unwrap().unwrap().seq(), 0, "the next producer reuses the slot");
        tx.write_reserved(&[4; 16]).unwrap();
        tx.publish().unwrap();
        assert_eq!(rx.try_peek().unwrap().unwrap().seq(), 0);
        drop(rx);
        let mut rx = BulkConsumer::claim(&mb, "b").unwrap();
        let p = rx.try_peek().unwrap().unwrap();
        assert_eq!((p.seq(), rx.peeked().unwrap()[0]), (0, 4), "the next consumer reads the message again");
        rx.release().unwrap();
        assert!(recv(&mut rx).is_none());
    }

    /// A mailbox with one bulk channel "p" of `parts` parts, messages of `size` bytes, capacity 2.
    fn part_ends(dir: &tempfile::TempDir, size: u32, parts: u32) -> (Mailbox, BulkProducer, BulkConsumer) {
        let config = MailboxConfig { size: 4 << 20, slots: 2, channels: 4 };
        let mb = Mailbox::create(dir.path().join("mb"), &config, CreateMode::Exclusive).unwrap();
        let info = mb.create_channel_parts("p", size, 2, Placement::Host, Protocol::Bulk, parts).unwrap();
        assert_eq!(info.parts, parts);
        let tx =
            BulkProducer::claim_with(&mb, "p", CopyConfig { threads: 2, min_part: 4096, non_temporal: false }).unwrap();
        let rx =
            BulkConsumer::claim_with(&mb, "p", CopyConfig { threads: 2, min_part: 4096, non_temporal: false }).unwrap();
        (mb, tx, rx)
    }

    fn pattern(seq: u64, len: usize) -> Vec<u8> {
        #[allow(clippy::cast_possible_truncation, reason = "a byte pattern")]
        (0..len).map(|i| (seq as usize * 131 + i * 7 + i / 4096) as u8).collect()
    }

    #[test]
    fn every_part_count_moves_every_byte_through_the_host_ends() {
        for parts in [1, 2, 4, 8, 32] {
            let dir = tempfile::tempdir().unwrap();
            let size = 16 * 1024;
            let (mb, mut tx, mut rx) = part_ends(&dir, size, parts);
            let mut out = vec![0; size as usize];
            for seq in 0..7u64 {
                let msg = pattern(seq, size as usize);
                match seq % 3 {
                    0 => assert!(tx.try_send(&msg).unwrap()),
                    1 => assert!(tx.try_send_with(|s| s.copy_from_slice(&msg)).unwrap()),
                    _ => {
                        let r = tx.try_reserve().unwrap().unwrap();
                        assert_eq!(r.seq(), seq);
                        tx.write_reserved(&msg).unwrap();
                        assert!(rx.try_peek().unwrap().is_none(), "{parts} parts: not published yet");
                        tx.publish().unwrap();
                    }
                }
                if seq % 2 == 0 {
                    assert!(rx.try_recv(&mut out).unwrap());
                    assert!(out == msg, "{parts} parts, message {seq}");
                } else {
                    let p = rx.try_peek().unwrap().unwrap();
                    assert_eq!(p.seq(), seq);
                    assert!(rx.peeked().unwrap() == &msg[..]);
                    rx.unpeek().unwrap();
                    assert_eq!(rx.try_recv_with(|m| m == &msg[..]).unwrap(), Some(true));
                }
            }
            let info = mb.channel("p").unwrap();
            assert_eq!((info.head, info.tail, info.parts), (7, 7, parts), "lower bounds over the parts");
        }
    }

    #[test]
    fn ends_of_a_parted_channel_resume_where_the_last_left() {
        let dir = tempfile::tempdir().unwrap();
        let size = 8 * 1024;
        let (mb, mut tx, mut rx) = part_ends(&dir, size, 8);
        assert!(tx.try_send(&pattern(0, size as usize)).unwrap());
        assert!(tx.try_send(&pattern(1, size as usize)).unwrap());
        assert!(!tx.try_send(&pattern(2, size as usize)).unwrap(), "capacity 2");
        let mut out = vec![0; size as usize];
        assert!(rx.try_recv(&mut out).unwrap());
        drop((tx, rx));
        let mut tx = BulkProducer::claim(&mb, "p").unwrap();
        let mut rx = BulkConsumer::claim(&mb, "p").unwrap();
        assert_eq!(tx.try_reserve().unwrap().unwrap().seq(), 2, "the producer resumes after message 1");
        tx.discard().unwrap();
        assert!(rx.try_recv(&mut out).unwrap());
        assert!(out == pattern(1, size as usize), "the consumer resumes at message 1");
        assert!(tx.try_send(&pattern(2, size as usize)).unwrap());
        assert!(rx.try_recv(&mut out).unwrap());
        assert!(out == pattern(2, size as usize));
    }

    #[test]
    fn parts_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let config = MailboxConfig { size: 1 << 20, slots: 2, channels: 4 };
        let mb = Mailbox::create(dir.path().join("mb"), &config, CreateMode::Exclusive).unwrap();
        let refused = |size, protocol, parts| {
            mb.create_channel_parts("x", size, 2, Placement::Host, protocol, parts).unwrap_err().to_string()
        };
        let e = refused(4096, Protocol::Bulk, 3);
        assert!(e.contains("\"x\"") || e.contains("x"), "{e}");
        assert!(e.contains("parts 3: must be a power of two from 1 to 32"), "{e}");
        assert!(refused(4096, Protocol::Bulk, 64).contains("parts 64: must be a power of two"));
        let e = refused(16 * 8 * 3, Protocol::Bulk, 16);
        assert!(e.contains("must be a multiple of 256 (16 × parts)"), "{e}");
        let e = refused(64, Protocol::Ll, 2);
        assert!(e.contains("only a channel of protocol bulk"), "{e}");
        assert!(refused(64, Protocol::Bulk, 0).contains("parts 0"), "zero parts is refused, not read as one");
        assert!(mb.channels().unwrap().is_empty(), "nothing was created");
    }

    #[test]
    fn a_panicking_closure_leaves_the_end_usable() {
        let dir = tempfile::tempdir().unwrap();
        let (_mb, mut tx, mut rx) = ends(&dir, 2);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tx.try_send_with(|_| panic!("fill")).unwrap();
        }));
        assert!(panicked.is_err());
        assert_eq!(tx.reservation(), None, "discarded");
        assert!(tx.try_send_with(|s| s[0] = 8).unwrap());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rx.try_recv_with(|_| -> () { panic!("read") }).unwrap();
        }));
        assert!(panicked.is_err());
        assert_eq!(rx.current_peek(), None, "unpeeked");
        assert_eq!(rx.try_recv_with(|m| (m[0], m.len())).unwrap(), Some((8, SIZE as usize)));
    }
}
