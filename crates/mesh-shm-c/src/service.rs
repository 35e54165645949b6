//! A client of a meshd service in C: `mesh_service_connect` attaches over meshd's control socket, then requests go into the service's fan-in channel and replies come from a reply ring of the client's own.
//!
//! A service `NAME` is a fan-in channel `NAME` (requests from any number of host clients, each
//! carrying its sender's id) and a channel group `NAME.replies` (one reply ring per client).
//! [`mesh_service_connect`] asks meshd for an id (one JSON line, `service_attach`), and keeps that
//! connection open as the client's **lease**; [`mesh_service_close`] detaches and frees. A process
//! that exits or dies without closing (kill -9 included) loses its lease with its sockets, and meshd
//! takes the client back then, completing a send it left half done (the server takes a skip, never
//! a torn request). The messages never touch the socket: they go through the mailbox.
//!
//! Writes to the socket use `MSG_NOSIGNAL`: a meshd that has gone is an error code, never a SIGPIPE
//! that would end the calling C program.

use std::ffi::{c_char, c_void};
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use mesh_shm::{ClientId, FanInSender, GroupClient, Mailbox, ReplyWindow};
use serde_json::Value;

use crate::args::{c_str, msg_slice, out_slice};
use crate::status::{
    MESH_EMPTY, MESH_ERR_ARG, MESH_ERR_ENV, MESH_ERR_NULL, MESH_FULL, MESH_OK, MeshStatus, fail, guard, shm_fail,
};

/// meshd refused the request (a service that does not exist, every client slot bound, …); the
/// reason, meshd's own text, is in `mesh_shm_last_error()`.
pub const MESH_ERR_REFUSED: MeshStatus = -11;
/// No meshd answers on the control socket (not running, or another socket path).
pub const MESH_ERR_UNREACHABLE: MeshStatus = -12;
/// meshd's answer could not be read (the connection closed early, a line that is not the protocol's
/// JSON, or no answer within [`MESH_SERVICE_ANSWER_TIMEOUT_MS`]).
pub const MESH_ERR_PROTOCOL: MeshStatus = -13;
/// The client already has its window of requests unanswered (the reply ring's capacity, or what
/// [`mesh_service_set_window`] set): receive replies first. A blocking send does not wait for it,
/// since only this client's own receives open it.
pub const MESH_ERR_WINDOW: MeshStatus = -14;

/// How long `mesh_service_connect` waits for each of meshd's answers (meshd answers at once, but
/// an attach may wait up to half a second for the serving program to acknowledge a departure).
pub const MESH_SERVICE_ANSWER_TIMEOUT_MS: u32 = 30_000;
/// How long `mesh_service_close` waits for meshd to acknowledge the detach before it just closes
/// the lease (which takes the client back too).
const DETACH_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest answer line read (as the other clients: a broken peer cannot make this one grow
/// without end).
const MAX_ANSWER: usize = 64 << 20;

/// A client of a meshd service (opaque): its lease on the control socket, its request end and its
/// reply ring, and its window (at most the reply ring's capacity of requests unanswered: a reply
/// past it would find the ring full, and a program answering in order would wait there, serving no
/// other client). Used by one thread at a time.
#[derive(Debug)]
pub struct MeshService {
    tx: FanInSender,
    rx: GroupClient,
    lease: UnixStream,
    service: String,
    /// Where meshd listens: a lease that ended with a previous meshd is taken back there.
    socket: String,
    id: u32,
    window: ReplyWindow,
}

/// What a service client is: its id and the sizes of its two channels.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeshServiceInfo {
    /// The client's id (`slot | epoch << 16`): what every request carries.
    pub id: u32,
    /// Bytes per request (shorter ones are zero-padded).
    pub msg_size: u32,
    /// Requests the fan-in ring holds, over all clients.
    pub capacity: u32,
    /// Bytes per reply: a receive buffer is exactly this long.
    pub reply_size: u32,
    /// Replies the client's own ring holds: also the client's window (requests unanswered at once)
    /// until [`mesh_service_set_window`] changes it.
    pub reply_capacity: u32,
}

/// Why a call on the control socket failed: a status and its text.
pub(crate) type Failed = (MeshStatus, String);

