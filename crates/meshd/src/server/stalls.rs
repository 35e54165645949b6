//! The services' stall watcher: a client that holds its service's fan-in ring (stopped with SIGSTOP, or descheduled, in the middle of a send) is revoked after `T_stall`, or reported and, when asked, killed.
//!
//! The design is `docs/explanation/services.md`, "Clients that stop". One thread, started
//! when the server runs ([`start`]), wakes every few ms (a quarter of `T_stall`, at most 10 ms) and
//! reads, for each service a client has used (its owner open: attached to, or adopted at start), and
//! for each shard of its fan-in channel (one ring each, watched apart), three words of the ring
//! ([`mesh_shm::FanInProbe::hold`]: the
//! consumer's published `tail`, the ownership word of the slot there, and that slot's commit word
//! while it is being written). It takes no lock for that, so it never waits behind a lease, an
//! attach or `info`, and they never wait behind it; it takes the service's owner lock only to act.
//!
//! A **hold** is a reservation of the slot at `tail` that is not final: the consumer waits for it
//! (or, for the slot's last lap taken but never finished, no producer can reserve `tail`). Once the
//! same hold (the same `tail` and the same ownership word: a slot's word never returns to a value it
//! had while `tail` stays put) has lasted `T_stall`, the watcher looks the slot's owner up in the
//! group (the bound client of that entry) and applies the design's rule through
//! `mesh_shm::fanin::revoke_live`:
//!
//! * **Reserved** (stopped before its first store): made a skip. The program takes `Skipped` with the
//!   client's id; when the client runs again its begin fails and it sends the request anew, so
//!   nothing is lost or sent twice.
//! * **Writing, committed** (stopped between its commit and its finish): finished for it. The
//!   message was whole; its late finish fails harmlessly.
//! * **Writing, not committed** (stopped inside the copy of one request): cannot be completed while
//!   the client lives. Logged once (`fan-in NAME held at seq S by pid P (stopped)`), shown in `info`
//!   and `ps` (`holds`, every shard held; `held_by`, the first) until it ends, and, with a kill delay ([`StallConfig::kill`]), the client is
//!   killed with SIGKILL once it has held the ring that long; its lease (or the watcher of adopted
//!   clients) then sees it die and completes the slot as a skip (`depart_dead`).
//!
//! A client that is merely slow cannot be told from a stopped one: it is revoked too, which costs
//! the program one skip and the client one resend, never a lost or repeated request.

use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mesh_shm::claim::{Holder, process_dying};
use mesh_shm::fanin::{Hold, OwnState};
use mesh_shm::group::EntryState;
use mesh_shm::{ClientId, FanInProbe, ServiceOwner};
use parking_lot::Mutex;

use super::limits::Limits;
use super::waits::{open_pidfd, wait_readable};
use crate::protocol::ServiceHold;

/// meshd's handle on one service (it derefs to mesh-shm's [`ServiceOwner`]) and whether the
/// service was deleted. A thread that took the handle before the delete (an attach, this watcher)
/// finds `deleted` under the handle's lock and leaves the mailbox alone: by then the service's ring
/// bytes may be another channel's.
#[derive(Debug)]
pub(super) struct ServiceHandle {
    owner: ServiceOwner,
    /// Set, under the lock, by the delete that removed the service from the mailbox.
    pub(super) deleted: bool,
}

impl ServiceHandle {
    pub(super) fn new(owner: ServiceOwner) -> Self {
        Self { owner, deleted: false }
    }
}

impl std::ops::Deref for ServiceHandle {
    type Target = ServiceOwner;
    fn deref(&self) -> &ServiceOwner {
        &self.owner
    }
}

impl std::ops::DerefMut for ServiceHandle {
    fn deref_mut(&mut self) -> &mut ServiceOwner {
        &mut self.owner
    }
}

/// A service's handle as the threads share it.
pub(super) type SharedOwner = Arc<Mutex<ServiceHandle>>;

/// The longest pause between two looks at a ring.
const MAX_PERIOD: Duration = Duration::from_millis(10);

/// The stall watcher's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct StallConfig {
    /// `T_stall`: how long one hold may last before the watcher acts.
    pub(super) after: Duration,
    /// Kill a client that holds the ring between the begin and the commit of a send this long (at
    /// the earliest once `after` has passed too); `None`: never.
    pub(super) kill: Option<Duration>,
}

