//! The host ends of a bulk channel (protocol bulk) for Python, and the views that lend a ring slot to Python.
//!
//! mesh-shm's `BulkProducer`/`BulkConsumer` take a slot in place only for the length of a closure
//! (`try_send_with`, `try_recv_with`); Python needs one held across a `with` block. So these ends are
//! made of the same public parts and in the same order as `mesh_shm::bulk_channel`'s: the claim
//! (`EndClaim`), the ring's cores (`BulkProducerCore`, `BulkConsumerCore`: `reserve`/`publish`,
//! `peek`/`release`), the ring's pages mapped at claim (as `bulk_channel`'s `prefault`), and a
//! `Copier` built from `CopyConfig::for_msg_size` (what `BulkProducer::claim` uses; so a change of the
//! Rust defaults reaches Python without a change here) unless the caller gives a `CopyConfig`. The
//! copy of a whole message is the copier's, exactly as the Rust ends do it.
//!
//! **Views.** A [`SlotView`] lends one slot: the producer's reserved (not yet published) slot,
//! writable, or the consumer's message (not yet released), read-only. It implements the buffer
//! protocol itself and counts its exports; its `__enter__` hands out a `memoryview` of itself. Giving
//! the slot back (publish, discard or release) first releases that memoryview, then refuses with
//! `BufferError` while any export lives (a `numpy.frombuffer` array, another memoryview): the slot
//! stays lent and the end stays busy until the user drops them and gives it back again. A view never
//! outlives its memory: it holds the mailbox's mapping, and once given back it exports no more.

use std::ffi::c_int;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use mesh_shm::bulk::{BulkConsumerCore, BulkMemory, BulkProducerCore};
use mesh_shm::copy::Copier;
use mesh_shm::layout::{RingHeader, bulk_payload_offset, bulk_slot_bytes};
use mesh_shm::{ChannelInfo, End, EndClaim, Mailbox, Placement, Protocol, ShmError};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyMemoryView;

use crate::{PyConsumer, PyProducer};

/// Copies of more bytes than this are made with the GIL released (below, releasing it costs more
/// than the copy).
pub(crate) const GIL_FREE_COPY: usize = 4096;

/// The copy settings of a bulk end: `mesh_shm::CopyConfig`, each field not given taking the value of
/// `CopyConfig::default()` (an end claimed without one uses `CopyConfig::for_msg_size` instead).
#[pyclass(name = "CopyConfig", module = "meshd", frozen, eq)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PyCopyConfig {
    pub(crate) inner: mesh_shm::CopyConfig,
}

#[pymethods]
impl PyCopyConfig {
    /// `threads`: threads copying one message together, the caller's included; `min_part`: the
    /// smallest share worth another thread, in bytes; `non_temporal`: streaming stores into the ring
    /// (the producer's copy). Each left out (None) is Rust's `CopyConfig::default()`.
    #[new]
    #[pyo3(signature = (threads=None, min_part=None, non_temporal=None))]
    fn new(threads: Option<usize>, min_part: Option<usize>, non_temporal: Option<bool>) -> Self {
        // Starting from Rust's defaults, so that fields mesh-shm adds later keep theirs.
        let mut inner = mesh_shm::CopyConfig::default();
        if let Some(t) = threads {
            inner.threads = t;
        }
        if let Some(m) = min_part {
            inner.min_part = m;
        }
        if let Some(nt) = non_temporal {
            inner.non_temporal = nt;
        }
        Self { inner }
    }

    /// `mesh_shm::CopyConfig::default()`.
    #[staticmethod]
    fn default() -> Self {
        Self { inner: mesh_shm::CopyConfig::default() }
    }

    /// What a bulk end claimed without a `copy_config` uses for `msg_size`-byte messages (the Rust
    /// host end's choice by size, `mesh_shm::CopyConfig::for_msg_size`, on this machine's CPUs).
    #[staticmethod]
    fn for_msg_size(msg_size: usize) -> Self {
        Self { inner: mesh_shm::CopyConfig::for_msg_size(msg_size) }
    }

    #[getter]
    fn threads(&self) -> usize {
        self.inner.threads
    }

    #[getter]
    fn min_part(&self) -> usize {
        self.inner.min_part
    }

