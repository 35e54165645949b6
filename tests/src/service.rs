//! A service on the GPU, the host side shared by the GPU test (`tests/service.rs`), the client
//! processes (`mesh-service-client`) and the benchmark (`mesh-gpu-bench service`): the client API, the
//! requests and the checks of their replies, and a client process driven from its parent.
//!
//! **The client API** is meshd's own, [`ServiceClient`] (`meshd::ServiceClient`): `service_attach` over
//! the control socket, the connection kept open as the client's lease, the requests into the fan-in
//! channel and the replies from the client's own ring in the mailbox.
//!
//! **Requests and replies** (service.cu answers a request with payload word 1 incremented, every other
//! word as it came): message `seq` of client process `pid` (with a `nonce` of its own, so that a pid
//! reused by a later client is told apart) is word 0 = low half of `seq`, word 1 = [`value`], word 2 =
//! `pid`, word 3 = `nonce`, word k ≥ 4 = [`stress::word`]`(seq, k) ^ nonce`. Its reply must be the same
//! with word 1 + 1: words 2 and 3 say whose it is (a reply that reached the wrong client fails), word 0
//! which request it answers.
//!
//! **Repeats.** One warp takes every request in the fan-in ring's order and a sender's requests are in
//! it in the order sent, so a client's replies come in the order of its requests. mesh.cuh's fan-in
//! consumer resumes at its published position: after an orderly stop (an upgrade, a blink) that is
//! exact (`mesh_fanin_close`; a request held for a full reply ring is committed only once answered),
//! so an upgrade repeats nothing; after a crash of the program (a fault, a killed MPS worker, meshd
//! killed) it is at-least-once: the relaunch takes again what the last launch took since it last
//! published, and answers it again. A client can then see a reply to a request it already has the
//! reply of: [`check_reply`] says [`Verdict::Repeat`] for exactly that (an older sequence number, with
//! that request's whole content), which a client counts and drops. Anything else out of order is an
//! error: a newer number (a reply lost), wrong content, another client's reply.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::stress;

/// The fan-in shards the GPU test and the benchmark create the service with: `MESH_SERVICE_SHARDS`
/// (a power of two from 1 to 64, passed as `meshd service create --shards`; absent: 32, the README's
/// 64-client recipe with [`service_grid`]'s 4 blocks of 256: a shard for each of 32 warps). A value
/// that is not a number stops the run naming it; meshd refuses one that breaks the rule, naming the rule.
pub fn service_shards() -> u32 {
    match std::env::var("MESH_SERVICE_SHARDS") {
        Ok(s) if !s.trim().is_empty() => s
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("MESH_SERVICE_SHARDS={s}: not a whole number ({e}); a power of two, 1 to 64")),
        _ => 32,
    }
}

/// The block the GPU test and the benchmark load the service programs with (`meshd load --block`):
/// `MESH_SERVICE_BLOCK` threads, else 256, the README's (service.cu serves with up to 8 warps, one
/// part of the shards each; with 32, one warp serves everything).
pub fn service_block() -> String {
    std::env::var("MESH_SERVICE_BLOCK").ok().filter(|b| !b.trim().is_empty()).unwrap_or_else(|| "256".into())
}

/// The grid they are loaded with (`meshd load --grid`): `MESH_SERVICE_GRID` blocks, else 4, the
/// README's 64-client recipe (the warps of every block share the shards: 4 blocks of 256 over 32
/// shards give 32 warps a shard each; `MESH_SERVICE_SHARDS=8 MESH_SERVICE_GRID=1` is the README's
/// smaller service).
pub fn service_grid() -> String {
    std::env::var("MESH_SERVICE_GRID").ok().filter(|g| !g.trim().is_empty()).unwrap_or_else(|| "4".into())
}

/// `meshd load`'s shape arguments for the service programs: `--grid` [`service_grid`] `--block`
/// [`service_block`].
pub fn service_shape() -> Vec<String> {
    vec!["--grid".into(), service_grid(), "--block".into(), service_block()]
}

pub use meshd::ServiceClient;

