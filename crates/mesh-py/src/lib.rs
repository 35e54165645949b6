//! `meshd._meshd`: the mailbox's host side (mesh-shm) for Python: open, list channels, claim an end, send and receive.
//!
//! Host memory only: nothing here touches CUDA, so importing the package never makes the process a
//! CUDA (or MPS) client. Messages go straight between Python buffers and the ring: `send` reads any
//! C-contiguous buffer in place (bytes, bytearray, memoryview, numpy arrays), `recv_into` writes into
//! a writable one, `recv` fills a new `bytes` object directly. One `Producer` and one `Consumer` class
//! serve every protocol: the end reads the channel's (ll and index: mesh-shm's `Producer`/`Consumer`;
//! bulk: `bulk`'s ends, which also lend a slot in place as a `SlotView`). A service's client
//! (issue 26) has two ends of its own, `service`'s `FanInSender` and `GroupClient`, which
//! `meshd.Service` pairs with its lease on the control socket.
//!
//! Blocking calls release the GIL and come back for it every `SIGNAL_CHECK` to let Python run its
//! signal handlers (Ctrl-C raises `KeyboardInterrupt` there); the `try_` calls keep the GIL, since
//! releasing it costs more than one attempt. Errors are the classes of `meshd._errors`, one per
//! mesh-shm error kind, carrying mesh-shm's own text.

mod bulk;
mod service;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bulk::{BulkRx, BulkTx, GIL_FREE_COPY, Lent, PyCopyConfig, SlotView};
use mesh_shm::{ChannelInfo, Consumer, End, Mailbox, Peeked, PollPause, Producer, Protocol, Reserved, ShmError};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict};

/// The longest stretch a blocking call spends without the GIL: signals are checked this often.
const SIGNAL_CHECK: Duration = Duration::from_millis(50);

// ---- errors ----

