//! Services (issue 26): `service create`, the clients' leases on the control socket, and the clients a previous meshd left bound.
//!
//! A service `NAME` is two channels: the fan-in channel `NAME` (every client's requests, each
//! carrying its sender's id) and the group `NAME.replies` (one reply ring per client slot). A
//! program serves it by binding the two, in that order. meshd's side of both is mesh-shm's
//! [`ServiceOwner`]: one per service, opened on first use and kept behind a mutex, because meshd
//! must be the only writer of the group's entries and its connection threads share it.
//!
//! * **Attach** (`service_attach`): the client's process is the socket's SO_PEERCRED pid (with its
//!   start time, so that a reused pid never passes for it), watched through a pidfd. The answer
//!   carries the client's id; the connection then stays open as the client's **lease**, with no
//!   idle timeout and outside the control connection limit (leases have their own,
//!   [`super::Limits::max_leases`]).
//! * **Leaving**: a `detach` line on the lease revokes what the live client may still hold of the
//!   fan-in ring and departs its entry. A lease that closes without one is a client that died (its
//!   pidfd readable, or it is exiting: its stores are final once it is gone, so meshd waits for that
//!   and completes its fan-in slots with `depart_dead`) or one that merely closed its socket (alive:
//!   detached as if it had asked). A client that dies holding its lease is departed the same way.
//! * **Start** ([`adopt`]): a meshd that takes over a mailbox repairs every service's fan-in ring
//!   (skip headers a completer that died left out), departs the clients whose process is gone, and
//!   watches the live ones' pidfds on one thread, departing each when it dies. Their leases died
//!   with the old meshd, so they can no longer detach: their entries stay bound until they exit.
//! * **Stalls** (`stalls.rs`): a live client that holds its fan-in ring in the middle of a send
//!   (stopped, or descheduled) is revoked by the stall watcher, or shown in `info` (`held_by`, kept
//!   here in [`Services::held`]) where it cannot be.
//! * **Stop**: leases and the watchers end without touching the mailbox; the next meshd adopts the
//!   clients still bound.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use mesh_shm::claim::{Holder, process_dying};
use mesh_shm::group::{EntryState, GroupError, MAX_ENTRIES};
use mesh_shm::layout::{MAX_CAPACITY, MAX_FANIN_SHARDS, MAX_MSG_SIZE, PLACEMENT_HOST, ring_bytes_at};
use mesh_shm::{ChannelInfo, ClientId, Completion, Mailbox, Protocol, ServiceOwner, ShmError};
use parking_lot::Mutex;
use rustix::event::{PollFd, PollFlags};

use super::Shared;
use super::listener::ConnectionSlot;
use super::stalls::{Held, StallConfig};
use crate::protocol::{
    AttachedClient, MAX_LINE, REPLIES_SUFFIX, Request, Response, SERVICE_NAME_MAX, ServiceClientRow, ServiceEvents,
    ServiceHold, ServiceRow, parse_request, write_response,
};

/// How long an attach waits for the serving program to acknowledge a departure before it is refused
/// (a program acknowledges within its rate-limited poll of the group's `changes` word, a few ms; a
/// client that reattaches at once would otherwise be refused for that short gap).
const ACK_WAIT: Duration = Duration::from_millis(500);

/// How long a detach is retried while the client is between the begin and the commit of a send
/// before meshd says so (a send's begin-to-commit is a copy of one message).
const DETACH_RETRY: Duration = Duration::from_secs(1);

/// A `service_create` as the backend thread applies it (the defaults filled in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ServiceSpec {
    pub(super) name: String,
    pub(super) clients: u32,
    pub(super) msg_size: u32,
    pub(super) capacity: u32,
    pub(super) reply_size: u32,
    pub(super) reply_capacity: u32,
    /// The fan-in channel's shards (its `parts` word).
    pub(super) shards: u32,
}

/// The group's name for service `name`.
fn replies_name(name: &str) -> String {
    format!("{name}{REPLIES_SUFFIX}")
}