    #[getter]
    fn non_temporal(&self) -> bool {
        self.inner.non_temporal
    }

    fn __repr__(&self) -> String {
        let c = self.inner;
        let nt = if c.non_temporal { "True" } else { "False" };
        format!("CopyConfig(threads={}, min_part={}, non_temporal={nt})", c.threads, c.min_part)
    }
}

/// The ring of host channel `info`, of protocol bulk: what `Mailbox::bulk_memory` (crate-private in
/// mesh-shm) does, from the mapping's public address and the validated descriptor, every bound checked again.
fn bulk_memory(mailbox: &Mailbox, info: &ChannelInfo) -> Result<BulkMemory, ShmError> {
    if info.placement != Placement::Host {
        return Err(ShmError::DevicePlacement { channel: info.name.clone() });
    }
    if info.protocol != Protocol::Bulk {
        return Err(ShmError::Protocol { channel: info.name.clone(), protocol: info.protocol, wanted: Protocol::Bulk });
    }
    let (base, len) = mailbox.as_raw_parts();
    let header_end = info.ring_offset.checked_add(core::mem::size_of::<RingHeader>() as u64);
    let slots_end = info.slots_offset.checked_add(bulk_slot_bytes(info.msg_size, info.capacity));
    let fits = |end: Option<u64>| end.is_some_and(|e| e <= len as u64);
    let sane = fits(header_end)
        && fits(slots_end)
        && info.ring_offset % 128 == 0
        && info.slots_offset % 16 == 0
        && info.slots_offset >= header_end.unwrap_or(u64::MAX)
        && info.msg_size > 0
        && info.msg_size % 16 == 0
        && info.capacity.is_power_of_two();
    if !sane {
        return Err(ShmError::Invalid {
            path: mailbox.path().to_path_buf(),
            field: "channel descriptor",
            reason: format!("channel {:?}: its bulk ring does not fit the mapping", info.name),
        });
    }
    #[allow(clippy::cast_possible_truncation, reason = "both offsets were checked to lie inside the mapping")]
    let (ring_at, slots_at) = (info.ring_offset as usize, info.slots_offset as usize);
    // SAFETY: both offsets lie inside the mapping (checked above), so the pointers are in bounds and
    // non-null; the header is 128-byte aligned and the slots 16-byte aligned (the mapping is page
    // aligned; offsets checked), the slots hold `bulk_slot_bytes` bytes after the header, the
    // capacity is a power of two (< 2^32, a u32) and the message size a non-zero multiple of 16 —
    // BulkMemory::new's contract. The mapping lives as long as the `Mailbox` clones the ends and
    // views hold (its `Arc`).
    unsafe {
        let header = core::ptr::NonNull::new_unchecked(base.add(ring_at).cast::<RingHeader>());
        let slots = core::ptr::NonNull::new_unchecked(base.add(slots_at));
        Ok(BulkMemory::new(header, slots, info.msg_size as usize, u64::from(info.capacity)))
    }
}

/// Maps every page of `ring`'s flags and payloads into this process at claim, as mesh-shm's bulk ends
/// do (`bulk_channel::prefault`, private there): otherwise the first lap of a 16 MiB ring takes a
/// page fault every 4 KiB inside its copies.
fn prefault(ring: &BulkMemory) {
    const PAGE: usize = 4096;
    let capacity = ring.capacity();
    #[allow(clippy::cast_possible_truncation, reason = "a ring's capacity is below 2^32 (BulkMemory::new)")]
    let offset = usize::try_from(bulk_payload_offset(capacity as u32)).unwrap_or(0);
    let len = offset + usize::try_from(capacity).unwrap_or(0).saturating_mul(ring.msg_size());
    let flags = ring.payload_ptr(0).cast_const().wrapping_sub(offset);
    let mut at = 0;
    while at < len {
        // SAFETY: inside the ring's slots (its flags, then its payloads), which `bulk_memory` checked
        // to lie in the mapping; a volatile one-byte read whose value is dropped disturbs nothing.
        unsafe { core::ptr::read_volatile(flags.add(at)) };
        at += PAGE;
    }
}

fn corrupt(info: &ChannelInfo, c: mesh_shm::bulk::Corrupt) -> ShmError {
    ShmError::Corrupt { channel: info.name.clone(), head: c.head, tail: c.tail, capacity: u64::from(info.capacity) }
}