impl StallConfig {
    /// The settings `limits` asks for; `None` when the watcher is off.
    pub(super) fn of(limits: &Limits) -> Option<Self> {
        limits.client_stall.filter(|t| !t.is_zero()).map(|after| Self { after, kill: limits.client_stall_kill })
    }

    /// How long the watcher sleeps between looks: a quarter of `T_stall` (so that a hold is acted
    /// on within `T_stall` and a quarter more), between 1 and 10 ms.
    fn period(&self) -> Duration {
        (self.after / 4).clamp(Duration::from_millis(1), MAX_PERIOD)
    }
}

/// A ring held between the begin and the commit of a send, as `info` shows it.
#[derive(Debug, Clone)]
pub(super) struct Held {
    client: ClientId,
    pid: u32,
    shard: u32,
    seq: u64,
    since: Instant,
}

impl Held {
    /// `info`'s `held_by` (its duration and the process's state as they are now).
    pub(super) fn row(&self) -> ServiceHold {
        ServiceHold {
            client: self.client.0,
            pid: self.pid,
            seq: self.seq,
            shard: self.shard,
            since_ms: u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX),
            stopped: ProcState::of(self.pid) == ProcState::Stopped,
        }
    }
}

/// What the watcher reads of meshd's table of services, and what it reports back to it (the table is
/// `services::Services`; the watcher knows it only through this, so that it sits beneath the
/// services and their leases).
pub(super) trait ServiceTable: Send + Sync + 'static {
    /// The watcher's settings; `None`: it does not run.
    fn stall_config(&self) -> Option<StallConfig>;
    /// Threads that may still act on the mailbox for a service: the watcher counts itself there
    /// while it runs, so that the server's end waits for it.
    fn active(&self) -> &AtomicUsize;
    /// How many owners were opened so far: the watcher looks at [`ServiceTable::open_owners`]
    /// again only when this moves.
    fn opened(&self) -> usize;
    /// Every service whose owner is open.
    fn open_owners(&self) -> Vec<(String, SharedOwner)>;
    /// Readable once the services stop.
    fn stop_fd(&self) -> BorrowedFd<'_>;
    /// Whether the services stop.
    fn stopping(&self) -> bool;
    /// Rings held between the begin and the commit of a send, by service and shard (`info`'s `holds`).
    fn held(&self) -> &Mutex<HashMap<(String, u32), Held>>;
    /// Client `client` of `service`: its process as meshd saw it attach, if it is bound.
    fn attached_holder(&self, service: &str, client: ClientId) -> Option<Holder>;
    /// Counts `requests` revoked from a stalled client of `service`.
    fn count_revoked(&self, service: &str, requests: u64);
    /// Counts a stalled client of `service` killed.
    fn count_killed(&self, service: &str);
}

/// What `/proc` says of a client's process, for the log and `info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProcState {
    /// Stopped (state `T`: SIGSTOP and the like, or `t`: a debugger's stop).
    Stopped,
    /// Exiting, or gone.
    Exiting,
    /// Running or sleeping: descheduled, or slow.
    Running,
}

impl ProcState {
    fn of(pid: u32) -> Self {
        if pid == 0 || process_dying(pid) {
            return Self::Exiting;
        }
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|stat| {
            // The command name (field 2) may hold spaces and parentheses: the state follows the last ')'.
            let rest = &stat[stat.rfind(')')? + 1..];
            rest.split_ascii_whitespace().next().map(str::to_owned)
        });
        match state.as_deref() {
            Some("T" | "t") => Self::Stopped,
            None => Self::Exiting,
            Some(_) => Self::Running,
        }
    }

    fn says(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::Exiting => "exiting",
            Self::Running => "not stopped: running, descheduled or slow",
        }
    }
}

/// What the watcher did about the hold it watches.
#[derive(Debug, Clone, Copy)]
enum Acted {
    /// Nothing yet: the hold has not lasted `T_stall`.
    Waiting,
    /// Revoked or finished (or found gone when looked at again): nothing more to do; the next look
    /// sees another hold or none.
    Done,
    /// Between the begin and the commit of a send: reported, and killed once if asked.
    Stuck { client: ClientId, holder: Option<Holder>, killed: bool },
    /// The slot's owner is no bound client (logged once; nothing meshd may complete).
    Orphan,
}

/// The hold being watched on one ring, since it was first seen.
#[derive(Debug)]
struct Seen {
    hold: Hold,
    since: Instant,
    acted: Acted,
}

