//! The monitoring endpoint (`--metrics-addr`): a small HTTP/1.1 listener on a thread of its own serving `GET /metrics`, `/livez` and `/readyz`, with the control socket's limits (bounded request, idle timeout, a thread per connection, a cap on connections).
//!
//! A scrape never waits for the backend: it reads the snapshot `ps` and `info` read. A client that
//! sends nothing, or trickles its request, holds only its own thread and only for
//! [`HttpLimits::idle`] in all; one that does not read its answer, for [`HttpLimits::write`]. Each
//! answer closes its connection (`Connection: close`), so nothing lingers between scrapes.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::metrics::CONTENT_TYPE;
use crate::monitor::Monitor;
use crate::observe::HealthConfig;

/// `meshd run`'s monitoring options.
#[derive(clap::Args, Debug, Clone)]
pub struct MonitorArgs {
    /// Serve GET /metrics (Prometheus text format), /livez and /readyz over HTTP on HOST:PORT (a bare
    /// PORT listens on 127.0.0.1 only; 0.0.0.0:PORT or the pod's address for a probe from outside).
    /// Off by default; `meshd metrics` prints the same text over the control socket.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,
    /// /readyz answers 503 when a running program's heartbeat has not moved for this many seconds
    /// (a program loaded with --no-readiness is not counted).
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_secs)]
    pub health_max_heartbeat_age: Duration,
    /// /livez answers 503 (and systemd's watchdog is no longer pinged) when the backend thread has not
    /// passed between jobs for this many seconds.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_secs)]
    pub health_live_deadline: Duration,
}

impl MonitorArgs {
    /// The health probes' thresholds.
    pub fn health(&self) -> HealthConfig {
        HealthConfig { max_heartbeat_age: self.health_max_heartbeat_age, live_deadline: self.health_live_deadline }
    }
}

/// A positive number of seconds (fractions allowed).
pub fn parse_secs(s: &str) -> Result<Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1e9 => Ok(Duration::from_secs_f64(v)),
        _ => Err(format!("{s:?}: expected a positive number of seconds, such as 5 or 0.5")),
    }
}

/// `--metrics-addr`: `PORT` (127.0.0.1), `HOST:PORT`, `[V6]:PORT`; a host name resolves to its first address.
pub fn parse_addr(spec: &str) -> Result<SocketAddr> {
    let spec = spec.trim();
    if let Ok(port) = spec.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Ok(addr) = spec.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if !spec.contains(':') {
        bail!("--metrics-addr {spec:?}: expected PORT or HOST:PORT");
    }
    spec.to_socket_addrs()
        .with_context(|| format!("--metrics-addr {spec:?}: expected PORT or HOST:PORT"))?
        .next()
        .with_context(|| format!("--metrics-addr {spec:?}: the host resolves to no address"))
}

/// The listener's limits.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Longest request head (request line and headers).
    pub max_head: usize,
    /// The whole request head must arrive within this (a silent or trickling client is dropped).
    pub idle: Duration,
    /// How long writing an answer may block.
    pub write: Duration,
    /// Connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self { max_head: 8 << 10, idle: Duration::from_secs(2), write: Duration::from_secs(5), max_connections: 64 }
    }
}

/// A bound monitoring endpoint, not yet serving (bind early: a taken port refuses the start
/// before the GPU is touched).
#[derive(Debug)]
pub struct Endpoint {
    listener: TcpListener,
}

impl Endpoint {
    /// Binds `--metrics-addr`.
    pub fn bind(spec: &str) -> Result<Self> {
        let addr = parse_addr(spec)?;
        let listener = TcpListener::bind(addr).with_context(|| format!("--metrics-addr {spec}: binding {addr}"))?;
        Ok(Self { listener })
    }

    /// Where it listens (the port chosen, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or_else(|_| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))
    }

    /// Serves on a thread of its own until the process ends.
    pub fn serve(self, monitor: Monitor, limits: HttpLimits) -> Result<JoinHandle<()>> {
        let addr = self.local_addr();
        let handle = std::thread::Builder::new()
            .name("meshd-http".into())
            .spawn(move || accept_loop(&self.listener, &monitor, limits))
            .context("starting the monitoring endpoint's thread")?;
        tracing::info!("monitoring endpoint: http://{addr}/metrics, /livez, /readyz");
        Ok(handle)
    }
}

/// Connections past the limit waiting for their 503 (more are closed unanswered).
const REFUSALS_QUEUED: usize = 64;

