//! Blocking without the GIL: deadlines from Python timeouts, waits that come back for the GIL every [`SIGNAL_CHECK`] so that Ctrl-C is heard, and the asyncio helpers of `meshd._aio`.

use std::time::{Duration, Instant};

use mesh_shm::{PollPause, ShmError};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::errors::shm_err;

/// The longest stretch a blocking call spends without the GIL: signals are checked this often.
pub(crate) const SIGNAL_CHECK: Duration = Duration::from_millis(50);

/// A timeout argument in seconds (None: wait for ever) as a deadline.
pub(crate) fn deadline(timeout: Option<f64>) -> PyResult<Option<(Instant, Duration)>> {
    match timeout {
        // +inf waits for ever, as None does (asyncio's forms read it so too).
        None => Ok(None),
        Some(t) if t == f64::INFINITY => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => {
            let d = Duration::from_secs_f64(t.min(1e9));
            Ok(Some((Instant::now() + d, d)))
        }
        Some(t) => Err(PyValueError::new_err(format!(
            "timeout {t}: expected None (or inf) to wait for ever, or a number of seconds >= 0"
        ))),
    }
}

/// Polls `attempt` until it yields or the deadline passes, the GIL released: spin, then yield the
/// CPU, then sleep with back-off (mesh-shm's [`PollPause`], as the Rust ends); every [`SIGNAL_CHECK`] the GIL is taken
/// back for Python's signal handlers, and nowhere else: a successful attempt returns inside the
/// same release (a caller whose attempt copies, a bulk end's, copies there too). `Ok(None)`: the
/// deadline passed.
pub(crate) fn wait_for<T: Send>(
    py: Python<'_>,
    deadline: Option<(Instant, Duration)>,
    attempt: impl FnMut() -> Result<Option<T>, ShmError> + Send,
) -> PyResult<Option<T>> {
    wait_pausing(py, deadline, PollPause::new(), attempt)
}

/// [`wait_for`] with the pauses of `pause`.
pub(crate) fn wait_pausing<T: Send>(
    py: Python<'_>,
    deadline: Option<(Instant, Duration)>,
    mut pause: PollPause,
    mut attempt: impl FnMut() -> Result<Option<T>, ShmError> + Send,
) -> PyResult<Option<T>> {
    loop {
        let stretch_end = Instant::now() + SIGNAL_CHECK;
        let end = deadline.map_or(stretch_end, |(d, _)| d.min(stretch_end));
        let got = py.detach(|| -> Result<Option<T>, ShmError> {
            loop {
                if let Some(v) = attempt()? {
                    return Ok(Some(v));
                }
                if Instant::now() >= end {
                    return Ok(None);
                }
                pause.pause(end);
            }
        });
        match got {
            Ok(Some(v)) => return Ok(Some(v)),
            Ok(None) => {}
            Err(e) => return Err(shm_err(py, e)),
        }
        py.check_signals()?;
        if deadline.is_some_and(|(d, _)| Instant::now() >= d) {
            return Ok(None);
        }
    }
}

pub(crate) fn timed_out(
    py: Python<'_>,
    channel: &str,
    op: &'static str,
    deadline: Option<(Instant, Duration)>,
) -> PyErr {
    let waited_ms = deadline.map_or(0, |(_, d)| d.as_millis());
    shm_err(py, ShmError::Timeout { channel: channel.to_string(), op, waited_ms })
}

/// One `attempt` with the GIL held (it costs less than a release), then, if it found nothing to do,
/// [`wait_for`] it until the deadline; MeshTimeoutError (`op` on `channel`) when that passed.
pub(crate) fn try_then_wait(
    py: Python<'_>,
    channel: &str,
    op: &'static str,
    deadline: Option<(Instant, Duration)>,
    attempt: impl FnMut() -> Result<bool, ShmError> + Send,
) -> PyResult<()> {
    try_then_wait_pausing(py, channel, op, deadline, PollPause::new(), attempt)
}

/// [`try_then_wait`] with the pauses of `pause`.
pub(crate) fn try_then_wait_pausing(
    py: Python<'_>,
    channel: &str,
    op: &'static str,
    deadline: Option<(Instant, Duration)>,
    pause: PollPause,
    mut attempt: impl FnMut() -> Result<bool, ShmError> + Send,
) -> PyResult<()> {
    if attempt().map_err(|e| shm_err(py, e))? {
        return Ok(());
    }
    match wait_pausing(py, deadline, pause, || Ok(attempt()?.then_some(())))? {
        Some(()) => Ok(()),
        None => Err(timed_out(py, channel, op, deadline)),
    }
}

/// The asyncio helpers of `meshd._aio`, imported once.
pub(crate) fn aio<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    MODULE.get_or_try_init(py, || py.import("meshd._aio").map(Bound::unbind))?.bind(py).getattr(name)
}