impl Seen {
    /// The same hold as `h`: the same position, the same ownership word, the same commit state.
    fn is(&self, h: &Hold) -> bool {
        (self.hold.tail, self.hold.word, self.hold.committed) == (h.tail, h.word, h.committed)
    }
}

/// One service as the watcher follows it: each shard's hold apart.
struct Watched {
    name: String,
    owner: SharedOwner,
    probe: FanInProbe,
    seen: Vec<Option<Seen>>,
}

/// One shard of a service's fan-in channel, for the log: the service's name, and the shard's index
/// when there are several.
#[derive(Debug, Clone, Copy)]
struct Ring<'a> {
    name: &'a str,
    shard: u32,
    shards: u32,
}

impl std::fmt::Display for Ring<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.shards > 1 { write!(f, "{} shard {}", self.name, self.shard) } else { f.write_str(self.name) }
    }
}

/// Starts the stall watcher on its own thread, when `services` has one configured; it ends when
/// the services stop ([`ServiceTable::stopping`]).
pub(super) fn start<T: ServiceTable>(services: &Arc<T>) {
    let Some(cfg) = services.stall_config() else { return };
    services.active().fetch_add(1, Ordering::AcqRel);
    let for_thread = services.clone();
    let spawned = std::thread::Builder::new().name("meshd-svc-stall".into()).spawn(move || {
        watch(&*for_thread, cfg);
        for_thread.active().fetch_sub(1, Ordering::AcqRel);
    });
    match spawned {
        Ok(_) => tracing::info!(
            stall_ms = cfg.after.as_millis(),
            kill_ms = cfg.kill.map(|k| k.as_millis()),
            "service stall watcher started: a client holding a fan-in ring for {} ms is revoked{}",
            cfg.after.as_millis(),
            match cfg.kill {
                Some(k) => format!(", or killed after {} ms where it cannot be", k.as_millis()),
                None => String::new(),
            }
        ),
        Err(e) => {
            services.active().fetch_sub(1, Ordering::AcqRel);
            tracing::error!("no thread for the service stall watcher ({e}): stalled service clients are not revoked");
        }
    }
}

/// The watcher's loop: every period, each service's hold looked at and acted on; ends at stop.
fn watch(services: &dyn ServiceTable, cfg: StallConfig) {
    let period = cfg.period();
    let mut watched: Vec<Watched> = Vec::new();
    let mut opened = usize::MAX;
    loop {
        // A service joins the watch as soon as a client first attaches to it, and leaves it when it
        // is deleted (which moves the count too).
        let now_opened = services.opened();
        if now_opened != opened {
            opened = now_opened;
            watched.retain(|w| !w.owner.lock().deleted);
            for (name, owner) in services.open_owners() {
                if !watched.iter().any(|w| w.name == name) {
                    let probe = owner.lock().stall_probe();
                    let seen = (0..probe.shards()).map(|_| None).collect();
                    watched.push(Watched { name, owner, probe, seen });
                }
            }
        }
        for w in &mut watched {
            w.look(services, &cfg, Instant::now());
        }
        let ready = wait_readable(&[services.stop_fd()], Some(period));
        if ready[0] || services.stopping() {
            return;
        }
    }
}

/// Milliseconds, for the log.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Watched {
    /// One look at every shard: follows its hold, and acts once it has lasted long enough.
    fn look(&mut self, services: &dyn ServiceTable, cfg: &StallConfig, now: Instant) {
        let shards = self.probe.shards();
        for (shard, seen) in (0..shards).zip(self.seen.iter_mut()) {
            let ring = Ring { name: &self.name, shard, shards };
            let hold = self.probe.hold(shard);
            match (seen, hold) {
                (Some(seen), Some(h)) if seen.is(&h) => {
                    let held = now.saturating_duration_since(seen.since);
                    match seen.acted {
                        Acted::Waiting if held >= cfg.after => {
                            seen.acted = act(ring, &self.owner, &self.probe, seen, held, services, cfg);
                        }
                        Acted::Stuck { client, holder, killed: false } if cfg.kill.is_some_and(|k| held >= k) => {
                            if kill(ring, seen.hold.seq, client, holder, held, cfg) {
                                services.count_killed(ring.name);
                            }
                            seen.acted = Acted::Stuck { client, holder, killed: true };
                        }
                        _ => {}
                    }
                }
                (seen, hold) => {
                    if let Some(old) = seen.take() {
                        ended(ring, &old, now, services);
                    }
                    *seen = hold.map(|hold| Seen { hold, since: now, acted: Acted::Waiting });
                }
            }
        }
    }
}