fn copier(mailbox: &Mailbox, config: mesh_shm::CopyConfig) -> Result<Copier, ShmError> {
    Copier::new(config).map_err(|source| ShmError::Io {
        path: mailbox.path().to_path_buf(),
        op: "start a copy thread",
        source,
    })
}

/// A copy of `len` bytes, with the GIL released above [`GIL_FREE_COPY`].
///
/// # Safety
/// As `Copier::copy`: `src` valid for `len` reads, `dst` for `len` writes, disjoint, and nothing else
/// writing either (or reading `dst`) until this returns.
unsafe fn copy(py: Python<'_>, copier: &mut Copier, dst: *mut u8, src: *const u8, len: usize, nt: bool) {
    if len <= GIL_FREE_COPY {
        // SAFETY: the caller's contract.
        unsafe { copier.copy(dst, src, len, nt) };
        return;
    }
    let (d, s) = (dst as usize, src as usize);
    // SAFETY: the caller's contract; the addresses go to the detached closure as integers, and it
    // ends before this function returns.
    py.detach(|| unsafe { copier.copy(d as *mut u8, s as *const u8, len, nt) });
}

/// The sending end of a bulk channel: its claim, its core and its copier.
#[derive(Debug)]
pub(crate) struct BulkTx {
    core: BulkProducerCore,
    copier: Copier,
    info: ChannelInfo,
    _claim: EndClaim,
}

impl BulkTx {
    /// Claims the producer end of bulk channel `name` (as `BulkProducer::claim`, or `claim_with`
    /// when `config` is given).
    pub(crate) fn claim(mailbox: &Mailbox, name: &str, config: Option<mesh_shm::CopyConfig>) -> Result<Self, ShmError> {
        let info = mailbox.channel(name)?;
        let config = config.unwrap_or_else(|| mesh_shm::CopyConfig::for_msg_size(info.msg_size as usize));
        let ring = bulk_memory(mailbox, &info)?;
        let claim = EndClaim::take(mailbox, name, End::Producer)?;
        let copier = copier(mailbox, config)?;
        prefault(&ring);
        Ok(Self { core: BulkProducerCore::new(ring), copier, info, _claim: claim })
    }

    pub(crate) fn info(&self) -> &ChannelInfo {
        &self.info
    }

    pub(crate) fn copy_config(&self) -> mesh_shm::CopyConfig {
        self.copier.config()
    }

    /// The next slot when there is room (its address as an integer, for closures without the GIL).
    pub(crate) fn reserve(&mut self) -> Result<Option<usize>, ShmError> {
        Ok(self.core.reserve().map_err(|c| corrupt(&self.info, c))?.map(|p| p as usize))
    }

    /// The sequence number of the slot `reserve` gives.
    pub(crate) fn head(&self) -> u64 {
        self.core.head()
    }

    /// Writes `msg` (checked against the message size) into the reserved slot at `dst`, zero-padded,
    /// and publishes it.
    ///
    /// # Safety
    /// `dst` must be the address the last `reserve` gave, not yet published.
    pub(crate) unsafe fn fill_and_publish(&mut self, py: Python<'_>, dst: usize, msg: &[u8]) {
        let size = self.info.msg_size as usize;
        let dst = dst as *mut u8;
        // SAFETY: `reserve` handed the slot's `size` bytes to this end until `publish` (the caller's
        // contract); `msg` is at most `size` bytes (checked by the callers), the caller's buffer,
        // disjoint from the mapping's slot; the copier waits for its helpers.
        unsafe {
            copy(py, &mut self.copier, dst, msg.as_ptr(), msg.len(), true);
            if msg.len() < size {
                core::ptr::write_bytes(dst.add(msg.len()), 0, size - msg.len());
            }
        }
        self.core.publish();
    }

    /// Refuses a message longer than the message size.
    pub(crate) fn check_len(&self, len: usize) -> Result<(), ShmError> {
        let size = self.info.msg_size as usize;
        if len > size {
            return Err(ShmError::MessageSize { channel: self.info.name.clone(), size, got: len });
        }
        Ok(())
    }

