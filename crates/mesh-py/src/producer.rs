//! `Producer`: the sending end of a channel of any protocol (ll, index: mesh-shm's `Producer`; bulk: `bulk`'s end, which also lends a slot as a view).

use std::sync::Arc;

use mesh_shm::{End, Mailbox, Producer, Protocol, Reserved, ShmError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::bulk::{BulkTx, GIL_FREE_COPY, Lent, PyCopyConfig, SlotOwner, SlotView, busy, no_views};
use crate::bytes::Bytes;
use crate::end::{EndInfo, Origin};
use crate::errors::{check_records, shm_err};
use crate::mapped::{PyMailbox, protocol_name};
use crate::waits::{deadline, timed_out, try_then_wait, wait_for};

/// A producer's ring end, by the channel's protocol.
#[derive(Debug)]
pub(crate) enum TxEnd {
    /// Protocols ll and index: mesh-shm's `Producer`.
    Ring(Producer),
    /// Protocol bulk.
    Bulk(BulkTx),
}

/// The sending end of a channel (any protocol), claimed for this process until closed.
#[pyclass(name = "Producer", module = "meshd")]
#[derive(Debug)]
pub(crate) struct PyProducer {
    pub(crate) inner: Option<TxEnd>,
    pub(crate) info: EndInfo,
    pub(crate) origin: Origin,
    pub(crate) protocol: Protocol,
    pub(crate) mailbox: Mailbox,
    /// The slot lent to a `send_view`, until it is given back.
    pub(crate) lent: Option<Arc<Lent>>,
}

impl PyProducer {
    pub(crate) fn end(&mut self) -> PyResult<&mut TxEnd> {
        if self.origin.inherited() {
            self.origin.forget_inherited(&mut self.inner);
            return Err(self.origin.refusal(&self.info.name, "Producer", "producer"));
        }
        if let Some(lent) = &self.lent {
            return Err(busy(&self.info.name, lent, "send_view"));
        }
        let name = &self.info.name;
        self.inner.as_mut().ok_or_else(|| PyValueError::new_err(format!("channel {name:?}: producer is closed")))
    }

    /// The view `lent` is given back: published (`publish`) or discarded.
    pub(crate) fn finish_view(&mut self, lent: &Arc<Lent>, publish: bool) -> Result<(), ShmError> {
        if self.origin.inherited() {
            // A view inherited through fork(): its slot is the parent's to publish.
            return Err(self.origin.end_inherited_view(
                &mut self.inner,
                &mut self.lent,
                lent,
                &self.info.name,
                End::Producer,
            ));
        }
        let mut done = Ok(());
        if self.lent.as_ref().is_some_and(|l| Arc::ptr_eq(l, lent)) {
            if let Some(TxEnd::Bulk(b)) = self.inner.as_mut() {
                done = if publish { b.publish() } else { b.discard() };
            }
            self.lent = None;
        }
        lent.finish();
        done
    }

    /// A view of the slot `reserve` lent.
    pub(crate) fn lend(slf: &Bound<'_, Self>, slot: Reserved) -> PyResult<SlotView> {
        let mut this = slf.borrow_mut();
        let lent = Arc::new(Lent::default());
        let mailbox = this.mailbox.clone();
        let view = SlotView::for_producer(
            Box::new(ProducerSlot(slf.clone().unbind())),
            lent.clone(),
            slot,
            this.info.name.clone(),
            mailbox,
        );
        this.lent = Some(lent);
        Ok(view)
    }

    pub(crate) fn bulk_for_view(&mut self, op: &str) -> PyResult<&mut BulkTx> {
        let (name, protocol) = (self.info.name.clone(), self.protocol);
        match self.end()? {
            TxEnd::Bulk(b) => Ok(b),
            TxEnd::Ring(_) => Err(no_views(&name, protocol, op)),
        }
    }
}

#[pymethods]
impl PyProducer {
    /// Claims the producer end of channel `name`, whatever its protocol. `copy_config` (bulk
    /// channels): how messages are copied into the ring; None: the Rust host end's choice by message
    /// size (`CopyConfig.for_producer`).
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
            TxEnd::Bulk(BulkTx::claim(mb, name, config).map_err(|e| shm_err(py, e))?)
        } else {
            TxEnd::Ring(Producer::claim(mb, name).map_err(|e| shm_err(py, e))?)
        };
        let info = match &inner {
            TxEnd::Ring(p) => p.info(),
            TxEnd::Bulk(b) => b.info(),
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

    /// Bytes per message (shorter messages are zero-padded).
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

    /// How a bulk end copies (None for ll and index channels, whose ends copy word by word).
    #[getter]
    fn copy_config(&self) -> Option<PyCopyConfig> {
        match self.inner.as_ref()? {
            TxEnd::Bulk(b) => Some(PyCopyConfig { inner: b.copy_config() }),
            TxEnd::Ring(_) => None,
        }
    }

    /// Sends one message (any C-contiguous buffer of at most `msg_size` bytes) if there is room;
    /// False when the ring is full. Keeps the GIL, but for a bulk copy of more than 4 KiB.
    fn try_send(&mut self, py: Python<'_>, msg: &Bound<'_, PyAny>) -> PyResult<bool> {
        let bytes = Bytes::get(msg, "send", false)?;
        match self.end()? {
            TxEnd::Ring(p) => p.try_send(bytes.as_slice()),
            TxEnd::Bulk(b) => b.try_send(py, bytes.as_slice()),
        }
        .map_err(|e| shm_err(py, e))
    }

    /// Sends one message, waiting for room (the GIL released) until `timeout` seconds pass (None: for ever).
    #[pyo3(signature = (msg, timeout=None))]
    fn send(&mut self, py: Python<'_>, msg: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        let bytes = Bytes::get(msg, "send", false)?;
        let deadline = deadline(timeout)?;
        let msg = bytes.as_slice();
        let name = self.info.name.clone();
        match self.end()? {
            TxEnd::Ring(end) => try_then_wait(py, &name, "send", deadline, || end.try_send(msg)),
            TxEnd::Bulk(b) => {
                // A message the GIL rule copies with the GIL held is first tried that way; anything
                // else goes in one stretch without the GIL: the wait, the copy and the publication,
                // so that the copy starts the moment a slot frees, with no GIL handoff in between
                // (one release and one reacquisition per message).
                if msg.len() <= GIL_FREE_COPY && b.try_send(py, msg).map_err(|e| shm_err(py, e))? {
                    return Ok(());
                }
                match wait_for(py, deadline, || Ok(b.try_send_here(msg)?.then_some(())))? {
                    Some(()) => Ok(()),
                    None => Err(timed_out(py, &name, "send", deadline)),
                }
            }
        }
    }

    /// Sends as many whole messages of `msgs` (a buffer of `msg_size`-byte records) as fit,
    /// publishing once (a bulk channel: each); returns how many. Keeps the GIL.
    fn try_send_batch(&mut self, py: Python<'_>, msgs: &Bound<'_, PyAny>) -> PyResult<usize> {
        let bytes = Bytes::get(msgs, "send_batch", false)?;
        let size = self.info.msg_size as usize;
        check_records(py, &self.info.name, size, bytes.as_slice().len(), "send_batch", true)?;
        match self.end()? {
            TxEnd::Ring(p) => p.try_send_batch(bytes.as_slice()),
            TxEnd::Bulk(b) => b.try_send_batch(py, bytes.as_slice(), size),
        }
        .map_err(|e| shm_err(py, e))
    }

    /// Sends every record of `msgs`, waiting for room until `timeout` seconds pass (None: for ever).
    /// On a timeout, the exception's `sent` says how many records went.
    #[pyo3(signature = (msgs, timeout=None))]
    fn send_batch(&mut self, py: Python<'_>, msgs: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        let bytes = Bytes::get(msgs, "send_batch", false)?;
        let deadline = deadline(timeout)?;
        let all = bytes.as_slice();
        let size = self.info.msg_size as usize;
        check_records(py, &self.info.name, size, all.len(), "send_batch", true)?;
        let mut done = 0;
        let finished = match self.end()? {
            TxEnd::Ring(end) => {
                done = end.try_send_batch(all).map_err(|e| shm_err(py, e))?;
                if done * size == all.len() {
                    return Ok(());
                }
                wait_for(py, deadline, || {
                    done += end.try_send_batch(&all[done * size..])?;
                    Ok((done * size == all.len()).then_some(()))
                })?
            }
            TxEnd::Bulk(b) => {
                if size <= GIL_FREE_COPY {
                    done = b.try_send_batch(py, all, size).map_err(|e| shm_err(py, e))?;
                    if done * size == all.len() {
                        return Ok(());
                    }
                }
                // Waits and copies in one stretch without the GIL (see `send`).
                wait_for(py, deadline, || {
                    done += b.try_send_records(&all[done * size..], size)?;
                    Ok((done * size == all.len()).then_some(()))
                })?
            }
        };
        match finished {
            Some(()) => Ok(()),
            None => {
                let err = timed_out(py, &self.info.name, "send", deadline);
                err.value(py).setattr("sent", done)?;
                Err(err)
            }
        }
    }

    /// The next slot in place (bulk channels), waiting for room until `timeout` seconds pass: a
    /// context manager whose `__enter__` gives a writable memoryview of the slot (`msg_size` bytes,
    /// holding whatever a message a lap ago left there). Published when the block ends normally,
    /// discarded (not published; the next send reuses the slot) when it raises.
    #[pyo3(signature = (timeout=None))]
    fn send_view(slf: &Bound<'_, Self>, timeout: Option<f64>) -> PyResult<SlotView> {
        let py = slf.py();
        let deadline = deadline(timeout)?;
        let slot = {
            let mut this = slf.borrow_mut();
            let name = this.info.name.clone();
            let b = this.bulk_for_view("send_view")?;
            match b.reserve().map_err(|e| shm_err(py, e))? {
                Some(a) => a,
                None => match wait_for(py, deadline, || b.reserve())? {
                    Some(a) => a,
                    None => return Err(timed_out(py, &name, "send", deadline)),
                },
            }
        };
        Self::lend(slf, slot)
    }

    /// `send_view` without waiting: None when the ring is full. Keeps the GIL.
    fn try_send_view(slf: &Bound<'_, Self>) -> PyResult<Option<SlotView>> {
        let py = slf.py();
        let slot = slf.borrow_mut().bulk_for_view("try_send_view")?.reserve().map_err(|e| shm_err(py, e))?;
        slot.map(|s| Self::lend(slf, s)).transpose()
    }

    /// Releases the claim (further calls raise ValueError). Also done when the object is collected.
    /// BufferError while a view it lent is still exported; an open view without exports is discarded.
    fn close(&mut self) -> PyResult<()> {
        if let Some(lent) = self.lent.take() {
            if lent.exports() > 0 {
                let err = busy(&self.info.name, &lent, "send_view");
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
            "Producer({:?}, protocol={}, msg_size={}, capacity={}{state})",
            self.info.name,
            protocol_name(self.protocol),
            self.info.msg_size,
            self.info.capacity
        )
    }
}

impl Drop for PyProducer {
    fn drop(&mut self) {
        self.origin.forget_inherited(&mut self.inner);
    }
}

/// A producer's slot lent to a view: published or discarded through the producer.
#[derive(Debug)]
struct ProducerSlot(Py<PyProducer>);

impl SlotOwner for ProducerSlot {
    fn give_back(&self, py: Python<'_>, lent: &Arc<Lent>, publish: bool) -> PyResult<Result<(), ShmError>> {
        Ok(self.0.bind(py).try_borrow_mut()?.finish_view(lent, publish))
    }

    fn abandon(&self, py: Python<'_>, lent: &Arc<Lent>) {
        if let Ok(mut p) = self.0.bind(py).try_borrow_mut() {
            // A slot lent to this view is discarded: nothing to refuse here.
            let _ = p.finish_view(lent, false);
        }
    }
}