/// The Python class for a mesh-shm error and the values it carries beside its text.
fn error_class(py: Python<'_>, e: &ShmError) -> (&'static str, Vec<(&'static str, Py<PyAny>)>) {
    let s = |v: &str| -> Py<PyAny> { pyo3::types::PyString::new(py, v).into_any().unbind() };
    let n = |v: u64| -> Py<PyAny> {
        let Ok(int) = v.into_pyobject(py);
        int.into_any().unbind()
    };
    match e {
        ShmError::Io { path, op, source } => (
            "MailboxIOError",
            vec![
                ("path", s(&path.to_string_lossy())),
                ("op", s(op)),
                ("errno", n(source.raw_os_error().unwrap_or(0) as u64)),
            ],
        ),
        ShmError::Exists { path } => ("MailboxExistsError", vec![("path", s(&path.to_string_lossy()))]),
        ShmError::Invalid { path, field: "layout version", .. } => {
            ("LayoutVersionError", vec![("path", s(&path.to_string_lossy())), ("field", s("layout version"))])
        }
        ShmError::Invalid { path, field, .. } => {
            ("MailboxInvalidError", vec![("path", s(&path.to_string_lossy())), ("field", s(field))])
        }
        ShmError::Config(_) => ("MailboxConfigError", vec![]),
        ShmError::NoSuchChannel(c) => ("NoSuchChannelError", vec![("channel", s(c))]),
        ShmError::ChannelExists(c) => ("ChannelExistsError", vec![("channel", s(c))]),
        ShmError::ChannelConfig { name, .. } => ("ChannelConfigError", vec![("channel", s(name))]),
        ShmError::Full { name, .. } => ("MailboxFullError", vec![("channel", s(name))]),
        ShmError::Claimed { channel, end, pid } => {
            ("ClaimedError", vec![("channel", s(channel)), ("end", s(&end.to_string())), ("pid", n(u64::from(*pid)))])
        }
        ShmError::MessageSize { channel, size, got } => {
            ("MessageSizeError", vec![("channel", s(channel)), ("size", n(*size as u64)), ("got", n(*got as u64))])
        }
        ShmError::Timeout { channel, op, waited_ms } => (
            "MeshTimeoutError",
            vec![
                ("channel", s(channel)),
                ("op", s(op)),
                ("waited_ms", n(u64::try_from(*waited_ms).unwrap_or(u64::MAX))),
            ],
        ),
        ShmError::Corrupt { channel, head, tail, capacity } => (
            "CorruptError",
            vec![("channel", s(channel)), ("head", n(*head)), ("tail", n(*tail)), ("capacity", n(*capacity))],
        ),
        ShmError::NoSuchSlot { index, count } => {
            ("NoSuchSlotError", vec![("index", n(u64::from(*index))), ("count", n(u64::from(*count)))])
        }
        ShmError::TooManyBindings { index, count, max } => (
            "TooManyBindingsError",
            vec![("index", n(u64::from(*index))), ("count", n(*count as u64)), ("max", n(*max as u64))],
        ),
        ShmError::DevicePlacement { channel } => ("DevicePlacementError", vec![("channel", s(channel))]),
        ShmError::NoDeviceRing { channel } => ("NoDeviceRingError", vec![("channel", s(channel))]),
        ShmError::Protocol { channel, protocol, wanted } => (
            "ProtocolMismatchError",
            vec![("channel", s(channel)), ("protocol", s(&protocol.to_string())), ("wanted", s(&wanted.to_string()))],
        ),
        ShmError::HostOnly { channel, protocol } => {
            ("ProtocolMismatchError", vec![("channel", s(channel)), ("protocol", s(&protocol.to_string()))])
        }
        ShmError::FanIn { channel, .. } => ("FanInCorruptError", vec![("channel", s(channel))]),
        ShmError::Group { channel, .. } => ("ServiceGroupError", vec![("channel", s(channel))]),
        // A kind without a class of its own is raised, with its text, as the base class: `SlotLent`
        // (a bulk end's split calls out of order, which the views' bookkeeping keeps Python from
        // reaching), and any kind mesh-shm gains after this table was written.
        #[allow(unreachable_patterns)]
        _ => ("MeshError", vec![]),
    }
}

/// The text of an error: mesh-shm's, except for a mailbox of another layout version, which gets
/// meshd's own refusal (`meshd::start::StartError::OtherVersion`, kept equal by a golden file).
fn error_text(e: &ShmError) -> String {
    match e {
        ShmError::Invalid { path, field: "layout version", reason } => format!(
            "mailbox {}: layout version {reason}; start with --fresh to replace it with an empty mailbox (its \
             channels and messages are lost), or give another --shm",
            path.display()
        ),
        e => e.to_string(),
    }
}

/// The `meshd._errors` module, imported once.
fn errors_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    Ok(MODULE.get_or_try_init(py, || py.import("meshd._errors").map(Bound::unbind))?.bind(py))
}

/// A mesh-shm error as the Python exception of its kind.
fn shm_err(py: Python<'_>, e: ShmError) -> PyErr {
    let (class, fields) = error_class(py, &e);
    error_of_class(py, class, error_text(&e), fields)
}

/// The exception `class` of `meshd._errors` with its text and the values it carries.
fn error_of_class(py: Python<'_>, class: &str, text: String, fields: Vec<(&'static str, Py<PyAny>)>) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let kwargs = PyDict::new(py);
        for (k, v) in fields {
            kwargs.set_item(k, v)?;
        }
        let exc = errors_module(py)?.getattr(class)?.call((text,), Some(&kwargs))?;
        Ok(PyErr::from_value(exc))
    };
    build().unwrap_or_else(|import_failed| import_failed)
}

