//! The host ends of a bulk channel (protocol bulk) for Python, and the views that lend a ring slot to Python.
//!
//! These ends are mesh-shm's `BulkProducer`/`BulkConsumer` (the claim, the ring's pages mapped at
//! claim, `CopyConfig::for_producer` or `for_msg_size` unless the caller gives a `CopyConfig`: so a change of the Rust
//! ends reaches Python without a change here), driven through their split calls: `try_reserve` then
//! `publish`/`discard`, `try_peek` then `release`/`unpeek`. What is added here is Python's: the
//! copies of more than [`GIL_FREE_COPY`] bytes are made with the GIL released, and a slot is lent
//! across a `with` block.
//!
//! **One GIL release per blocking call.** A blocking `send`/`recv_into`/`send_batch`/`recv_batch`
//! of such messages waits, copies and publishes (releases) in one stretch without the GIL
//! (`try_send_here`, `try_recv_here`, the `_records` calls), not a wait, a reacquisition, then a
//! second release for the copy: with two Python threads streaming (a sender and a receiver, as
//! through a GPU echo), every reacquisition the other thread holds the GIL for is a futex sleep
//! and wake-up, and it fell on the critical path, between a slot coming free (a message becoming
//! whole) and its copy starting.
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

use mesh_shm::{BulkConsumer, BulkProducer, ChannelInfo, Mailbox, Peeked, Reserved, ShmError};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyMemoryView;

use crate::errors::shm_err;
use mesh_shm::Protocol;

/// Copies of more bytes than this are made with the GIL released (below, releasing it costs more
/// than the copy).
pub(crate) const GIL_FREE_COPY: usize = 4096;

/// The most threads a `CopyConfig` may ask to copy one message (a DRAM-bound copy gains nothing
/// from more; the H200 host's best was 8).
pub(crate) const MAX_COPY_THREADS: usize = 64;

/// The copy settings of a bulk end: `mesh_shm::CopyConfig`, each field not given taking the value of
/// `CopyConfig.default()`; `threads` is 1 to 64 (ValueError otherwise). An end claimed without one
/// uses the Rust host end's choice by message size instead: a producer `CopyConfig.for_producer`,
/// a consumer `CopyConfig.for_msg_size`.
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
    fn new(threads: Option<usize>, min_part: Option<usize>, non_temporal: Option<bool>) -> PyResult<Self> {
        // Starting from Rust's defaults, so that fields mesh-shm adds later keep theirs.
        let mut inner = mesh_shm::CopyConfig::default();
        if let Some(t) = threads {
            // Checked here, not at the claim: an end starts `threads - 1` helper threads, and a
            // count the system cannot start failed there as an OSError about a copy thread.
            if !(1..=MAX_COPY_THREADS).contains(&t) {
                return Err(PyValueError::new_err(format!(
                    "CopyConfig threads {t}: expected 1 to {MAX_COPY_THREADS} (the threads copying one message, the caller's included)"
                )));
            }
            inner.threads = t;
        }
        if let Some(m) = min_part {
            inner.min_part = m;
        }
        if let Some(nt) = non_temporal {
            inner.non_temporal = nt;
        }
        Ok(Self { inner })
    }

    /// `mesh_shm::CopyConfig::default()`.
    #[staticmethod]
    fn default() -> Self {
        Self { inner: mesh_shm::CopyConfig::default() }
    }

    /// What a bulk consumer claimed without a `copy_config` uses for `msg_size`-byte messages (the
    /// Rust host end's choice by size, `mesh_shm::CopyConfig::for_msg_size`, on this machine's CPUs).
    #[staticmethod]
    fn for_msg_size(msg_size: usize) -> Self {
        Self { inner: mesh_shm::CopyConfig::for_msg_size(msg_size) }
    }

    /// What a bulk producer claimed without a `copy_config` uses (`mesh_shm::CopyConfig::for_producer`:
    /// four streaming threads from 256 KiB to 4 MiB, otherwise as `for_msg_size`).
    #[staticmethod]
    fn for_producer(msg_size: usize) -> Self {
        Self { inner: mesh_shm::CopyConfig::for_producer(msg_size) }
    }

    /// Threads copying one message together, the caller's included.
    #[getter]
    fn threads(&self) -> usize {
        self.inner.threads
    }

    /// The smallest share of a message worth another thread, in bytes.
    #[getter]
    fn min_part(&self) -> usize {
        self.inner.min_part
    }

    /// Streaming stores into the ring (the producer's copy).
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