    /// One message if there is room, with the copy's GIL rule. `Ok(false)`: full.
    pub(crate) fn try_send(&mut self, py: Python<'_>, msg: &[u8]) -> Result<bool, ShmError> {
        self.check_len(msg.len())?;
        let Some(dst) = self.reserve()? else { return Ok(false) };
        // SAFETY: `dst` was just reserved.
        unsafe { self.fill_and_publish(py, dst, msg) };
        Ok(true)
    }

    /// Publishes the slot lent to a view (written in place).
    pub(crate) fn publish(&mut self) {
        self.core.publish();
    }
}

/// The receiving end of a bulk channel.
#[derive(Debug)]
pub(crate) struct BulkRx {
    core: BulkConsumerCore,
    copier: Copier,
    info: ChannelInfo,
    _claim: EndClaim,
}

impl BulkRx {
    /// Claims the consumer end of bulk channel `name` (as `BulkConsumer::claim`, or `claim_with`
    /// when `config` is given).
    pub(crate) fn claim(mailbox: &Mailbox, name: &str, config: Option<mesh_shm::CopyConfig>) -> Result<Self, ShmError> {
        let info = mailbox.channel(name)?;
        let config = config.unwrap_or_else(|| mesh_shm::CopyConfig::for_msg_size(info.msg_size as usize));
        let ring = bulk_memory(mailbox, &info)?;
        let claim = EndClaim::take(mailbox, name, End::Consumer)?;
        let core = BulkConsumerCore::new(ring).map_err(|c| corrupt(&info, c))?;
        let copier = copier(mailbox, config)?;
        prefault(&ring);
        Ok(Self { core, copier, info, _claim: claim })
    }

    pub(crate) fn info(&self) -> &ChannelInfo {
        &self.info
    }

    pub(crate) fn copy_config(&self) -> mesh_shm::CopyConfig {
        self.copier.config()
    }

    /// The next whole message's address (an integer), if any.
    pub(crate) fn peek(&self) -> Option<usize> {
        self.core.peek().map(|p| p as usize)
    }

    /// The sequence number of the message `peek` gives.
    pub(crate) fn tail(&self) -> u64 {
        self.core.tail()
    }

    /// Refuses a buffer that is not exactly the message size.
    pub(crate) fn check_len(&self, len: usize) -> Result<(), ShmError> {
        let size = self.info.msg_size as usize;
        if len != size {
            return Err(ShmError::MessageSize { channel: self.info.name.clone(), size, got: len });
        }
        Ok(())
    }

    /// Copies the message at `src` into `out` and releases its slot.
    ///
    /// # Safety
    /// `src` must be what the last `peek` gave, not yet released; `out` exactly the message size.
    pub(crate) unsafe fn take_into(&mut self, py: Python<'_>, src: usize, out: &mut [u8]) {
        // SAFETY: `peek` handed the slot's msg_size bytes to this end until `release` (the producer
        // rewrites it only after); `out` is the caller's buffer of that size; the copier waits for
        // its helpers before returning.
        unsafe { copy(py, &mut self.copier, out.as_mut_ptr(), src as *const u8, out.len(), false) };
        self.core.release();
    }

    /// One message into `out` (exactly the message size) if one is whole. `Ok(false)`: none.
    pub(crate) fn try_recv(&mut self, py: Python<'_>, out: &mut [u8]) -> Result<bool, ShmError> {
        self.check_len(out.len())?;
        let Some(src) = self.peek() else { return Ok(false) };
        // SAFETY: `src` was just peeked; `out` has the message size (checked).
        unsafe { self.take_into(py, src, out) };
        Ok(true)
    }

    /// Releases the slot lent to a view.
    pub(crate) fn release(&mut self) {
        self.core.release();
    }
}

// ---- views ----

/// What an end and the view it lent share: whether the view is given back, and its live exports.
#[derive(Debug, Default)]
pub(crate) struct Lent {
    exports: AtomicUsize,
    done: AtomicBool,
}

impl Lent {
    pub(crate) fn exports(&self) -> usize {
        self.exports.load(Ordering::Acquire)
    }