/// A buffer of records (`send_batch`, `recv_batch`) that is not a whole number of messages, or (a
/// receive, which could never be satisfied) holds none: MessageSizeError naming the buffer, not one
/// message of its odd remainder as mesh-shm's own check would.
fn check_records(py: Python<'_>, channel: &str, size: usize, len: usize, op: &str, may_be_empty: bool) -> PyResult<()> {
    let why = if len == 0 && !may_be_empty {
        "holds no message (a receive into it could never be satisfied)"
    } else if size != 0 && !len.is_multiple_of(size) {
        "is not a whole number of messages"
    } else {
        return Ok(());
    };
    let text =
        format!("channel {channel:?}: {op}: a buffer of {len} bytes {why}; the channel carries {size}-byte messages");
    let fields = vec![
        ("channel", channel.into_pyobject(py)?.into_any().unbind()),
        ("size", size.into_pyobject(py)?.into_any().unbind()),
        ("got", len.into_pyobject(py)?.into_any().unbind()),
    ];
    Err(error_of_class(py, "MessageSizeError", text, fields))
}

// ---- fork ----

/// How many fork()s lie between the process that imported the package and this one: bumped in
/// every child (`os.register_at_fork`), so an end can tell that it was inherited.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// Registered with `os.register_at_fork(after_in_child=...)` when the module loads.
#[pyfunction]
fn _after_fork_in_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// The process an end was made in. An end copied into a child by fork() still names its parent's
/// claim (the claim word holds the parent's pid) and, for a bulk end, copy threads that do not
/// exist in the child: used there it would write beside the parent into the same ring, and dropped
/// there it would release the parent's claim or wait on those threads for ever. So in a child it
/// refuses every call and is forgotten, never dropped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin {
    forks: u64,
    pid: u32,
}

impl Origin {
    pub(crate) fn here() -> Self {
        Self { forks: FORKS.load(Ordering::Relaxed), pid: std::process::id() }
    }

    pub(crate) fn inherited(self) -> bool {
        self.forks != FORKS.load(Ordering::Relaxed)
    }

    /// In a child of fork(): the inherited end taken out of `inner` and leaked (see the type's doc).
    pub(crate) fn forget_inherited<T>(self, inner: &mut Option<T>) {
        if self.inherited()
            && let Some(end) = inner.take()
        {
            std::mem::forget(end);
        }
    }

    /// A view given back in a child of fork() (an inherited end's `lent`): the end forgotten, the view
    /// finished without touching the slot (the parent's to publish or release), and the error to return.
    pub(crate) fn end_inherited_view<T>(
        self,
        inner: &mut Option<T>,
        lent_slot: &mut Option<Arc<Lent>>,
        lent: &Lent,
        channel: &str,
        end: End,
    ) -> ShmError {
        self.forget_inherited(inner);
        *lent_slot = None;
        lent.finish();
        ShmError::Claimed { channel: channel.to_string(), end, pid: self.pid }
    }

    /// The refusal of a call on an inherited end (ClaimedError: the parent holds it).
    pub(crate) fn refusal(self, channel: &str, what: &str, end: &str) -> PyErr {
        Python::attach(|py| {
            let text = format!(
                "channel {channel:?}: this {what} belongs to pid {}, which made it; this process is its child by \
                 fork() and may not use it (claim an end of its own: Mailbox.open, then producer / consumer, or \
                 Service.connect)",
                self.pid
            );
            let s = |v: &str| -> Py<PyAny> { pyo3::types::PyString::new(py, v).into_any().unbind() };
            let Ok(pid) = self.pid.into_pyobject(py);
            error_of_class(
                py,
                "ClaimedError",
                text,
                vec![("channel", s(channel)), ("end", s(end)), ("pid", pid.into_any().unbind())],
            )
        })
    }
}

/// What an end shows of its channel, read once at the claim.
#[derive(Debug)]
pub(crate) struct EndInfo {
    name: String,
    msg_size: u32,
    capacity: u32,
}

impl From<&ChannelInfo> for EndInfo {
    fn from(c: &ChannelInfo) -> Self {
        Self { name: c.name.clone(), msg_size: c.msg_size, capacity: c.capacity }
    }
}

/// A new `bytes` of `size` bytes that `fill` writes; None (the object dropped) when it wrote nothing.
fn new_bytes<'py>(
    py: Python<'py>,
    size: usize,
    fill: impl FnOnce(&mut [u8]) -> PyResult<bool>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let mut got = false;
    let bytes = PyBytes::new_with(py, size, |out| {
        got = fill(out)?;
        Ok(())
    })?;
    Ok(got.then_some(bytes))
}

