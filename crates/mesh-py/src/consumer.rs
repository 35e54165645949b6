//! `Consumer`: the receiving end of a channel of any protocol (ll, index: mesh-shm's `Consumer`; bulk: `bulk`'s end, which also lends a message as a view).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mesh_shm::{Consumer, End, Mailbox, Peeked, Protocol, ShmError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::bulk::{BulkRx, GIL_FREE_COPY, Lent, PyCopyConfig, SlotOwner, SlotView, busy, no_views};
use crate::bytes::{Bytes, new_bytes};
use crate::end::{EndInfo, Origin};
use crate::errors::{check_records, shm_err};
use crate::mapped::{PyMailbox, protocol_name};
use crate::waits::{aio, deadline, timed_out, wait_for};

/// A consumer's ring end, by the channel's protocol.
#[derive(Debug)]
pub(crate) enum RxEnd {
    /// Protocols ll and index: mesh-shm's `Consumer`.
    Ring(Consumer),
    /// Protocol bulk.
    Bulk(BulkRx),
}

/// The receiving end of a channel (any protocol), claimed for this process until closed.
#[pyclass(name = "Consumer", module = "meshd")]
#[derive(Debug)]
pub(crate) struct PyConsumer {
    pub(crate) inner: Option<RxEnd>,
    pub(crate) info: EndInfo,
    pub(crate) origin: Origin,
    pub(crate) protocol: Protocol,
    pub(crate) mailbox: Mailbox,
    /// The slot lent to a `recv_view`, until it is given back.
    pub(crate) lent: Option<Arc<Lent>>,
}

impl PyConsumer {
    pub(crate) fn end(&mut self) -> PyResult<&mut RxEnd> {
        if self.origin.inherited() {
            self.origin.forget_inherited(&mut self.inner);
            return Err(self.origin.refusal(&self.info.name, "Consumer", "consumer"));
        }
        if let Some(lent) = &self.lent {
            return Err(busy(&self.info.name, lent, "recv_view"));
        }
        let name = &self.info.name;
        self.inner.as_mut().ok_or_else(|| PyValueError::new_err(format!("channel {name:?}: consumer is closed")))
    }

    /// The view `lent` is given back: its slot released to the producer.
    /// (`release` false: unpeeked instead, the message staying in the ring to come again.)
    pub(crate) fn finish_view(&mut self, lent: &Arc<Lent>, release: bool) -> Result<(), ShmError> {
        if self.origin.inherited() {
            // A view inherited through fork(): its slot is the parent's to release.
            return Err(self.origin.end_inherited_view(
                &mut self.inner,
                &mut self.lent,
                lent,
                &self.info.name,
                End::Consumer,
            ));
        }
        let mut done = Ok(());
        if self.lent.as_ref().is_some_and(|l| Arc::ptr_eq(l, lent)) {
            if let Some(RxEnd::Bulk(b)) = self.inner.as_mut() {
                done = if release { b.release() } else { b.unpeek() };
            }
            self.lent = None;
        }
        lent.finish();
        done
    }

    /// The view `lent` is dropped unreleased: the message stays in the ring and comes again.
    pub(crate) fn abandon_view(&mut self, lent: &Arc<Lent>) -> Result<(), ShmError> {
        self.finish_view(lent, false)
    }

    /// A view of the message `peek` lent.
    pub(crate) fn lend(slf: &Bound<'_, Self>, msg: Peeked) -> PyResult<SlotView> {
        let mut this = slf.borrow_mut();
        let lent = Arc::new(Lent::default());
        let mailbox = this.mailbox.clone();
        let view = SlotView::for_consumer(
            Box::new(ConsumerSlot(slf.clone().unbind())),
            lent.clone(),
            msg,
            this.info.name.clone(),
            mailbox,
        );
        this.lent = Some(lent);
        Ok(view)
    }

    pub(crate) fn bulk_for_view(&mut self, op: &str) -> PyResult<&mut BulkRx> {
        let (name, protocol) = (self.info.name.clone(), self.protocol);
        match self.end()? {
            RxEnd::Bulk(b) => Ok(b),
            RxEnd::Ring(_) => Err(no_views(&name, protocol, op)),
        }
    }
}

