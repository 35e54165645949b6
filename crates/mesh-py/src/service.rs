//! A service client's two ends for Python: `FanInSender` (its requests, into the service's fan-in channel) and `GroupClient` (its own reply ring in the service's channel group).
//!
//! Both are mesh-shm's ends as they are ([`mesh_shm::FanInSender`], [`mesh_shm::GroupClient`]), for
//! the client id meshd handed out at `service_attach`; `meshd.Service` (python/meshd/service.py) pairs
//! them with the control-socket connection that holds the id. The calls follow `Producer` and
//! `Consumer`: `send` reads any C-contiguous buffer in place, `recv_into` writes a writable one,
//! blocking calls release the GIL and wake for signals every [`crate::waits::SIGNAL_CHECK`], the `try_`
//! calls keep it, and errors are `meshd._errors`' classes.

use mesh_shm::{ChannelInfo, ClientId, PollPause, ShmError};
use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::bytes::{Bytes, new_bytes};
use crate::end::{EndInfo, Origin};
use crate::errors::shm_err;
use crate::mapped::PyMailbox;
use crate::waits::{aio, deadline, try_then_wait, try_then_wait_pausing};

/// A client id from Python: an int from 0 to 2**32 - 1 (`slot | epoch << 16`); ValueError for one out
/// of that range however large, TypeError for what is no int.
fn client_id(id: &Bound<'_, PyAny>) -> PyResult<ClientId> {
    match id.extract::<u32>() {
        Ok(v) => Ok(ClientId(v)),
        Err(e) if e.is_instance_of::<PyOverflowError>(id.py()) => {
            Err(PyValueError::new_err(format!("client id {id}: expected 0 <= id < 2**32 (slot | epoch << 16)")))
        }
        Err(e) => Err(e),
    }
}

/// One of a client's two ends, opened by `open` for the id given: the end and what it shows.
fn client_end<T>(
    py: Python<'_>,
    id: &Bound<'_, PyAny>,
    open: impl FnOnce(ClientId) -> Result<T, ShmError>,
    info: impl FnOnce(&T) -> &ChannelInfo,
) -> PyResult<(T, EndInfo, u32)> {
    let id = client_id(id)?;
    let end = open(id).map_err(|e| shm_err(py, e))?;
    let shown = EndInfo::from(info(&end));
    Ok((end, shown, id.0))
}

/// A client's request end of a service's fan-in channel: every message it sends carries its id.
/// Many clients send into one channel, so it claims nothing.
#[pyclass(name = "FanInSender", module = "meshd")]
#[derive(Debug)]
pub(crate) struct PyFanInSender {
    inner: Option<mesh_shm::FanInSender>,
    info: EndInfo,
    origin: Origin,
    id: u32,
}

impl PyFanInSender {
    fn end(&mut self) -> PyResult<&mut mesh_shm::FanInSender> {
        if self.origin.inherited() {
            self.origin.forget_inherited(&mut self.inner);
            let what = format!("FanInSender of client {:#x}", self.id);
            return Err(self.origin.refusal(&self.info.name, &what, "sender"));
        }
        let name = &self.info.name;
        self.inner.as_mut().ok_or_else(|| PyValueError::new_err(format!("channel {name:?}: sender is closed")))
    }
}

#[pymethods]
impl PyFanInSender {
    /// The request end of fan-in channel `name` for the client meshd bound as `id`.
    #[new]
    fn new(py: Python<'_>, mailbox: &PyMailbox, name: &str, id: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (inner, info, id) = client_end(
            py,
            id,
            |id| mesh_shm::FanInSender::open(&mailbox.inner, name, id),
            mesh_shm::FanInSender::info,
        )?;
        Ok(Self { inner: Some(inner), info, origin: Origin::here(), id })
    }

    /// The channel's name.
    #[getter]
    fn name(&self) -> &str {
        &self.info.name
    }

    /// Bytes per request (shorter ones are zero-padded).
    #[getter]
    fn msg_size(&self) -> u32 {
        self.info.msg_size
    }

    /// Requests the ring holds, over all clients.
    #[getter]
    fn capacity(&self) -> u32 {
        self.info.capacity
    }

    /// The sender id every request carries.
    #[getter]
    fn id(&self) -> u32 {
        self.id
    }

    /// Sends one request (any C-contiguous buffer of at most `msg_size` bytes) if there is room;
    /// False when the ring is full. Keeps the GIL.
    fn try_send(&mut self, py: Python<'_>, msg: &Bound<'_, PyAny>) -> PyResult<bool> {
        let bytes = Bytes::get(msg, "send", false)?;
        self.end()?.try_send(bytes.as_slice()).map_err(|e| shm_err(py, e))
    }

    /// Sends one request, waiting for room (the GIL released) until `timeout` seconds pass (None: for ever).
    #[pyo3(signature = (msg, timeout=None))]
    fn send(&mut self, py: Python<'_>, msg: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        let bytes = Bytes::get(msg, "send", false)?;
        let deadline = deadline(timeout)?;
        let msg = bytes.as_slice();
        let name = self.info.name.clone();
        let end = self.end()?;
        try_then_wait(py, &name, "send", deadline, || end.try_send(msg))
    }

    /// Further calls raise ValueError. Also done when the object is collected.
    fn close(&mut self) {
        self.inner = None;
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&mut self, _t: &Bound<'_, PyAny>, _v: &Bound<'_, PyAny>, _tb: &Bound<'_, PyAny>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        let state = if self.inner.is_some() { "" } else { ", closed" };
        format!(
            "FanInSender({:?}, id={:#x}, msg_size={}, capacity={}{state})",
            self.info.name, self.id, self.info.msg_size, self.info.capacity
        )
    }
}