/// The sending end of a bulk channel: mesh-shm's, its copies made with the GIL released above
/// [`GIL_FREE_COPY`] bytes.
#[derive(Debug)]
pub(crate) struct BulkTx {
    end: BulkProducer,
}

impl BulkTx {
    /// Claims the producer end of bulk channel `name` (`BulkProducer::claim`, or `claim_with` when
    /// `config` is given).
    pub(crate) fn claim(mailbox: &Mailbox, name: &str, config: Option<mesh_shm::CopyConfig>) -> Result<Self, ShmError> {
        let end = match config {
            Some(config) => BulkProducer::claim_with(mailbox, name, config)?,
            None => BulkProducer::claim(mailbox, name)?,
        };
        Ok(Self { end })
    }

    pub(crate) fn info(&self) -> &ChannelInfo {
        self.end.info()
    }

    pub(crate) fn copy_config(&self) -> mesh_shm::CopyConfig {
        self.end.copy_config()
    }

    /// Reserves the next slot when there is room (`BulkProducer::try_reserve`).
    pub(crate) fn reserve(&mut self) -> Result<Option<Reserved>, ShmError> {
        self.end.try_reserve()
    }

    /// Refuses a message longer than the message size.
    pub(crate) fn check_len(&self, len: usize) -> Result<(), ShmError> {
        self.end.check_len(len)
    }

    /// Writes `msg` into the reserved slot, zero-padded, and publishes it; a write refused (a message
    /// too long) discards the slot.
    pub(crate) fn fill_and_publish(&mut self, py: Python<'_>, msg: &[u8]) -> Result<(), ShmError> {
        if msg.len() <= GIL_FREE_COPY {
            return self.fill_reserved_and_publish(msg);
        }
        py.detach(|| self.fill_reserved_and_publish(msg))
    }

    /// One message if there is room, with the copy's GIL rule. `Ok(false)`: full.
    pub(crate) fn try_send(&mut self, py: Python<'_>, msg: &[u8]) -> Result<bool, ShmError> {
        if msg.len() <= GIL_FREE_COPY {
            return self.end.try_send(msg);
        }
        self.check_len(msg.len())?;
        if self.reserve()?.is_none() {
            return Ok(false);
        }
        self.fill_and_publish(py, msg)?;
        Ok(true)
    }

    /// One message if there is room: check, reserve, copy, publish, all here. For a caller that has
    /// released the GIL (a blocking send's wait), so that the copy starts the moment a slot frees,
    /// not after a GIL handoff.
    pub(crate) fn try_send_here(&mut self, msg: &[u8]) -> Result<bool, ShmError> {
        self.end.try_send(msg)
    }

    /// As many `size`-byte records of `all` as there is room for, one message each; how many. The
    /// copies are made here (a caller copying more than [`GIL_FREE_COPY`] bytes releases the GIL
    /// around the call).
    pub(crate) fn try_send_records(&mut self, all: &[u8], size: usize) -> Result<usize, ShmError> {
        check_records(self.info(), all.len(), size)?;
        let mut n = 0;
        for msg in all.chunks_exact(size) {
            if !self.end.try_send(msg)? {
                break;
            }
            n += 1;
        }
        Ok(n)
    }

