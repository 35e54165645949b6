//! Services: `service create`, meshd's table of them (one owner each, the clients' records) and `info`'s rows.
//!
//! A service `NAME` is two channels: the fan-in channel `NAME` (every client's requests, each
//! carrying its sender's id) and the group `NAME.replies` (one reply ring per client slot). A
//! program serves it by binding the two, in that order. meshd's side of both is mesh-shm's
//! [`ServiceOwner`]: one per service, opened on first use and kept behind a mutex, because meshd
//! must be the only writer of the group's entries and its connection threads share it.
//!
//! * **Clients** come and go through their leases (`leases.rs`: attach, detach, death, and the
//!   clients a previous meshd left bound), which record what they see here ([`ServiceRecord`]).
//! * **Stalls** (`stalls.rs`): a live client that holds its fan-in ring in the middle of a send
//!   (stopped, or descheduled) is revoked by the stall watcher, or shown in `info` (`held_by`, kept
//!   here in [`Services::held`]) where it cannot be. The watcher reads this table through
//!   [`ServiceTable`], so that it knows nothing of leases or creation.
//! * **Stop**: leases and the watchers end without touching the mailbox; the next meshd adopts the
//!   clients still bound.

use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use mesh_shm::claim::Holder;
use mesh_shm::group::{EntryState, MAX_ENTRIES};
use mesh_shm::layout::{MAX_CAPACITY, MAX_FANIN_SHARDS, MAX_MSG_SIZE, PLACEMENT_HOST, ring_bytes_at};
use mesh_shm::{ChannelInfo, ClientId, Mailbox, Protocol, ServiceOwner, ShmError};
use parking_lot::Mutex;