/// A client's reply ring in a service's channel group: the consumer end of that one ring, claimed
/// for this process until closed (the claim dies with the process, kill -9 included).
#[pyclass(name = "GroupClient", module = "meshd")]
#[derive(Debug)]
pub(crate) struct PyGroupClient {
    inner: Option<mesh_shm::GroupClient>,
    info: EndInfo,
    origin: Origin,
    id: u32,
}

impl PyGroupClient {
    fn end(&mut self) -> PyResult<&mut mesh_shm::GroupClient> {
        if self.origin.inherited() {
            self.origin.forget_inherited(&mut self.inner);
            let what = format!("GroupClient of client {:#x}", self.id);
            return Err(self.origin.refusal(&self.info.name, &what, "replies"));
        }
        let name = &self.info.name;
        self.inner.as_mut().ok_or_else(|| PyValueError::new_err(format!("channel {name:?}: reply end is closed")))
    }
}

#[pymethods]
impl PyGroupClient {
    /// Claims the reply ring of client `id` in group `name`; ClaimedError while a live process holds it.
    #[new]
    fn new(py: Python<'_>, mailbox: &PyMailbox, name: &str, id: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (inner, info, id) = client_end(
            py,
            id,
            |id| mesh_shm::GroupClient::claim(&mailbox.inner, name, id),
            mesh_shm::GroupClient::info,
        )?;
        Ok(Self { inner: Some(inner), info, origin: Origin::here(), id })
    }

    /// The group's name.
    #[getter]
    fn name(&self) -> &str {
        &self.info.name
    }

    /// Bytes per reply.
    #[getter]
    fn msg_size(&self) -> u32 {
        self.info.msg_size
    }

    /// Replies the client's ring holds.
    #[getter]
    fn capacity(&self) -> u32 {
        self.info.capacity
    }

    /// The client's id.
    #[getter]
    fn id(&self) -> u32 {
        self.id
    }

    /// One reply as bytes (`msg_size` long), or None when none is waiting. Keeps the GIL.
    fn try_recv<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let size = self.info.msg_size as usize;
        let end = self.end()?;
        new_bytes(py, size, |out| end.try_recv(out).map_err(|e| shm_err(py, e)))
    }

    /// One reply as bytes, waiting (the GIL released) until `timeout` seconds pass (None: for ever).
    /// `unanswered`: the requests the caller has in flight; with more than one the wait yields the
    /// CPU from the first poll instead of spinning first (it is streaming: mesh-shm's
    /// `PollPause::for_replies`).
    #[pyo3(signature = (timeout=None, *, unanswered=1))]
    fn recv<'py>(&mut self, py: Python<'py>, timeout: Option<f64>, unanswered: u64) -> PyResult<Bound<'py, PyBytes>> {
        let deadline = deadline(timeout)?;
        let name = self.info.name.clone();
        let size = self.info.msg_size as usize;
        let end = self.end()?;
        let pause = PollPause::for_replies(unanswered);
        PyBytes::new_with(py, size, |out| {
            try_then_wait_pausing(py, &name, "recv", deadline, pause, || end.try_recv(out))
        })
    }

    /// One reply into `buffer` (writable, C-contiguous, exactly `msg_size` bytes); False when none
    /// is waiting. Keeps the GIL.
    fn try_recv_into(&mut self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<bool> {
        let mut bytes = Bytes::get(buffer, "recv_into", true)?;
        self.end()?.try_recv(bytes.as_mut_slice()).map_err(|e| shm_err(py, e))
    }

    /// One reply into `buffer`, waiting (the GIL released) until `timeout` seconds pass;
    /// `unanswered` as for `recv`.
    #[pyo3(signature = (buffer, timeout=None, *, unanswered=1))]
    fn recv_into(
        &mut self,
        py: Python<'_>,
        buffer: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        unanswered: u64,
    ) -> PyResult<()> {
        let mut bytes = Bytes::get(buffer, "recv_into", true)?;
        let deadline = deadline(timeout)?;
        let name = self.info.name.clone();
        let (end, out) = (self.end()?, bytes.as_mut_slice());
        try_then_wait_pausing(py, &name, "recv", deadline, PollPause::for_replies(unanswered), || end.try_recv(out))
    }

    /// `await replies.arecv(timeout)`: `recv` for asyncio, polling from the event loop (no thread).
    #[pyo3(signature = (timeout=None))]
    fn arecv<'py>(slf: Bound<'py, Self>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        aio(slf.py(), "arecv")?.call1((slf, timeout))
    }

    /// `await replies.arecv_into(buffer, timeout)`: `recv_into` for asyncio.
    #[pyo3(signature = (buffer, timeout=None))]
    fn arecv_into<'py>(
        slf: Bound<'py, Self>,
        buffer: Bound<'py, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        aio(slf.py(), "arecv_into")?.call1((slf, buffer, timeout))
    }

    /// Releases the ring's claim (further calls raise ValueError). Also done when the object is collected.
    fn close(&mut self) {
        self.inner = None;
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&mut self, _t: &Bound<'_, PyAny>, _v: &Bound<'_, PyAny>, _tb: &Bound<'_, PyAny>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        let state = if self.inner.is_some() { "" } else { ", closed" };
        format!(
            "GroupClient({:?}, id={:#x}, msg_size={}, capacity={}{state})",
            self.info.name, self.id, self.info.msg_size, self.info.capacity
        )
    }
}

impl Drop for PyFanInSender {
    fn drop(&mut self) {
        self.origin.forget_inherited(&mut self.inner);
    }
}

impl Drop for PyGroupClient {
    fn drop(&mut self) {
        self.origin.forget_inherited(&mut self.inner);
    }
}