/// Writes all of `bytes` without SIGPIPE.
fn write_all(conn: &UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match rustix::net::send(conn, bytes, rustix::net::SendFlags::NOSIGNAL) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Reads one answer line (without its newline); empty when meshd closed without answering.
fn read_line(conn: &UnixStream) -> Result<Vec<u8>, Failed> {
    let mut line = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = match (&*conn).read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err((MESH_ERR_PROTOCOL, format!("reading meshd's answer: {e}"))),
        };
        if n == 0 {
            return Ok(line);
        }
        line.extend_from_slice(&chunk[..n]);
        if let Some(end) = line.iter().position(|&b| b == b'\n') {
            line.truncate(end);
            return Ok(line);
        }
        if line.len() > MAX_ANSWER {
            return Err((MESH_ERR_PROTOCOL, format!("meshd's answer is longer than {MAX_ANSWER} bytes")));
        }
    }
}

/// Sends `request` (one JSON line) and reads meshd's answer: the answer, or the refusal's reason.
pub(crate) fn ask(conn: &UnixStream, request: &str, what: &str) -> Result<Value, Failed> {
    let sent = write_all(conn, request.as_bytes());
    let line = read_line(conn)?;
    if line.is_empty() {
        let why = sent.err().map(|e| format!(": {e}")).unwrap_or_default();
        return Err((MESH_ERR_PROTOCOL, format!("meshd closed the connection without answering {what}{why}")));
    }
    let answer: Value = serde_json::from_slice(&line)
        .map_err(|e| (MESH_ERR_PROTOCOL, format!("malformed answer from meshd to {what}: {e}")))?;
    match answer.get("ok").and_then(Value::as_bool) {
        Some(true) => Ok(answer),
        Some(false) => {
            let reason = answer.get("error").and_then(Value::as_str).unwrap_or("refused");
            Err((MESH_ERR_REFUSED, reason.to_string()))
        }
        None => Err((MESH_ERR_PROTOCOL, format!("malformed answer from meshd to {what}: no \"ok\""))),
    }
}

/// A connection to meshd's control socket, answers waited for up to [`MESH_SERVICE_ANSWER_TIMEOUT_MS`].
pub(crate) fn dial(socket: &str) -> Result<UnixStream, Failed> {
    let conn = UnixStream::connect(socket).map_err(|e| {
        (MESH_ERR_UNREACHABLE, format!("cannot reach meshd at {socket} (is `meshd run` running?): {e}"))
    })?;
    let timeout = Some(Duration::from_millis(u64::from(MESH_SERVICE_ANSWER_TIMEOUT_MS)));
    conn.set_read_timeout(timeout)
        .and_then(|()| conn.set_write_timeout(timeout))
        .map_err(|e| (MESH_ERR_UNREACHABLE, format!("meshd at {socket}: {e}")))?;
    Ok(conn)
}

/// Sends `detach` on a lease and waits a moment for meshd's answer; a refusal is returned, a meshd
/// that is gone is not (its clients went with it).
fn detach(lease: &UnixStream) -> Result<(), Failed> {
    detach_answered(lease).map(|_| ())
}

/// [`detach`], saying whether meshd answered it (`false`: the lease is closed, or silent).
fn detach_answered(lease: &UnixStream) -> Result<bool, Failed> {
    let _ = lease.set_read_timeout(Some(DETACH_TIMEOUT));
    match ask(lease, "{\"op\":\"detach\"}\n", "detach") {
        Ok(_) => Ok(true),
        Err((MESH_ERR_REFUSED, reason)) => Err((MESH_ERR_REFUSED, reason)),
        Err(_) => Ok(false),
    }
}

/// [`detach`], and when the lease is closed (it ended with a previous meshd, a crash, a restart or
/// a handoff, and the client stayed bound), the lease taken back from the meshd serving `socket`
/// now (`service_resume`) and the detach sent on it. Nothing to take back (no meshd there, the
/// client departed already) is not an error.
fn detach_or_resume(lease: &UnixStream, socket: &str, service: &str, id: u32) -> Result<(), Failed> {
    if detach_answered(lease)? {
        return Ok(());
    }
    let Ok(conn) = dial(socket) else { return Ok(()) };
    let _ = conn.set_read_timeout(Some(DETACH_TIMEOUT));
    let name = serde_json::to_string(service).map_err(|e| (MESH_ERR_PROTOCOL, e.to_string()))?;
    let resume = format!("{{\"op\":\"service_resume\",\"service\":{name},\"client\":{id}}}\n");
    if ask(&conn, &resume, "service_resume").is_err() {
        return Ok(());
    }
    detach(&conn)
}

