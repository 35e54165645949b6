//! The Rust client of a meshd service: attached over the control socket, requests into the service's fan-in channel, replies from a reply ring of its own.
//!
//! A service `NAME` (made by `meshd service create`) is a fan-in channel `NAME` that every client
//! sends its requests into, each carrying the client's id, and a group `NAME.replies` holding one
//! reply ring per client slot; a program (usually a GPU program binding the two) takes the requests
//! and replies to each sender. [`ServiceClient::connect`] asks meshd to attach this process (the
//! `service_attach` request): meshd binds a slot to it and answers its id, and the connection then
//! stays open as the client's **lease**. The messages never touch the socket: they go through the
//! mailbox, as on every channel. [`ServiceClient::detach`] (or dropping the client) gives the slot
//! back; if the process dies instead, kill -9 included, meshd sees the lease close, completes any
//! send the client left half done (the server takes a skip, never a torn request) and frees the
//! slot for the next client once the server has acknowledged the departure.
//!
//! A restart of meshd (a crash, `systemctl restart`, `meshd handoff`) ends the lease but not the
//! client: the new meshd finds it still bound and watches its process, and requests and replies go
//! on through the mailbox. Its detach then takes the lease back from the meshd serving the socket
//! (`service_resume`) and detaches on it.

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use mesh_shm::{ClientId, FanInSender, GroupClient, Mailbox, ReplyWindow};

use crate::protocol::{Request, Response, read_response, write_request};

/// How long meshd may take to answer `info` or `service_attach` (it answers at once unless every
/// slot waits for the serving program's acknowledgement, which it waits up to 500 ms for).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a detach waits for meshd's answer before the lease is just closed (which frees the
/// slot too, a little later).
const DETACH_TIMEOUT: Duration = Duration::from_secs(5);

/// The control socket a client uses when given none, as the `meshd` command line resolves it:
/// `$MESHD_SOCKET`; else, with `$MESHD_DEVICE`, that GPU's meshd (`/tmp/meshd-<GPU UUID>.sock`; an
/// ordinal is looked up through the driver); else `/tmp/meshd.sock`.
pub fn default_socket() -> Result<PathBuf> {
    if let Some(s) = std::env::var_os("MESHD_SOCKET").filter(|s| !s.is_empty()) {
        return Ok(PathBuf::from(s));
    }
    let uuid = match std::env::var("MESHD_DEVICE").ok().filter(|d| !d.is_empty()) {
        None => None,
        Some(d) => Some(match crate::start::whole_uuid(&d) {
            Some(u) => u,
            None => crate::start::lookup_uuid(&d)
                .with_context(|| format!("MESHD_DEVICE={d}: set MESHD_SOCKET, or the GPU's whole UUID (GPU-…)"))?,
        }),
    };
    Ok(crate::start::default_paths(uuid.as_deref()).socket)
}

/// One request and its answer on a connection of its own; a refusal is an error with meshd's reason.
fn call(socket: &Path, req: &Request) -> Result<Response> {
    let conn = UnixStream::connect(socket)
        .with_context(|| format!("cannot reach meshd at {} (is `meshd run` running?)", socket.display()))?;
    conn.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    write_request(&mut &conn, req, &[])?;
    let resp = read_response(&mut BufReader::new(&conn))?;
    if !resp.ok {
        bail!("meshd refused: {}", resp.error.unwrap_or_else(|| "no reason given".into()));
    }
    Ok(resp)
}

/// The open lease: the connection `service_attach` was answered on. Dropping it detaches (best effort).
#[derive(Debug)]
struct Lease {
    conn: Option<UnixStream>,
    service: String,
    /// Where meshd listens: a lease that ended with a previous meshd is taken back there.
    socket: PathBuf,
    /// The client's id, which a `service_resume` names.
    id: u32,
}

impl Lease {
    /// Sends `detach` and waits (up to [`DETACH_TIMEOUT`]) for meshd's answer; the lease is closed
    /// either way. A lease that ended with a previous meshd (a crash, a restart, a handoff: the
    /// client stayed bound) is taken back from the meshd serving the socket now (`service_resume`),
    /// and the detach sent on it.
    fn detach(&mut self) -> Result<()> {
        let Some(conn) = self.conn.take() else { return Ok(()) };
        let resp = match Self::ask_detach(&conn) {
            Ok(resp) => resp,
            Err(closed) => {
                drop(conn);
                let conn = self.resume().with_context(|| {
                    format!(
                        "service {:?}: detach: the lease connection is closed ({closed}) and meshd would not give it \
                         back; the slot stays bound until this process exits",
                        self.service
                    )
                })?;
                Self::ask_detach(&conn)
                    .map_err(|e| anyhow!("service {:?}: detach on the lease taken back: {e}", self.service))?
            }
        };
        if !resp.ok {
            bail!("service {:?}: detach refused: {}", self.service, resp.error.unwrap_or_default());
        }
        Ok(())
    }