// ---- buffers ----

/// A Python object's bytes, held exported (so that a bytearray cannot be resized under us).
struct Bytes {
    buf: PyUntypedBuffer,
}

impl Bytes {
    /// Exports `obj`'s buffer; refuses one that is not C-contiguous, or (for `writable`) a read-only one.
    fn get(obj: &Bound<'_, PyAny>, what: &str, writable: bool) -> PyResult<Self> {
        let buf = PyUntypedBuffer::get(obj)?;
        if !buf.is_c_contiguous() {
            return Err(PyBufferError::new_err(format!(
                "{what}: the buffer is not C-contiguous (pass a contiguous copy, e.g. numpy.ascontiguousarray)"
            )));
        }
        if writable && buf.readonly() {
            return Err(PyBufferError::new_err(format!("{what}: the buffer is read-only")));
        }
        Ok(Self { buf })
    }

    fn as_slice(&self) -> &[u8] {
        let len = self.buf.len_bytes();
        if len == 0 {
            return &[];
        }
        // SAFETY: the exported buffer is C-contiguous (checked in `get`), so its `len_bytes` bytes
        // start at `buf_ptr`, and stay valid while the export (held by `self`) lives. Python code
        // may still write them concurrently (as with any buffer handed to native code): the bytes
        // sent are then whatever was there, never memory outside the buffer.
        unsafe { std::slice::from_raw_parts(self.buf.buf_ptr().cast::<u8>(), len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.buf.len_bytes();
        if len == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`; `get` checked the export writable, and `&mut self` keeps this
        // the only slice of it made here.
        unsafe { std::slice::from_raw_parts_mut(self.buf.buf_ptr().cast::<u8>(), len) }
    }
}

// ---- blocking ----

/// A timeout argument in seconds (None: wait for ever) as a deadline.
fn deadline(timeout: Option<f64>) -> PyResult<Option<(Instant, Duration)>> {
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
fn wait_for<T: Send>(
    py: Python<'_>,
    deadline: Option<(Instant, Duration)>,
    attempt: impl FnMut() -> Result<Option<T>, ShmError> + Send,
) -> PyResult<Option<T>> {
    wait_pausing(py, deadline, PollPause::new(), attempt)
}

/// [`wait_for`] with the pauses of `pause`.
fn wait_pausing<T: Send>(
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

fn timed_out(py: Python<'_>, channel: &str, op: &'static str, deadline: Option<(Instant, Duration)>) -> PyErr {
    let waited_ms = deadline.map_or(0, |(_, d)| d.as_millis());
    shm_err(py, ShmError::Timeout { channel: channel.to_string(), op, waited_ms })
}

/// One `attempt` with the GIL held (it costs less than a release), then, if it found nothing to do,
/// [`wait_for`] it until the deadline; MeshTimeoutError (`op` on `channel`) when that passed.
fn try_then_wait(
    py: Python<'_>,
    channel: &str,
    op: &'static str,
    deadline: Option<(Instant, Duration)>,
    attempt: impl FnMut() -> Result<bool, ShmError> + Send,
) -> PyResult<()> {
    try_then_wait_pausing(py, channel, op, deadline, PollPause::new(), attempt)
}

/// [`try_then_wait`] with the pauses of `pause`.
fn try_then_wait_pausing(
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

// ---- the classes ----

/// A channel as the mailbox's table describes it, with a snapshot of its indices and claims.
#[pyclass(name = "ChannelInfo", module = "meshd", frozen, get_all)]
#[derive(Debug)]
struct PyChannelInfo {
    /// Index in the descriptor table (what a program slot binds).
    index: u32,
    /// The channel's name.
    name: String,
    /// Bytes per message.
    msg_size: u32,
    /// Messages the ring holds.
    capacity: u32,
    /// Messages ever sent (a GPU producer publishes in batches: a lower bound).
    head: u64,
    /// Messages ever received (likewise a lower bound for a GPU consumer).
    tail: u64,
    /// Pid holding the producer end, if any.
    producer_pid: Option<u32>,
    /// Pid holding the consumer end, if any.
    consumer_pid: Option<u32>,
}

impl From<ChannelInfo> for PyChannelInfo {
    fn from(c: ChannelInfo) -> Self {
        Self {
            index: c.index,
            name: c.name,
            msg_size: c.msg_size,
            capacity: c.capacity,
            head: c.head,
            tail: c.tail,
            producer_pid: c.producer_pid,
            consumer_pid: c.consumer_pid,
        }
    }
}

#[pymethods]
impl PyChannelInfo {
    fn __repr__(&self) -> String {
        format!(
            "ChannelInfo(name={:?}, index={}, msg_size={}, capacity={}, head={}, tail={}, producer_pid={:?}, consumer_pid={:?})",
            self.name,
            self.index,
            self.msg_size,
            self.capacity,
            self.head,
            self.tail,
            self.producer_pid,
            self.consumer_pid
        )
    }
}

/// A mapped mailbox file.
#[pyclass(name = "Mailbox", module = "meshd", frozen)]
#[derive(Debug)]
struct PyMailbox {
    inner: Mailbox,
}

#[pymethods]
impl PyMailbox {
    /// Maps the mailbox at `path` after validating it (a file of another layout version is refused).
    #[staticmethod]
    fn open(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        Mailbox::open(&path).map(|inner| Self { inner }).map_err(|e| shm_err(py, e))
    }

    /// The file's path.
    #[getter]
    fn path(&self) -> std::path::PathBuf {
        self.inner.path().to_path_buf()
    }

    /// The pid of the meshd serving this mailbox, as it recorded it (None: none recorded).
    #[getter]
    fn owner_pid(&self) -> Option<u32> {
        self.inner.owner_pid()
    }

    /// Every live channel.
    fn channels(&self, py: Python<'_>) -> PyResult<Vec<PyChannelInfo>> {
        let list = self.inner.channels().map_err(|e| shm_err(py, e))?;
        Ok(list.into_iter().map(PyChannelInfo::from).collect())
    }

    /// One channel by name.
    fn channel(&self, py: Python<'_>, name: &str) -> PyResult<PyChannelInfo> {
        self.inner.channel(name).map(PyChannelInfo::from).map_err(|e| shm_err(py, e))
    }

    /// Claims the producer end of channel `name`, whatever its protocol (`copy_config`: a bulk
    /// channel's copy settings; None: the Rust host end's choice by message size).
    #[pyo3(signature = (name, copy_config=None))]
    fn producer(
        &self,
        py: Python<'_>,
        name: &str,
        copy_config: Option<PyRef<'_, PyCopyConfig>>,
    ) -> PyResult<PyProducer> {
        PyProducer::new(py, self, name, copy_config)
    }

    /// Claims the consumer end of channel `name`, whatever its protocol.
    #[pyo3(signature = (name, copy_config=None))]
    fn consumer(
        &self,
        py: Python<'_>,
        name: &str,
        copy_config: Option<PyRef<'_, PyCopyConfig>>,
    ) -> PyResult<PyConsumer> {
        PyConsumer::new(py, self, name, copy_config)
    }

    fn __repr__(&self) -> String {
        format!("Mailbox({:?})", self.inner.path().display().to_string())
    }
}

/// A channel's protocol as Python names it.
fn protocol_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Ll => "ll",
        Protocol::Bulk => "bulk",
        Protocol::Index => "index",
        Protocol::FanIn => "fanin",
        Protocol::Group => "group",
    }
}

/// The refusal of an in-place view on a channel whose format has none.
fn no_views(name: &str, protocol: Protocol, op: &str) -> PyErr {
    PyValueError::new_err(format!(
        "channel {name:?}: {op} lends a slot in place, which only bulk channels have (protocol {protocol} \
         interleaves its own words with the payload or reuses slots as it goes); use send / recv_into"
    ))
}

/// The refusal of a call on an end that lent a slot not yet given back.
fn busy(name: &str, lent: &Lent, what: &str) -> PyErr {
    PyBufferError::new_err(format!(
        "channel {name:?}: a {what} is still open ({} export(s) live); give it back first \
         (leave its with block, or call publish / discard / release)",
        lent.exports()
    ))
}

/// A producer's ring end, by the channel's protocol.
#[derive(Debug)]
enum TxEnd {
    /// Protocols ll and index: mesh-shm's `Producer`.
    Ring(Producer),
    /// Protocol bulk.
    Bulk(BulkTx),
}

/// The sending end of a channel (any protocol), claimed for this process until closed.
#[pyclass(name = "Producer", module = "meshd")]
#[derive(Debug)]
struct PyProducer {
    inner: Option<TxEnd>,
    info: EndInfo,
    origin: Origin,
    protocol: Protocol,
    mailbox: Mailbox,
    /// The slot lent to a `send_view`, until it is given back.
    lent: Option<Arc<Lent>>,
}

impl PyProducer {
    fn end(&mut self) -> PyResult<&mut TxEnd> {
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
    fn lend(slf: &Bound<'_, Self>, slot: Reserved) -> PyResult<SlotView> {
        let mut this = slf.borrow_mut();
        let lent = Arc::new(Lent::default());
        let mailbox = this.mailbox.clone();
        let view = SlotView::for_producer(slf.clone().unbind(), lent.clone(), slot, this.info.name.clone(), mailbox);
        this.lent = Some(lent);
        Ok(view)
    }

    fn bulk_for_view(&mut self, op: &str) -> PyResult<&mut BulkTx> {
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
    fn new(
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

/// A consumer's ring end, by the channel's protocol.
#[derive(Debug)]
enum RxEnd {
    /// Protocols ll and index: mesh-shm's `Consumer`.
    Ring(Consumer),
    /// Protocol bulk.
    Bulk(BulkRx),
}

/// The receiving end of a channel (any protocol), claimed for this process until closed.
#[pyclass(name = "Consumer", module = "meshd")]
#[derive(Debug)]
struct PyConsumer {
    inner: Option<RxEnd>,
    info: EndInfo,
    origin: Origin,
    protocol: Protocol,
    mailbox: Mailbox,
    /// The slot lent to a `recv_view`, until it is given back.
    lent: Option<Arc<Lent>>,
}

impl PyConsumer {
    fn end(&mut self) -> PyResult<&mut RxEnd> {
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
    fn lend(slf: &Bound<'_, Self>, msg: Peeked) -> PyResult<SlotView> {
        let mut this = slf.borrow_mut();
        let lent = Arc::new(Lent::default());
        let mailbox = this.mailbox.clone();
        let view = SlotView::for_consumer(slf.clone().unbind(), lent.clone(), msg, this.info.name.clone(), mailbox);
        this.lent = Some(lent);
        Ok(view)
    }

    fn bulk_for_view(&mut self, op: &str) -> PyResult<&mut BulkRx> {
        let (name, protocol) = (self.info.name.clone(), self.protocol);
        match self.end()? {
            RxEnd::Bulk(b) => Ok(b),
            RxEnd::Ring(_) => Err(no_views(&name, protocol, op)),
        }
    }
}

/// The asyncio helpers of `meshd._aio`, imported once.
fn aio<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    MODULE.get_or_try_init(py, || py.import("meshd._aio").map(Bound::unbind))?.bind(py).getattr(name)
}

/// One message into `out`, waiting (the GIL released) until the deadline; false when it passed.
fn recv_one(py: Python<'_>, end: &mut RxEnd, out: &mut [u8], deadline: Option<(Instant, Duration)>) -> PyResult<bool> {
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
fn try_recv_batch_any(py: Python<'_>, end: &mut RxEnd, out: &mut [u8], size: usize) -> Result<usize, ShmError> {
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
    fn new(
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

impl Drop for PyProducer {
    fn drop(&mut self) {
        self.origin.forget_inherited(&mut self.inner);
    }
}

impl Drop for PyConsumer {
    fn drop(&mut self) {
        self.origin.forget_inherited(&mut self.inner);
    }
}

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