/// The attach, every step of it; on any failure after meshd bound the client, its lease is given back.
fn connect(socket: &str, service: &str) -> Result<MeshService, Failed> {
    let mailbox_path = {
        let conn = dial(socket)?;
        let info = ask(&conn, "{\"op\":\"info\"}\n", "info")?;
        match info.pointer("/info/mailbox").and_then(Value::as_str) {
            Some(p) => p.to_string(),
            None => return Err((MESH_ERR_PROTOCOL, "meshd answered info without its mailbox".to_string())),
        }
    };
    let mailbox = Mailbox::open(&mailbox_path).map_err(|e| (shm_fail(&e), e.to_string()))?;
    let lease = dial(socket)?;
    let name = serde_json::to_string(service).map_err(|e| (MESH_ERR_PROTOCOL, e.to_string()))?;
    let answer = ask(&lease, &format!("{{\"op\":\"service_attach\",\"service\":{name}}}\n"), "service_attach")?;
    let client = answer.get("client");
    let field = |k: &str| client.and_then(|c| c.get(k));
    let (Some(id), Some(requests), Some(replies)) = (
        field("id").and_then(Value::as_u64).and_then(|v| u32::try_from(v).ok()),
        field("requests").and_then(Value::as_str),
        field("replies").and_then(Value::as_str),
    ) else {
        let _ = detach(&lease);
        return Err((MESH_ERR_PROTOCOL, format!("meshd answered service_attach with a malformed client: {answer}")));
    };
    let ends = FanInSender::open(&mailbox, requests, ClientId(id))
        .and_then(|tx| Ok((tx, GroupClient::claim(&mailbox, replies, ClientId(id))?)));
    match ends {
        Ok((tx, rx)) => {
            // The lease is held, not read, until the detach: no timeout on it meanwhile.
            let _ = lease.set_read_timeout(None);
            let window = ReplyWindow::new(rx.info().capacity);
            Ok(MeshService { tx, rx, lease, service: service.to_string(), socket: socket.to_string(), id, window })
        }
        Err(e) => {
            let _ = detach(&lease);
            Err((shm_fail(&e), e.to_string()))
        }
    }
}

/// Attaches this process to service `service` of the meshd listening on `socket_path` (NULL: the
/// path in `MESHD_SOCKET`; else, with `MESHD_DEVICE` set to a GPU's whole UUID, that GPU's meshd,
/// `/tmp/meshd-GPU-….sock`; else `/tmp/meshd.sock`; another `MESHD_DEVICE` is [`MESH_ERR_ENV`],
/// saying what to set), maps its mailbox and opens the client's two
/// ends, into `*out` (written only on success). The connection stays open as the client's lease
/// until [`mesh_service_close`].
///
/// Returns [`MESH_ERR_REFUSED`] when meshd refuses (no such service, every client slot bound: its
/// reason in `mesh_shm_last_error()`), [`MESH_ERR_UNREACHABLE`] when no meshd answers there,
/// [`MESH_ERR_PROTOCOL`] when its answer cannot be read, or a mailbox error.
///
/// # Safety
/// `socket_path` is NULL or NUL-terminated; `service` is NULL (refused) or NUL-terminated; `out`
/// is NULL (refused) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_connect(
    socket_path: *const c_char,
    service: *const c_char,
    out: *mut *mut MeshService,
) -> MeshStatus {
    guard(|| {
        if out.is_null() {
            return fail(MESH_ERR_NULL, "mesh_service_connect: out is NULL");
        }
        // SAFETY: NULL (refused) or NUL-terminated by the caller's contract.
        let service = match unsafe { c_str(service, "mesh_service_connect: service") } {
            Ok(s) => s,
            Err(code) => return code,
        };
        let socket = if socket_path.is_null() {
            match mesh_shm::paths::client_socket_from_env() {
                Ok(p) => p.to_string_lossy().into_owned(),
                Err(why) => return fail(MESH_ERR_ENV, format!("mesh_service_connect: {why}")),
            }
        } else {
            // SAFETY: non-null, NUL-terminated by the caller's contract.
            match unsafe { c_str(socket_path, "mesh_service_connect: socket_path") } {
                Ok(s) => s.to_string(),
                Err(code) => return code,
            }
        };
        match connect(&socket, service) {
            Ok(svc) => {
                // SAFETY: `out` is non-null and writable by the caller's contract.
                unsafe { out.write(Box::into_raw(Box::new(svc))) };
                MESH_OK
            }
            Err((code, text)) => fail(code, format!("service {service:?}: {text}")),
        }
    })
}