/// The service benchmark's raw baseline (`raw_pingpong_many.cu`, `mesh-service-client --mode raw`):
/// client `index`'s two words in host channel `channel`'s LL slots, the one it stores (slot byte
/// index x 128) and the one the GPU thread of that index stores back (64 bytes after it). Refused,
/// naming why, when the channel is a device one or its slots do not reach that far.
pub fn raw_words<'a>(
    mb: &'a mesh_shm::Mailbox,
    channel: &str,
    index: u64,
) -> Result<(&'a std::sync::atomic::AtomicU64, &'a std::sync::atomic::AtomicU64), String> {
    let info = mb.channel(channel).map_err(|e| format!("channel {channel}: {e}"))?;
    let slots = u64::from(info.msg_size) * 2 * u64::from(info.capacity);
    let at = index.saturating_mul(128);
    if info.placement != mesh_shm::Placement::Host || at.saturating_add(128) > slots {
        return Err(format!(
            "index {index}: channel {channel} has no host slot bytes {at}..{}",
            at.saturating_add(128)
        ));
    }
    let (base, len) = mb.as_raw_parts();
    let off = usize::try_from(info.slots_offset + at).unwrap_or(usize::MAX);
    if off.saturating_add(128) > len {
        return Err(format!("channel {channel}: its slots lie outside the mapping"));
    }
    // SAFETY: bytes off..off + 128 lie inside the mapping (checked above), 8-aligned (slots start on a
    // line and `at` is a multiple of 128), and stay mapped while `mb` lives (the borrow's lifetime);
    // the client stores one word and the GPU thread of its index the other.
    Ok(unsafe {
        (
            std::sync::atomic::AtomicU64::from_ptr(base.add(off).cast()),
            std::sync::atomic::AtomicU64::from_ptr(base.add(off + 64).cast()),
        )
    })
}

/// Smallest message a service client of these tools sends: four words of header.
pub const MIN_MSG: usize = 16;

/// Word 1 of request `seq` of a client with `nonce`.
#[allow(clippy::cast_possible_truncation, reason = "a hash of seq: its high half, on purpose")]
pub fn value(seq: u64, nonce: u32) -> u32 {
    (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32 ^ nonce.rotate_left(7)
}

/// Word `k` of request `seq` of client (`pid`, `nonce`), as sent.
#[allow(clippy::cast_possible_truncation, reason = "word 0 is the low half of seq, as the GPU keeps it")]
fn request_word(seq: u64, pid: u32, nonce: u32, k: u32) -> u32 {
    match k {
        0 => seq as u32,
        1 => value(seq, nonce),
        2 => pid,
        3 => nonce,
        k => stress::word(seq, k) ^ nonce,
    }
}

/// Writes request `seq` of client (`pid`, `nonce`) into `buf` (the message size, at least [`MIN_MSG`]).
#[allow(clippy::cast_possible_truncation, reason = "a message has at most 1024 words")]
pub fn fill_request(buf: &mut [u8], seq: u64, pid: u32, nonce: u32) {
    for (k, w) in buf.chunks_exact_mut(4).enumerate() {
        w.copy_from_slice(&request_word(seq, pid, nonce, k as u32).to_le_bytes());
    }
}

/// What a reply was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The reply to the request expected next, whole.
    Expected,
    /// A whole reply to an earlier request, whose reply came before (at-least-once after a crash).
    Repeat(u64),
}

fn word_of(buf: &[u8], k: usize) -> u32 {
    u32::from_le_bytes(buf[4 * k..4 * k + 4].try_into().expect("4 bytes"))
}

/// Whether `buf` is exactly the reply to request `seq` of client (`pid`, `nonce`); `Err` names the
/// first word that differs.
#[allow(clippy::cast_possible_truncation, reason = "a message has at most 1024 words")]
fn is_reply(buf: &[u8], seq: u64, pid: u32, nonce: u32) -> Result<(), String> {
    for k in 0..buf.len() / 4 {
        let sent = request_word(seq, pid, nonce, k as u32);
        let want = if k == 1 { sent.wrapping_add(1) } else { sent };
        let got = word_of(buf, k);
        if got != want {
            return Err(format!("word {k} is {got:#010x}, expected {want:#010x}"));
        }
    }
    Ok(())
}