    /// `try_send_records` with the copy's GIL rule: records above [`GIL_FREE_COPY`] are copied in one
    /// stretch without the GIL (one release for the batch, not one per record), taken only when
    /// there is room for the first (a full ring costs no GIL round trip).
    pub(crate) fn try_send_batch(&mut self, py: Python<'_>, all: &[u8], size: usize) -> Result<usize, ShmError> {
        check_records(self.info(), all.len(), size)?;
        if size <= GIL_FREE_COPY || all.is_empty() {
            return self.try_send_records(all, size);
        }
        if self.reserve()?.is_none() {
            return Ok(0);
        }
        py.detach(|| {
            let (first, rest) = all.split_at(size);
            self.fill_reserved_and_publish(first)?;
            Ok(1 + self.try_send_records(rest, size)?)
        })
    }

    /// Writes `msg` into the reserved slot and publishes it, wherever the caller stands with the GIL;
    /// a write refused discards the slot.
    fn fill_reserved_and_publish(&mut self, msg: &[u8]) -> Result<(), ShmError> {
        if let Err(e) = self.end.write_reserved(msg) {
            let _ = self.end.discard();
            return Err(e);
        }
        self.end.publish().map(drop)
    }

    /// Publishes the slot lent to a view (written in place).
    pub(crate) fn publish(&mut self) -> Result<(), ShmError> {
        self.end.publish().map(drop)
    }

    /// Gives the slot lent to a view back unpublished (the next send reuses it).
    pub(crate) fn discard(&mut self) -> Result<(), ShmError> {
        self.end.discard()
    }
}

/// The receiving end of a bulk channel: mesh-shm's, its copies made with the GIL released above
/// [`GIL_FREE_COPY`] bytes.
#[derive(Debug)]
pub(crate) struct BulkRx {
    end: BulkConsumer,
}

impl BulkRx {
    /// Claims the consumer end of bulk channel `name` (`BulkConsumer::claim`, or `claim_with` when
    /// `config` is given).
    pub(crate) fn claim(mailbox: &Mailbox, name: &str, config: Option<mesh_shm::CopyConfig>) -> Result<Self, ShmError> {
        let end = match config {
            Some(config) => BulkConsumer::claim_with(mailbox, name, config)?,
            None => BulkConsumer::claim(mailbox, name)?,
        };
        Ok(Self { end })
    }

    pub(crate) fn info(&self) -> &ChannelInfo {
        self.end.info()
    }

    pub(crate) fn copy_config(&self) -> mesh_shm::CopyConfig {
        self.end.copy_config()
    }

    /// The next whole message, if any (`BulkConsumer::try_peek`).
    pub(crate) fn peek(&mut self) -> Result<Option<Peeked>, ShmError> {
        self.end.try_peek()
    }

    /// Refuses a buffer that is not exactly the message size.
    pub(crate) fn check_len(&self, len: usize) -> Result<(), ShmError> {
        self.end.check_len(len)
    }

    /// Copies the peeked message into `out` (exactly the message size) and releases its slot; a
    /// read refused (a buffer of another size) unpeeks the message instead.
    pub(crate) fn take_into(&mut self, py: Python<'_>, out: &mut [u8]) -> Result<(), ShmError> {
        if out.len() <= GIL_FREE_COPY {
            return self.take_peeked(out);
        }
        py.detach(|| self.take_peeked(out))
    }

    /// One message into `out` (exactly the message size) if one is whole. `Ok(false)`: none.
    pub(crate) fn try_recv(&mut self, py: Python<'_>, out: &mut [u8]) -> Result<bool, ShmError> {
        if out.len() <= GIL_FREE_COPY {
            return self.end.try_recv(out);
        }
        self.check_len(out.len())?;
        if self.peek()?.is_none() {
            return Ok(false);
        }
        self.take_into(py, out)?;
        Ok(true)
    }