/// The client's id and its channels' sizes into `*info`.
///
/// # Safety
/// `s` is NULL or a live service client; `info` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_info(s: *const MeshService, info: *mut MeshServiceInfo) -> MeshStatus {
    guard(|| {
        if s.is_null() || info.is_null() {
            return fail(MESH_ERR_NULL, "mesh_service_info: s and info must not be NULL");
        }
        // SAFETY: a live client by the caller's contract.
        let svc = unsafe { &*s };
        let (req, rep) = (svc.tx.info(), svc.rx.info());
        let got = MeshServiceInfo {
            id: svc.tx.id().0,
            msg_size: req.msg_size,
            capacity: req.capacity,
            reply_size: rep.msg_size,
            reply_capacity: rep.capacity,
        };
        // SAFETY: writable by the caller's contract.
        unsafe { info.write(got) };
        MESH_OK
    })
}

/// The client's id (`slot | epoch << 16`) into `*id`.
///
/// # Safety
/// `s` is NULL or a live service client; `id` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_id(s: *const MeshService, id: *mut u32) -> MeshStatus {
    guard(|| {
        if s.is_null() || id.is_null() {
            return fail(MESH_ERR_NULL, "mesh_service_id: s and id must not be NULL");
        }
        // SAFETY: live and writable by the caller's contract.
        unsafe { id.write((*s).tx.id().0) };
        MESH_OK
    })
}

/// Sends one request of `len` bytes (at most the request size; shorter ones are zero-padded) if
/// there is room: [`MESH_FULL`] when the fan-in ring is full, or the client's window is (receive
/// replies first: [`mesh_service_unanswered`]).
///
/// # Safety
/// `s` is NULL or a live service client, used by one thread at a time; `msg` is NULL or `len`
/// readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_try_send(s: *mut MeshService, msg: *const c_void, len: usize) -> MeshStatus {
    guard(|| {
        if s.is_null() {
            return fail(MESH_ERR_NULL, "mesh_service_try_send: s is NULL");
        }
        // SAFETY: a live client, not shared between threads, by the caller's contract.
        let s = unsafe { &mut *s };
        let info = s.tx.info();
        // SAFETY: NULL or `len` readable bytes by the caller's contract.
        let msg = match unsafe { msg_slice(msg, len, info.msg_size, &info.name, "mesh_service_try_send") } {
            Ok(m) => m,
            Err(code) => return code,
        };
        if !s.window.is_open() {
            return MESH_FULL;
        }
        match s.tx.try_send(msg) {
            Ok(true) => {
                s.window.sent();
                MESH_OK
            }
            Ok(false) => MESH_FULL,
            Err(e) => shm_fail(&e),
        }
    })
}

/// Sends one request, waiting up to `timeout_ms` for room in the fan-in ring (`MESH_TIMEOUT` then);
/// [`MESH_ERR_WINDOW`] at once when the client's window is full.
///
/// # Safety
/// As [`mesh_service_try_send`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_send(
    s: *mut MeshService,
    msg: *const c_void,
    len: usize,
    timeout_ms: u32,
) -> MeshStatus {
    guard(|| {
        if s.is_null() {
            return fail(MESH_ERR_NULL, "mesh_service_send: s is NULL");
        }
        // SAFETY: a live client, not shared between threads, by the caller's contract.
        let s = unsafe { &mut *s };
        let info = s.tx.info();
        // SAFETY: NULL or `len` readable bytes by the caller's contract.
        let msg = match unsafe { msg_slice(msg, len, info.msg_size, &info.name, "mesh_service_send") } {
            Ok(m) => m,
            Err(code) => return code,
        };
        if !s.window.is_open() {
            return fail(MESH_ERR_WINDOW, s.window.full(&s.service));
        }
        match s.tx.send(msg, Duration::from_millis(u64::from(timeout_ms))) {
            Ok(()) => {
                s.window.sent();
                MESH_OK
            }
            Err(e) => shm_fail(&e),
        }
    })
}

