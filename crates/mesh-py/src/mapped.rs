//! The mapped mailbox as Python holds it ([`PyMailbox`]; its methods are in `mailbox`, above the ends they claim) and a channel as the mailbox's table describes it (`ChannelInfo`).

use mesh_shm::{ChannelInfo, Mailbox, Protocol};
use pyo3::prelude::*;

/// A channel as the mailbox's table describes it, with a snapshot of its indices and claims.
#[pyclass(name = "ChannelInfo", module = "meshd", frozen, get_all)]
#[derive(Debug)]
pub(crate) struct PyChannelInfo {
    /// Index in the descriptor table (what a program slot binds).
    pub(crate) index: u32,
    /// The channel's name.
    pub(crate) name: String,
    /// Bytes per message.
    pub(crate) msg_size: u32,
    /// Messages the ring holds.
    pub(crate) capacity: u32,
    /// Messages ever sent (a GPU producer publishes in batches: a lower bound).
    pub(crate) head: u64,
    /// Messages ever received (likewise a lower bound for a GPU consumer).
    pub(crate) tail: u64,
    /// Pid holding the producer end, if any.
    pub(crate) producer_pid: Option<u32>,
    /// Pid holding the consumer end, if any.
    pub(crate) consumer_pid: Option<u32>,
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
pub(crate) struct PyMailbox {
    pub(crate) inner: Mailbox,
}

/// A channel's protocol as Python names it.
pub(crate) fn protocol_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Ll => "ll",
        Protocol::Bulk => "bulk",
        Protocol::Index => "index",
        Protocol::FanIn => "fanin",
        Protocol::Group => "group",
    }
}
