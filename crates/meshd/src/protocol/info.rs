//! The rows of `info`'s answer (the mailbox's channels and room, the GPU's identity, the MPS pool) and of `handoff`'s.

use mesh_backend::pool::PoolSnapshot;
use serde::{Deserialize, Serialize};

use super::defaults::{is_one_part, is_zero, one_part};

/// A channel's row in `info`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChannelRow {
    /// As created.
    pub name: String,
    /// Bytes per message.
    pub msg_size: u32,
    /// Messages the ring holds.
    pub capacity: u32,
    /// Where its slots live: `host` or `device`.
    #[serde(default)]
    pub placement: String,
    /// The slots' format: `ll` (a tag in every word), `bulk` (payload, then one flag per message) or
    /// `index` (payload alone, published indices; host ends only).
    /// Absent from an older meshd's answer (and from the Python client's golden files): ll.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    /// Parts each message is split into (bulk), or a fan-in channel's shards; absent from the answer
    /// when 1, as from an older meshd.
    #[serde(default = "one_part", skip_serializing_if = "is_one_part")]
    pub parts: u32,
    /// Messages lost with a device ring's slots (meshd started again, or a GPU fault), over its life.
    #[serde(default)]
    pub lost: u64,
    /// Messages ever sent, as the producer last published it (a GPU producer publishes in batches).
    pub head: u64,
    /// Messages ever received, as the consumer last published it; `head - tail` are in flight.
    pub tail: u64,
}

/// The daemon's description of itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Info {
    /// The isolation mode: `blink` (one context, programs paused for a change) or `mps`.
    pub mode: String,
    /// The mailbox file's path, which clients map to reach the channels.
    pub mailbox: String,
    /// The GPU's name as the driver reports it.
    pub device: String,
    /// Whether the GPU does atomics on mapped host memory natively (`HOST_NATIVE_ATOMIC_SUPPORTED`).
    pub host_atomics: bool,
    /// Every channel of the mailbox, in table order.
    pub channels: Vec<ChannelRow>,
    /// Every service (a fan-in channel `X` with a group `X.replies`) and its attached clients;
    /// absent when there is none (and from an older meshd's answer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceRow>,
    /// What the mailbox's channel table and ring arena hold (absent from an older meshd's answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arena: Option<ArenaRow>,
    /// The GPU's identity and, in MPS mode, the worker pool.
    #[serde(flatten)]
    pub extra: InfoExtra,
}

/// The mailbox's room for channels in `info`: channel descriptors, and the ring arena's bytes. A
/// channel or service whose rings need more than `largest_free_bytes` is refused, however many
/// bytes are free in all.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ArenaRow {
    /// Bytes of the ring arena taken by live channels' rings (service channels included).
    pub in_use_bytes: u64,
    /// Bytes of the ring arena that no live ring takes.
    pub free_bytes: u64,
    /// Bytes of the longest free run: the largest ring that can be created now.
    pub largest_free_bytes: u64,
    /// Channel descriptors in use (every live channel, a service's two included).
    pub descriptors_in_use: u32,
    /// Channel descriptors in the mailbox (`meshd run --channels`).
    pub descriptors_total: u32,
}

impl From<mesh_shm::arena::ArenaUsage> for ArenaRow {
    fn from(u: mesh_shm::arena::ArenaUsage) -> Self {
        Self {
            in_use_bytes: u.in_use,
            free_bytes: u.free,
            largest_free_bytes: u.largest_free,
            descriptors_in_use: u.descriptors_in_use,
            descriptors_total: u.descriptors_total,
        }
    }
}

/// What `info` shows beyond the GPU's name and mode: the GPU's UUID and how `--device` named it,
/// and the MPS pool (read when `info` is answered, without waiting for the backend).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct InfoExtra {
    /// The GPU's UUID (`GPU-…`, as `nvidia-smi -L` prints it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_uuid: Option<String>,
    /// `--device` as given (an ordinal or a UUID); absent when meshd was started without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_selector: Option<String>,
    /// The MPS worker pool (MPS mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolRow>,
    /// meshd's version line, as `meshd --version` prints it after "meshd " (absent from an older meshd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// meshd's pid (absent from an older meshd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// When this process image started, ms since the Unix epoch: a handoff (or a replacement after a
    /// GPU fault) keeps the pid and changes this (absent from an older meshd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_unix_ms: Option<u64>,
}

/// What a handoff hands over, in its answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct HandoffRow {
    /// The binary the process executes next.
    pub binary: String,
    /// Its version line, as its `--version` printed it.
    pub version: String,
    /// Programs that run on for the new image to adopt (MPS mode under `--orphan-grace-ms`).
    pub running_on: usize,
    /// Programs stopped in order for the new image to relaunch.
    pub stopped: usize,
    /// Programs whose worker was not seen waiting for the new image in time, each with its worker:
    /// the new image stops and relaunches them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub late: Vec<String>,
}

/// The MPS worker pool in `info`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PoolRow {
    /// `--pool`: workers made at start.
    pub size: u32,
    /// Workers waiting for a program, when `info` was answered.
    pub idle: u32,
    /// Workers running a program, when `info` was answered.
    pub in_use: u32,
    /// MPS clients the device takes (48 on Volta and later, 60 from CUDA 13.1).
    pub client_limit: u32,
    /// Where that figure comes from (the driver's version, or "unknown" and the older limit assumed).
    pub client_limit_source: String,
    /// `--pool-grow`: a load past the pool creates a client (stalling the running programs) instead of being refused.
    pub grow: bool,
    /// MPS clients created while programs ran, since start: each stalled every running program once.
    pub stalls: u64,
    /// The most recent of those stalls, oldest first.
    pub recent: Vec<GrowthRow>,
}