/// Receives the next reply into `out` (`len` must be the reply size): [`MESH_EMPTY`] when
/// none is there.
///
/// # Safety
/// `s` is NULL or a live service client, used by one thread at a time; `out` is NULL or `len`
/// writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_try_recv(s: *mut MeshService, out: *mut c_void, len: usize) -> MeshStatus {
    guard(|| {
        if s.is_null() {
            return fail(MESH_ERR_NULL, "mesh_service_try_recv: s is NULL");
        }
        // SAFETY: a live client, not shared between threads, by the caller's contract.
        let s = unsafe { &mut *s };
        let info = s.rx.info();
        // SAFETY: NULL or `len` writable bytes by the caller's contract.
        let out = match unsafe { out_slice(out, len, info.msg_size, &info.name, "mesh_service_try_recv") } {
            Ok(o) => o,
            Err(code) => return code,
        };
        match s.rx.try_recv(out) {
            Ok(true) => {
                s.window.received();
                MESH_OK
            }
            Ok(false) => MESH_EMPTY,
            Err(e) => shm_fail(&e),
        }
    })
}

/// Receives the next reply, waiting up to `timeout_ms` (`MESH_TIMEOUT` then). While the client has
/// one request unanswered it spins on the CPU first (then yields, then sleeps); with several it yields
/// from the first poll, leaving the CPU to other clients (it is streaming).
///
/// # Safety
/// As [`mesh_service_try_recv`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_recv(
    s: *mut MeshService,
    out: *mut c_void,
    len: usize,
    timeout_ms: u32,
) -> MeshStatus {
    guard(|| {
        if s.is_null() {
            return fail(MESH_ERR_NULL, "mesh_service_recv: s is NULL");
        }
        // SAFETY: a live client, not shared between threads, by the caller's contract.
        let s = unsafe { &mut *s };
        let info = s.rx.info();
        // SAFETY: NULL or `len` writable bytes by the caller's contract.
        let out = match unsafe { out_slice(out, len, info.msg_size, &info.name, "mesh_service_recv") } {
            Ok(o) => o,
            Err(code) => return code,
        };
        match s.rx.recv_in_window(out, Duration::from_millis(u64::from(timeout_ms)), &mut s.window) {
            Ok(()) => MESH_OK,
            Err(e) => shm_fail(&e),
        }
    })
}

/// Sends one request and receives the next reply into `out` (`out_len` must be the reply size),
/// both within `timeout_ms` (`MESH_TIMEOUT` then: if the send went, its reply is the next
/// receive's). Replies come in the order the server sends them; this pairs a request with the next.
/// [`MESH_ERR_WINDOW`] at once, nothing sent, when the client's window is full (as
/// [`mesh_service_send`]).
///
/// # Safety
/// `s` is NULL or a live service client, used by one thread at a time; `msg` is NULL or `len`
/// readable bytes; `out` is NULL or `out_len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_request(
    s: *mut MeshService,
    msg: *const c_void,
    len: usize,
    out: *mut c_void,
    out_len: usize,
    timeout_ms: u32,
) -> MeshStatus {
    guard(|| {
        if s.is_null() {
            return fail(MESH_ERR_NULL, "mesh_service_request: s is NULL");
        }
        // SAFETY: a live client, not shared between threads, by the caller's contract.
        let svc = unsafe { &mut *s };
        let (req, rep) = (svc.tx.info(), svc.rx.info());
        // SAFETY: NULL or `len` readable bytes by the caller's contract.
        let msg = match unsafe { msg_slice(msg, len, req.msg_size, &req.name, "mesh_service_request") } {
            Ok(m) => m,
            Err(code) => return code,
        };
        // Checked before the send, so that a wrong buffer sends nothing.
        // SAFETY: NULL or `out_len` writable bytes by the caller's contract.
        let out = match unsafe { out_slice(out, out_len, rep.msg_size, &rep.name, "mesh_service_request") } {
            Ok(o) => o,
            Err(code) => return code,
        };
        if !svc.window.is_open() {
            return fail(MESH_ERR_WINDOW, svc.window.full(&svc.service));
        }
        let timeout = Duration::from_millis(u64::from(timeout_ms));
        let deadline = Instant::now() + timeout;
        if let Err(e) = svc.tx.send(msg, timeout) {
            return shm_fail(&e);
        }
        svc.window.sent();
        match svc.rx.recv_in_window(out, deadline.saturating_duration_since(Instant::now()), &mut svc.window) {
            Ok(()) => MESH_OK,
            Err(e) => shm_fail(&e),
        }
    })
}

