//! The Rust peer of the Python package's tests and benchmark: makes mailboxes, produces, consumes and echoes sequence-numbered messages, and serves the control socket over a stand-in backend.
//!
//! ```text
//! peer mailbox PATH [--size BYTES] NAME:MSG_SIZE:CAPACITY[:PROTOCOL]...
//!                                               a new mailbox (replacing any file; 64 MiB unless --size) with
//!                                               these channels (protocol ll, bulk or index; by size if left out)
//! peer bump-version PATH                        make PATH a mailbox of the next layout version
//! peer produce PATH CHANNEL COUNT [--from-head] [--first-word]
//!                                               COUNT messages numbered from 0 (or from the channel's head;
//!                                               --first-word: only the number word written, the rest zero)
//! peer consume PATH CHANNEL COUNT [--from-tail] [--first-word]
//!                                               COUNT messages, each checked to carry the next number
//!                                               (--first-word: only the number word, as the benchmark's Python side)
//! peer echo PATH IN OUT COUNT                   COUNT messages from IN sent back unchanged on OUT
//! peer pair PATH CHANNEL COUNT                  try_send + try_recv pairs in one thread: ns per pair
//! peer ping PATH OUT IN COUNT                   round trips through an echo (a peer's or a GPU program's): median, p99
//! peer serve SOCKET MAILBOX                     meshd's control plane over a stand-in backend, until shutdown
//! peer serve-again SOCKET MAILBOX               the same on the mailbox a killed `serve` left (a restart of meshd)
//! peer user-store PATH SLOT WORD=VALUE...      user words of program slot SLOT, as a kernel's mesh_user_store
//! peer service-server PATH NAME                 a host server of service NAME until its stdin closes: each
//!                                               reply is its request with the first u32 word plus one
//! ```
//!
//! A message numbered `n` carries `n` as a little-endian u64 in its first 8 bytes, and every further
//! 8-byte word holds `n ^ word_index`, so a byte out of place anywhere is caught. Counts and timings
//! go to stdout as `key value` lines for the Python side to read. `produce`, `consume` and `echo` take
//! a channel of any protocol: a bulk channel's ends are mesh-shm's `BulkProducer`/`BulkConsumer` with
//! their default copy settings (the Rust host end the Python one is measured against).

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mesh_shm::{
    BulkConsumer, BulkProducer, ClientId, Consumer, CreateMode, FanInReceiver, GroupServer, Mailbox, MailboxConfig,
    Placement, Producer, Protocol, Replied, Taken,
};

/// How long a blocking call may wait before the peer gives up (a test's deadline, not a measurement).
const PATIENCE: Duration = Duration::from_secs(30);

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["mailbox", path, channels @ ..] => make_mailbox(Path::new(path), channels),
        ["bump-version", path] => bump_version(Path::new(path)),
        ["produce", path, channel, count, opts @ ..] => produce(Path::new(path), channel, count.parse()?, opts),
        ["consume", path, channel, count, opts @ ..] => consume(Path::new(path), channel, count.parse()?, opts),
        ["echo", path, input, output, count] => echo(Path::new(path), input, output, count.parse()?),
        ["pair", path, channel, count] => pair(Path::new(path), channel, count.parse()?),
        ["ping", path, out, input, count] => ping(Path::new(path), out, input, count.parse()?),
        ["serve", socket, mailbox] => serve(PathBuf::from(socket), Path::new(mailbox), false),
        ["serve-again", socket, mailbox] => serve(PathBuf::from(socket), Path::new(mailbox), true),
        ["service-server", path, name] => service_server(Path::new(path), name),
        ["user-store", path, slot, words @ ..] => user_store(Path::new(path), slot.parse()?, words),
        _ => bail!("usage: see the top of crates/mesh-py/examples/peer.rs (got {args:?})"),
    }
}

/// Fills `msg` as message number `n` (see the file's comment).
fn fill(msg: &mut [u8], n: u64) {
    for (i, word) in msg.chunks_exact_mut(8).enumerate() {
        let v = if i == 0 { n } else { n ^ i as u64 };
        word.copy_from_slice(&v.to_le_bytes());
    }
}