/// A hold that ended (the client went on, was revoked, or died): a reported one is no longer shown.
fn ended(ring: Ring<'_>, old: &Seen, now: Instant, services: &dyn ServiceTable) {
    if let Acted::Stuck { client, holder, .. } = old.acted {
        services.held().lock().remove(&(ring.name.to_string(), ring.shard));
        tracing::info!(
            service = %ring.name, shard = ring.shard, client = client.0, pid = holder.map_or(0, |h| h.pid),
            seq = old.hold.seq, held_ms = ms(now.saturating_duration_since(old.since)),
            "fan-in {ring} no longer held at seq {}: its client went on or died", old.hold.seq
        );
    }
}

/// Applies the design's rule to a hold that lasted `T_stall`: what it did.
fn act(
    ring: Ring<'_>,
    owner: &Mutex<ServiceHandle>,
    probe: &FanInProbe,
    seen: &Seen,
    held: Duration,
    services: &dyn ServiceTable,
    cfg: &StallConfig,
) -> Acted {
    let (name, shard) = (ring.name, ring.shard);
    let h = seen.hold;
    // Under the owner's lock no connect or departure changes the entries, and no other completer
    // runs; the ring is looked at again there, so that a client that went on meanwhile is left alone.
    let mut o = owner.lock();
    // A deleted service's ring may be another channel's by now: nothing of it is touched.
    if o.deleted || !probe.hold(shard).is_some_and(|now| seen.is(&now)) {
        return Acted::Done;
    }
    let entry = match o.entry(h.owner) {
        Ok(e) if e.state == EntryState::Bound => e,
        found => {
            let why = match found {
                Ok(e) => format!("entry {} is {:?} at epoch {}", h.owner, e.state, e.epoch),
                Err(e) => format!("{e}"),
            };
            tracing::warn!(
                service = %name, slot = h.owner, seq = h.seq, stalled_ms = ms(held),
                "fan-in {ring} held at seq {} by client slot {}, which no client holds ({why}): not completed", h.seq, h.owner
            );
            return Acted::Orphan;
        }
    };
    let client = ClientId::new(h.owner, entry.epoch);
    let pid = entry.holder.map_or(0, |h| h.pid);
    let state = match (h.state, h.committed) {
        (OwnState::Reserved, _) => "reserved",
        (_, true) => "committed",
        _ => "writing",
    };
    let done = match o.revoke_stalled(client) {
        Ok(done) => done,
        Err(e) => {
            drop(o);
            tracing::warn!(
                service = %name, client = client.0, pid, seq = h.seq, state, stalled_ms = ms(held),
                "fan-in {ring} held at seq {} by client {:#x}: its revocation was refused: {e}", h.seq, client.0
            );
            return Acted::Orphan;
        }
    };
    drop(o);
    if done.skipped > 0 {
        services.count_revoked(name, u64::from(done.skipped));
        tracing::warn!(
            service = %name, client = client.0, pid, seq = h.seq, state, stalled_ms = ms(held), skipped = done.skipped,
            "service client revoked: it held fan-in {ring} at seq {} for {} ms, reserved and not begun ({}); the \
             program takes a skip from it, and it sends that request again when it runs",
            h.seq, ms(held), ProcState::of(pid).says()
        );
    }
    if done.finished > 0 {
        tracing::warn!(
            service = %name, client = client.0, pid, seq = h.seq, state, stalled_ms = ms(held), finished = done.finished,
            "service client's send finished for it: it held fan-in {ring} at seq {} for {} ms between the commit and \
             the finish of a send ({}); the request was whole",
            h.seq, ms(held), ProcState::of(pid).says()
        );
    }
    if done.stuck > 0 {
        tracing::warn!(
            service = %name, client = client.0, pid, seq = h.seq, state, stalled_ms = ms(held),
            "fan-in {ring} held at seq {} by pid {pid} ({}): client {:#x} is between the begin and the commit of a \
             send, which cannot be revoked while it lives; the program waits there until it goes on or dies{}",
            h.seq,
            ProcState::of(pid).says(),
            client.0,
            if cfg.kill.is_some() { " (it is killed after --client-stall-kill-ms)" } else { "" }
        );
        services
            .held()
            .lock()
            .insert((name.to_string(), shard), Held { client, pid, shard, seq: h.seq, since: seen.since });
        // The process to kill, if it comes to that, is the one meshd saw attach, never the entry's
        // holder word (shared memory any process of the uid can rewrite to name another process).
        let recorded = services.attached_holder(name, client);
        if recorded.is_some() && recorded != entry.holder {
            tracing::warn!(
                service = %name, client = client.0, pid, recorded_pid = recorded.map_or(0, |h| h.pid),
                "fan-in {ring}: client {:#x}'s entry names pid {pid}, not the process that attached: the word was \
                 rewritten; only the attached process would be signalled",
                client.0
            );
        }
        return Acted::Stuck { client, holder: recorded, killed: false };
    }
    if done == mesh_shm::Completion::default() {
        tracing::debug!(service = %name, client = client.0, seq = h.seq, "stalled client went on before its revocation");
    }
    Acted::Done
}

