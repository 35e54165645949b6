//! Errors for Python: each mesh-shm error as its class of `meshd._errors`, with mesh-shm's own text and the values it carries.

use mesh_shm::ShmError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

/// The Python class for a mesh-shm error and the values it carries beside its text.
pub(crate) fn error_class(py: Python<'_>, e: &ShmError) -> (&'static str, Vec<(&'static str, Py<PyAny>)>) {
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
pub(crate) fn error_text(e: &ShmError) -> String {
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
pub(crate) fn errors_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    Ok(MODULE.get_or_try_init(py, || py.import("meshd._errors").map(Bound::unbind))?.bind(py))
}

/// A mesh-shm error as the Python exception of its kind.
pub(crate) fn shm_err(py: Python<'_>, e: ShmError) -> PyErr {
    let (class, fields) = error_class(py, &e);
    error_of_class(py, class, error_text(&e), fields)
}

/// The exception `class` of `meshd._errors` with its text and the values it carries.
pub(crate) fn error_of_class(
    py: Python<'_>,
    class: &str,
    text: String,
    fields: Vec<(&'static str, Py<PyAny>)>,
) -> PyErr {
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
pub(crate) fn check_records(
    py: Python<'_>,
    channel: &str,
    size: usize,
    len: usize,
    op: &str,
    may_be_empty: bool,
) -> PyResult<()> {
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