    /// One message into `out` if one is whole: check, peek, copy, release, all here. For a caller
    /// that has released the GIL (a blocking receive's wait), so that the copy starts the moment
    /// the message is whole, not after a GIL handoff.
    pub(crate) fn try_recv_here(&mut self, out: &mut [u8]) -> Result<bool, ShmError> {
        self.end.try_recv(out)
    }

    /// As many whole messages as wait and fit in `out` (a multiple of `size` bytes), one copy each;
    /// how many. The copies are made here (a caller copying more than [`GIL_FREE_COPY`] bytes
    /// releases the GIL around the call).
    pub(crate) fn try_recv_records(&mut self, out: &mut [u8], size: usize) -> Result<usize, ShmError> {
        check_records(self.info(), out.len(), size)?;
        let mut n = 0;
        for msg in out.chunks_exact_mut(size) {
            if !self.end.try_recv(msg)? {
                break;
            }
            n += 1;
        }
        Ok(n)
    }

    /// `try_recv_records` with the copy's GIL rule: messages above [`GIL_FREE_COPY`] are copied in
    /// one stretch without the GIL, taken only when the first is whole (an empty ring costs no GIL
    /// round trip).
    pub(crate) fn try_recv_batch(&mut self, py: Python<'_>, out: &mut [u8], size: usize) -> Result<usize, ShmError> {
        check_records(self.info(), out.len(), size)?;
        if size <= GIL_FREE_COPY || out.is_empty() {
            return self.try_recv_records(out, size);
        }
        if self.peek()?.is_none() {
            return Ok(0);
        }
        py.detach(|| {
            let (first, rest) = out.split_at_mut(size);
            self.take_peeked(first)?;
            Ok(1 + self.try_recv_records(rest, size)?)
        })
    }

    /// Copies the peeked message into `out` and releases it, wherever the caller stands with the
    /// GIL; a read refused unpeeks it.
    fn take_peeked(&mut self, out: &mut [u8]) -> Result<(), ShmError> {
        if let Err(e) = self.end.read_peeked(out) {
            let _ = self.end.unpeek();
            return Err(e);
        }
        self.end.release().map(drop)
    }

    /// Releases the slot lent to a view.
    pub(crate) fn release(&mut self) -> Result<(), ShmError> {
        self.end.release().map(drop)
    }

