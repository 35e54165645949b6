//! The Rust peer of the Python package's tests and benchmark: makes mailboxes, produces, consumes and echoes sequence-numbered messages, and serves the control socket over a stand-in backend.
//!
//! ```text
//! peer mailbox PATH NAME:MSG_SIZE:CAPACITY...   a new mailbox (replacing any file) with these channels
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
//! ```
//!
//! A message numbered `n` carries `n` as a little-endian u64 in its first 8 bytes, and every further
//! 8-byte word holds `n ^ word_index`, so a byte out of place anywhere is caught. Counts and timings
//! go to stdout as `key value` lines for the Python side to read.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mesh_shm::{Consumer, CreateMode, Mailbox, MailboxConfig, Producer};

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
        ["serve", socket, mailbox] => serve(PathBuf::from(socket), Path::new(mailbox)),
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

fn make_mailbox(path: &Path, channels: &[&str]) -> Result<()> {
    let config = MailboxConfig { size: 64 << 20, slots: 8, channels: 16 };
    let mailbox = Mailbox::create(path, &config, CreateMode::Replace)?;
    for spec in channels {
        let parts: Vec<&str> = spec.split(':').collect();
        let [name, size, cap] = parts.as_slice() else { bail!("channel {spec:?}: expected NAME:MSG_SIZE:CAPACITY") };
        mailbox.create_channel(name, size.parse()?, cap.parse()?)?;
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

fn produce(path: &Path, channel: &str, count: u64, opts: &[&str]) -> Result<()> {
    let mailbox = Mailbox::open(path)?;
    let mut tx = Producer::claim(&mailbox, channel)?;
    let first = if opts.contains(&"--from-head") { mailbox.channel(channel)?.head } else { 0 };
    let first_word = opts.contains(&"--first-word");
    let mut msg = vec![0u8; tx.info().msg_size as usize];
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
    let mut rx = Consumer::claim(&mailbox, channel)?;
    let first_word = opts.contains(&"--first-word");
    let mut next = if opts.contains(&"--from-tail") { mailbox.channel(channel)?.tail } else { 0 };
    let size = rx.info().msg_size as usize;
    // Batches of up to 64 messages: the consumer keeps up with any producer, as a real one would.
    let mut buf = vec![0u8; size * 64];
    let mut got = 0;
    let mut start = None;
    while got < count {
        let want = usize::try_from(count - got).unwrap_or(usize::MAX).min(64);
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
    let mut rx = Consumer::claim(&mailbox, input)?;
    let mut tx = Producer::claim(&mailbox, output)?;
    let mut msg = vec![0u8; rx.info().msg_size as usize];
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
    let mut tx = Producer::claim(&mailbox, channel)?;
    let mut rx = Consumer::claim(&mailbox, channel)?;
    let msg = vec![7u8; tx.info().msg_size as usize];
    let mut out = msg.clone();
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

fn serve(socket: PathBuf, mailbox_path: &Path) -> Result<()> {
    let config = MailboxConfig { size: 16 << 20, slots: 8, channels: 16 };
    let mailbox = Mailbox::create(mailbox_path, &config, CreateMode::Replace)?;
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