/// What `service_create`'s numbers must be, checked before anything is made (the mailbox checks
/// them again, but by then the fan-in channel could exist without its group).
fn check_spec(spec: &ServiceSpec) -> Result<()> {
    let name = &spec.name;
    if name.is_empty() || name.len() > SERVICE_NAME_MAX || name.contains('\0') {
        bail!(
            "service {name:?}: a service name is 1 to {SERVICE_NAME_MAX} bytes without NUL (its group's channel, \
             the name and {REPLIES_SUFFIX:?}, must fit the mailbox's {} bytes)",
            mesh_shm::layout::NAME_LEN
        );
    }
    if let Some(c) = name.chars().find(|&c| c.is_control() || c.is_whitespace() || c == ',') {
        bail!("service {name:?}: a service name may not hold control characters, spaces or commas (it holds {c:?})");
    }
    if spec.clients == 0 || spec.clients > MAX_ENTRIES {
        bail!("service {name:?}: {} clients: a service has 1 to {MAX_ENTRIES} client slots", spec.clients);
    }
    for (what, size) in [("request size (msg_size)", spec.msg_size), ("reply size (reply_size)", spec.reply_size)] {
        if size == 0 || size % 8 != 0 || size > MAX_MSG_SIZE {
            bail!("service {name:?}: {what} {size}: must be a multiple of 8 from 8 to {MAX_MSG_SIZE} bytes");
        }
    }
    for (what, capacity) in [
        ("capacity (requests in flight over all clients)", spec.capacity),
        ("reply_capacity (replies each client's ring holds)", spec.reply_capacity),
    ] {
        if !capacity.is_power_of_two() || capacity > MAX_CAPACITY {
            bail!("service {name:?}: {what} {capacity}: must be a power of two up to {MAX_CAPACITY}");
        }
    }
    if !spec.shards.is_power_of_two() || spec.shards > MAX_FANIN_SHARDS {
        bail!(
            "service {name:?}: {} shards: the fan-in channel has a power of two from 1 to {MAX_FANIN_SHARDS} shards",
            spec.shards
        );
    }
    Ok(())
}

