//! The listener: the accept loop, one thread per connection, and the answers read from the
//! snapshot and the mailbox (`ps`, `info`, `metrics`) without asking the backend thread.

use std::io::{BufReader, Read};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};

use anyhow::{Context, Result, anyhow};
use mesh_backend::BoardView;
use mesh_backend::pool::PoolFigures;
use rustix::event::{PollFd, PollFlags};

use super::jobs::{Job, Query, Routed};
use super::leases;
use super::natives::native_stop;
use super::plane::Server;
use super::shared::{Shared, fresh};
use super::stalls;
use crate::observe::overlay_recovery;
use crate::protocol::{
    ChannelRow, Info, InfoExtra, PoolRow, ProgramRow, Request, RequestError, Response, read_request_within,
    write_response,
};

impl Server {
    /// Serves `listener` until a `shutdown` request or a stop (signal or [`StopHandle`](super::StopHandle)).
    /// Returns whether every program stopped (false: some kernel ignored its stop request and still runs).
    pub fn run(self, listener: UnixListener) -> Result<bool> {
        listener.set_nonblocking(true)?;
        // Here rather than at start: a server that never runs leaves no thread behind. It ends with
        // the leases, at `services.stop()` below.
        stalls::start(&self.shared.services);
        loop {
            let (conn_ready, wake_ready) = {
                let mut fds = [PollFd::new(&listener, PollFlags::IN), PollFd::new(&self.wake_rx, PollFlags::IN)];
                match rustix::event::poll(&mut fds, None) {
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(e).context("poll on the control socket"),
                }
                (!fds[0].revents().is_empty(), !fds[1].revents().is_empty())
            };
            if wake_ready {
                let mut buf = [0u8; 64];
                while matches!((&self.wake_rx).read(&mut buf), Ok(n) if n > 0) {}
            }
            if self.shared.stopping.load(Ordering::Acquire) || self.backend.is_finished() {
                break;
            }
            if conn_ready {
                self.accept(&listener);
            }
        }
        self.shared.stopping.store(true, Ordering::Release);
        // Service leases and the watcher leave the mailbox as it is (the next meshd adopts the
        // clients still bound): they only close their connections and end.
        self.shared.services.stop();
        // The backend thread may already have ended (after a shutdown request): then this send fails, harmlessly.
        let _ = self.jobs.send(Job::Shutdown { reply: None });
        let clean = self.backend.join().map_err(|_| anyhow!("the backend thread panicked"))?;
        let_answers_out(&self.shared, std::time::Duration::from_millis(500));
        self.shared.services.wait_ended(std::time::Duration::from_millis(1000));
        Ok(clean)
    }

    fn accept(&self, listener: &UnixListener) {
        let conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                // EMFILE and the like: wait a little for descriptors to free, watching for a stop.
                tracing::warn!("accept: {e}");
                let mut fds = [PollFd::new(&self.wake_rx, PollFlags::IN)];
                let _ = rustix::event::poll(&mut fds, Some(&rustix::time::Timespec { tv_sec: 0, tv_nsec: 50_000_000 }));
                return;
            }
        };
        let _ = conn.set_nonblocking(false);
        let n = self.shared.connections.fetch_add(1, Ordering::AcqRel);
        let guard = ConnectionSlot(self.shared.clone());
        if n >= self.shared.limits.max_connections {
            tracing::warn!("refused a connection: {n} already being served");
            let _ = conn.set_write_timeout(Some(self.shared.limits.write));
            let _ = write_response(
                &mut &conn,
                &Response::error(format!("meshd is serving {n} connections, its limit; try again")),
            );
            return;
        }
        let (shared, jobs) = (self.shared.clone(), self.jobs.clone());
        let spawned = std::thread::Builder::new().name("meshd-conn".into()).spawn(move || {
            serve_connection(&shared, &jobs, &conn, guard);
        });
        if let Err(e) = spawned {
            tracing::warn!("no thread for a connection: {e}");
        }
    }
}

