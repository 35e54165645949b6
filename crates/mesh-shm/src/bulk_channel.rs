//! Host ends of a bulk channel (protocol bulk): claimed producer and consumer that copy large messages with wide stores, on several threads where it pays.
//!
//! `claim` picks how to copy from the channel's message size ([`CopyConfig::for_msg_size`]: one
//! thread and streaming stores for 64 KiB, two threads for 1 MiB, four threads and streaming stores
//! from 4 MiB); `claim_with` takes an explicit [`CopyConfig`]. Either way the end maps every page of
//! its ring into this process when it is claimed, so that the first lap of a 16 MiB ring does not
//! take a page fault every 4 KiB inside the copy.

use std::time::{Duration, Instant};

use crate::bulk::{BulkConsumerCore, BulkMemory, BulkProducerCore, Corrupt};
use crate::channel::{EndClaim, poll_until};
use crate::copy::{Copier, CopyConfig};
use crate::error::{End, Result, ShmError};
use crate::mailbox::{ChannelInfo, Mailbox};

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

/// Maps every page of `ring`'s flags and payloads into this process's page tables: one read per page
/// (the kernel maps its neighbours around it too). A /dev/shm mapping is otherwise filled in one
/// fault per 4 KiB page on first touch, inside the first lap's copies: 4096 faults per 16 MiB slot.
fn prefault(ring: &BulkMemory) {
    const PAGE: usize = 4096;
    let capacity = usize::try_from(ring.capacity()).unwrap_or(usize::MAX);
    let flags = ring.payload_ptr(0).cast_const().wrapping_sub(bulk_payload_offset_of(ring));
    let len = bulk_payload_offset_of(ring) + capacity.saturating_mul(ring.msg_size());
    let mut at = 0;
    while at < len {
        // SAFETY: inside the ring's slots (flags, then payloads), mapped for the mailbox's life; a
        // volatile read of one byte, whose value is dropped, cannot disturb the other end's data.
        unsafe { core::ptr::read_volatile(flags.add(at)) };
        at += PAGE;
    }
}

/// Bytes from the start of `ring`'s slots (its flags) to its first payload.
fn bulk_payload_offset_of(ring: &BulkMemory) -> usize {
    // The capacity of a ring is below 2^32 (`BulkMemory::new`'s contract).
    let capacity = u32::try_from(ring.capacity()).unwrap_or(u32::MAX);
    usize::try_from(crate::layout::bulk_payload_offset(capacity)).unwrap_or(0)
}

fn timeout(info: &ChannelInfo, op: &'static str, waited: Duration) -> ShmError {
    ShmError::Timeout { channel: info.name.clone(), op, waited_ms: waited.as_millis() }
}

/// The sending end of a bulk channel.
#[derive(Debug)]
pub struct BulkProducer {
    core: BulkProducerCore,
    copier: Copier,
    info: ChannelInfo,
    _claim: EndClaim,
}

impl BulkProducer {
    /// Claims the producer end of `name`, a host channel of protocol bulk, copying as
    /// [`CopyConfig::for_msg_size`] says for its message size.
    pub fn claim(mailbox: &Mailbox, name: &str) -> Result<Self> {
        let info = mailbox.channel(name)?;
        Self::claim_with(mailbox, name, CopyConfig::for_msg_size(info.msg_size as usize))
    }

    /// Claims the producer end of `name`, copying as `config` says (threads, non-temporal stores).
    pub fn claim_with(mailbox: &Mailbox, name: &str, config: CopyConfig) -> Result<Self> {
        let info = mailbox.channel(name)?;
        let ring = mailbox.bulk_memory(&info)?;
        let claim = EndClaim::take(mailbox, name, End::Producer)?;
        let copier = copier(mailbox, config)?;
        prefault(&ring);
        Ok(Self { core: BulkProducerCore::new(ring), copier, info, _claim: claim })
    }

    /// The channel.
    pub fn info(&self) -> &ChannelInfo {
        &self.info
    }

    /// How this end copies.
    pub fn copy_config(&self) -> CopyConfig {
        self.copier.config()
    }