/// Kills (SIGKILL) a client stuck between the begin and the commit of a send, through a pidfd opened
/// and then checked against its recorded start time, so that a reused pid is never signalled; whether it
/// was signalled.
fn kill(ring: Ring<'_>, seq: u64, client: ClientId, holder: Option<Holder>, held: Duration, cfg: &StallConfig) -> bool {
    let name = ring.name;
    let kill_ms = cfg.kill.map_or(0, ms);
    let Some(holder) = holder else {
        tracing::warn!(
            service = %name, client = client.0, seq,
            "fan-in {ring} held at seq {seq} by client {:#x} for {} ms: not killed, no process is recorded for it",
            client.0, ms(held)
        );
        return false;
    };
    let pid = holder.pid;
    // The holder is read from the entry's shared word, which any process of the uid can rewrite: one
    // naming meshd itself would have it kill itself. Its clients are never meshd.
    if pid == std::process::id() {
        tracing::warn!(
            service = %name, client = client.0, seq, pid,
            "fan-in {ring} held at seq {seq} by client {:#x} for {} ms: not killed, its entry's holder word names \
             meshd itself (written by another process)",
            client.0, ms(held)
        );
        return false;
    }
    let pidfd = open_pidfd(pid);
    // Checked after the pidfd is open: it then names the recorded process, not a later one of that pid.
    let sent = match pidfd {
        _ if !holder.alive() => Err("it is already gone".to_string()),
        Some(fd) => rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL)
            .map_err(|e| format!("pidfd_send_signal: {e}")),
        None => Err("the kernel gave no pidfd for it".to_string()),
    };
    match sent {
        Ok(()) => {
            tracing::warn!(
                service = %name, client = client.0, pid, seq, held_ms = ms(held), kill_ms,
                "service client killed (SIGKILL): it held fan-in {ring} at seq {seq} between the begin and the \
                 commit of a send for {} ms (--client-stall-kill-ms {kill_ms}); its death completes the slot as a skip",
                ms(held)
            );
            true
        }
        Err(why) => {
            tracing::warn!(
                service = %name, client = client.0, pid, seq, held_ms = ms(held),
                "service client {:#x} (pid {pid}) holding fan-in {ring} at seq {seq} not killed: {why}", client.0
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_is_a_quarter_of_t_stall_within_1_to_10_ms() {
        let cfg = |ms| StallConfig { after: Duration::from_millis(ms), kill: None };
        assert_eq!(cfg(50).period(), Duration::from_millis(10));
        assert_eq!(cfg(20).period(), Duration::from_millis(5));
        assert_eq!(cfg(1).period(), Duration::from_millis(1));
        let limits = |stall| Limits { client_stall: stall, ..Limits::default() };
        assert_eq!(StallConfig::of(&limits(Some(Duration::ZERO))), None, "0 is off");
        assert_eq!(StallConfig::of(&limits(None)), None);
        assert_eq!(StallConfig::of(&Limits::default()), None, "off unless asked");
        assert_eq!(StallConfig::of(&limits(Some(Duration::from_millis(50)))).map(|c| c.after.as_millis()), Some(50));
    }

    #[test]
    fn this_process_is_running_and_a_gone_one_is_exiting() {
        assert_eq!(ProcState::of(std::process::id()), ProcState::Running);
        assert_eq!(ProcState::of(0), ProcState::Exiting);
    }
}
