//! The requests as the control plane routes them: answered on the connection thread ([`Query`]), applied on the backend thread ([`Change`], [`Job`]), or turned into a service lease.

use std::sync::mpsc;
use std::time::Duration;

use super::services::ServiceSpec;
use crate::native::NativeSpec;
use crate::protocol::{Request, Response};

/// What the connection threads answer themselves: reads of the snapshot and the mailbox, a
/// native worker's stop, and the shutdown.
#[derive(Debug)]
pub(super) enum Query {
    Ps,
    Info,
    Metrics,
    Stop {
        name: String,
    },
    Shutdown,
    /// Replace the process with a new build (on the backend thread, as a [`Job::Handoff`]).
    Handoff {
        binary: Option<String>,
    },
    /// A `detach` on a connection that attached nothing.
    StrayDetach,
}

/// What only the backend thread applies, one at a time (a native worker's spawn is its own job:
/// its answer comes from the worker's waiting thread).
#[derive(Debug)]
pub(super) enum Change {
    Load {
        name: String,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        bind: Vec<String>,
        sms: Option<u32>,
        no_readiness: bool,
    },
    Upgrade {
        name: String,
    },
    Unload {
        name: String,
    },
    ChannelCreate {
        name: String,
        msg_size: u32,
        capacity: u32,
        placement: String,
        protocol: String,
        parts: u32,
    },
    ServiceCreate(ServiceSpec),
    ChannelDelete {
        name: String,
        discard: bool,
    },
    ServiceDelete {
        name: String,
        discard: bool,
    },
}

impl Change {
    /// Its `op` label in the metrics.
    pub(super) fn op(&self) -> &'static str {
        match self {
            Self::Load { .. } => "load",
            Self::Upgrade { .. } => "upgrade",
            Self::Unload { .. } => "unload",
            Self::ChannelCreate { .. } => "channel_create",
            Self::ServiceCreate(_) => "service_create",
            Self::ChannelDelete { .. } => "channel_delete",
            Self::ServiceDelete { .. } => "service_delete",
        }
    }
}

/// A request's `op` label in the metrics when the backend thread applies it; `None` for the rest.
pub fn change_op(req: &Request) -> Option<&'static str> {
    match Routed::from(req.clone()) {
        Routed::Change(change) => Some(change.op()),
        Routed::Query(_) | Routed::Spawn(_) | Routed::Attach { .. } | Routed::Resume { .. } => None,
    }
}

/// A request sorted by who answers it.
#[derive(Debug)]
pub(super) enum Routed {
    Query(Query),
    Change(Change),
    Spawn(NativeSpec),
    /// A client attaching to a service: its connection becomes the lease.
    Attach {
        service: String,
    },
    /// A client taking back the lease a previous meshd held: its connection becomes the lease.
    Resume {
        service: String,
    },
}

impl From<Request> for Routed {
    fn from(req: Request) -> Self {
        match req {
            Request::Ps => Self::Query(Query::Ps),
            Request::Info => Self::Query(Query::Info),
            Request::Metrics => Self::Query(Query::Metrics),
            Request::Stop { name } => Self::Query(Query::Stop { name }),
            Request::Shutdown => Self::Query(Query::Shutdown),
            Request::Handoff { binary } => Self::Query(Query::Handoff { binary }),
            Request::Load { name, grid, block, shared_mem, bind, sms, no_readiness, image_len: _ } => {
                Self::Change(Change::Load { name, grid, block, shared_mem, bind, sms, no_readiness })
            }
            Request::Upgrade { name, image_len: _ } => Self::Change(Change::Upgrade { name }),
            Request::Unload { name } => Self::Change(Change::Unload { name }),
            Request::ChannelCreate { name, msg_size, capacity, placement, protocol, parts } => {
                Self::Change(Change::ChannelCreate { name, msg_size, capacity, placement, protocol, parts })
            }
            Request::Spawn { name, bind, command, ready_timeout_ms } => {
                Self::Spawn(NativeSpec { name, bind, command, ready_timeout: Duration::from_millis(ready_timeout_ms) })
            }
            Request::ServiceCreate { name, clients, msg_size, capacity, reply_size, reply_capacity, shards } => {
                Self::Change(Change::ServiceCreate(ServiceSpec {
                    name,
                    clients,
                    msg_size,
                    capacity,
                    reply_size: reply_size.unwrap_or(msg_size),
                    reply_capacity,
                    shards,
                }))
            }
            Request::ChannelDelete { name, discard } => Self::Change(Change::ChannelDelete { name, discard }),
            Request::ServiceDelete { name, discard } => Self::Change(Change::ServiceDelete { name, discard }),
            Request::ServiceAttach { service } => Self::Attach { service },
            Request::ServiceResume { service, .. } => Self::Resume { service },
            Request::Detach => Self::Query(Query::StrayDetach),
        }
    }
}

/// A job for the backend thread, with where to send its answer.
pub(super) enum Job {
    Change {
        change: Change,
        image: Vec<u8>,
        reply: mpsc::SyncSender<Response>,
    },
    Spawn {
        spec: NativeSpec,
        reply: mpsc::SyncSender<Response>,
    },
    /// Record the native workers' table in the desired state now, then acknowledge: a `spawn` or a
    /// `stop` is answered only once the state says so, so that a crash right after the answer
    /// neither forgets a worker nor starts a stopped one again.
    RecordNatives {
        done: mpsc::SyncSender<()>,
    },
    Shutdown {
        reply: Option<mpsc::SyncSender<Response>>,
    },
    /// `meshd handoff`: answered just before the process executes the new binary.
    Handoff {
        binary: Option<String>,
        reply: mpsc::SyncSender<Response>,
    },
    /// The backend has news it received unasked (an MPS worker's kernel ended): run the watchdog now.
    Wake,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_have_an_op_label_and_reads_have_none() {
        assert_eq!(change_op(&Request::Unload { name: "x".into() }), Some("unload"));
        assert_eq!(change_op(&Request::Upgrade { name: "x".into(), image_len: 1 }), Some("upgrade"));
        assert_eq!(change_op(&Request::ChannelDelete { name: "x".into(), discard: false }), Some("channel_delete"));
        assert_eq!(change_op(&Request::ServiceDelete { name: "x".into(), discard: true }), Some("service_delete"));
        assert_eq!(change_op(&Request::Ps), None);
        assert_eq!(change_op(&Request::Metrics), None);
    }
}
