//! A service client's two ends for Python (issue 26): `FanInSender` (its requests, into the service's fan-in channel) and `GroupClient` (its own reply ring in the service's channel group).
//!
//! Both are mesh-shm's ends as they are ([`mesh_shm::FanInSender`], [`mesh_shm::GroupClient`]), for
//! the client id meshd handed out at `service_attach`; `meshd.Service` (python/meshd/service.py) pairs
//! them with the control-socket connection that holds the id. The calls follow `Producer` and
//! `Consumer`: `send` reads any C-contiguous buffer in place, `recv_into` writes a writable one,
//! blocking calls release the GIL and wake for signals every [`crate::SIGNAL_CHECK`], the `try_`
//! calls keep it, and errors are `meshd._errors`' classes.

use mesh_shm::{ClientId, ShmError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::{Bytes, PyMailbox, aio, deadline, shm_err, timed_out, wait_for};

/// A client id from Python: a u32 (`slot | epoch << 16`), anything else refused.
fn client_id(id: i64) -> PyResult<ClientId> {
    u32::try_from(id)
        .map(ClientId)
        .map_err(|_| PyValueError::new_err(format!("client id {id}: expected 0 <= id < 2**32 (slot | epoch << 16)")))
}

/// A client's request end of a service's fan-in channel: every message it sends carries its id.
/// Many clients send into one channel, so it claims nothing.
#[pyclass(name = "FanInSender", module = "meshd")]
#[derive(Debug)]
pub(crate) struct PyFanInSender {
    inner: Option<mesh_shm::FanInSender>,
    name: String,
    msg_size: u32,
    capacity: u32,
    id: u32,
}

impl PyFanInSender {
    fn end(&mut self) -> PyResult<&mut mesh_shm::FanInSender> {
        let name = &self.name;
        self.inner.as_mut().ok_or_else(|| PyValueError::new_err(format!("channel {name:?}: sender is closed")))
    }
}

#[pymethods]
impl PyFanInSender {
    /// The request end of fan-in channel `name` for the client meshd bound as `id`.
    #[new]
    fn new(py: Python<'_>, mailbox: &PyMailbox, name: &str, id: i64) -> PyResult<Self> {
        let id = client_id(id)?;
        let inner = mesh_shm::FanInSender::open(&mailbox.inner, name, id).map_err(|e| shm_err(py, e))?;
        let info = inner.info();
        Ok(Self {
            name: info.name.clone(),
            msg_size: info.msg_size,
            capacity: info.capacity,
            id: id.0,
            inner: Some(inner),
        })
    }

    /// The channel's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Bytes per request (shorter ones are zero-padded).
    #[getter]
    fn msg_size(&self) -> u32 {
        self.msg_size
    }

    /// Requests the ring holds, over all clients.
    #[getter]
    fn capacity(&self) -> u32 {
        self.capacity
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
        let name = self.name.clone();
        let end = self.end()?;
        if end.try_send(msg).map_err(|e| shm_err(py, e))? {
            return Ok(());
        }
        match wait_for(py, deadline, || Ok(end.try_send(msg)?.then_some(())))? {
            Some(()) => Ok(()),
            None => Err(timed_out(py, &name, "send", deadline)),
        }
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
            self.name, self.id, self.msg_size, self.capacity
        )
    }
}

/// A client's reply ring in a service's channel group: the consumer end of that one ring, claimed
/// for this process until closed (the claim dies with the process, kill -9 included).
#[pyclass(name = "GroupClient", module = "meshd")]
#[derive(Debug)]
pub(crate) struct PyGroupClient {
    inner: Option<mesh_shm::GroupClient>,
    name: String,
    msg_size: u32,
    capacity: u32,
    id: u32,
}

impl PyGroupClient {
    fn end(&mut self) -> PyResult<&mut mesh_shm::GroupClient> {
        let name = &self.name;
        self.inner.as_mut().ok_or_else(|| PyValueError::new_err(format!("channel {name:?}: reply end is closed")))
    }
}

/// One reply into `out`, waiting (the GIL released) until the deadline; false when it passed.
fn recv_reply(
    py: Python<'_>,
    end: &mut mesh_shm::GroupClient,
    out: &mut [u8],
    deadline: Option<(std::time::Instant, std::time::Duration)>,
) -> PyResult<bool> {
    if end.try_recv(out).map_err(|e| shm_err(py, e))? {
        return Ok(true);
    }
    Ok(wait_for(py, deadline, || -> Result<Option<()>, ShmError> { Ok(end.try_recv(out)?.then_some(())) })?.is_some())
}

#[pymethods]
impl PyGroupClient {
    /// Claims the reply ring of client `id` in group `name`; ClaimedError while a live process holds it.
    #[new]
    fn new(py: Python<'_>, mailbox: &PyMailbox, name: &str, id: i64) -> PyResult<Self> {
        let id = client_id(id)?;
        let inner = mesh_shm::GroupClient::claim(&mailbox.inner, name, id).map_err(|e| shm_err(py, e))?;
        let info = inner.info();
        Ok(Self {
            name: info.name.clone(),
            msg_size: info.msg_size,
            capacity: info.capacity,
            id: id.0,
            inner: Some(inner),
        })
    }

    /// The group's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Bytes per reply.
    #[getter]
    fn msg_size(&self) -> u32 {
        self.msg_size
    }

    /// Replies the client's ring holds.
    #[getter]
    fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The client's id.
    #[getter]
    fn id(&self) -> u32 {
        self.id
    }

    /// One reply as bytes (`msg_size` long), or None when none is waiting. Keeps the GIL.
    fn try_recv<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let size = self.msg_size as usize;
        let end = self.end()?;
        let mut got = false;
        let bytes = PyBytes::new_with(py, size, |out| {
            got = end.try_recv(out).map_err(|e| shm_err(py, e))?;
            Ok(())
        })?;
        Ok(got.then_some(bytes))
    }

    /// One reply as bytes, waiting (the GIL released) until `timeout` seconds pass (None: for ever).
    #[pyo3(signature = (timeout=None))]
    fn recv<'py>(&mut self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyBytes>> {
        let deadline = deadline(timeout)?;
        let name = self.name.clone();
        let size = self.msg_size as usize;
        let end = self.end()?;
        PyBytes::new_with(py, size, |out| {
            if recv_reply(py, end, out, deadline)? { Ok(()) } else { Err(timed_out(py, &name, "recv", deadline)) }
        })
    }

    /// One reply into `buffer` (writable, C-contiguous, exactly `msg_size` bytes); False when none
    /// is waiting. Keeps the GIL.
    fn try_recv_into(&mut self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<bool> {
        let mut bytes = Bytes::get(buffer, "recv_into", true)?;
        self.end()?.try_recv(bytes.as_mut_slice()).map_err(|e| shm_err(py, e))
    }

    /// One reply into `buffer`, waiting (the GIL released) until `timeout` seconds pass.
    #[pyo3(signature = (buffer, timeout=None))]
    fn recv_into(&mut self, py: Python<'_>, buffer: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        let mut bytes = Bytes::get(buffer, "recv_into", true)?;
        let deadline = deadline(timeout)?;
        let name = self.name.clone();
        if recv_reply(py, self.end()?, bytes.as_mut_slice(), deadline)? {
            Ok(())
        } else {
            Err(timed_out(py, &name, "recv", deadline))
        }
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
            self.name, self.id, self.msg_size, self.capacity
        )
    }
}