/// The channel `name`, or `None` when there is none.
fn channel(mailbox: &Mailbox, name: &str) -> Result<Option<ChannelInfo>> {
    match mailbox.channel(name) {
        Ok(c) => Ok(Some(c)),
        Err(ShmError::NoSuchChannel(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A ring still to be made: its message size, capacity, protocol and `parts` word.
type Ring = (u32, u32, Protocol, u32);

/// Checks that the mailbox has room for `rings`, made one after the other: free descriptors, and
/// ring arena bytes from the end of the last ring made (channels are never deleted, so the arena's
/// used part ends where the furthest ring ends). A check, not a reservation: meshd makes channels on
/// its one backend thread, and a host process that makes channels itself meanwhile can still take
/// the room (the creation then fails, and says so).
fn check_room(mailbox: &Mailbox, service: &str, rings: &[Ring]) -> Result<()> {
    let g = mailbox.geometry();
    let channels = mailbox.channels()?;
    let free = (g.channel_count as usize).saturating_sub(channels.len());
    if free < rings.len() {
        bail!(
            "service {service:?}: mailbox full: it needs {} channel descriptor(s) and {free} of the {} are free \
             (`meshd run --channels` sets how many a new mailbox has)",
            rings.len(),
            g.channel_count
        );
    }
    let end = channels
        .iter()
        .map(|c| {
            let bytes =
                ring_bytes_at(c.ring_offset, c.msg_size, c.capacity, c.placement.code(), c.protocol.code(), c.parts);
            c.ring_offset + bytes.unwrap_or(0)
        })
        .fold(g.arena_offset, u64::max);
    let free_bytes = (g.arena_offset + g.arena_size).saturating_sub(end);
    let mut need = 0u64;
    for &(msg_size, capacity, protocol, parts) in rings {
        let bytes = ring_bytes_at(end + need, msg_size, capacity, PLACEMENT_HOST, protocol.code(), parts)
            .ok_or_else(|| anyhow!("service {service:?}: protocol {protocol} has no size in this build"))?;
        need = need.saturating_add(bytes);
    }
    if need > free_bytes {
        bail!(
            "service {service:?}: mailbox full: its channels need {need} bytes of the ring arena and {free_bytes} of its \
             {} are free (fewer --clients, a smaller --reply-capacity, --reply-size or --capacity, or a larger \
             `meshd run --shm-size` for a new mailbox)",
            g.arena_size
        );
    }
    Ok(())
}

/// Makes service `spec.name`: its fan-in channel, then its group. Everything that can be checked is
/// checked first, so that a refusal leaves the mailbox as it was. Should the group still fail after
/// the fan-in channel was made (another process took the room in between), the fan-in channel
/// stays (channels cannot be deleted) and the error says so; a `service_create` of that name with
/// the same request size and capacity then makes only the group, completing the service.
pub(super) fn create(mailbox: &Mailbox, spec: &ServiceSpec) -> Result<()> {
    check_spec(spec)?;
    let ServiceSpec { name, clients, msg_size, capacity, reply_size, reply_capacity, shards } = spec.clone();
    let replies = replies_name(&name);
    let group: Ring = (reply_size, reply_capacity, Protocol::Group, clients);
    match (channel(mailbox, &name)?, channel(mailbox, &replies)?) {
        (Some(c), _) if c.protocol != Protocol::FanIn => bail!(
            "service {name:?}: channel {name:?} already exists (protocol {}), and a service's fan-in channel takes \
             the service's name; choose another name",
            c.protocol
        ),
        (Some(_), Some(_)) => bail!("service {name:?}: already exists"),
        (None, Some(g)) => bail!(
            "service {name:?}: channel {replies:?} already exists (protocol {}), and the service's group takes that \
             name; choose another name",
            g.protocol
        ),
        (Some(c), None) => {
            // A fan-in channel without its group: what a creation whose group failed leaves.
            if (c.msg_size, c.capacity, c.parts) != (msg_size, capacity, shards) {
                bail!(
                    "service {name:?}: fan-in channel {name:?} exists ({} requests of {} bytes, {} shard(s)) without \
                     its group {replies:?} (a `service create` whose group could not be made left it); create the \
                     service again with --msg-size {} --capacity {} --shards {} to complete it",
                    c.capacity,
                    c.msg_size,
                    c.parts,
                    c.msg_size,
                    c.capacity,
                    c.parts
                );
            }
            check_room(mailbox, &name, &[group])?;
            mailbox.create_group(&replies, clients, reply_size, reply_capacity)?;
            tracing::info!(
                service = %name, clients, msg_size, capacity, reply_size, reply_capacity,
                "service completed: group {replies} made beside the fan-in channel a failed creation left"
            );
            return Ok(());
        }
        (None, None) => {}
    }
    check_room(mailbox, &name, &[(msg_size, capacity, Protocol::FanIn, shards), group])?;
    mailbox.create_fanin(&name, msg_size, capacity, shards)?;
    if let Err(e) = mailbox.create_group(&replies, clients, reply_size, reply_capacity) {
        bail!(
            "service {name:?}: its fan-in channel {name:?} was made, but its group {replies:?} could not be: {e}; the \
             fan-in channel stays (channels cannot be deleted), and a `service create` of {name:?} with the same \
             --msg-size, --capacity and --shards completes the service once there is room"
        );
    }
    tracing::info!(
        service = %name, clients, msg_size, capacity, reply_size, reply_capacity, shards,
        "service created: fan-in channel {name} ({shards} shard(s)), group {replies}"
    );
    Ok(())
}

/// The services of `channels`: every fan-in channel `X` beside a group `X.replies`, with the
/// group's entries.
fn service_names(channels: &[ChannelInfo]) -> Vec<(String, u32)> {
    let groups: HashMap<&str, u32> =
        channels.iter().filter_map(|c| c.clients().map(|entries| (c.name.as_str(), entries))).collect();
    channels
        .iter()
        .filter(|c| c.protocol == Protocol::FanIn)
        .filter_map(|c| groups.get(replies_name(&c.name).as_str()).map(|&entries| (c.name.clone(), entries)))
        .collect()
}

/// What meshd keeps of one service in its own memory, never in the mailbox: each attached client's
/// process as meshd saw it attach (what the stall watcher may signal: the entry's holder word is
/// shared memory that any process of the uid can rewrite), and the clients' events since meshd
/// started (`info`'s `events`, the metrics' counters), bumped by whichever thread saw the event.
#[derive(Debug, Default)]
pub(super) struct ServiceRecord {
    /// Each bound client's process, by client id, from its attach (or, for a client a previous meshd
    /// attached, from the entry as found at start); removed when it departs.
    clients: Mutex<HashMap<u32, Holder>>,
    attached: AtomicU64,
    detached: AtomicU64,
    died: AtomicU64,
    skipped: AtomicU64,
    pub(super) stall_revoked: AtomicU64,
    pub(super) stall_killed: AtomicU64,
}

impl ServiceRecord {
    fn bind(&self, id: ClientId, holder: Holder) {
        self.clients.lock().insert(id.0, holder);
    }

    fn unbind(&self, id: ClientId) {
        self.clients.lock().remove(&id.0);
    }

    /// Client `id`'s process as meshd recorded it, if it is bound.
    pub(super) fn holder(&self, id: ClientId) -> Option<Holder> {
        self.clients.lock().get(&id.0).copied()
    }

    fn snapshot(&self) -> ServiceEvents {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ServiceEvents {
            attached: get(&self.attached),
            detached: get(&self.detached),
            died: get(&self.died),
            skipped: get(&self.skipped),
            stall_revoked: get(&self.stall_revoked),
            stall_killed: get(&self.stall_killed),
        }
    }
}

/// meshd's services: one owner each, the leases, the watcher of adopted clients and the stall
/// watcher's settings and findings.
pub(super) struct Services {
    mailbox: Mailbox,
    owners: Mutex<HashMap<String, Arc<Mutex<ServiceOwner>>>>,
    /// Owners opened so far (bumped after each joins `owners`): the stall watcher looks at `owners`
    /// again when it moves, and at nothing else the rest of the time.
    pub(super) opened: AtomicUsize,
    /// Leases held now.
    leases: AtomicUsize,
    /// Threads that may still act on the mailbox for a service (leases and the watchers): the
    /// server waits for them at its end, so that a meshd started next in this process never shares
    /// an entry's writes with them.
    pub(super) active: AtomicUsize,
    stopped: AtomicBool,
    /// Written once at stop and never read: readable from then on, so every lease's and the
    /// watchers' `poll` wakes.
    stop_tx: UnixStream,
    pub(super) stop_rx: UnixStream,
    /// The stall watcher's settings (`None`: it does not run).
    pub(super) stall: Option<StallConfig>,
    /// Fan-in rings held by a client between the begin and the commit of a send (what the stall
    /// watcher cannot revoke), by service and shard: `info`'s `holds` (and `held_by`, the lowest shard's).
    pub(super) held: Mutex<HashMap<(String, u32), Held>>,
    /// Each service's record, by service.
    records: Mutex<HashMap<String, Arc<ServiceRecord>>>,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Services({} leases)", self.leases.load(Ordering::Relaxed))
    }
}

impl Services {
    pub(super) fn new(mailbox: &Mailbox, stall: Option<StallConfig>) -> Result<Self> {
        let (stop_tx, stop_rx) = UnixStream::pair().context("the service leases' stop socket")?;
        stop_tx.set_nonblocking(true)?;
        Ok(Self {
            mailbox: mailbox.clone(),
            owners: Mutex::new(HashMap::new()),
            opened: AtomicUsize::new(0),
            leases: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            stop_tx,
            stop_rx,
            stall,
            held: Mutex::new(HashMap::new()),
            records: Mutex::new(HashMap::new()),
        })
    }

    /// Ends every lease and the watcher (each closes what it holds, leaving the mailbox as it is).
    pub(super) fn stop(&self) {
        if !self.stopped.swap(true, Ordering::AcqRel) {
            let _ = (&self.stop_tx).write(&[1]);
        }
    }

    /// Waits, up to `within`, for the leases and the watcher to end after [`Services::stop`].
    pub(super) fn wait_ended(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while self.active.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub(super) fn stopping(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Service `service`'s record (made on first use).
    pub(super) fn record(&self, service: &str) -> Arc<ServiceRecord> {
        self.records.lock().entry(service.to_string()).or_default().clone()
    }

    /// The owner of service `service`, opened on first use.
    pub(super) fn owner(&self, service: &str) -> Result<Arc<Mutex<ServiceOwner>>> {
        let mut owners = self.owners.lock();
        if let Some(o) = owners.get(service) {
            return Ok(o.clone());
        }
        let no_such =
            |why: String| anyhow!("service {service:?}: no such service ({why}; `meshd service create` makes one)");
        let replies = replies_name(service);
        match channel(&self.mailbox, service)? {
            None => return Err(no_such(format!("no channel {service:?}"))),
            Some(c) if c.protocol != Protocol::FanIn => {
                return Err(no_such(format!("channel {service:?} is protocol {}, not a service's fan-in", c.protocol)));
            }
            Some(_) => {}
        }
        match channel(&self.mailbox, &replies)? {
            None => return Err(no_such(format!("fan-in channel {service:?} has no group {replies:?}"))),
            Some(c) if c.protocol != Protocol::Group => {
                return Err(no_such(format!("channel {replies:?} is protocol {}, not a group", c.protocol)));
            }
            Some(_) => {}
        }
        let owner = Arc::new(Mutex::new(ServiceOwner::open(&self.mailbox, service, &replies)?));
        owners.insert(service.to_string(), owner.clone());
        self.opened.fetch_add(1, Ordering::Release);
        Ok(owner)
    }

    /// Every service whose owner is open (each one a client attached to, or adopted at start, at
    /// least once: a service no client ever used has nothing to watch).
    pub(super) fn open_owners(&self) -> Vec<(String, Arc<Mutex<ServiceOwner>>)> {
        self.owners.lock().iter().map(|(name, o)| (name.clone(), o.clone())).collect()
    }

    /// `info`'s rows: every service, its clients, the slots waiting for the program's ack, and what
    /// holds its fan-in ring that the stall watcher cannot revoke.
    pub(super) fn rows(&self) -> Vec<ServiceRow> {
        // A descriptor a peer damaged leaves out its own service alone (`info` logs it).
        let channels: Vec<ChannelInfo> = self.mailbox.channels_each().into_iter().filter_map(Result::ok).collect();
        let held = self.held.lock().clone();
        service_names(&channels)
            .into_iter()
            .map(|(name, entries)| {
                // Every shard's hold, by shard; `held_by` stays the first, for clients that read
                // only that (one ring, as before shards).
                let mut holds: Vec<(u32, ServiceHold)> = held
                    .iter()
                    .filter(|((service, _), _)| *service == name)
                    .map(|((_, shard), h)| (*shard, h.row()))
                    .collect();
                holds.sort_unstable_by_key(|(shard, _)| *shard);
                let holds: Vec<ServiceHold> = holds.into_iter().map(|(_, h)| h).collect();
                let held_by = holds.first().cloned();
                let events = self.records.lock().get(&name).map(|r| r.snapshot()).unwrap_or_default();
                // Entry by entry: a damaged entry is named in `error`, and every other client is listed.
                let read = self.owner(&name).map(|o| {
                    let o = o.lock();
                    let (clients, mut corrupt) = o.bound_each();
                    let shards = o.shards();
                    let mut awaiting_ack = 0;
                    for slot in 0..entries {
                        #[allow(clippy::cast_possible_truncation, reason = "slot < entries <= 2^16")]
                        if let Ok(e) = o.entry(slot as u16)
                            && e.state == EntryState::Departed
                            && e.acked_epoch != e.epoch
                        {
                            awaiting_ack += 1;
                        }
                    }
                    let error = corrupt.drain(..).next().map(|e| format!("{e:#}"));
                    (clients, awaiting_ack, shards, error)
                });
                match read {
                    Ok((clients, awaiting_ack, shards, error)) => ServiceRow {
                        name,
                        entries,
                        shards,
                        #[allow(clippy::cast_possible_truncation, reason = "at most the group's entries, <= 2^16")]
                        bound: clients.len() as u32,
                        awaiting_ack,
                        clients: clients
                            .into_iter()
                            .map(|(id, holder)| ServiceClientRow { id: id.0, pid: holder.map_or(0, |h| h.pid) })
                            .collect(),
                        held_by,
                        holds,
                        error,
                        events,
                    },
                    Err(e) => ServiceRow {
                        name,
                        entries,
                        shards: 1,
                        held_by,
                        holds,
                        error: Some(format!("{e:#}")),
                        events,
                        ..ServiceRow::default()
                    },
                }
            })
            .collect()
    }
}

/// Counts a lease (and its thread) until dropped.
struct LeaseSlot<'a>(&'a Services);

impl<'a> LeaseSlot<'a> {
    fn take(services: &'a Services, max: usize) -> std::result::Result<Self, usize> {
        let n = services.leases.fetch_add(1, Ordering::AcqRel);
        services.active.fetch_add(1, Ordering::AcqRel);
        let slot = Self(services);
        if n >= max { Err(n) } else { Ok(slot) }
    }
}

impl Drop for LeaseSlot<'_> {
    fn drop(&mut self) {
        self.0.leases.fetch_sub(1, Ordering::AcqRel);
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A pidfd for `pid`, readable once the process has exited; `None` where the kernel has none (the
/// waits then poll the process's liveness every 100 ms instead).
pub(super) fn open_pidfd(pid: u32) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// A bound client as meshd watches it.
struct Client {
    service: String,
    owner: Arc<Mutex<ServiceOwner>>,
    id: ClientId,
    holder: Holder,
    pidfd: Option<OwnedFd>,
    record: Arc<ServiceRecord>,
}

impl Client {
    /// Completes a dead client's fan-in slots and departs its entry; logged either way.
    fn depart_dead(&self, how: &str) {
        let Self { service, id, holder, .. } = self;
        let done = self.owner.lock().depart_dead(*id);
        match done {
            Ok(Completion { skipped, finished, .. }) => {
                self.record.unbind(*id);
                self.record.died.fetch_add(1, Ordering::Relaxed);
                self.record.skipped.fetch_add(u64::from(skipped), Ordering::Relaxed);
                tracing::info!(
                    service = %service, client = id.0, slot = id.slot(), pid = holder.pid, skipped, finished,
                    "service client departed: {how}"
                );
            }
            Err(e) => tracing::warn!(
                service = %service, client = id.0, pid = holder.pid,
                "service client {how}, but its departure was refused: {e}"
            ),
        }
    }

    /// A live client's detach, retried while it is in the middle of a send, up to [`DETACH_RETRY`].
    fn detach_live(&self) -> Result<Completion> {
        let start = Instant::now();
        loop {
            let tried = self.owner.lock().detach(self.id);
            match tried {
                Ok(done) => return Ok(done),
                Err(ShmError::Group { error: GroupError::StillSending { stuck, .. }, .. }) => {
                    if start.elapsed() >= DETACH_RETRY {
                        bail!(
                            "service {:?}: client {:#x} is in the middle of a send ({stuck} request slot(s) reserved and \
                             not yet committed) and stayed there for {} ms; its slot stays bound: finish the send, then \
                             detach again",
                            self.service,
                            self.id.0,
                            DETACH_RETRY.as_millis()
                        );
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The client's lease ended without a detach (its connection closed, or its pidfd said it died):
    /// a dead or exiting client is departed once it is gone (its stores are final then), a live one
    /// detached. A live one that stays in the middle of a send is logged and waited for: its slot is
    /// departed as soon as it finishes the send or dies. Ends early, leaving the entry bound, when
    /// meshd stops (the next meshd adopts it).
    fn leave(&self, services: &Services) {
        let started = Instant::now();
        let mut warned = false;
        loop {
            if services.stopping() {
                return;
            }
            if !self.holder.alive() {
                self.depart_dead("its process is gone");
                return;
            }
            let dying = process_dying(self.holder.pid);
            if !dying {
                let tried = self.owner.lock().detach(self.id);
                match tried {
                    Ok(done) => {
                        self.record.unbind(self.id);
                        self.record.detached.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(
                            service = %self.service, client = self.id.0, slot = self.id.slot(), pid = self.holder.pid,
                            revoked = done.skipped,
                            "service client detached: it closed its connection"
                        );
                        return;
                    }
                    Err(ShmError::Group { error: GroupError::StillSending { stuck, .. }, .. }) => {
                        if !warned && started.elapsed() >= DETACH_RETRY {
                            warned = true;
                            tracing::warn!(
                                service = %self.service, client = self.id.0, pid = self.holder.pid, stuck,
                                "service client closed its connection in the middle of a send and lives on; its slot \
                                 stays bound until it finishes the send or exits"
                            );
                        }
                    }
                    Err(e) => {
                        tracing::warn!(
                            service = %self.service, client = self.id.0, pid = self.holder.pid,
                            "service client closed its connection, but its detach was refused: {e}"
                        );
                        return;
                    }
                }
            }
            // Exiting (its pidfd wakes this at its end, which can take seconds when it was killed
            // inside a driver call), or mid-send: wait for its death, or a little to try the detach again.
            let pause = match (dying && self.pidfd.is_some(), warned) {
                (true, _) => Duration::from_secs(1),
                (false, true) => Duration::from_millis(100),
                (false, false) => Duration::from_millis(2),
            };
            let mut fds = vec![services.stop_rx.as_fd()];
            fds.extend(self.pidfd.as_ref().map(AsFd::as_fd));
            let _ = wait_readable(&fds, Some(pause));
        }
    }
}

/// How long a wait on a client without a pidfd lasts at most: its liveness is checked that often.
const NO_PIDFD_CHECK: Duration = Duration::from_millis(100);

/// Waits until one of `fds` is readable (or hung up), or `timeout` passes; which were. A pidfd among
/// them is readable once its process has exited.
pub(super) fn wait_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> Vec<bool> {
    let mut polled: Vec<PollFd<'_>> = fds.iter().map(|fd| PollFd::new(fd, PollFlags::IN)).collect();
    let spec = timeout.map(|t| rustix::time::Timespec {
        tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    match rustix::event::poll(&mut polled, spec.as_ref()) {
        Ok(_) => polled.iter().map(|p| !p.revents().is_empty()).collect(),
        // EINTR and the like: nothing is known ready; the caller looks again (after a pause, so that
        // an error that repeats never spins).
        Err(_) => {
            std::thread::sleep(Duration::from_millis(1));
            vec![false; fds.len()]
        }
    }
}

/// Serves a `service_attach` of `service` from process `pid` on `conn`: binds the client, answers
/// with its id, then holds the connection as its lease until it detaches, closes it or dies.
pub(super) fn serve_lease(
    shared: &Shared,
    conn: &UnixStream,
    pid: i32,
    service: &str,
    slot: ConnectionSlot,
    early: Vec<u8>,
) {
    let services = &*shared.services;
    // No longer a control connection: the lease has its own bound.
    drop(slot);
    let refuse = |why: String| {
        tracing::warn!(service = %service, peer_pid = pid, "service attach refused: {why}");
        let _ = write_response(&mut &*conn, &Response::error(why));
    };
    let _lease = match LeaseSlot::take(services, shared.limits.max_leases) {
        Ok(l) => l,
        Err(n) => {
            return refuse(format!(
                "service {service:?}: cannot attach: meshd holds {n} service leases (attached clients), its limit; try \
                 again once some detach"
            ));
        }
    };
    if shared.stopping.load(Ordering::Acquire) || services.stopping() {
        return refuse("meshd is shutting down".into());
    }
    let Ok(pid) = u32::try_from(pid) else {
        return refuse(format!(
            "service {service:?}: cannot attach: the peer's pid {pid} is not a process meshd can watch"
        ));
    };
    let client = match attach(services, service, pid) {
        Ok(c) => c,
        Err(e) => return refuse(format!("{e:#}")),
    };
    let id = client.id;
    tracing::info!(service = %service, client = id.0, slot = id.slot(), pid, "service client attached");
    let answer = Response {
        ok: true,
        client: Some(AttachedClient { id: id.0, requests: service.to_string(), replies: replies_name(service) }),
        ..Response::default()
    };
    if let Err(e) = write_response(&mut &*conn, &answer) {
        tracing::warn!(service = %service, client = id.0, pid, "answering the attach: {e}; taking the client back");
        return client.leave(services);
    }
    hold_lease(services, conn, &client, early);
}

/// Binds a client of process `pid` to `service`; waits up to [`ACK_WAIT`] for an entry whose last
/// client's departure the program has yet to acknowledge.
fn attach(services: &Services, service: &str, pid: u32) -> Result<Client> {
    let owner = services.owner(service)?;
    let holder = Holder::of_pid(pid);
    let pidfd = open_pidfd(pid);
    // After the pidfd is open: it names this process (its start time matches), not a later one of that pid.
    if !holder.alive() {
        bail!("service {service:?}: cannot attach: the client's process {pid} is gone");
    }
    let start = Instant::now();
    let id = loop {
        let tried = owner.lock().connect(holder);
        match tried {
            Ok(id) => break id,
            Err(ShmError::Group { error: GroupError::AwaitingAck { .. }, .. }) if start.elapsed() < ACK_WAIT => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(ShmError::Group { error: GroupError::AllBound { entries }, .. }) => bail!(
                "service {service:?}: cannot attach: all {entries} client slot(s) are bound to clients; try again once \
                 one detaches (`service create --clients` sets how many there are)"
            ),
            Err(ShmError::Group { error: GroupError::AwaitingAck { entries, bound, awaiting_ack }, .. }) => bail!(
                "service {service:?}: cannot attach: no client slot is free: {bound} of {entries} bound to clients, \
                 {awaiting_ack} left by departed clients and not yet acknowledged by the serving program (is it \
                 running, and does it handle departures?)"
            ),
            Err(e) => return Err(anyhow!(e).context(format!("service {service:?}: cannot attach"))),
        }
    };
    let record = services.record(service);
    record.bind(id, holder);
    record.attached.fetch_add(1, Ordering::Relaxed);
    Ok(Client { service: service.to_string(), owner, id, holder, pidfd, record })
}

/// What a lease waits for.
enum Woke {
    Stop,
    /// The pidfd or the connection said something (data, EOF, or the process's exit).
    Ready,
}

/// Holds `client`'s lease on `conn`: reads `detach` lines (anything else is refused, the lease
/// kept), and ends at a detach, at the connection's end or the process's death (then
/// [`Client::leave`]), or at meshd's stop (the entry left bound).
fn hold_lease(services: &Services, conn: &UnixStream, client: &Client, early: Vec<u8>) {
    let mut pending = early;
    let mut buf = [0u8; 4096];
    loop {
        while let Some(at) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=at).collect();
            let answer = match parse_request(&line) {
                Ok(Request::Detach) => match client.detach_live() {
                    Ok(done) => {
                        client.record.unbind(client.id);
                        client.record.detached.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(
                            service = %client.service, client = client.id.0, slot = client.id.slot(),
                            pid = client.holder.pid, revoked = done.skipped, "service client detached"
                        );
                        let _ = write_response(&mut &*conn, &Response::ok());
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(service = %client.service, client = client.id.0, "detach refused: {e:#}");
                        Response::error(format!("{e:#}"))
                    }
                },
                Ok(_) => Response::error(
                    "this connection is a service lease: it takes only {\"op\":\"detach\"}; send other requests on a \
                     connection of their own",
                ),
                Err(e) => Response::error(e),
            };
            if write_response(&mut &*conn, &answer).is_err() {
                return client.leave(services);
            }
        }
        if pending.len() > MAX_LINE {
            let _ = write_response(
                &mut &*conn,
                &Response::error(format!("request line longer than {MAX_LINE} bytes; lease closed")),
            );
            return client.leave(services);
        }
        let woke = {
            let mut fds = vec![services.stop_rx.as_fd(), conn.as_fd()];
            fds.extend(client.pidfd.as_ref().map(AsFd::as_fd));
            // Without a pidfd, wake now and then to check the process's liveness.
            let timeout = client.pidfd.is_none().then_some(NO_PIDFD_CHECK);
            let ready = wait_readable(&fds, timeout);
            if ready[0] { Woke::Stop } else { Woke::Ready }
        };
        match woke {
            Woke::Stop => {
                tracing::debug!(service = %client.service, client = client.id.0, "meshd stops: lease closed, client left bound");
                return;
            }
            Woke::Ready => {}
        }
        if !client.holder.alive() {
            return client.leave(services);
        }
        match rustix::net::recv(conn, &mut buf[..], rustix::net::RecvFlags::DONTWAIT) {
            Ok((0, _)) => return client.leave(services),
            Ok((n, _)) => pending.extend_from_slice(&buf[..n]),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
            Err(e) => {
                tracing::debug!(service = %client.service, client = client.id.0, "lease connection: {e}");
                return client.leave(services);
            }
        }
    }
}

/// At start (also a takeover): for every service, writes the skip headers a dead completer left
/// out, departs the clients whose process is gone, and watches the live ones on one thread,
/// departing each when it dies. Everything done is logged.
pub(super) fn adopt(services: &Arc<Services>) {
    // Each descriptor on its own: a damaged one leaves out its own service, not every other.
    let channels: Vec<ChannelInfo> = services
        .mailbox
        .channels_each()
        .into_iter()
        .filter_map(|c| c.inspect_err(|e| tracing::warn!("a service not checked at start: {e}")).ok())
        .collect();
    let mut watched = Vec::new();
    for (name, _) in service_names(&channels) {
        let owner = match services.owner(&name) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(service = %name, "service not checked at start: {e:#}");
                continue;
            }
        };
        let (repaired, (bound, corrupt)) = {
            let o = owner.lock();
            (o.repair(), o.bound_each())
        };
        // A damaged entry is left as it is, named; every other client is checked.
        for e in corrupt {
            tracing::warn!(service = %name, "a service client's entry not checked at start: {e}");
        }
        let (mut departed, mut live) = (0, 0);
        for (id, holder) in bound {
            let Some(holder) = holder else {
                departed += 1;
                let c = Client {
                    service: name.clone(),
                    owner: owner.clone(),
                    id,
                    holder: Holder { pid: 0, start: 0 },
                    pidfd: None,
                    record: services.record(&name),
                };
                c.depart_dead("bound with no process recorded (found at start)");
                continue;
            };
            let pidfd = if holder.alive() { open_pidfd(holder.pid) } else { None };
            let client = Client {
                service: name.clone(),
                owner: owner.clone(),
                id,
                holder,
                pidfd,
                record: services.record(&name),
            };
            // Checked again after the pidfd is open, so that the pidfd names the recorded process.
            if client.holder.alive() {
                live += 1;
                client.record.bind(id, holder);
                watched.push(client);
            } else {
                departed += 1;
                client.depart_dead("its process is gone (found at start)");
            }
        }
        tracing::info!(
            service = %name, repaired, departed, watched = live,
            "service checked at start: {repaired} fan-in skip header(s) repaired, {departed} dead client(s) departed, \
             {live} live client(s) watched until they exit (their leases ended with the previous meshd)"
        );
    }
    if watched.is_empty() {
        return;
    }
    services.active.fetch_add(1, Ordering::AcqRel);
    let for_thread = services.clone();
    let spawned = std::thread::Builder::new().name("meshd-svc-watch".into()).spawn(move || {
        watch_adopted(&for_thread, watched);
        for_thread.active.fetch_sub(1, Ordering::AcqRel);
    });
    if let Err(e) = spawned {
        services.active.fetch_sub(1, Ordering::AcqRel);
        tracing::error!("no thread to watch the adopted service clients ({e}): they stay bound until a restart");
    }
}

/// Departs each of `clients` when its process dies (its pidfd readable; without one, checked every
/// 100 ms); ends when none is left or at meshd's stop.
fn watch_adopted(services: &Services, mut clients: Vec<Client>) {
    while !clients.is_empty() {
        let all_pidfds = clients.iter().all(|c| c.pidfd.is_some());
        let mut fds: Vec<BorrowedFd<'_>> = vec![services.stop_rx.as_fd()];
        fds.extend(clients.iter().filter_map(|c| c.pidfd.as_ref().map(AsFd::as_fd)));
        let ready = wait_readable(&fds, (!all_pidfds).then_some(NO_PIDFD_CHECK));
        if ready[0] || services.stopping() {
            return;
        }
        clients.retain(|c| {
            if c.holder.alive() {
                return true;
            }
            c.depart_dead("its process is gone (watched since meshd started)");
            false
        });
    }
}
