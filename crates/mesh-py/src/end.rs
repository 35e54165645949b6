//! What every end carries: its channel's facts ([`EndInfo`]) and the process it was made in ([`Origin`]), so that an end inherited through fork() refuses every call and is forgotten, never dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mesh_shm::{ChannelInfo, End, ShmError};
use pyo3::prelude::*;

use crate::bulk::Lent;
use crate::errors::error_of_class;

/// How many fork()s lie between the process that imported the package and this one: bumped in
/// every child (`os.register_at_fork`), so an end can tell that it was inherited.
pub(crate) static FORKS: AtomicU64 = AtomicU64::new(0);

/// Registered with `os.register_at_fork(after_in_child=...)` when the module loads.
#[pyfunction]
pub(crate) fn _after_fork_in_child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// The process an end was made in. An end copied into a child by fork() still names its parent's
/// claim (the claim word holds the parent's pid) and, for a bulk end, copy threads that do not
/// exist in the child: used there it would write beside the parent into the same ring, and dropped
/// there it would release the parent's claim or wait on those threads for ever. So in a child it
/// refuses every call and is forgotten, never dropped.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin {
    pub(crate) forks: u64,
    pub(crate) pid: u32,
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
    pub(crate) name: String,
    pub(crate) msg_size: u32,
    pub(crate) capacity: u32,
}

impl From<&ChannelInfo> for EndInfo {
    fn from(c: &ChannelInfo) -> Self {
        Self { name: c.name.clone(), msg_size: c.msg_size, capacity: c.capacity }
    }
}
