//! `meshd._meshd`: the mailbox's host side (mesh-shm) for Python: open, list channels, claim an end, send and receive.
//!
//! Host memory only: nothing here touches CUDA, so importing the package never makes the process a
//! CUDA (or MPS) client. Messages go straight between Python buffers and the ring: `send` reads any
//! C-contiguous buffer in place (bytes, bytearray, memoryview, numpy arrays), `recv_into` writes into
//! a writable one, `recv` fills a new `bytes` object directly. One `Producer` and one `Consumer` class
//! serve every protocol: the end reads the channel's (ll and index: mesh-shm's `Producer`/`Consumer`;
//! bulk: `bulk`'s ends, which also lend a slot in place as a `SlotView`). A service's client
//! has two ends of its own, `service`'s `FanInSender` and `GroupClient`, which
//! `meshd.Service` pairs with its lease on the control socket.
//!
//! Blocking calls release the GIL and come back for it every `SIGNAL_CHECK` to let Python run its
//! signal handlers (Ctrl-C raises `KeyboardInterrupt` there); the `try_` calls keep the GIL, since
//! releasing it costs more than one attempt. Errors are the classes of `meshd._errors`, one per
//! mesh-shm error kind, carrying mesh-shm's own text.

mod bulk;
mod bytes;
mod consumer;
mod end;
mod errors;
mod mailbox;
mod mapped;
mod producer;
mod service;
mod waits;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use bulk::{PyCopyConfig, SlotView};
use consumer::PyConsumer;
use end::_after_fork_in_child;
use errors::shm_err;
use mapped::{PyChannelInfo, PyMailbox};
use mesh_shm::ShmError;
use producer::PyProducer;

/// A timeout error for the asyncio helpers (`meshd._aio`), with the same text as a blocking call's
/// (`op`: "send", else "recv").
#[pyfunction]
#[pyo3(signature = (channel, waited_ms, op="recv"))]
fn _timeout_error<'py>(py: Python<'py>, channel: &str, waited_ms: u64, op: &str) -> Bound<'py, PyAny> {
    let op = if op == "send" { "send" } else { "recv" };
    let err = ShmError::Timeout { channel: channel.to_string(), op, waited_ms: u128::from(waited_ms) };
    shm_err(py, err).into_value(py).into_bound(py).into_any()
}

/// The control socket a client uses when given none (mesh-shm's `paths::client_socket_from_env`:
/// `$MESHD_SOCKET`, else `$MESHD_DEVICE`'s meshd when it is a whole GPU UUID, else
/// `/tmp/meshd.sock`); a `$MESHD_DEVICE` of another form raises ValueError saying what to set.
#[pyfunction]
fn _default_socket() -> PyResult<String> {
    mesh_shm::paths::client_socket_from_env()
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(pyo3::exceptions::PyValueError::new_err)
}

/// The extension module.
#[pymodule]
fn _meshd(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMailbox>()?;
    m.add_class::<PyProducer>()?;
    m.add_class::<PyConsumer>()?;
    m.add_class::<PyChannelInfo>()?;
    m.add_class::<PyCopyConfig>()?;
    m.add_class::<SlotView>()?;
    m.add_class::<service::PyFanInSender>()?;
    m.add_class::<service::PyGroupClient>()?;
    m.add_function(wrap_pyfunction!(_timeout_error, m)?)?;
    m.add_function(wrap_pyfunction!(_default_socket, m)?)?;
    let after_fork = wrap_pyfunction!(_after_fork_in_child, m)?;
    m.add_function(after_fork.clone())?;
    let kwargs = PyDict::new(m.py());
    kwargs.set_item("after_in_child", after_fork)?;
    m.py().import("os")?.getattr("register_at_fork")?.call((), Some(&kwargs))?;
    m.add("LAYOUT_VERSION", mesh_shm::layout::LAYOUT_VERSION)?;
    m.add("MAX_MSG_SIZE", mesh_shm::layout::MAX_MSG_SIZE)?;
    m.add("MAX_BULK_MSG_SIZE", mesh_shm::layout::MAX_BULK_MSG_SIZE)?;
    Ok(())
}