/// Gives the connection threads still answering (the `shutdown` request's own reply, above all) up
/// to `within` to finish: the process may exit right after [`Server::run`] returns, and a reply cut off
/// then reads as "meshd closed the connection without answering". Bounded, because a silent client is
/// only dropped after the idle timeout.
fn let_answers_out(shared: &Shared, within: std::time::Duration) {
    let deadline = std::time::Instant::now() + within;
    while shared.connections.load(Ordering::Acquire) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Counts a connection until dropped.
struct ConnectionSlot(Arc<Shared>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a peer of `uid` may talk to a meshd running as `own_uid`: that uid and root.
pub fn peer_allowed(uid: u32, own_uid: u32) -> bool {
    uid == own_uid || uid == 0
}

/// Serves one connection; `slot` counts it against the connection limit until it is answered, or
/// until it becomes a service lease (which has its own bound).
fn serve_connection(shared: &Shared, jobs: &mpsc::Sender<Job>, conn: &UnixStream, slot: ConnectionSlot) {
    let limits = shared.limits;
    let _ = conn.set_write_timeout(Some(limits.write));
    let peer = match rustix::net::sockopt::socket_peercred(conn.as_fd()) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("refused a connection: no peer credentials ({e})");
            let _ = write_response(&mut &*conn, &Response::error(format!("no peer credentials: {e}")));
            return;
        }
    };
    let (pid, uid) = (peer.pid.as_raw_nonzero().get(), peer.uid.as_raw());
    if !peer_allowed(uid, shared.own_uid) {
        tracing::warn!(peer_pid = pid, peer_uid = uid, "refused a client of another user");
        let why = format!("uid {uid} may not control this meshd (it serves uid {} and root)", shared.own_uid);
        let _ = write_response(&mut &*conn, &Response::error(why));
        return;
    }
    if let Err(e) = conn.set_read_timeout(Some(limits.idle)) {
        tracing::warn!("connection from pid {pid}: {e}");
        return;
    }
    let mut reader = BufReader::new(conn);
    let response = match read_request_within(&mut reader, Some(limits.idle)) {
        Ok((Request::ServiceAttach { service }, _)) => {
            // Bytes the client sent after its request line (a detach written at once) are the lease's.
            let early = reader.buffer().to_vec();
            // No longer a control connection: the lease has its own bound.
            drop(slot);
            let (max, stopping) = (shared.limits.max_leases, &*shared.stopping);
            return leases::serve_lease(&shared.services, max, stopping, conn, pid, &service, None, early);
        }
        Ok((Request::ServiceResume { service, client }, _)) => {
            let early = reader.buffer().to_vec();
            drop(slot);
            let (max, stopping) = (shared.limits.max_leases, &*shared.stopping);
            return leases::serve_lease(&shared.services, max, stopping, conn, pid, &service, Some(client), early);
        }
        Ok((req, image)) => answer(shared, jobs, req, image),
        Err(RequestError::Closed) => {
            tracing::debug!(peer_pid = pid, "a client closed its connection without a request");
            return;
        }
        Err(e @ RequestError::Idle(_)) => {
            tracing::info!(peer_pid = pid, "dropped a silent client: {e}");
            Response::error(e)
        }
        Err(e) => {
            tracing::warn!(peer_pid = pid, "refused a request: {e}");
            Response::error(e)
        }
    };
    if let Err(e) = write_response(&mut &*conn, &response) {
        tracing::warn!(peer_pid = pid, "answering a client: {e}");
    }
}

/// Answers queries (`ps`, `info`, `metrics`…) on this thread; queues anything else for the backend thread.
fn answer(shared: &Shared, jobs: &mpsc::Sender<Job>, req: Request, image: Vec<u8>) -> Response {
    let (reply, answer) = mpsc::sync_channel(1);
    let job = match Routed::from(req) {
        Routed::Query(query) => return self::query(shared, jobs, query),
        Routed::Change(change) => Job::Change { change, image, reply },
        Routed::Spawn(spec) => Job::Spawn { spec, reply },
        // `serve_connection` turns an attach's or a resume's connection into its lease before it gets here.
        Routed::Attach { service } | Routed::Resume { service } => {
            return Response::error(format!(
                "service_attach or service_resume of {service:?}: served only as a connection's first request"
            ));
        }
    };
    if shared.stopping.load(Ordering::Acquire) {
        return Response::error("meshd is shutting down");
    }
    let spawn = matches!(job, Job::Spawn { .. });
    if jobs.send(job).is_err() {
        return Response::error("meshd is shutting down");
    }
    let response = answer.recv().unwrap_or_else(|_| Response::error("meshd is shutting down"));
    if spawn && response.ok {
        natives_recorded(jobs);
    }
    response
}

/// Waits until the backend thread has written the native workers' table to the desired state (a
/// spawn's or a stop's answer must not precede its record: a crash would then undo it). When the
/// backend thread has ended, nothing more is recorded anyway.
fn natives_recorded(jobs: &mpsc::Sender<Job>) {
    let (done, recorded) = mpsc::sync_channel(1);
    if jobs.send(Job::RecordNatives { done }).is_ok() {
        let _ = recorded.recv();
    }
}