    /// `detach` on `conn` and meshd's answer; `Err` when the connection is closed (or says nothing
    /// within [`DETACH_TIMEOUT`]).
    fn ask_detach(conn: &UnixStream) -> std::result::Result<Response, String> {
        let mut line = serde_json::to_vec(&Request::Detach).map_err(|e| e.to_string())?;
        line.push(b'\n');
        conn.set_read_timeout(Some(DETACH_TIMEOUT)).map_err(|e| e.to_string())?;
        let mut sent = 0;
        while sent < line.len() {
            // NOSIGNAL: a meshd that is gone (restarted: the lease died with it) is an error here, not
            // a SIGPIPE that would end a process which never asked to ignore it.
            sent +=
                rustix::net::send(conn, &line[sent..], rustix::net::SendFlags::NOSIGNAL).map_err(|e| e.to_string())?;
        }
        read_response(&mut BufReader::new(conn)).map_err(|e| e.to_string())
    }

    /// A new connection to the socket holding this client's lease again (`service_resume`).
    fn resume(&self) -> Result<UnixStream> {
        let conn = UnixStream::connect(&self.socket)
            .with_context(|| format!("cannot reach meshd at {} (is `meshd run` running?)", self.socket.display()))?;
        conn.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        write_request(&mut &conn, &Request::ServiceResume { service: self.service.clone(), client: self.id }, &[])?;
        let resp = read_response(&mut BufReader::new(&conn))?;
        if !resp.ok {
            bail!("meshd refused: {}", resp.error.unwrap_or_else(|| "no reason given".into()));
        }
        conn.set_read_timeout(None)?;
        Ok(conn)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Err(e) = self.detach() {
            tracing::debug!("{e:#}");
        }
    }
}

/// A client of a meshd service: [`send`](Self::send) requests, [`recv`](Self::recv) replies, or
/// [`request`](Self::request) for both.
///
/// One client is one slot of the service: requests go out in order, and replies come back on the
/// client's own ring in the order the server sends them.
///
/// **The window.** A client keeps at most its reply ring's capacity of requests unanswered
/// ([`window`](Self::window), [`unanswered`](Self::unanswered)): past it, a reply would find the ring
/// full, and a program answering requests in order (mesh.cuh's loops) then waits at that reply and
/// serves *no other client* until this one reads. So [`try_send`](Self::try_send) says `false` and
/// [`send`](Self::send) fails at once (waiting cannot help: only this client's own receives open the
/// window) while the window is full. A service whose program does not answer each request exactly
/// once (several replies, or none) sets its clients' window off with [`set_window`](Self::set_window).
///
/// It is `Send`, not `Sync`: use one per thread (each attaches as a client of its own). Errors are `anyhow` errors with meshd's or the
/// mailbox's reason; a send or receive that timed out carries a [`mesh_shm::ShmError::Timeout`]
/// (`err.downcast_ref::<mesh_shm::ShmError>()`).
///
/// ```no_run
/// use std::time::Duration;
/// // `meshd service create kv --clients 8 --msg-size 64` made it; a program binds kv and kv.replies.
/// let mut kv = meshd::ServiceClient::connect_default("kv")?;
/// let mut reply = vec![0u8; kv.reply_size()];
/// kv.request(b"get a", &mut reply, Duration::from_secs(1))?;
/// println!("client {:#x}: {}", kv.id(), String::from_utf8_lossy(&reply));
/// kv.detach()?; // or drop it; a process that dies is detached by meshd
/// # Ok::<(), anyhow::Error>(())
/// ```
#[derive(Debug)]
pub struct ServiceClient {
    // Declared before `lease`, so dropped first: the reply ring's claim is released before meshd
    // can hand the slot to another client.
    tx: FanInSender,
    rx: GroupClient,
    lease: Lease,
    service: String,
    msg_size: usize,
    reply_size: usize,
    window: ReplyWindow,
}

const _: () = {
    const fn sendable<T: Send>() {}
    sendable::<ServiceClient>();
};

impl ServiceClient {
    /// Attaches to service `service` of the meshd listening on `socket`: asks `info` for the
    /// mailbox, maps it, sends `service_attach`, then opens the request end and claims the reply
    /// ring meshd bound. Refused with meshd's reason (no such service, every slot bound, …).
    pub fn connect(socket: &Path, service: &str) -> Result<Self> {
        let info = call(socket, &Request::Info)?.info.context("meshd answered info without it")?;
        let mailbox =
            Mailbox::open(&info.mailbox).with_context(|| format!("the mailbox meshd names, {}", info.mailbox))?;
        let conn = UnixStream::connect(socket)
            .with_context(|| format!("cannot reach meshd at {} (is `meshd run` running?)", socket.display()))?;
        conn.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        write_request(&mut &conn, &Request::ServiceAttach { service: service.to_string() }, &[])?;
        let resp = read_response(&mut BufReader::new(&conn))?;
        if !resp.ok {
            bail!("meshd refused: {}", resp.error.unwrap_or_else(|| "no reason given".into()));
        }
        let client = resp.client.context("meshd answered service_attach without the client")?;
        // Held, never read, from now on.
        conn.set_read_timeout(None)?;
        // From here on a failure drops the lease, which detaches.
        let lease =
            Lease { conn: Some(conn), service: service.to_string(), socket: socket.to_path_buf(), id: client.id };
        let id = ClientId(client.id);
        let tx = FanInSender::open(&mailbox, &client.requests, id)?;
        let rx = GroupClient::claim(&mailbox, &client.replies, id)?;
        let (msg_size, reply_size) = (tx.info().msg_size as usize, rx.info().msg_size as usize);
        let window = ReplyWindow::new(rx.info().capacity);
        Ok(Self { tx, rx, lease, service: service.to_string(), msg_size, reply_size, window })
    }