fn accept_loop(listener: &TcpListener, monitor: &Monitor, limits: HttpLimits) {
    let active = Arc::new(AtomicUsize::new(0));
    // One thread answers the connections past the limit, one at a time, so that the accept loop
    // never waits on a client.
    let (refuse, refusals) = std::sync::mpsc::sync_channel::<(TcpStream, usize)>(REFUSALS_QUEUED);
    let refuser = std::thread::Builder::new().name("meshd-http-refuse".into()).spawn(move || {
        for (mut conn, n) in refusals {
            // Read the request first (briefly), so that closing does not reset the connection and lose the answer.
            let _ = read_head(&mut conn, HttpLimits { idle: REFUSAL_READ, ..limits });
            let body = format!("meshd's monitoring endpoint is serving {n} connections, its limit; try again\n");
            let _ = respond(&conn, 503, TEXT, &body, false);
        }
    });
    if let Err(e) = refuser {
        tracing::warn!("monitoring endpoint: no thread for refusals ({e}); connections past the limit are closed");
    }
    loop {
        let conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                // EMFILE and the like: wait a little for descriptors to free.
                tracing::warn!("monitoring endpoint: accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let _ = conn.set_write_timeout(Some(limits.write));
        let n = active.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(active.clone());
        if n >= limits.max_connections {
            drop(slot);
            let _ = refuse.try_send((conn, n));
            continue;
        }
        let monitor = monitor.clone();
        let spawned = std::thread::Builder::new().name("meshd-http-conn".into()).spawn(move || {
            let _slot = slot;
            serve_connection(conn, &monitor, limits);
        });
        if let Err(e) = spawned {
            tracing::warn!("monitoring endpoint: no thread for a connection: {e}");
        }
    }
}

/// Counts a connection until dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Asked {
    head: bool,
    path: String,
}

/// Why a request head could not be had; each maps to an answer (or to none: the client left).
#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    Closed,
    Timeout,
    TooLarge,
    Malformed(String),
    MethodNotAllowed(String),
}

/// Reads one request head within `limits.idle` in all, at most `limits.max_head` bytes.
fn read_head(conn: &mut impl ReadWithDeadline, limits: HttpLimits) -> Result<Asked, HeadError> {
    let deadline = Instant::now() + limits.idle;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HeadError::Timeout);
        }
        let n = match conn.read_within(&mut chunk, left) {
            Ok(0) => return Err(HeadError::Closed),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(HeadError::Timeout);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return Err(HeadError::Closed),
        };
        buf.extend_from_slice(&chunk[..n]);
        if let Some(asked) = parse_head(&buf)? {
            return Ok(asked);
        }
        if buf.len() > limits.max_head {
            return Err(HeadError::TooLarge);
        }
    }
}

/// Parses a request head; `None` while it is incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<Asked>, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(_)) => {
            let method = req.method.unwrap_or_default();
            let head = match method {
                "GET" => false,
                "HEAD" => true,
                m => return Err(HeadError::MethodNotAllowed(m.to_string())),
            };
            let target = req.path.unwrap_or("/");
            let path = target.split(['?', '#']).next().unwrap_or("/").to_string();
            Ok(Some(Asked { head, path }))
        }
        Err(httparse::Error::TooManyHeaders) => Err(HeadError::TooLarge),
        Err(e) => Err(HeadError::Malformed(e.to_string())),
    }
}

/// A reader whose reads give up after a time (a socket's receive timeout).
trait ReadWithDeadline {
    fn read_within(&mut self, buf: &mut [u8], left: Duration) -> std::io::Result<usize>;
}

impl ReadWithDeadline for TcpStream {
    fn read_within(&mut self, buf: &mut [u8], left: Duration) -> std::io::Result<usize> {
        self.set_read_timeout(Some(left))?;
        self.read(buf)
    }
}

const TEXT: &str = "text/plain; charset=utf-8";

fn serve_connection(mut conn: TcpStream, monitor: &Monitor, limits: HttpLimits) {
    let asked = match read_head(&mut conn, limits) {
        Ok(a) => a,
        Err(HeadError::Closed) => return,
        Err(HeadError::Timeout) => {
            let body = format!("no whole request within {:.1} s; connection closed\n", limits.idle.as_secs_f64());
            let _ = respond(&conn, 408, TEXT, &body, false);
            return;
        }
        Err(HeadError::TooLarge) => {
            let body = format!("request head longer than {} bytes; connection closed\n", limits.max_head);
            let _ = respond(&conn, 431, TEXT, &body, false);
            return;
        }
        Err(HeadError::Malformed(why)) => {
            let _ = respond(&conn, 400, TEXT, &format!("malformed HTTP request: {why}\n"), false);
            return;
        }
        Err(HeadError::MethodNotAllowed(m)) => {
            let _ = respond(&conn, 405, TEXT, &format!("method {m} not allowed: GET or HEAD\n"), false);
            return;
        }
    };
    let (code, ctype, body) = route(monitor, &asked.path);
    if let Err(e) = respond(&conn, code, ctype, &body, asked.head) {
        tracing::debug!("monitoring endpoint: answering {}: {e}", asked.path);
    }
}