    /// Marks the slot given back: the view exports no more.
    pub(crate) fn finish(&self) {
        self.done.store(true, Ordering::Release);
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
}

/// The end a view's slot belongs to.
#[derive(Debug)]
enum Owner {
    Tx(Py<PyProducer>),
    Rx(Py<PyConsumer>),
}

/// A slot of a bulk ring lent to Python (see the module's comment).
#[pyclass(name = "SlotView", module = "meshd", frozen)]
#[derive(Debug)]
pub(crate) struct SlotView {
    owner: Owner,
    lent: Arc<Lent>,
    /// The slot's first byte, as an integer (`Send`).
    addr: usize,
    len: usize,
    seq: u64,
    channel: String,
    /// The memoryview `__enter__` gave, released when the slot is given back.
    view: Mutex<Option<Py<PyAny>>>,
    /// Keeps the mapping (and so `addr`) valid for as long as this object, hence any export, lives.
    _mailbox: Mailbox,
}

impl SlotView {
    pub(crate) fn for_producer(end: Py<PyProducer>, lent: Arc<Lent>, addr: usize, p: &BulkTx, m: Mailbox) -> Self {
        let (len, seq, channel) = (p.info().msg_size as usize, p.head(), p.info().name.clone());
        Self { owner: Owner::Tx(end), lent, addr, len, seq, channel, view: Mutex::new(None), _mailbox: m }
    }

    pub(crate) fn for_consumer(end: Py<PyConsumer>, lent: Arc<Lent>, addr: usize, c: &BulkRx, m: Mailbox) -> Self {
        let (len, seq, channel) = (c.info().msg_size as usize, c.tail(), c.info().name.clone());
        Self { owner: Owner::Rx(end), lent, addr, len, seq, channel, view: Mutex::new(None), _mailbox: m }
    }

    fn writable(&self) -> bool {
        matches!(self.owner, Owner::Tx(_))
    }

    /// Gives the slot back: `publish` (a producer's; false discards it) or release (a consumer's).
    /// Refuses with BufferError, the slot still lent, while an export lives.
    fn give_back(&self, py: Python<'_>, publish: bool) -> PyResult<()> {
        if self.lent.is_done() {
            return Ok(());
        }
        let mine = self.view.lock().map_err(|_| PyValueError::new_err("view state poisoned"))?.take();
        if let Some(view) = mine {
            if let Err(e) = view.bind(py).call_method0("release") {
                let text = format!(
                    "channel {:?}: message {}'s slot is still exported ({}); drop the arrays and views made \
                     from it, then give it back again",
                    self.channel,
                    self.seq,
                    e.value(py)
                );
                *self.view.lock().map_err(|_| PyValueError::new_err("view state poisoned"))? = Some(view);
                return Err(PyBufferError::new_err(text));
            }
        }
        let live = self.lent.exports();
        if live > 0 {
            return Err(PyBufferError::new_err(format!(
                "channel {:?}: message {}'s slot has {live} live export(s) (a numpy array or memoryview made from \
                 the view); drop them, then give it back again",
                self.channel, self.seq
            )));
        }
        match &self.owner {
            Owner::Tx(end) => end.bind(py).try_borrow_mut()?.finish_view(&self.lent, publish),
            Owner::Rx(end) => end.bind(py).try_borrow_mut()?.finish_view(&self.lent, true),
        }
        Ok(())
    }

    fn memoryview(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let this = slf.get();
        if this.lent.is_done() {
            return Err(PyValueError::new_err(format!(
                "channel {:?}: message {}'s slot was given back",
                this.channel, this.seq
            )));
        }
        let mut mine = this.view.lock().map_err(|_| PyValueError::new_err("view state poisoned"))?;
        if let Some(v) = mine.as_ref() {
            return Ok(v.clone_ref(slf.py()));
        }
        let view = PyMemoryView::from(slf.as_any())?.into_any().unbind();
        *mine = Some(view.clone_ref(slf.py()));
        Ok(view)
    }
}

impl Drop for SlotView {
    /// A view dropped without being given back (never entered, or its end busy): the slot is
    /// abandoned as it is (a producer's not published, a consumer's not released: that message
    /// comes again), so that the end is free again. No export can live here: each holds this object.
    fn drop(&mut self) {
        if self.lent.is_done() {
            return;
        }
        Python::attach(|py| match &self.owner {
            Owner::Tx(end) => {
                if let Ok(mut p) = end.bind(py).try_borrow_mut() {
                    p.finish_view(&self.lent, false);
                }
            }
            Owner::Rx(end) => {
                if let Ok(mut c) = end.bind(py).try_borrow_mut() {
                    c.abandon_view(&self.lent);
                }
            }
        });
    }
}

#[pymethods]
impl SlotView {
    /// A memoryview of the slot (writable for a producer's, read-only for a consumer's).
    fn __enter__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        Self::memoryview(slf)
    }