/// The number message `msg` carries, if every word agrees with it.
fn check(msg: &[u8]) -> Option<u64> {
    let word = |i: usize| u64::from_le_bytes(msg[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let n = word(0);
    (1..msg.len() / 8).all(|i| word(i) == n ^ i as u64).then_some(n)
}

/// A producer end of any protocol.
enum Tx {
    Ring(Producer),
    Bulk(BulkProducer),
}

impl Tx {
    fn claim(mailbox: &Mailbox, name: &str) -> Result<Self> {
        Ok(match mailbox.channel(name)?.protocol {
            Protocol::Bulk => Tx::Bulk(BulkProducer::claim(mailbox, name)?),
            _ => Tx::Ring(Producer::claim(mailbox, name)?),
        })
    }

    fn msg_size(&self) -> usize {
        match self {
            Tx::Ring(p) => p.info().msg_size as usize,
            Tx::Bulk(p) => p.info().msg_size as usize,
        }
    }

    fn try_send(&mut self, msg: &[u8]) -> Result<bool> {
        Ok(match self {
            Tx::Ring(p) => p.try_send(msg)?,
            Tx::Bulk(p) => p.try_send(msg)?,
        })
    }

    fn send(&mut self, msg: &[u8], timeout: Duration) -> Result<()> {
        match self {
            Tx::Ring(p) => p.send(msg, timeout)?,
            Tx::Bulk(p) => p.send(msg, timeout)?,
        }
        Ok(())
    }
}

/// A consumer end of any protocol.
enum Rx {
    Ring(Consumer),
    Bulk(BulkConsumer),
}

impl Rx {
    fn claim(mailbox: &Mailbox, name: &str) -> Result<Self> {
        Ok(match mailbox.channel(name)?.protocol {
            Protocol::Bulk => Rx::Bulk(BulkConsumer::claim(mailbox, name)?),
            _ => Rx::Ring(Consumer::claim(mailbox, name)?),
        })
    }

    fn msg_size(&self) -> usize {
        match self {
            Rx::Ring(c) => c.info().msg_size as usize,
            Rx::Bulk(c) => c.info().msg_size as usize,
        }
    }

    fn try_recv(&mut self, out: &mut [u8]) -> Result<bool> {
        Ok(match self {
            Rx::Ring(c) => c.try_recv(out)?,
            Rx::Bulk(c) => c.try_recv(out)?,
        })
    }

    fn recv(&mut self, out: &mut [u8], timeout: Duration) -> Result<()> {
        match self {
            Rx::Ring(c) => c.recv(out, timeout)?,
            Rx::Bulk(c) => c.recv(out, timeout)?,
        }
        Ok(())
    }

    /// At least one message into `out` (a multiple of the message size); how many. A bulk end takes one.
    fn recv_batch(&mut self, out: &mut [u8], timeout: Duration) -> Result<usize> {
        match self {
            Rx::Ring(c) => Ok(c.recv_batch(out, timeout)?),
            Rx::Bulk(c) => {
                let size = c.info().msg_size as usize;
                c.recv(&mut out[..size], timeout)?;
                Ok(1)
            }
        }
    }
}

fn make_mailbox(path: &Path, args: &[&str]) -> Result<()> {
    let (size, channels) = match args {
        ["--size", bytes, rest @ ..] => (bytes.parse()?, rest),
        rest => (64 << 20, rest),
    };
    let config = MailboxConfig { size, slots: 8, channels: 16 };
    let mailbox = Mailbox::create(path, &config, CreateMode::Replace)?;
    for spec in channels {
        let parts: Vec<&str> = spec.split(':').collect();
        let (name, size, cap, protocol) = match parts.as_slice() {
            [name, size, cap] => (name, size.parse()?, cap.parse()?, None),
            [name, size, cap, p] => (name, size.parse()?, cap.parse()?, Some(*p)),
            _ => bail!("channel {spec:?}: expected NAME:MSG_SIZE:CAPACITY[:PROTOCOL]"),
        };
        let protocol = match protocol {
            None => Protocol::default_for(size),
            Some("ll") => Protocol::Ll,
            Some("bulk") => Protocol::Bulk,
            Some("index") => Protocol::Index,
            Some(other) => bail!("channel {spec:?}: protocol {other:?} is none of ll, bulk, index"),
        };
        mailbox.create_channel_with(name, size, cap, Placement::Host, protocol)?;
    }
    println!("ready");
    Ok(())
}

fn bump_version(path: &Path) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let at = core::mem::offset_of!(mesh_shm::layout::Header, version) as u64;
    let file = std::fs::OpenOptions::new().write(true).open(path).with_context(|| path.display().to_string())?;
    file.write_all_at(&(mesh_shm::layout::LAYOUT_VERSION + 1).to_le_bytes(), at)?;
    println!("version {}", mesh_shm::layout::LAYOUT_VERSION + 1);
    Ok(())
}

/// Stores user words into program slot `slot` (what a kernel's `mesh_user_store` does), through the
/// file: its page cache is the mapping every process shares.
fn user_store(path: &Path, slot: u32, words: &[&str]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mailbox = Mailbox::open(path)?;
    let user = mailbox.slot(slot)?.offset() + core::mem::offset_of!(mesh_shm::layout::Slot, user) as u64;
    let file = std::fs::OpenOptions::new().write(true).open(path).with_context(|| path.display().to_string())?;
    for pair in words {
        let (i, v) = pair.split_once('=').with_context(|| format!("{pair:?}: not WORD=VALUE"))?;
        let (i, v): (u64, u32) = (i.parse()?, v.parse()?);
        if i >= 32 {
            bail!("user word {i}: a slot holds 32");
        }
        file.write_all_at(&v.to_le_bytes(), user + 4 * i)?;
    }
    println!("stored {}", words.len());
    Ok(())
}

fn produce(path: &Path, channel: &str, count: u64, opts: &[&str]) -> Result<()> {
    let mailbox = Mailbox::open(path)?;
    let mut tx = Tx::claim(&mailbox, channel)?;
    let first = if opts.contains(&"--from-head") { mailbox.channel(channel)?.head } else { 0 };
    let first_word = opts.contains(&"--first-word");
    let mut msg = vec![0u8; tx.msg_size()];
    // Every page written once, so that the copies read real memory (an untouched buffer maps the
    // kernel's one zero page, which a copy reads from the cache: faster than any real message).
    fill(&mut msg, first);
    println!("first {first}");
    let start = Instant::now();
    for n in first..first + count {
        if first_word {
            msg[..8].copy_from_slice(&n.to_le_bytes());
        } else {
            fill(&mut msg, n);
        }
        tx.send(&msg, PATIENCE)?;
    }
    println!("sent {count}");
    println!("seconds {}", start.elapsed().as_secs_f64());
    Ok(())
}

fn consume(path: &Path, channel: &str, count: u64, opts: &[&str]) -> Result<()> {
    let mailbox = Mailbox::open(path)?;
    let mut rx = Rx::claim(&mailbox, channel)?;
    let first_word = opts.contains(&"--first-word");
    let mut next = if opts.contains(&"--from-tail") { mailbox.channel(channel)?.tail } else { 0 };
    let size = rx.msg_size();
    // Batches of up to 64 messages (at most 4 MiB): the consumer keeps up with any producer, as a real
    // one would.
    let batch = ((4 << 20) / size).clamp(1, 64);
    let mut buf = vec![0u8; size * batch];
    let mut got = 0;
    let mut start = None;
    while got < count {
        let want = usize::try_from(count - got).unwrap_or(usize::MAX).min(batch);
        let n = rx.recv_batch(&mut buf[..want * size], PATIENCE)?;
        start.get_or_insert_with(Instant::now);
        for msg in buf[..n * size].chunks_exact(size) {
            let number = if first_word { Some(u64::from_le_bytes(msg[..8].try_into()?)) } else { check(msg) };
            match number {
                Some(v) if v == next => next += 1,
                other => bail!("message {got}: expected number {next}, got {other:?} (first bytes {:?})", &msg[..16]),
            }
            got += 1;
        }
    }
    println!("received {got}");
    // From the first message to the last: the stream's rate, without the start-up.
    println!("seconds {}", start.map_or(0.0, |s| s.elapsed().as_secs_f64()));
    Ok(())
}

fn echo(path: &Path, input: &str, output: &str, count: u64) -> Result<()> {
    let mailbox = Mailbox::open(path)?;
    let mut rx = Rx::claim(&mailbox, input)?;
    let mut tx = Tx::claim(&mailbox, output)?;
    let mut msg = vec![0u8; rx.msg_size()];
    println!("ready");
    for _ in 0..count {
        rx.recv(&mut msg, PATIENCE)?;
        tx.send(&msg, PATIENCE)?;
    }
    println!("echoed {count}");
    Ok(())
}

fn pair(path: &Path, channel: &str, count: u64) -> Result<()> {
    let mailbox = Mailbox::open(path)?;
    let mut tx = Tx::claim(&mailbox, channel)?;
    let mut rx = Rx::claim(&mailbox, channel)?;
    let msg = vec![7u8; tx.msg_size()];
    let mut out = msg.clone();
    // One pair first (page faults, the copy threads' start), as the Python side's warm-up.
    if !tx.try_send(&msg)? || !rx.try_recv(&mut out)? {
        bail!("a try_send/try_recv pair on an empty ring failed");
    }
    let start = Instant::now();
    for _ in 0..count {
        if !tx.try_send(&msg)? || !rx.try_recv(&mut out)? {
            bail!("a try_send/try_recv pair on an empty ring failed");
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / count as f64;
    println!("ns_per_pair {ns}");
    Ok(())
}

fn ping(path: &Path, out: &str, input: &str, count: usize) -> Result<()> {
    let mailbox = Mailbox::open(path)?;
    let mut tx = Producer::claim(&mailbox, out)?;
    let mut rx = Consumer::claim(&mailbox, input)?;
    let mut msg = vec![0u8; tx.info().msg_size as usize];
    let mut back = msg.clone();
    let warm = 1000;
    let mut rtt = Vec::with_capacity(count);
    for i in 0..warm + count {
        fill(&mut msg, i as u64);
        let start = Instant::now();
        tx.send(&msg, PATIENCE)?;
        let deadline = start + PATIENCE;
        while !rx.try_recv(&mut back)? {
            if Instant::now() > deadline {
                bail!("round trip {i}: no answer within {PATIENCE:?}");
            }
        }
        if i >= warm {
            rtt.push(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
        if back != msg {
            bail!("round trip {i}: the answer differs from the message");
        }
    }
    rtt.sort_unstable();
    println!("median_ns {}", rtt[rtt.len() / 2]);
    println!("p99_ns {}", rtt[rtt.len() * 99 / 100]);
    Ok(())
}

// ---- the control plane over a stand-in backend ----

fn serve(socket: PathBuf, mailbox_path: &Path, again: bool) -> Result<()> {
    let config = MailboxConfig { size: 64 << 20, slots: 8, channels: 16 };
    let mailbox =
        if again { Mailbox::open(mailbox_path)? } else { Mailbox::create(mailbox_path, &config, CreateMode::Replace)? };
    let server = meshd::server::Server::start(mailbox, meshd::server::Limits::default(), None, |mb| {
        Ok(meshd::server::Opened {
            backend: Box::new(meshd::stand_in::StandInBackend::new(mb)),
            device: "stand-in (no GPU)".into(),
            arch: None,
        })
    })?;
    let listener = meshd::start::bind_socket(&socket)?;
    println!("ready");
    let clean = server.run(listener)?;
    // `run` returns once the backend has stopped, without joining the connection threads: the one
    // answering `shutdown` may not have written its answer yet, and leaving now would cut it off
    // (meshd's own main has the same window). Give it a moment before the process ends.
    std::thread::sleep(Duration::from_millis(200));
    println!("stopped clean={clean}");
    Ok(())
}

// ---- services ----

/// A host server of service `name` until its stdin closes: every request is answered with itself,
/// its first little-endian u32 word plus one, on the sender's ring, in order. A reply that finds
/// its client's ring full waits in that client's queue (the other clients are served meanwhile);
/// a client that has gone loses its queue. Prints what it took, skipped, answered and saw leave.
fn service_server(path: &Path, name: &str) -> Result<()> {
    let mailbox = Mailbox::open(path)?;
    let mut rx = FanInReceiver::claim(&mailbox, name)?;
    let mut srv = GroupServer::claim(&mailbox, &format!("{name}.replies"))?;
    let mut req = vec![0u8; rx.info().msg_size as usize];
    let reply_size = srv.info().msg_size as usize;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            stop.store(true, Ordering::Release);
        });
    }
    let mut queued: HashMap<u32, VecDeque<Vec<u8>>> = HashMap::new();
    let (mut taken, mut skipped, mut replied, mut gone, mut departed) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut idle = 0u32;
    println!("ready");
    while !stop.load(Ordering::Acquire) {
        let mut busy = false;
        match rx.try_take(&mut req)? {
            Some(Taken::Message { sender }) => {
                taken += 1;
                busy = true;
                let mut out = vec![0u8; reply_size];
                let n = req.len().min(reply_size);
                out[..n].copy_from_slice(&req[..n]);
                if reply_size >= 4 {
                    let word = u32::from_le_bytes(out[..4].try_into()?).wrapping_add(1);
                    out[..4].copy_from_slice(&word.to_le_bytes());
                }
                queued.entry(sender).or_default().push_back(out);
            }
            Some(Taken::Skipped { .. }) => {
                skipped += 1;
                busy = true;
            }
            None => {}
        }
        for (&to, queue) in &mut queued {
            while let Some(out) = queue.front() {
                match srv.reply(ClientId(to), out)? {
                    Replied::Sent => {
                        replied += 1;
                        queue.pop_front();
                    }
                    Replied::Full => break,
                    Replied::Gone => {
                        gone += queue.len() as u64;
                        queue.clear();
                    }
                }
            }
        }
        queued.retain(|_, q| !q.is_empty());
        for left in srv.departures()? {
            departed += 1;
            if let Some(q) = queued.remove(&left.0) {
                gone += q.len() as u64;
            }
        }
        if busy {
            idle = 0;
        } else {
            idle = idle.saturating_add(1);
            if idle > 1000 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }
    println!("taken {taken}");
    println!("skipped {skipped}");
    println!("replied {replied}");
    println!("gone {gone}");
    println!("departed {departed}");
    Ok(())
}
