//! Service clients' leases: `service_attach` binds a client and holds its connection until it detaches, closes it or dies; and at start, the clients a previous meshd left bound are adopted.
//!
//! * **Attach** (`service_attach`): the client's process is the socket's SO_PEERCRED pid (with its
//!   start time, so that a reused pid never passes for it), watched through a pidfd. The answer
//!   carries the client's id; the connection then stays open as the client's **lease**, with no
//!   idle timeout and outside the control connection limit (leases have their own,
//!   [`Limits::max_leases`](super::limits::Limits::max_leases)).
//! * **Leaving**: a `detach` line on the lease revokes what the live client may still hold of the
//!   fan-in ring and departs its entry. A lease that closes without one is a client that died (its
//!   pidfd readable, or it is exiting: its stores are final once it is gone, so meshd waits for that
//!   and completes its fan-in slots with `depart_dead`) or one that merely closed its socket (alive:
//!   detached as if it had asked). A client that dies holding its lease is departed the same way.
//! * **Start** ([`adopt`]): a meshd that takes over a mailbox repairs every service's fan-in ring
//!   (skip headers a completer that died left out), departs the clients whose process is gone, and
//!   watches the live ones' pidfds on one thread, departing each when it dies. Their leases died
//!   with the old meshd, so they can no longer detach: their entries stay bound until they exit.
//! * **Stop**: leases and the watchers end without touching the mailbox; the next meshd adopts the
//!   clients still bound.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use mesh_shm::claim::{Holder, process_dying};
use mesh_shm::group::GroupError;
use mesh_shm::{ChannelInfo, ClientId, Completion, ShmError};

use super::services::{ServiceRecord, Services, replies_name, service_names};
use super::stalls::SharedOwner;
use super::waits::{open_pidfd, wait_readable};
use crate::protocol::{AttachedClient, MAX_LINE, Request, Response, parse_request, write_response};

/// How long an attach waits for the serving program to acknowledge a departure before it is refused
/// (a program acknowledges within its rate-limited poll of the group's `changes` word, a few ms; a
/// client that reattaches at once would otherwise be refused for that short gap).
const ACK_WAIT: Duration = Duration::from_millis(500);

/// How long a detach is retried while the client is between the begin and the commit of a send
/// before meshd says so (a send's begin-to-commit is a copy of one message).
const DETACH_RETRY: Duration = Duration::from_secs(1);

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

/// A bound client as meshd watches it.
struct Client {
    service: String,
    owner: SharedOwner,
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

/// Serves a `service_attach` of `service` from process `pid` on `conn` (with `resume`, a
/// `service_resume` of that client id instead): binds the client (or takes back the one a previous
/// meshd left bound to this process), answers with its id, then holds the connection as its lease
/// until it detaches, closes it or dies. `max_leases` bounds the leases held at once; `stopping` is
/// the server's stop flag.
#[allow(clippy::too_many_arguments)]
pub(super) fn serve_lease(
    services: &Services,
    max_leases: usize,
    stopping: &AtomicBool,
    conn: &UnixStream,
    pid: i32,
    service: &str,
    resume: Option<u32>,
    early: Vec<u8>,
) {
    let op = if resume.is_some() { "resume" } else { "attach" };
    let refuse = |why: String| {
        tracing::warn!(service = %service, peer_pid = pid, "service {op} refused: {why}");
        let _ = write_response(&mut &*conn, &Response::error(why));
    };
    let _lease = match LeaseSlot::take(services, max_leases) {
        Ok(l) => l,
        Err(n) => {
            return refuse(format!(
                "service {service:?}: cannot attach: meshd holds {n} service leases (attached clients), its limit; try \
                 again once some detach"
            ));
        }
    };
    if stopping.load(Ordering::Acquire) || services.stopping() {
        return refuse("meshd is shutting down".into());
    }
    let Ok(pid) = u32::try_from(pid) else {
        return refuse(format!(
            "service {service:?}: cannot attach: the peer's pid {pid} is not a process meshd can watch"
        ));
    };
    let taken = match resume {
        None => attach(services, service, pid),
        Some(id) => take_back(services, service, pid, ClientId(id)),
    };
    let client = match taken {
        Ok(c) => c,
        Err(e) => return refuse(format!("{e:#}")),
    };
    let id = client.id;
    match resume {
        None => tracing::info!(service = %service, client = id.0, slot = id.slot(), pid, "service client attached"),
        Some(_) => tracing::info!(
            service = %service, client = id.0, slot = id.slot(), pid,
            "service client took back its lease (bound under a previous meshd)"
        ),
    }
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

/// The client's process `pid` (with its start time, so that a reused pid never passes for it) and a
/// pidfd of it; refused when it is gone.
fn client_process(pid: u32) -> Result<(Holder, Option<OwnedFd>)> {
    let holder = Holder::of_pid(pid);
    let pidfd = open_pidfd(pid);
    // After the pidfd is open: it names this process (its start time matches), not a later one of that pid.
    if !holder.alive() {
        bail!("the client's process {pid} is gone");
    }
    Ok((holder, pidfd))
}

/// Binds a client of process `pid` to `service`; waits up to [`ACK_WAIT`] for an entry whose last
/// client's departure the program has yet to acknowledge.
fn attach(services: &Services, service: &str, pid: u32) -> Result<Client> {
    let owner = services.owner(service)?;
    let (holder, pidfd) = client_process(pid).with_context(|| format!("service {service:?}: cannot attach"))?;
    let start = Instant::now();
    let id = loop {
        let tried = {
            let mut o = owner.lock();
            // Deleted since this attach found it: its rings may be another channel's now.
            if o.deleted {
                bail!("service {service:?}: no such service (it was deleted)");
            }
            o.connect(holder)
        };
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

/// The client `id` of `service` that a previous meshd left bound to process `pid`, taken out of
/// the unleased ones that the start's watcher looks after, for a new lease to hold. Refused, naming
/// why, unless `id` is bound to that very process (pid and start time) and no lease holds it.
fn take_back(services: &Services, service: &str, pid: u32, id: ClientId) -> Result<Client> {
    let owner = services.owner(service)?;
    let (holder, pidfd) =
        client_process(pid).with_context(|| format!("service {service:?}: cannot resume client {:#x}", id.0))?;
    let bound = owner.lock().bound_each().0;
    match bound.iter().find(|(b, _)| *b == id) {
        None => bail!(
            "service {service:?}: cannot resume client {:#x}: no such client is bound (departed, or never attached); \
             attach anew",
            id.0
        ),
        Some((_, h)) if *h != Some(holder) => bail!(
            "service {service:?}: cannot resume client {:#x}: it is bound to {}, not to this process ({pid})",
            id.0,
            h.map_or_else(|| "no process".to_string(), |h| format!("process {}", h.pid))
        ),
        Some(_) => {}
    }
    if !services.unleased.lock().remove(&(service.to_string(), id.0)) {
        bail!(
            "service {service:?}: cannot resume client {:#x}: a lease of this meshd holds it already (only a client \
             whose lease ended with a previous meshd is resumed)",
            id.0
        );
    }
    let record = services.record(service);
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
                services.unleased.lock().insert((name.clone(), id.0));
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
            let key = (c.service.clone(), c.id.0);
            let mut unleased = services.unleased.lock();
            // Taken back by a lease (`service_resume`): that lease looks after it from now on.
            if !unleased.contains(&key) {
                return false;
            }
            if c.holder.alive() {
                return true;
            }
            unleased.remove(&key);
            drop(unleased);
            c.depart_dead("its process is gone (watched since meshd started)");
            false
        });
    }
}