    /// [`ServiceClient::connect`] on the default socket ([`default_socket`]: `$MESHD_SOCKET`, else
    /// `$MESHD_DEVICE`'s meshd, else `/tmp/meshd.sock`).
    pub fn connect_default(service: &str) -> Result<Self> {
        Self::connect(&default_socket()?, service)
    }

    /// The service's name.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// This client's id (`slot | epoch << 16`): what every request carries to the server.
    pub fn id(&self) -> u32 {
        self.tx.id().0
    }

    /// Bytes per request: a shorter request is zero-padded, a longer one refused.
    pub fn msg_size(&self) -> usize {
        self.msg_size
    }

    /// Bytes per reply: a receive buffer must hold at least this many (the reply fills its start).
    pub fn reply_size(&self) -> usize {
        self.reply_size
    }

    /// Requests sent whose replies this client has not received yet.
    pub fn unanswered(&self) -> u64 {
        self.window.unanswered()
    }

    /// How many requests may be unanswered at once: the reply ring's capacity unless
    /// [`set_window`](Self::set_window) said otherwise (`None`: no limit).
    pub fn window(&self) -> Option<u32> {
        self.window.limit()
    }

    /// Sets the window: `Some(n)`, 1 to the reply ring's capacity; `None` for a service whose program
    /// does not answer each request exactly once (with it, a client that sends more than its ring
    /// holds before reading can hold up every other client of an in-order program).
    pub fn set_window(&mut self, window: Option<u32>) -> Result<()> {
        self.window.set_limit(window).map_err(|why| anyhow!("service {:?}: {why}", self.service))
    }

    /// Sends one request (at most [`msg_size`](Self::msg_size) bytes); `false` when the service's
    /// request ring has no room now, or the window is full (receive replies first).
    pub fn try_send(&mut self, msg: &[u8]) -> Result<bool> {
        if !self.window.is_open() {
            return Ok(false);
        }
        let sent = self.tx.try_send(msg)?;
        if sent {
            self.window.sent();
        }
        Ok(sent)
    }

    /// Sends one request, waiting up to `timeout` for room in the service's request ring. Fails at
    /// once when the window is full: only this client's receives can open it.
    pub fn send(&mut self, msg: &[u8], timeout: Duration) -> Result<()> {
        if !self.window.is_open() {
            bail!(self.window.full(&self.service));
        }
        self.tx.send(msg, timeout)?;
        self.window.sent();
        Ok(())
    }

    /// The part of `out` a reply fills (its first `reply_size` bytes), or why `out` is too short.
    fn reply_buf<'a>(&self, out: &'a mut [u8]) -> Result<&'a mut [u8]> {
        let n = self.reply_size;
        let len = out.len();
        out.get_mut(..n).ok_or_else(|| {
            anyhow!("service {:?}: a buffer of {len} bytes cannot hold a reply of {n} bytes", self.service)
        })
    }

    /// Receives one reply into the start of `out` (at least [`reply_size`](Self::reply_size)
    /// bytes); `false` when none has come.
    pub fn try_recv(&mut self, out: &mut [u8]) -> Result<bool> {
        let buf = self.reply_buf(out)?;
        let got = self.rx.try_recv(buf)?;
        if got {
            self.window.received();
        }
        Ok(got)
    }

    /// Receives one reply into the start of `out`, waiting up to `timeout`: spinning on the CPU
    /// first when this is the client's only request in flight, yielding the CPU from the start when
    /// it has several (it is streaming: [`mesh_shm::PollPause::for_replies`]).
    pub fn recv(&mut self, out: &mut [u8], timeout: Duration) -> Result<()> {
        let buf = self.reply_buf(out)?;
        self.rx.recv_in_window(buf, timeout, &mut self.window)?;
        Ok(())
    }

    /// Sends `req`, then receives the next reply into `out`, both within `timeout`. The next reply
    /// is this request's when the client has no other request in flight (a reply that came after an
    /// earlier request timed out is received here first). Fails at once, nothing sent, when the
    /// window is full (as [`send`](Self::send)).
    pub fn request(&mut self, req: &[u8], out: &mut [u8], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        self.send(req, timeout)?;
        self.recv(out, deadline.saturating_duration_since(Instant::now()))
    }

    /// Leaves the service: the reply ring is released, then meshd frees the slot (for the next
    /// client once the server has acknowledged). Dropping the client does the same, ignoring errors.
    /// After a restart of meshd it takes its lease back from the new one first (see the module).
    pub fn detach(self) -> Result<()> {
        let Self { tx, rx, mut lease, .. } = self;
        drop(tx);
        drop(rx);
        lease.detach()
    }
}