/// Checks a reply against the request expected next (`expected`, of client `pid` with `nonce`): see
/// the module's "Repeats". `Err` describes what is wrong, naming the words.
#[allow(clippy::cast_possible_truncation, reason = "sequence numbers are compared in their low halves, as sent")]
pub fn check_reply(buf: &[u8], expected: u64, pid: u32, nonce: u32) -> Result<Verdict, String> {
    if buf.len() < MIN_MSG {
        return Err(format!("a reply of {} bytes: the test's messages have at least {MIN_MSG}", buf.len()));
    }
    let (w0, w2, w3) = (word_of(buf, 0), word_of(buf, 2), word_of(buf, 3));
    if (w2, w3) != (pid, nonce) {
        return Err(format!(
            "a reply for another client: words 2-3 say pid {w2} nonce {w3:#010x}, this is pid {pid} nonce {nonce:#010x} \
             (word 0 says request {w0}, expected {expected})"
        ));
    }
    let behind = (expected as u32).wrapping_sub(w0);
    if behind == 0 {
        return is_reply(buf, expected, pid, nonce)
            .map(|()| Verdict::Expected)
            .map_err(|e| format!("the reply to request {expected}: {e}"));
    }
    if i32::try_from(behind).is_ok() && u64::from(behind) <= expected {
        let seq = expected - u64::from(behind);
        return is_reply(buf, seq, pid, nonce)
            .map(|()| Verdict::Repeat(seq))
            .map_err(|e| format!("a reply to earlier request {seq} (expected {expected}), and not its reply: {e}"));
    }
    Err(format!(
        "a reply to request {w0} while {expected} is the next expected: request {expected}'s reply is lost (or {w0} was never sent)"
    ))
}

/// The client binary: `MESH_SERVICE_CLIENT`, beside this executable (a bundle's bin/, or cargo's
/// target dir for a test or benchmark), else on the PATH.
pub fn client_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("MESH_SERVICE_CLIENT") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("this executable's path");
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join("mesh-service-client");
        if candidate.is_file() {
            return candidate;
        }
    }
    PathBuf::from("mesh-service-client")
}

/// The `key=value` fields of a line the client prints (`ready …`, `progress …`, `done …`).
pub fn fields(line: &str) -> Vec<(&str, &str)> {
    line.split_whitespace().filter_map(|kv| kv.split_once('=')).collect()
}

/// Field `key` of `line` as a number.
pub fn field(line: &str, key: &str) -> Option<u64> {
    fields(line).into_iter().find(|(k, _)| *k == key).and_then(|(_, v)| v.parse().ok())
}

/// What a client process has said so far (its stdout, read by a thread).
#[derive(Debug, Default, Clone)]
pub struct Heard {
    /// Its `ready …` line (attached), if said.
    pub ready: Option<String>,
    /// Replies as of its last `progress …` line, and when the parent read it.
    pub progress: Option<(u64, Instant)>,
    /// Its `done …` line (the final counts), if said.
    pub done: Option<String>,
    /// Every line, for a failure's message.
    pub lines: Vec<String>,
}

/// A client process (`mesh-service-client`), its stdin kept to tell it to go or to finish.
#[derive(Debug)]
pub struct ClientProcess {
    /// The process.
    pub child: Child,
    /// Its stdin: `go` starts a benchmark's run; closing it (or `stop`) ends every mode: the client
    /// stops sending, receives what it is owed, detaches, prints `done …` and exits.
    stdin: Option<ChildStdin>,
    /// What it said.
    pub heard: Arc<Mutex<Heard>>,
    /// Its stderr goes here.
    pub log: PathBuf,
}