/// One message into `out`, waiting (the GIL released) until the deadline; false when it passed.
pub(crate) fn recv_one(
    py: Python<'_>,
    end: &mut RxEnd,
    out: &mut [u8],
    deadline: Option<(Instant, Duration)>,
) -> PyResult<bool> {
    match end {
        RxEnd::Ring(end) => {
            if end.try_recv(out).map_err(|e| shm_err(py, e))? {
                return Ok(true);
            }
            Ok(wait_for(py, deadline, || Ok(end.try_recv(out)?.then_some(())))?.is_some())
        }
        RxEnd::Bulk(b) => {
            // As a bulk `send`: a message the GIL rule copies with the GIL held is first tried that
            // way; otherwise the wait and the copy run in one stretch without the GIL, so that the
            // copy starts the moment the message is whole.
            if out.len() <= GIL_FREE_COPY && b.try_recv(py, out).map_err(|e| shm_err(py, e))? {
                return Ok(true);
            }
            Ok(wait_for(py, deadline, || Ok(b.try_recv_here(out)?.then_some(())))?.is_some())
        }
    }
}

/// As many whole messages as wait and fit in `out` (bulk: one copy each); how many.
pub(crate) fn try_recv_batch_any(
    py: Python<'_>,
    end: &mut RxEnd,
    out: &mut [u8],
    size: usize,
) -> Result<usize, ShmError> {
    match end {
        RxEnd::Ring(c) => c.try_recv_batch(out),
        RxEnd::Bulk(b) => b.try_recv_batch(py, out, size),
    }
}

#[pymethods]
impl PyConsumer {
    /// Claims the consumer end of channel `name`, whatever its protocol. `copy_config` (bulk
    /// channels): how messages are copied out of the ring; None: the Rust host end's choice by size.
    #[new]
    #[pyo3(signature = (mailbox, name, copy_config=None))]
    pub(crate) fn new(
        py: Python<'_>,
        mailbox: &PyMailbox,
        name: &str,
        copy_config: Option<PyRef<'_, PyCopyConfig>>,
    ) -> PyResult<Self> {
        let mb = &mailbox.inner;
        let info = mb.channel(name).map_err(|e| shm_err(py, e))?;
        let inner = if info.protocol == Protocol::Bulk {
            let config = copy_config.map(|c| c.inner);
            RxEnd::Bulk(BulkRx::claim(mb, name, config).map_err(|e| shm_err(py, e))?)
        } else {
            RxEnd::Ring(Consumer::claim(mb, name).map_err(|e| shm_err(py, e))?)
        };
        let info = match &inner {
            RxEnd::Ring(c) => c.info(),
            RxEnd::Bulk(b) => b.info(),
        };
        Ok(Self {
            info: EndInfo::from(info),
            origin: Origin::here(),
            protocol: info.protocol,
            inner: Some(inner),
            mailbox: mb.clone(),
            lent: None,
        })
    }

    /// The channel's name.
    #[getter]
    fn name(&self) -> &str {
        &self.info.name
    }

    /// Bytes per message.
    #[getter]
    fn msg_size(&self) -> u32 {
        self.info.msg_size
    }

    /// Messages the ring holds.
    #[getter]
    fn capacity(&self) -> u32 {
        self.info.capacity
    }