    /// Sends one message (at most the message size; a shorter one is zero-padded). `Ok(false)`: full.
    pub fn try_send(&mut self, msg: &[u8]) -> Result<bool> {
        let size = self.info.msg_size as usize;
        if msg.len() > size {
            return Err(ShmError::MessageSize { channel: self.info.name.clone(), size, got: msg.len() });
        }
        let Some(dst) = self.core.reserve().map_err(|c| corrupt(&self.info, c))? else { return Ok(false) };
        // SAFETY: `reserve` handed the slot's `size` bytes to this end until `publish`; `msg` is the
        // caller's buffer, disjoint from the mapping's slot; the copier waits for its helpers.
        unsafe {
            self.copier.copy(dst, msg.as_ptr(), msg.len(), true);
            if msg.len() < size {
                core::ptr::write_bytes(dst.add(msg.len()), 0, size - msg.len());
            }
        }
        self.core.publish();
        Ok(true)
    }

    /// Sends one message written in place: `fill` gets the slot (exactly the message size, its bytes
    /// those of a message sent a lap ago) and writes the message into it. `Ok(false)`: full (`fill`
    /// not called). A `fill` that writes with non-temporal (streaming) stores must end with an
    /// `sfence` (`core::arch::x86_64::_mm_sfence`): the publish that follows is a release, which
    /// orders ordinary stores only.
    pub fn try_send_with(&mut self, fill: impl FnOnce(&mut [u8])) -> Result<bool> {
        let Some(dst) = self.core.reserve().map_err(|c| corrupt(&self.info, c))? else { return Ok(false) };
        // SAFETY: `reserve` handed the slot's msg_size bytes to this end alone until `publish`.
        fill(unsafe { core::slice::from_raw_parts_mut(dst, self.info.msg_size as usize) });
        self.core.publish();
        Ok(true)
    }

    /// Sends one message, waiting for room until `timeout` passes.
    pub fn send(&mut self, msg: &[u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        poll_until(deadline, || Ok(self.try_send(msg)?.then_some(())))?
            .ok_or_else(|| self::timeout(&self.info, "send", timeout))
    }
}

/// The receiving end of a bulk channel.
#[derive(Debug)]
pub struct BulkConsumer {
    core: BulkConsumerCore,
    copier: Copier,
    info: ChannelInfo,
    _claim: EndClaim,
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
        let claim = EndClaim::take(mailbox, name, End::Consumer)?;
        let core = BulkConsumerCore::new(ring).map_err(|c| corrupt(&info, c))?;
        let copier = copier(mailbox, config)?;
        prefault(&ring);
        Ok(Self { core, copier, info, _claim: claim })
    }

    /// The channel.
    pub fn info(&self) -> &ChannelInfo {
        &self.info
    }

    /// Receives one message into `out` (exactly the message size). `Ok(false)`: none is whole yet.
    pub fn try_recv(&mut self, out: &mut [u8]) -> Result<bool> {
        let size = self.info.msg_size as usize;
        if out.len() != size {
            return Err(ShmError::MessageSize { channel: self.info.name.clone(), size, got: out.len() });
        }
        let Some(src) = self.core.peek() else { return Ok(false) };
        // SAFETY: `peek` handed the slot's `size` bytes to this end until `release` (the producer
        // rewrites it only after); `out` is the caller's buffer; the copier waits for its helpers.
        unsafe { self.copier.copy(out.as_mut_ptr(), src, size, false) };
        self.core.release();
        Ok(true)
    }

    /// Receives one message in place: `read` gets the message (exactly the message size) and returns
    /// what the caller wants of it; the slot goes back to the producer after it returns. `Ok(None)`:
    /// none is whole yet (`read` not called).
    pub fn try_recv_with<R>(&mut self, read: impl FnOnce(&[u8]) -> R) -> Result<Option<R>> {
        let Some(src) = self.core.peek() else { return Ok(None) };
        // SAFETY: `peek` handed the slot's msg_size bytes to this end until `release`.
        let r = read(unsafe { core::slice::from_raw_parts(src, self.info.msg_size as usize) });
        self.core.release();
        Ok(Some(r))
    }

    /// Receives one message, waiting until `timeout` passes.
    pub fn recv(&mut self, out: &mut [u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        poll_until(deadline, || Ok(self.try_recv(out)?.then_some(())))?
            .ok_or_else(|| self::timeout(&self.info, "recv", timeout))
    }
}