/// The answer to `path`: status, content type, body.
fn route(monitor: &Monitor, path: &str) -> (u16, &'static str, String) {
    match path {
        "/metrics" => (200, CONTENT_TYPE, monitor.render()),
        "/livez" => probe(monitor.live()),
        "/readyz" => probe(monitor.ready()),
        "/" => (200, TEXT, "meshd: /metrics, /livez, /readyz\n".into()),
        other => (404, TEXT, format!("{other}: not found; meshd serves /metrics, /livez and /readyz\n")),
    }
}

fn probe(verdict: Result<String, String>) -> (u16, &'static str, String) {
    match verdict {
        Ok(body) => (200, TEXT, body + "\n"),
        Err(body) => (503, TEXT, body + "\n"),
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// How long a refused client's request is waited for.
const REFUSAL_READ: Duration = Duration::from_millis(250);

/// How long, after answering, meshd waits for the client to close (see [`respond`]).
const LINGER: Duration = Duration::from_millis(250);

/// Writes one answer (in one write) and closes the connection: its sending side first, then,
/// after reading what the client still sends for up to [`LINGER`], the whole. Closing a socket
/// with unread data resets it, and a reset can discard the answer before the client reads it.
fn respond(mut conn: &TcpStream, code: u16, ctype: &str, body: &str, head_only: bool) -> std::io::Result<()> {
    let allow = if code == 405 { "Allow: GET, HEAD\r\n" } else { "" };
    let mut out = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n{allow}\
         Connection: close\r\n\r\n",
        reason(code),
        body.len()
    );
    if !head_only {
        out.push_str(body);
    }
    conn.write_all(out.as_bytes())?;
    conn.flush()?;
    conn.shutdown(Shutdown::Write)?;
    let deadline = Instant::now() + LINGER;
    let mut sink = [0u8; 4096];
    let mut drained = 0usize;
    while drained < (64 << 10) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        conn.set_read_timeout(Some(left))?;
        match conn.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out fixed pieces, then times out.
    struct Pieces(Vec<Vec<u8>>);

    impl ReadWithDeadline for Pieces {
        fn read_within(&mut self, buf: &mut [u8], _left: Duration) -> std::io::Result<usize> {
            if self.0.is_empty() {
                return Err(ErrorKind::WouldBlock.into());
            }
            let p = self.0.remove(0);
            buf[..p.len()].copy_from_slice(&p);
            Ok(p.len())
        }
    }

    fn read(pieces: &[&[u8]]) -> Result<Asked, HeadError> {
        read_head(&mut Pieces(pieces.iter().map(|p| p.to_vec()).collect()), HttpLimits::default())
    }

    #[test]
    fn a_head_may_arrive_in_pieces_and_the_query_is_ignored() {
        let asked = read(&[b"GET /met", b"rics?x=1 HTTP/1.1\r\nHost: a\r\n", b"\r\n"]).unwrap();
        assert_eq!(asked, Asked { head: false, path: "/metrics".into() });
        assert!(read(&[b"HEAD /livez HTTP/1.0\r\n\r\n"]).unwrap().head);
    }

    #[test]
    fn bad_heads_are_refused_with_their_reason() {
        assert_eq!(read(&[b"GET /metrics HTTP/1.1\r\n"]), Err(HeadError::Timeout), "an unfinished head times out");
        assert_eq!(read(&[]), Err(HeadError::Timeout));
        assert_eq!(read(&[b"POST /metrics HTTP/1.1\r\n\r\n"]), Err(HeadError::MethodNotAllowed("POST".into())));
        assert!(matches!(read(&[b"\x01\x02 nonsense\r\n\r\n"]), Err(HeadError::Malformed(_))));
        let long = [b"GET /".as_slice(), &[b'a'; 9000]].concat();
        let pieces: Vec<&[u8]> = long.chunks(1000).collect();
        assert_eq!(read(&pieces), Err(HeadError::TooLarge), "a head past the limit is not read on");
    }

    #[test]
    fn addresses_default_to_loopback_and_bad_ones_say_why() {
        assert_eq!(parse_addr("9400").unwrap(), "127.0.0.1:9400".parse().unwrap());
        assert_eq!(parse_addr("0.0.0.0:9400").unwrap(), "0.0.0.0:9400".parse().unwrap());
        assert_eq!(parse_addr("[::1]:9400").unwrap(), "[::1]:9400".parse().unwrap());
        let e = parse_addr("nine").unwrap_err().to_string();
        assert!(e.contains("--metrics-addr") && e.contains("HOST:PORT"), "{e}");
        assert!(parse_addr("127.0.0.1:99999").is_err());
        assert!(parse_secs("0").is_err() && parse_secs("-1").is_err() && parse_secs("x").is_err());
        assert_eq!(parse_secs("0.5"), Ok(Duration::from_millis(500)));
    }
}