impl ClientProcess {
    /// Starts `mesh-service-client` with `args` (after `--socket SOCKET --service NAME`), stderr to `log`.
    pub fn spawn(socket: &Path, service: &str, args: &[String], log: PathBuf) -> Self {
        let mut child = Command::new(client_bin())
            .arg("--socket")
            .arg(socket)
            .args(["--service", service])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("the client's log"))
            .spawn()
            .unwrap_or_else(|e| {
                panic!("start {} ({e}): build it with cargo build -p mesh-gpu-tests --bins", client_bin().display())
            });
        let stdout = child.stdout.take().expect("the client's stdout");
        let heard = Arc::new(Mutex::new(Heard::default()));
        let into = Arc::clone(&heard);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut h = into.lock().expect("heard");
                if line.starts_with("ready") {
                    h.ready = Some(line.clone());
                } else if line.starts_with("progress") {
                    if let Some(n) = field(&line, "replies") {
                        h.progress = Some((n, Instant::now()));
                    }
                } else if line.starts_with("done") {
                    h.done = Some(line.clone());
                }
                h.lines.push(line);
            }
        });
        let stdin = child.stdin.take();
        Self { child, stdin, heard, log }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it said so far.
    pub fn heard(&self) -> Heard {
        self.heard.lock().expect("heard").clone()
    }

    /// Waits until it says `ready` (attached); `Err` with what it said (and its stderr) when it exits
    /// first or `timeout` passes.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.heard().ready {
                return Ok(r);
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the reader thread take the last lines.
                std::thread::sleep(Duration::from_millis(50));
                if let Some(r) = self.heard().ready {
                    return Ok(r);
                }
                return Err(format!("client {} exited ({status}) before attaching: {}", self.pid(), self.said()));
            }
            if Instant::now() >= deadline {
                return Err(format!("client {} not attached within {timeout:?}: {}", self.pid(), self.said()));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends one line to its stdin.
    pub fn say(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }

    /// Closes its stdin: it finishes (receives what it is owed, detaches, says `done`, exits).
    pub fn finish(&mut self) {
        self.stdin = None;
    }

    /// Waits for it to exit; (exit code, its `done` line). `None` for the code when it was killed by a
    /// signal; `Err` when it has not exited within `timeout` (it is then killed).
    pub fn wait_done(&mut self, timeout: Duration) -> Result<(Option<i32>, Option<String>), String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    std::thread::sleep(Duration::from_millis(50));
                    return Ok((status.code(), self.heard().done));
                }
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    return Err(format!("client {} did not finish within {timeout:?}: {}", self.pid(), self.said()));
                }
            }
        }
    }

    /// SIGKILL (nothing of its own runs: its lease, reply-ring claim and any send in progress are left
    /// for meshd to take back); reaps it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its stdout lines and stderr so far, for a failure's message.
    pub fn said(&self) -> String {
        let stderr = std::fs::read_to_string(&self.log).unwrap_or_default();
        format!("stdout: {:?}; stderr: {stderr}", self.heard().lines)
    }
}

impl Drop for ClientProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The clients the group of `service` (its `SERVICE.replies`) holds bound: (client id, holder pid), read
/// from the mailbox's table (what meshd wrote at each attach and departure).
pub fn bound_clients(mailbox: &mesh_shm::Mailbox, service: &str) -> Result<Vec<(u32, u32)>, String> {
    let owner =
        mesh_shm::ServiceOwner::open(mailbox, service, &format!("{service}.replies")).map_err(|e| e.to_string())?;
    Ok(owner.bound().map_err(|e| e.to_string())?.into_iter().map(|(id, h)| (id.0, h.map_or(0, |h| h.pid))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_its_request_with_word_1_incremented_and_repeats_and_strangers_are_told_apart() {
        let (pid, nonce) = (4242, 0xdead_beef);
        let reply = |seq: u64, buf: &mut [u8]| {
            fill_request(buf, seq, pid, nonce);
            let w1 = word_of(buf, 1).wrapping_add(1);
            buf[4..8].copy_from_slice(&w1.to_le_bytes());
        };
        let mut buf = vec![0u8; 64];
        reply(7, &mut buf);
        assert_eq!(check_reply(&buf, 7, pid, nonce), Ok(Verdict::Expected));
        assert_eq!(check_reply(&buf, 9, pid, nonce), Ok(Verdict::Repeat(7)));
        let ahead = check_reply(&buf, 6, pid, nonce).unwrap_err();
        assert!(ahead.contains("lost"), "{ahead}");
        assert!(check_reply(&buf, 7, pid + 1, nonce).unwrap_err().contains("another client"));
        assert!(check_reply(&buf, 7, pid, nonce ^ 1).unwrap_err().contains("another client"));
        // The request itself (word 1 not incremented) is not a reply.
        fill_request(&mut buf, 7, pid, nonce);
        assert!(check_reply(&buf, 7, pid, nonce).unwrap_err().contains("word 1"));
        // A torn body.
        reply(7, &mut buf);
        buf[40] ^= 1;
        assert!(check_reply(&buf, 7, pid, nonce).unwrap_err().contains("word 10"));
        // Across the 32-bit wrap of word 0.
        let mut buf = vec![0u8; 16];
        reply(1 << 32, &mut buf);
        assert_eq!(check_reply(&buf, 1 << 32, pid, nonce), Ok(Verdict::Expected));
        reply((1 << 32) - 1, &mut buf);
        assert_eq!(check_reply(&buf, (1 << 32) + 1, pid, nonce), Ok(Verdict::Repeat((1 << 32) - 1)));
    }

    #[test]
    fn fields_read_the_clients_lines() {
        let line = "done pid=12 sent=100 replies=100 repeats=0 max_gap_us=1500";
        assert_eq!(field(line, "replies"), Some(100));
        assert_eq!(field(line, "max_gap_us"), Some(1500));
        assert_eq!(field(line, "nope"), None);
    }
}