use super::stalls::{Held, ServiceHandle, ServiceTable, SharedOwner, StallConfig};
use crate::protocol::{REPLIES_SUFFIX, SERVICE_NAME_MAX, ServiceClientRow, ServiceEvents, ServiceHold, ServiceRow};

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
pub(super) fn replies_name(name: &str) -> String {
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

/// Checks that the mailbox has room for `rings`: free descriptors, and arena bytes
/// ([`Mailbox::arena_usage`]): as many free in all as the rings take together, and a free run as
/// long as the largest of them (a deleted channel's ring leaves a gap that only rings of its size or
/// less fit). A check, not a reservation: meshd makes channels on its one backend thread, and a host
/// process that makes channels itself meanwhile can still take the room (the creation then fails,
/// and says so); and two rings that each fit a run may not fit side by side, which the creation
/// finds too.
fn check_room(mailbox: &Mailbox, service: &str, rings: &[Ring]) -> Result<()> {
    let g = mailbox.geometry();
    let usage = mailbox.arena_usage();
    let free = usage.descriptors_total.saturating_sub(usage.descriptors_in_use) as usize;
    if free < rings.len() {
        bail!(
            "service {service:?}: mailbox full: it needs {} channel descriptor(s) and {free} of the {} are free \
             (`meshd run --channels` sets how many a new mailbox has; `meshd channel delete` and \
             `meshd service delete` free some)",
            rings.len(),
            usage.descriptors_total
        );
    }
    let (mut need, mut largest) = (0u64, 0u64);
    for &(msg_size, capacity, protocol, parts) in rings {
        // Sized where the arena starts: a ring's size varies by its padding to a page with where it
        // starts, which the creation accounts for exactly.
        let bytes = ring_bytes_at(g.arena_offset, msg_size, capacity, PLACEMENT_HOST, protocol.code(), parts)
            .ok_or_else(|| anyhow!("service {service:?}: protocol {protocol} has no size in this build"))?;
        need = need.saturating_add(bytes);
        largest = largest.max(bytes);
    }
    let fix = "fewer --clients, a smaller --reply-capacity, --reply-size or --capacity, deleting channels or services \
               no longer used, or a larger `meshd run --shm-size` for a new mailbox";
    if need > usage.free {
        bail!(
            "service {service:?}: mailbox full: its channels need {need} bytes of the ring arena and {} of its {} \
             are free ({fix})",
            usage.free,
            g.arena_size
        );
    }
    if largest > usage.largest_free {
        bail!(
            "service {service:?}: mailbox fragmented: its largest ring needs {largest} bytes, and the longest free \
             run of the ring arena is {} bytes ({} free in all, in runs left by deleted channels; {fix})",
            usage.largest_free,
            usage.free
        );
    }
    Ok(())
}

/// Makes service `spec.name`: its fan-in channel, then its group. Everything that can be checked is
/// checked first, so that a refusal leaves the mailbox as it was. Should the group still fail after
/// the fan-in channel was made (another process took the room in between), the fan-in channel stays
/// and the error says so; a `service_create` of that name with the same request size and capacity
/// then makes only the group, completing the service (or `service_delete` removes what was made).
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
        // Each ring fitted a free run (check_room), yet not both side by side: undone, so that the
        // refusal leaves the mailbox as it was.
        if mailbox.delete_service(&name, true).is_ok() {
            bail!(
                "service {name:?}: {e} (its fan-in channel fitted the ring arena, its group then did not; neither is kept)"
            );
        }
        bail!(
            "service {name:?}: its fan-in channel {name:?} was made, but its group {replies:?} could not be: {e}; the \
             fan-in channel stays: a `service create` of {name:?} with the same --msg-size, --capacity and \
             --shards completes the service once there is room, and `meshd service delete {name}` removes it"
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
pub(super) fn service_names(channels: &[ChannelInfo]) -> Vec<(String, u32)> {
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
    pub(super) attached: AtomicU64,
    pub(super) detached: AtomicU64,
    pub(super) died: AtomicU64,
    pub(super) skipped: AtomicU64,
    stall_revoked: AtomicU64,
    stall_killed: AtomicU64,
}

impl ServiceRecord {
    pub(super) fn bind(&self, id: ClientId, holder: Holder) {
        self.clients.lock().insert(id.0, holder);
    }

    pub(super) fn unbind(&self, id: ClientId) {
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
    pub(super) mailbox: Mailbox,
    owners: Mutex<HashMap<String, SharedOwner>>,
    /// Owners opened so far (bumped after each joins `owners`): the stall watcher looks at `owners`
    /// again when it moves, and at nothing else the rest of the time.
    opened: AtomicUsize,
    /// Leases held now.
    pub(super) leases: AtomicUsize,
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
    stall: Option<StallConfig>,
    /// Fan-in rings held by a client between the begin and the commit of a send (what the stall
    /// watcher cannot revoke), by service and shard: `info`'s `holds` (and `held_by`, the lowest shard's).
    held: Mutex<HashMap<(String, u32), Held>>,
    /// Each service's record, by service.
    records: Mutex<HashMap<String, Arc<ServiceRecord>>>,
    /// The live clients a previous meshd left bound, by service and client id, while no lease of
    /// this meshd holds them: watched until they exit, or until they take their lease back
    /// (`service_resume`), which removes them here.
    pub(super) unleased: Mutex<std::collections::HashSet<(String, u32)>>,
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
            unleased: Mutex::new(std::collections::HashSet::new()),
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
    pub(super) fn owner(&self, service: &str) -> Result<SharedOwner> {
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
        let owner = Arc::new(Mutex::new(ServiceHandle::new(ServiceOwner::open(&self.mailbox, service, &replies)?)));
        owners.insert(service.to_string(), owner.clone());
        self.opened.fetch_add(1, Ordering::Release);
        Ok(owner)
    }

    /// Deletes service `name`, its fan-in channel and its group (the mailbox's `delete_service`,
    /// which refuses while a program binds either, and while they hold messages unless `discard`);
    /// returns the messages dropped. Refused, naming the client and its process, while a client is
    /// attached. Done under the service's handle lock (the handle opened here if no client used the
    /// service yet), so that no attach binds a client between the check and the delete; the handle
    /// is then marked deleted, and the service's handle, record and holds are forgotten.
    pub(super) fn delete(&self, name: &str, discard: bool) -> Result<u64> {
        // No handle for what is not a whole service (no such name, a plain channel, a fan-in channel
        // whose group was never made): the mailbox's delete says what it is, or removes the part made.
        let handle = self.owner(name).ok();
        let mut guard = handle.as_ref().map(|h| h.lock());
        if let Some(o) = &guard {
            let (bound, _) = o.bound_each();
            if let Some((id, holder)) = bound.first() {
                // The process meshd saw attach, else the entry's word.
                let pid = self.record(name).holder(*id).or(*holder).map_or(0, |h| h.pid);
                let more = match bound.len() {
                    1 => String::new(),
                    n => format!(" (and {} more client(s))", n - 1),
                };
                bail!(
                    "service {name:?}: in use: client {:#x} of pid {pid} is attached{more}; a service is deleted \
                     once its clients have detached or exited",
                    id.0
                );
            }
        }
        let discarded = self.mailbox.delete_service(name, discard)?;
        if let Some(o) = guard.as_mut() {
            o.deleted = true;
        }
        drop(guard);
        self.owners.lock().remove(name);
        self.records.lock().remove(name);
        self.held.lock().retain(|(service, _), _| service != name);
        // The stall watcher looks at its list again, and drops the deleted service.
        self.opened.fetch_add(1, Ordering::Release);
        Ok(discarded)
    }

    /// Every service whose owner is open (each one a client attached to, or adopted at start, at
    /// least once: a service no client ever used has nothing to watch).
    pub(super) fn open_owners(&self) -> Vec<(String, SharedOwner)> {
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

/// The stall watcher's view of the table.
impl ServiceTable for Services {
    fn stall_config(&self) -> Option<StallConfig> {
        self.stall
    }

    fn active(&self) -> &AtomicUsize {
        &self.active
    }

    fn opened(&self) -> usize {
        self.opened.load(Ordering::Acquire)
    }

    fn open_owners(&self) -> Vec<(String, SharedOwner)> {
        Services::open_owners(self)
    }

    fn stop_fd(&self) -> BorrowedFd<'_> {
        self.stop_rx.as_fd()
    }

    fn stopping(&self) -> bool {
        Services::stopping(self)
    }

    fn held(&self) -> &Mutex<HashMap<(String, u32), Held>> {
        &self.held
    }

    fn attached_holder(&self, service: &str, client: ClientId) -> Option<Holder> {
        self.record(service).holder(client)
    }

    fn count_revoked(&self, service: &str, requests: u64) {
        self.record(service).stall_revoked.fetch_add(requests, Ordering::Relaxed);
    }

    fn count_killed(&self, service: &str) {
        self.record(service).stall_killed.fetch_add(1, Ordering::Relaxed);
    }
}