/// Answers a query on the connection thread.
fn query(shared: &Shared, jobs: &mpsc::Sender<Job>, query: Query) -> Response {
    match query {
        Query::Ps => Response {
            ok: true,
            programs: Some(ps_rows(shared, &shared.board.view())),
            natives: Some(shared.natives.rows()),
            ..Response::default()
        },
        Query::Stop { name } => {
            let response = native_stop(shared, &name);
            if response.ok {
                natives_recorded(jobs);
            }
            response
        }
        Query::Info => info(shared),
        Query::StrayDetach => Response::error(
            "detach: this connection attached no client; a client detaches on the connection its \
             service_attach was answered on (its lease), or by closing that connection",
        ),
        Query::Metrics => {
            let text = crate::monitor::exposition(&shared.metrics, shared);
            Response { ok: true, metrics: Some(text), ..Response::default() }
        }
        Query::Shutdown => {
            let (reply, answer) = mpsc::sync_channel(1);
            shared.stopping.store(true, Ordering::Release);
            if jobs.send(Job::Shutdown { reply: Some(reply) }).is_err() {
                return Response::ok();
            }
            // The backend thread may have ended already (a signal raced): the daemon stops either way.
            answer.recv().unwrap_or_else(|_| Response::ok())
        }
        Query::Handoff { binary } => {
            let (reply, answer) = mpsc::sync_channel(1);
            if jobs.send(Job::Handoff { binary, reply }).is_err() {
                return Response::error("handoff: meshd is shutting down");
            }
            answer.recv().unwrap_or_else(|_| Response::error("handoff: meshd is shutting down"))
        }
    }
}

/// The snapshot's programs with heartbeat, exit and user words read now from their slots (plain
/// host memory), overlaid with the recovery board `view` (a program a recovery holds shows `recovering`).
fn ps_rows(shared: &Shared, view: &BoardView) -> Vec<ProgramRow> {
    let snap = shared.snapshot();
    let mut rows: Vec<ProgramRow> = snap
        .programs
        .iter()
        .map(|p| {
            let mut row = ProgramRow::from(&fresh(&shared.mailbox, p));
            // A program held back has no slot (HELD_SLOT fails the lookup): no words to show.
            if let Ok(slot) = shared.mailbox.slot(p.slot) {
                row.user = slot.user_words().to_vec();
            }
            row
        })
        .collect();
    overlay_recovery(&mut rows, view);
    rows
}

/// A scrape reads what `ps` and `info` answer with.
impl crate::observe::Source for Shared {
    fn scrape(&self) -> crate::observe::Scrape {
        let info = info(self);
        let recovery = self.board.view();
        crate::observe::Scrape {
            programs: ps_rows(self, &recovery),
            natives: self.natives.rows(),
            info: info.info.ok_or_else(|| info.error.unwrap_or_default()),
            stopping: self.stopping.load(Ordering::Acquire),
            recovery,
        }
    }

    fn recovery(&self) -> BoardView {
        self.board.view()
    }
}

fn info(shared: &Shared) -> Response {
    let snap = shared.snapshot();
    // Each descriptor on its own: one that a peer process damaged is logged, naming it, and the
    // others are listed (one bad word must not blind `info` to every channel).
    let channels = shared
        .mailbox
        .channels_each()
        .into_iter()
        .filter_map(|c| c.inspect_err(|e| tracing::warn!("info: channel left out: {e}")).ok())
        .map(|c| ChannelRow {
            placement: c.placement.to_string(),
            protocol: c.protocol.to_string(),
            parts: c.parts,
            lost: c.lost,
            name: c.name,
            msg_size: c.msg_size,
            capacity: c.capacity,
            head: c.head,
            tail: c.tail,
        })
        .collect();
    Response {
        ok: true,
        info: Some(Info {
            mode: snap.mode.to_string(),
            mailbox: shared.mailbox.path().display().to_string(),
            device: snap.device.clone(),
            host_atomics: snap.host_atomics,
            channels,
            services: shared.services.rows(),
            arena: Some(shared.mailbox.arena_usage().into()),
            extra: InfoExtra {
                device_uuid: shared.device_id.get().map(|d| d.uuid.clone()),
                device_selector: shared.device_id.get().and_then(|d| d.selector.clone()),
                pool: snap.pool.as_ref().and_then(PoolFigures::snapshot).map(|p| PoolRow::from(&p)),
                version: Some(crate::handoff::version_line().to_string()),
                pid: Some(std::process::id()),
                started_unix_ms: crate::replace::process_start_unix_ms(),
            },
        }),
        ..Response::default()
    }
}