    /// A producer's slot is published when the block ends normally and discarded (not published: the
    /// next send reuses it) when it raises; a consumer's is released either way. BufferError while an
    /// export of the view lives (the slot then stays lent: drop the exports and call
    /// `publish`/`discard`/`release`).
    fn __exit__(
        &self,
        py: Python<'_>,
        t: &Bound<'_, PyAny>,
        _v: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.give_back(py, t.is_none())?;
        Ok(false)
    }

    /// The slot as a memoryview (the same one `__enter__` gives).
    #[getter]
    fn view(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        Self::memoryview(slf)
    }

    /// Publishes a producer's slot as the next message.
    fn publish(&self, py: Python<'_>) -> PyResult<()> {
        self.done_check("publish")?;
        if !self.writable() {
            return Err(PyValueError::new_err("publish: a received message's view is released, not published"));
        }
        self.give_back(py, true)
    }

    /// Gives a producer's slot back unpublished (the next send reuses it).
    fn discard(&self, py: Python<'_>) -> PyResult<()> {
        self.done_check("discard")?;
        if !self.writable() {
            return Err(PyValueError::new_err("discard: a received message's view is released, not discarded"));
        }
        self.give_back(py, false)
    }

    /// Hands a consumer's slot back to the producer (the message is consumed).
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        self.done_check("release")?;
        if self.writable() {
            return Err(PyValueError::new_err("release: a producer's view is published or discarded"));
        }
        self.give_back(py, true)
    }

    /// The message's sequence number in its channel.
    #[getter]
    fn seq(&self) -> u64 {
        self.seq
    }

    /// The slot's size in bytes (the channel's message size).
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    /// Whether the view is read-only (a received message's).
    #[getter]
    fn readonly(&self) -> bool {
        !self.writable()
    }

    /// Whether the slot was given back.
    #[getter]
    fn done(&self) -> bool {
        self.lent.is_done()
    }

    /// Live exports of the slot (memoryviews and arrays made from it, the one `__enter__` gave included).
    #[getter]
    fn exports(&self) -> usize {
        self.lent.exports()
    }

    /// # Safety
    /// Called by Python's buffer protocol with a `Py_buffer` to fill.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut pyo3::ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let this = slf.get();
        if this.lent.is_done() {
            return Err(PyBufferError::new_err(format!(
                "channel {:?}: message {}'s slot was given back; its view exports nothing",
                this.channel, this.seq
            )));
        }
        let len = pyo3::ffi::Py_ssize_t::try_from(this.len).map_err(|_| PyBufferError::new_err("slot too large"))?;
        let readonly = c_int::from(!this.writable());
        // SAFETY: `view` is the Py_buffer Python passed to fill; the slot's `len` bytes at `addr` stay
        // valid while the export lives (the export holds this object, which holds the mapping, and
        // the slot is not given back while `exports` > 0); FillInfo takes its own reference to the
        // object, refuses a writable request on a read-only slot, and fills a 1-D byte buffer.
        let rc = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(view, slf.as_ptr(), this.addr as *mut std::ffi::c_void, len, readonly, flags)
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        this.lent.exports.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// # Safety
    /// Called by Python's buffer protocol when an export of this object ends.
    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.lent.exports.fetch_sub(1, Ordering::AcqRel);
    }

    fn __repr__(&self) -> String {
        let state = if self.lent.is_done() { ", given back" } else { "" };
        let kind = if self.writable() { "send" } else { "recv" };
        format!("SlotView({:?}, {kind}, seq={}, nbytes={}{state})", self.channel, self.seq, self.len)
    }
}

impl SlotView {
    fn done_check(&self, op: &str) -> PyResult<()> {
        if self.lent.is_done() {
            return Err(PyValueError::new_err(format!(
                "{op}: channel {:?}: message {}'s slot was already given back",
                self.channel, self.seq
            )));
        }
        Ok(())
    }
}