/// One client creation that stalled running programs.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct GrowthRow {
    /// Counts from 1 since meshd started; a gap means older rows were dropped from `recent`.
    pub seq: u64,
    /// The program whose load or upgrade needed the client (the one unloaded, for a refill).
    pub program: String,
    /// load, upgrade or refill (the pool grown back after an unload or upgrade discarded a worker).
    pub op: String,
    /// Programs that were running, and stalled.
    pub stalled: u32,
    /// When, milliseconds since the Unix epoch.
    pub unix_ms: u64,
}

impl From<&PoolSnapshot> for PoolRow {
    fn from(p: &PoolSnapshot) -> Self {
        Self {
            size: p.size,
            idle: p.idle,
            in_use: p.in_use,
            client_limit: p.limit,
            client_limit_source: p.limit_source.clone(),
            grow: p.grow,
            stalls: p.stalls,
            recent: p
                .recent
                .iter()
                .map(|g| GrowthRow {
                    seq: g.seq,
                    program: g.program.clone(),
                    op: g.op.to_string(),
                    stalled: g.stalled,
                    unix_ms: g.unix_ms,
                })
                .collect(),
        }
    }
}

/// A service's row in `info`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServiceRow {
    /// The service (its fan-in channel; its group is this name and [`REPLIES_SUFFIX`](super::REPLIES_SUFFIX)).
    pub name: String,
    /// Client slots in its group.
    pub entries: u32,
    /// Clients attached now.
    pub bound: u32,
    /// Shards of its fan-in channel (absent when 1, as from a meshd before shards).
    #[serde(default = "one_part", skip_serializing_if = "is_one_part")]
    pub shards: u32,
    /// Slots left by departed clients whose departure the serving program has not acknowledged yet
    /// (not reusable until it does).
    #[serde(default)]
    pub awaiting_ack: u32,
    /// The attached clients.
    #[serde(default)]
    pub clients: Vec<ServiceClientRow>,
    /// A client that holds the service's fan-in ring between the begin and the commit of a send
    /// (stopped with SIGSTOP, or descheduled, in the middle of writing a request), for longer than
    /// the stall watcher's `--client-stall-ms`: what it cannot revoke while the client lives. Absent
    /// when nothing holds the ring that way (or the watcher is off). With several shards held at
    /// once, the lowest shard's: every one is in [`ServiceRow::holds`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<ServiceHold>,
    /// Every shard's hold as [`ServiceRow::held_by`] describes it, by shard (each shard is a ring of
    /// its own, held apart), so `holds[0]` is `held_by`. Absent when nothing is held, and from a
    /// meshd before it (which showed `held_by` only): read `held_by` then.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<ServiceHold>,
    /// Why the service's state could not be read (a corrupt group word), where it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What happened to its clients since this meshd started (absent while nothing has, and from a
    /// meshd before it).
    #[serde(default, skip_serializing_if = "ServiceEvents::is_none")]
    pub events: ServiceEvents,
}

/// A service's client events since this meshd started: counters, each from 0 at meshd's start.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServiceEvents {
    /// Clients attached.
    #[serde(default)]
    pub attached: u64,
    /// Clients that left alive: a detach, or a live process closing its lease.
    #[serde(default)]
    pub detached: u64,
    /// Clients departed because their process was gone (killed, crashed, or exited without a detach).
    #[serde(default)]
    pub died: u64,
    /// Requests cut off by a client's death, completed as skips for the program (no reply is owed).
    #[serde(default)]
    pub skipped: u64,
    /// Reservations the stall watcher revoked from a live client stopped before writing (it sends
    /// that request again when it runs).
    #[serde(default)]
    pub stall_revoked: u64,
    /// Clients the stall watcher killed (`--client-stall-kill-ms`); each is then counted in `died`.
    #[serde(default)]
    pub stall_killed: u64,
}

impl ServiceEvents {
    /// Nothing happened yet (the field is then left out of `info`).
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }
}

/// A client holding a service's fan-in ring in the middle of a send (`info`'s `held_by`): the
/// program waits at that request, and the other clients once the ring is full, until the client
/// goes on or dies (`meshd run --client-stall-kill-ms` kills it after that long).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServiceHold {
    /// The client's id (`slot | epoch << 16`).
    pub client: u32,
    /// Its process (0: not recorded).
    pub pid: u32,
    /// The held request's sequence number in the fan-in ring (in its shard's).
    pub seq: u64,
    /// The fan-in shard held (absent when 0, as from a meshd before shards).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shard: u32,
    /// How long the ring has been held there, ms (since the watcher first saw it).
    pub since_ms: u64,
    /// Whether the process is stopped now (SIGSTOP, or a debugger's stop), as `/proc` says; `false`:
    /// it runs, descheduled or slow.
    #[serde(default)]
    pub stopped: bool,
}

/// An attached client in `info`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServiceClientRow {
    /// Its id (`slot | epoch << 16`).
    pub id: u32,
    /// Its process, as meshd learned it from the socket's peer credentials (0: not recorded).
    pub pid: u32,
}