    /// Gives the message lent to a view back unreleased (it comes again).
    pub(crate) fn unpeek(&mut self) -> Result<(), ShmError> {
        self.end.unpeek()
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

/// The end a view's slot belongs to (a `Producer` or a `Consumer`): what the view gives its slot
/// back to. The ends implement it, so that this module, beneath them, names neither.
pub(crate) trait SlotOwner: std::fmt::Debug + Send + Sync {
    /// Gives the slot back: a producer's published (`publish` false: discarded), a consumer's
    /// released. Refused while the end is in use (borrowed).
    fn give_back(&self, py: Python<'_>, lent: &Arc<Lent>, publish: bool) -> PyResult<Result<(), ShmError>>;
    /// The view is dropped without being given back: a producer's slot is discarded, a consumer's
    /// message unpeeked (it comes again). Nothing when the end is in use.
    fn abandon(&self, py: Python<'_>, lent: &Arc<Lent>);
}

/// A bulk ring's slot lent to Python in place: `with` gives a memoryview of it, writable for a
/// producer's slot (`send_view`: it holds whatever a message a lap ago left there, so write every
/// byte the consumer reads) and read-only for a consumer's message (`recv_view`). Given back when
/// the block ends: a producer's published (discarded when the block raises), a consumer's released.
/// Giving it back while an export of the view lives (an array from `numpy.frombuffer`, another
/// memoryview) raises BufferError and keeps it lent: drop them, then call `publish`, `discard` or
/// `release`. Dropped without being given back, a producer's slot is not published and a consumer's
/// message is not released (it comes again).
#[pyclass(name = "SlotView", module = "meshd", frozen)]
#[derive(Debug)]
pub(crate) struct SlotView {
    owner: Box<dyn SlotOwner>,
    /// A producer's slot (writable), else a consumer's message (read-only).
    writable: bool,
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
    /// A view of the slot `slot` that the producer `end` reserved.
    pub(crate) fn for_producer(
        end: Box<dyn SlotOwner>,
        lent: Arc<Lent>,
        slot: Reserved,
        channel: String,
        m: Mailbox,
    ) -> Self {
        let (addr, len, seq) = (slot.as_mut_ptr() as usize, slot.len(), slot.seq());
        Self { owner: end, writable: true, lent, addr, len, seq, channel, view: Mutex::new(None), _mailbox: m }
    }

    /// A view of the message `msg` that the consumer `end` peeked.
    pub(crate) fn for_consumer(
        end: Box<dyn SlotOwner>,
        lent: Arc<Lent>,
        msg: Peeked,
        channel: String,
        m: Mailbox,
    ) -> Self {
        let (addr, len, seq) = (msg.as_ptr() as usize, msg.len(), msg.seq());
        Self { owner: end, writable: false, lent, addr, len, seq, channel, view: Mutex::new(None), _mailbox: m }
    }

    fn writable(&self) -> bool {
        self.writable
    }

    /// Gives the slot back: `publish` (a producer's; false discards it) or release (a consumer's).
    /// Refuses with BufferError, the slot still lent, while an export lives.
    fn give_back(&self, py: Python<'_>, publish: bool) -> PyResult<()> {
        if self.lent.is_done() {
            return Ok(());
        }
        let mine = self.view.lock().map_err(|_| PyValueError::new_err("view state poisoned"))?.take();
        if let Some(view) = mine
            && let Err(e) = view.bind(py).call_method0(pyo3::intern!(py, "release"))
        {
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
        let live = self.lent.exports();
        if live > 0 {
            return Err(PyBufferError::new_err(format!(
                "channel {:?}: message {}'s slot has {live} live export(s) (a numpy array or memoryview made from \
                 the view); drop them, then give it back again",
                self.channel, self.seq
            )));
        }
        self.owner.give_back(py, &self.lent, publish)?.map_err(|e| shm_err(py, e))
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
        Python::attach(|py| self.owner.abandon(py, &self.lent));
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
        // SAFETY: `view` is the Py_buffer Python passed to fill. The slot's `len` bytes at `addr` are a
        // mesh-shm `Reserved`/`Peeked` and stay valid under its contract while the export lives: the
        // export holds this object, which holds the mapping; the slot is not published, discarded or
        // released while `exports` > 0 (`give_back` refuses), nor is the end dropped (its `close`
        // refuses, and a view given back exports no more: checked above). FillInfo takes its own
        // reference to the object, refuses a writable request on a read-only slot, and fills a 1-D
        // byte buffer.
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

/// Refuses a batch (to send) or a buffer (to receive into) that is not whole `size`-byte messages.
fn check_records(info: &ChannelInfo, len: usize, size: usize) -> Result<(), ShmError> {
    if size == 0 || !len.is_multiple_of(size) {
        return Err(ShmError::MessageSize { channel: info.name.clone(), size, got: len % size.max(1) });
    }
    Ok(())
}

/// The refusal of an in-place view on a channel whose format has none.
pub(crate) fn no_views(name: &str, protocol: Protocol, op: &str) -> PyErr {
    PyValueError::new_err(format!(
        "channel {name:?}: {op} lends a slot in place, which only bulk channels have (protocol {protocol} \
         interleaves its own words with the payload or reuses slots as it goes); use send / recv_into"
    ))
}

/// The refusal of a call on an end that lent a slot not yet given back.
pub(crate) fn busy(name: &str, lent: &Lent, what: &str) -> PyErr {
    PyBufferError::new_err(format!(
        "channel {name:?}: a {what} is still open ({} export(s) live); give it back first \
         (leave its with block, or call publish / discard / release)",
        lent.exports()
    ))
}