    /// The channel's protocol: "ll", "bulk" or "index".
    #[getter]
    fn protocol(&self) -> &'static str {
        protocol_name(self.protocol)
    }

    /// How a bulk end copies (None for ll and index channels).
    #[getter]
    fn copy_config(&self) -> Option<PyCopyConfig> {
        match self.inner.as_ref()? {
            RxEnd::Bulk(b) => Some(PyCopyConfig { inner: b.copy_config() }),
            RxEnd::Ring(_) => None,
        }
    }

    /// One message as bytes (`msg_size` long), or None when none is waiting. Keeps the GIL, but
    /// for a bulk copy of more than 4 KiB.
    fn try_recv<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let size = self.info.msg_size as usize;
        let end = self.end()?;
        new_bytes(py, size, |out| {
            match end {
                RxEnd::Ring(c) => c.try_recv(out),
                RxEnd::Bulk(b) => b.try_recv(py, out),
            }
            .map_err(|e| shm_err(py, e))
        })
    }

    /// One message as bytes, waiting (the GIL released) until `timeout` seconds pass (None: for ever).
    #[pyo3(signature = (timeout=None))]
    fn recv<'py>(&mut self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyBytes>> {
        let deadline = deadline(timeout)?;
        let name = self.info.name.clone();
        let size = self.info.msg_size as usize;
        let end = self.end()?;
        PyBytes::new_with(py, size, |out| {
            if recv_one(py, end, out, deadline)? { Ok(()) } else { Err(timed_out(py, &name, "recv", deadline)) }
        })
    }

    /// Receives one message into `buffer` (writable, C-contiguous, exactly `msg_size` bytes);
    /// False when none is waiting. Keeps the GIL, but for a bulk copy of more than 4 KiB.
    fn try_recv_into(&mut self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<bool> {
        let mut bytes = Bytes::get(buffer, "recv_into", true)?;
        match self.end()? {
            RxEnd::Ring(c) => c.try_recv(bytes.as_mut_slice()),
            RxEnd::Bulk(b) => b.try_recv(py, bytes.as_mut_slice()),
        }
        .map_err(|e| shm_err(py, e))
    }

    /// Receives one message into `buffer`, waiting (the GIL released) until `timeout` seconds pass.
    #[pyo3(signature = (buffer, timeout=None))]
    fn recv_into(&mut self, py: Python<'_>, buffer: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        let mut bytes = Bytes::get(buffer, "recv_into", true)?;
        let deadline = deadline(timeout)?;
        if recv_one(py, self.end()?, bytes.as_mut_slice(), deadline)? {
            Ok(())
        } else {
            Err(timed_out(py, &self.info.name, "recv", deadline))
        }
    }

    /// Receives as many whole messages as are waiting and fit in `buffer` (writable, a multiple of
    /// `msg_size` bytes), publishing once (a bulk channel: each); returns how many (0: none waiting).
    fn try_recv_batch(&mut self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let mut bytes = Bytes::get(buffer, "recv_batch", true)?;
        let size = self.info.msg_size as usize;
        check_records(py, &self.info.name, size, bytes.as_mut_slice().len(), "recv_batch", false)?;
        try_recv_batch_any(py, self.end()?, bytes.as_mut_slice(), size).map_err(|e| shm_err(py, e))
    }

    /// Receives at least one message into `buffer` (as `try_recv_batch`), waiting until `timeout`
    /// seconds pass; returns how many.
    #[pyo3(signature = (buffer, timeout=None))]
    fn recv_batch(&mut self, py: Python<'_>, buffer: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<usize> {
        let mut bytes = Bytes::get(buffer, "recv_batch", true)?;
        let deadline = deadline(timeout)?;
        let out = bytes.as_mut_slice();
        let size = self.info.msg_size as usize;
        check_records(py, &self.info.name, size, out.len(), "recv_batch", false)?;
        let end = self.end()?;
        // The first attempt with the GIL held, but for bulk messages the GIL rule copies without it:
        // those wait and copy in one stretch without the GIL (see a bulk `send`).
        let gil_held_first = match end {
            RxEnd::Ring(_) => true,
            RxEnd::Bulk(_) => size <= GIL_FREE_COPY,
        };
        if gil_held_first {
            let n = try_recv_batch_any(py, end, out, size).map_err(|e| shm_err(py, e))?;
            if n > 0 {
                return Ok(n);
            }
        }
        let got = match end {
            RxEnd::Ring(c) => wait_for(py, deadline, || {
                let n = c.try_recv_batch(out)?;
                Ok((n > 0).then_some(n))
            })?,
            RxEnd::Bulk(b) => wait_for(py, deadline, || {
                let n = b.try_recv_records(out, size)?;
                Ok((n > 0).then_some(n))
            })?,
        };
        got.ok_or_else(|| timed_out(py, &self.info.name, "recv", deadline))
    }

    /// The next message in place (bulk channels), waiting until `timeout` seconds pass: a context
    /// manager whose `__enter__` gives a read-only memoryview of the slot (`numpy.frombuffer` on it
    /// copies nothing). Released to the producer when the block ends, normally or not; BufferError
    /// then if an array or memoryview made from it still lives (the slot stays held until `release`).
    #[pyo3(signature = (timeout=None))]
    fn recv_view(slf: &Bound<'_, Self>, timeout: Option<f64>) -> PyResult<SlotView> {
        let py = slf.py();
        let deadline = deadline(timeout)?;
        let msg = {
            let mut this = slf.borrow_mut();
            let name = this.info.name.clone();
            let b = this.bulk_for_view("recv_view")?;
            match b.peek().map_err(|e| shm_err(py, e))? {
                Some(a) => a,
                None => match wait_for(py, deadline, || b.peek())? {
                    Some(a) => a,
                    None => return Err(timed_out(py, &name, "recv", deadline)),
                },
            }
        };
        Self::lend(slf, msg)
    }

    /// `recv_view` without waiting: None when no message is whole. Keeps the GIL.
    fn try_recv_view(slf: &Bound<'_, Self>) -> PyResult<Option<SlotView>> {
        let py = slf.py();
        let msg = slf.borrow_mut().bulk_for_view("try_recv_view")?.peek().map_err(|e| shm_err(py, e))?;
        msg.map(|m| Self::lend(slf, m)).transpose()
    }

    /// `await consumer.arecv(timeout)`: `recv` for asyncio, polling from the event loop (no thread).
    #[pyo3(signature = (timeout=None))]
    fn arecv<'py>(slf: Bound<'py, Self>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        aio(slf.py(), "arecv")?.call1((slf, timeout))
    }

    /// `await consumer.arecv_into(buffer, timeout)`: `recv_into` for asyncio, polling from the event loop.
    #[pyo3(signature = (buffer, timeout=None))]
    fn arecv_into<'py>(
        slf: Bound<'py, Self>,
        buffer: Bound<'py, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        aio(slf.py(), "arecv_into")?.call1((slf, buffer, timeout))
    }

    /// Releases the claim (further calls raise ValueError). Also done when the object is collected.
    /// BufferError while a view it lent is still exported; an open view without exports is left
    /// unreleased (its message comes again to the next consumer).
    fn close(&mut self) -> PyResult<()> {
        if let Some(lent) = self.lent.take() {
            if lent.exports() > 0 {
                let err = busy(&self.info.name, &lent, "recv_view");
                self.lent = Some(lent);
                return Err(err);
            }
            lent.finish();
        }
        self.inner = None;
        Ok(())
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&mut self, _t: &Bound<'_, PyAny>, _v: &Bound<'_, PyAny>, _tb: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.close()?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.inner.is_some() { "" } else { ", closed" };
        format!(
            "Consumer({:?}, protocol={}, msg_size={}, capacity={}{state})",
            self.info.name,
            protocol_name(self.protocol),
            self.info.msg_size,
            self.info.capacity
        )
    }
}

impl Drop for PyConsumer {
    fn drop(&mut self) {
        self.origin.forget_inherited(&mut self.inner);
    }
}

/// A consumer's message lent to a view: released (or unpeeked) through the consumer.
#[derive(Debug)]
struct ConsumerSlot(Py<PyConsumer>);

impl SlotOwner for ConsumerSlot {
    fn give_back(&self, py: Python<'_>, lent: &Arc<Lent>, _publish: bool) -> PyResult<Result<(), ShmError>> {
        // A consumer's message is released however the view is given back.
        Ok(self.0.bind(py).try_borrow_mut()?.finish_view(lent, true))
    }

    fn abandon(&self, py: Python<'_>, lent: &Arc<Lent>) {
        if let Ok(mut c) = self.0.bind(py).try_borrow_mut() {
            // A message lent to this view is unpeeked: nothing to refuse here.
            let _ = c.abandon_view(lent);
        }
    }
}