/// The client's requests sent whose replies it has not received, into `*out`.
///
/// # Safety
/// `s` is NULL or a live service client; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_unanswered(s: *const MeshService, out: *mut u64) -> MeshStatus {
    guard(|| {
        if s.is_null() || out.is_null() {
            return fail(MESH_ERR_NULL, "mesh_service_unanswered: s or out is NULL");
        }
        // SAFETY: a live client and a writable `out`, by the caller's contract.
        unsafe { *out = (*s).window.unanswered() };
        MESH_OK
    })
}

/// The client's window into `*out`: how many requests may be unanswered at once (0: no limit).
///
/// # Safety
/// `s` is NULL or a live service client; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_window(s: *const MeshService, out: *mut u32) -> MeshStatus {
    guard(|| {
        if s.is_null() || out.is_null() {
            return fail(MESH_ERR_NULL, "mesh_service_window: s or out is NULL");
        }
        // SAFETY: a live client and a writable `out`, by the caller's contract.
        unsafe { *out = (*s).window.limit().unwrap_or(0) };
        MESH_OK
    })
}

/// Sets the client's window: at most `window` requests unanswered, 1 to the reply ring's capacity
/// (the default); 0 for no limit, for a service whose program does not answer each request exactly
/// once (with it, a client that sends more than its ring holds before reading can hold up every
/// other client of a program that answers in order). Anything else is [`MESH_ERR_ARG`].
///
/// # Safety
/// `s` is NULL or a live service client, used by one thread at a time.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_set_window(s: *mut MeshService, window: u32) -> MeshStatus {
    guard(|| {
        if s.is_null() {
            return fail(MESH_ERR_NULL, "mesh_service_set_window: s is NULL");
        }
        // SAFETY: a live client, not shared between threads, by the caller's contract.
        let s = unsafe { &mut *s };
        match s.window.set_limit((window != 0).then_some(window)) {
            Ok(()) => MESH_OK,
            Err(why) => fail(MESH_ERR_ARG, format!("service {:?}: {why}", s.service)),
        }
    })
}

/// Leaves the service and frees the client: releases its reply ring, then detaches (meshd takes
/// the client back, and the server is told of its departure). NULL is ignored. The client is freed
/// whatever this returns: [`MESH_OK`], also when meshd has gone (nothing is left to give back) or
/// restarted since the connect (the lease is then taken back from the new meshd first), or
/// [`MESH_ERR_REFUSED`] when meshd refused the detach (the lease is closed all the same, which meshd
/// takes as leaving too).
///
/// # Safety
/// `s` is NULL or a live service client, closed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mesh_service_close(s: *mut MeshService) -> MeshStatus {
    guard(|| {
        if s.is_null() {
            return MESH_OK;
        }
        // SAFETY: from Box::into_raw in mesh_service_connect, closed once by the caller's contract.
        let MeshService { tx, rx, lease, service, socket, id, .. } = *unsafe { Box::from_raw(s) };
        drop(rx);
        drop(tx);
        match detach_or_resume(&lease, &socket, &service, id) {
            Ok(()) => MESH_OK,
            Err((code, text)) => fail(code, format!("service {service:?}: detach: {text}")),
        }
    })
}
