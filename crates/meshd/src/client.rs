//! The client: one function per subcommand, each one request to the control socket (`send` and
//! `recv` then use the mailbox directly).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use mesh_backend::LaunchShape;
use mesh_shm::{BulkConsumer, BulkProducer, Consumer, Mailbox, Producer, Protocol, ShmError};
use meshd::protocol::{Request, Response};
use meshd::replace::unix_ms;
use meshd::start;

mod delete;
mod handoff;
mod wire;

use wire::call;

use crate::cli::{ChannelCommand, Command, ServiceCommand};
use crate::exit::{Exit, refused};

/// A client's socket: --socket or MESHD_SOCKET; else, with --device, the GPU's (a whole UUID names
/// it without the driver; an ordinal or a prefix is looked up: cuInit, cuDeviceGet, cuDeviceGetUuid,
/// no context); else /tmp/meshd.sock.
pub fn socket(socket: Option<PathBuf>, device: Option<&str>) -> Result<PathBuf, Exit> {
    if let Some(s) = socket {
        return Ok(s);
    }
    let uuid = match device {
        None => None,
        Some(d) => Some(match start::whole_uuid(d) {
            Some(u) => u,
            None => start::lookup_uuid(d).map_err(|e| {
                Exit(2, anyhow!("{e:#}; or give --socket, MESHD_SOCKET or the GPU's whole UUID (GPU-…)"))
            })?,
        }),
    };
    Ok(start::default_paths(uuid.as_deref()).socket)
}

/// Runs a client subcommand against `socket`.
pub fn dispatch(socket: &Path, command: Command) -> Result<(), Exit> {
    match command {
        Command::Run(_) => unreachable!("`meshd run` is the daemon, not a client"),
        Command::Load { name, image, grid, block, shared_mem, bind, sms, no_readiness } => {
            load(socket, name, &image, LaunchShape { grid, block, shared_mem }, bind, sms, no_readiness)
        }
        Command::Upgrade { name, image } => upgrade(socket, name, &image),
        Command::Unload { name } => unload(socket, &name),
        Command::Ps { json } => ps(socket, json),
        Command::User { name, json } => user(socket, &name, json),
        Command::Channel(ChannelCommand::Create { name, msg_size, capacity, placement, protocol, parts }) => {
            channel_create(socket, &name, msg_size, capacity, placement, protocol.unwrap_or_default(), parts)
        }
        Command::Service(ServiceCommand::Create {
            name,
            clients,
            msg_size,
            capacity,
            reply_size,
            reply_capacity,
            shards,
        }) => service_create(socket, name, clients, msg_size, capacity, reply_size, reply_capacity, shards),
        Command::Service(ServiceCommand::Request { name, messages, hex, timeout_ms }) => {
            service_request(socket, &name, &messages, hex, timeout_ms)
        }
        Command::Channel(ChannelCommand::Delete { name, discard }) => delete::channel(socket, &name, discard),
        Command::Service(ServiceCommand::Delete { name, discard }) => delete::service(socket, &name, discard),
        Command::Send { channel, messages, hex, timeout_ms } => send(socket, &channel, &messages, hex, timeout_ms),
        Command::Recv { channel, count, hex, timeout_ms } => recv(socket, &channel, count, hex, timeout_ms),
        Command::Spawn { name, bind, ready_timeout, command } => spawn(socket, name, bind, ready_timeout, command),
        Command::Stop { name } => stop(socket, &name),
        Command::Info => info(socket),
        Command::Metrics => {
            let text = call(socket, &Request::Metrics, &[])?.metrics.unwrap_or_default();
            print!("{text}");
            Ok(())
        }
        Command::Shutdown => {
            call(socket, &Request::Shutdown, &[])?;
            println!("meshd is shutting down");
            Ok(())
        }
        Command::Handoff { binary, timeout_ms } => handoff::handoff(socket, binary, timeout_ms),
    }
}

/// ` (backend 0.125 ms)` when meshd said how long its backend took.
fn backend_time(resp: &Response) -> String {
    resp.backend_us.map_or_else(String::new, |us| format!(" (backend {:.3} ms)", us as f64 / 1000.0))
}

fn load(
    socket: &Path,
    name: String,
    image: &Path,
    shape: LaunchShape,
    bind: Vec<String>,
    sms: Option<u32>,
    no_readiness: bool,
) -> Result<(), Exit> {
    let bytes = read_image(image)?;
    let LaunchShape { grid, block, shared_mem } = shape;
    let req = Request::Load { name, image_len: bytes.len(), grid, block, shared_mem, bind, sms, no_readiness };
    let since = unix_ms();
    let resp = call(socket, &req, &bytes)?;
    for p in resp.programs.as_deref().unwrap_or_default() {
        let took = backend_time(&resp);
        println!("loaded {} (slot {}, generation {}, {}){took}", p.name, p.slot, p.generation, p.state);
        print_stalls(socket, &p.name, since);
    }
    Ok(())
}

fn upgrade(socket: &Path, name: String, image: &Path) -> Result<(), Exit> {
    let bytes = read_image(image)?;
    let since = unix_ms();
    let resp = call(socket, &Request::Upgrade { name, image_len: bytes.len() }, &bytes)?;
    for p in resp.programs.as_deref().unwrap_or_default() {
        let took = backend_time(&resp);
        println!("upgraded {} (slot {}, generation {}, {}){took}", p.name, p.slot, p.generation, p.state);
        print_stalls(socket, &p.name, since);
    }
    Ok(())
}

fn unload(socket: &Path, name: &str) -> Result<(), Exit> {
    let since = unix_ms();
    let resp = call(socket, &Request::Unload { name: name.to_string() }, &[])?;
    println!("unloaded {name}{}", backend_time(&resp));
    print_stalls(socket, name, since);
    Ok(())
}

/// MPS mode: the client creations this request of `program` caused (the pool was empty and
/// --pool-grow let meshd create one), each of which stalled every running program. Read from `info`,
/// which records every such creation with its program and time.
fn print_stalls(socket: &Path, program: &str, since_ms: u64) {
    let Ok(Some(info)) = call(socket, &Request::Info, &[]).map(|r| r.info) else { return };
    let Some(pool) = info.extra.pool else { return };
    for g in pool.recent.iter().filter(|g| g.program == program && g.unix_ms >= since_ms) {
        let why = if g.op == "refill" {
            "a discarded worker was replaced to keep --pool (--pool-grow): meshd created an MPS client".to_string()
        } else {
            format!("the MPS pool had no idle worker: meshd created an MPS client for this {} (--pool-grow)", g.op)
        };
        println!(
            "note: {why}, which stalled {} running program(s) (stall #{} of {} since start)",
            g.stalled, g.seq, pool.stalls
        );
    }
}

/// `ps`'s last line in MPS mode: the pool, and how often it grew while programs ran.
fn print_pool(pool: &meshd::protocol::PoolRow) {
    println!(
        "MPS pool: {} idle, {} in use (--pool {}; limit {} clients: {}); growth {}; {} MPS client creation(s) stalled \
         the running programs since start",
        pool.idle,
        pool.in_use,
        pool.size,
        pool.client_limit,
        pool.client_limit_source,
        if pool.grow { "allowed (--pool-grow)" } else { "refused (no --pool-grow)" },
        pool.stalls
    );
}

/// `meshd user NAME`: the program's user words from `ps`'s row.
fn user(socket: &Path, name: &str, json: bool) -> Result<(), Exit> {
    let rows = call(socket, &Request::Ps, &[])?.programs.unwrap_or_default();
    let words = meshd::protocol::user_words(&rows, name).map_err(refused)?;
    if json {
        println!("{}", serde_json::to_string(&words).map_err(|e| refused(anyhow!(e)))?);
    } else {
        for (i, w) in words.iter().enumerate() {
            println!("{i} {w}");
        }
    }
    Ok(())
}

fn ps(socket: &Path, json: bool) -> Result<(), Exit> {
    let resp = call(socket, &Request::Ps, &[])?;
    let natives = resp.natives.clone().unwrap_or_default();
    let rows = resp.programs.unwrap_or_default();
    if json {
        return print_whole(&ps_json(&rows, &natives).map_err(refused)?);
    }
    println!(
        "{:<20} {:>4} {:<24} {:>5} {:>14} {:>5} {:>8} {:<6} {:<10} {:<10} {:>8} NOTE",
        "NAME", "SLOT", "STATE", "GEN", "HEARTBEAT", "SMS", "WORKER", "KIND", "GRID", "BLOCK", "RESTARTS"
    );
    let dims = |d: [u32; 3]| format!("{}x{}x{}", d[0], d[1], d[2]);
    let opt = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    for p in rows {
        println!(
            "{:<20} {:>4} {:<24} {:>5} {:>14} {:>5} {:>8} {:<6} {:<10} {:<10} {:>8} {}",
            p.name,
            if p.slot == meshd::server::HELD_SLOT { "-".to_string() } else { p.slot.to_string() },
            p.state,
            p.generation,
            p.heartbeat,
            opt(p.sms),
            opt(p.worker_pid),
            p.kind,
            dims(p.grid),
            dims(p.block),
            p.restarts,
            ps_note(&p)
        );
    }
    print_natives(&natives);
    if let Ok(Some(info)) = call(socket, &Request::Info, &[]).map(|r| r.info) {
        for line in loss_lines(&info.channels) {
            println!("{line}");
        }
        for line in service_lines(&info.services) {
            println!("{line}");
        }
        if let Some(pool) = &info.extra.pool {
            print_pool(pool);
        }
    }
    Ok(())
}

/// `ps`'s line for each channel that lost messages with its device ring's slots (nothing when none
/// did): the total over the channel's life, as `info`'s `lost` (`ps --json` keeps its shape).
fn loss_lines(channels: &[meshd::protocol::ChannelRow]) -> Vec<String> {
    channels
        .iter()
        .filter(|c| c.lost > 0)
        .map(|c| {
            let placement = if c.placement.is_empty() { "host" } else { c.placement.as_str() };
            let parts = if c.parts > 1 { format!(", {} parts", c.parts) } else { String::new() };
            format!(
                "channel {} ({placement}{parts}): {} message(s) lost with its ring's slots, made anew when meshd started again \
                 or after a GPU fault",
                c.name, c.lost
            )
        })
        .collect()
}

/// `ps`'s line for each service: its clients (id and pid) and the slots waiting for the program.
fn service_lines(services: &[meshd::protocol::ServiceRow]) -> Vec<String> {
    services
        .iter()
        .map(|s| {
            let shards = if s.shards > 1 { format!(" ({} fan-in shards)", s.shards) } else { String::new() };
            let mut line = format!("service {}{shards}: {} of {} client slot(s) bound", s.name, s.bound, s.entries);
            if !s.clients.is_empty() {
                let clients: Vec<String> = s.clients.iter().map(|c| format!("{:#x} pid {}", c.id, c.pid)).collect();
                line.push_str(&format!(" ({})", clients.join(", ")));
            }
            if s.awaiting_ack > 0 {
                line.push_str(&format!(
                    "; {} left by departed clients, waiting for the serving program to acknowledge",
                    s.awaiting_ack
                ));
            }
            // Every shard's hold (`holds`); a meshd before it sends `held_by` alone.
            let holds = if s.holds.is_empty() { s.held_by.as_slice() } else { s.holds.as_slice() };
            for h in holds {
                line.push_str(&format!(
                    "; fan-in {}{} held at seq {} by {:#x} pid {} ({}) for {} ms, in the middle of writing a request",
                    s.name,
                    if s.shards > 1 { format!(" shard {}", h.shard) } else { String::new() },
                    h.seq,
                    h.client,
                    h.pid,
                    if h.stopped { "stopped" } else { "not stopped: descheduled or slow" },
                    h.since_ms
                ));
            }
            if !holds.is_empty() {
                line.push_str(if holds.len() == 1 {
                    ": not revocable while it lives (`meshd run --client-stall-kill-ms` kills such a client)"
                } else {
                    ": not revocable while their clients live (`meshd run --client-stall-kill-ms` kills such clients)"
                });
            }
            if let Some(e) = &s.error {
                line.push_str(&format!("; unreadable: {e}"));
            }
            line.push_str(&trouble(&s.events));
            line
        })
        .collect()
}

/// What went wrong with a service's clients since meshd started, for `ps` (nothing when nothing did:
/// attaches and detaches are the normal course, `info` and the metrics count them).
fn trouble(e: &meshd::protocol::ServiceEvents) -> String {
    let mut said = Vec::new();
    if e.died > 0 {
        let killed = if e.stall_killed > 0 {
            format!(", {} killed by the stall watcher", e.stall_killed)
        } else {
            String::new()
        };
        said.push(format!("{} client(s) died{killed}", e.died));
    }
    if e.skipped > 0 {
        said.push(format!("{} request(s) cut off by a death", e.skipped));
    }
    if e.stall_revoked > 0 {
        said.push(format!("{} reservation(s) revoked from stalled clients (sent again)", e.stall_revoked));
    }
    if said.is_empty() { String::new() } else { format!("; since meshd started: {}", said.join(", ")) }
}

/// `ps --json`: one array, the programs' rows, then the native workers' rows marked `"native": true`
/// (an array, as before natives were listed, so that a script iterating over programs by name keeps working).
fn ps_json(
    programs: &[meshd::protocol::ProgramRow],
    natives: &[meshd::native::NativeRow],
) -> serde_json::Result<String> {
    let mut rows: Vec<serde_json::Value> = programs.iter().map(serde_json::to_value).collect::<Result<_, _>>()?;
    for n in natives {
        let mut row = serde_json::to_value(n)?;
        if let Some(obj) = row.as_object_mut() {
            obj.insert("native".into(), serde_json::Value::Bool(true));
        }
        rows.push(row);
    }
    serde_json::to_string_pretty(&rows)
}

/// `ps`'s last column: why a program is stopped, else its last fault and when (seconds ago).
fn ps_note(p: &meshd::protocol::ProgramRow) -> String {
    if let Some(r) = &p.recovery {
        return format!("recovering from {} for {} ms", r.reason, r.elapsed_ms);
    }
    if let Some(why) = &p.stopped_why {
        return why.clone();
    }
    if p.adopted {
        return "adopted from the previous meshd, never stopped".into();
    }
    match (&p.last_fault, p.last_fault_unix_ms) {
        (Some(f), Some(at)) => format!("last fault {:.1} s ago: {f}", unix_ms().saturating_sub(at) as f64 / 1000.0),
        (Some(f), None) => format!("last fault: {f}"),
        _ => "-".into(),
    }
}

fn channel_create(
    socket: &Path,
    name: &str,
    msg_size: u32,
    capacity: Option<u32>,
    placement: String,
    protocol: String,
    parts: u32,
) -> Result<(), Exit> {
    let shown = meshd::placement::protocol(&protocol, msg_size).map_err(refused)?;
    let capacity = capacity.unwrap_or_else(|| meshd::protocol::default_capacity(msg_size, shown));
    let req = Request::ChannelCreate {
        name: name.to_string(),
        msg_size,
        capacity,
        placement: placement.clone(),
        protocol,
        parts,
    };
    call(socket, &req, &[])?;
    let split = if parts > 1 { format!(", {parts} parts of {} bytes", msg_size / parts) } else { String::new() };
    println!(
        "created channel {name} ({capacity} messages of {msg_size} bytes, in {placement} memory, protocol {shown}{split})"
    );
    Ok(())
}

#[allow(clippy::too_many_arguments, reason = "the command's options, one each")]
fn service_create(
    socket: &Path,
    name: String,
    clients: u32,
    msg_size: u32,
    capacity: u32,
    reply_size: Option<u32>,
    reply_capacity: u32,
    shards: u32,
) -> Result<(), Exit> {
    let req =
        Request::ServiceCreate { name: name.clone(), clients, msg_size, capacity, reply_size, reply_capacity, shards };
    call(socket, &req, &[])?;
    let replies = format!("{name}{}", meshd::protocol::REPLIES_SUFFIX);
    let reply_size = reply_size.unwrap_or(msg_size);
    println!("created service {name} for up to {clients} clients at once:");
    if shards > 1 {
        println!(
            "  requests: fan-in channel {name} of {shards} shards ({capacity} requests of {msg_size} bytes in flight \
             in each; client slot s sends into shard s mod {shards})"
        );
    } else {
        println!(
            "  requests: fan-in channel {name} ({capacity} requests of {msg_size} bytes in flight over all clients)"
        );
    }
    println!("  replies:  group {replies} (one ring of {reply_capacity} replies of {reply_size} bytes per client)");
    println!(
        "a program serves it by binding both, requests first: meshd load PROGRAM IMAGE --bind {name} --bind {replies}"
    );
    if clients > MESH_GROUP_MAX_ENTRIES {
        println!(
            "note: mesh.cuh's mesh_group_open(ctx, b, in) keeps state for at most {MESH_GROUP_MAX_ENTRIES} clients (and \
             refuses a larger group: every reply then GONE); a program for {clients} needs \
             mesh_group_open(ctx, b, in, state, {clients}) with its own array of mesh_reply_state"
        );
    }
    Ok(())
}

/// mesh.cuh's MESH_GROUP_MAX_ENTRIES: the clients its three-argument mesh_group_open serves.
const MESH_GROUP_MAX_ENTRIES: u32 = 1024;

/// `meshd service request`: attaches as a client, sends each message and prints its reply, detaches.
fn service_request(socket: &Path, service: &str, messages: &[String], hex: bool, timeout_ms: u64) -> Result<(), Exit> {
    // Every message's hex first (bad usage, exit 2), before the client attaches.
    let messages = message_bytes(messages, hex)?;
    // A meshd that is not there is exit 3, as for every other command; a refusal of the attach, 1.
    drop(
        UnixStream::connect(socket)
            .with_context(|| format!("cannot reach meshd at {} (is `meshd run` running?)", socket.display()))
            .map_err(|e| Exit(3, e))?,
    );
    let mut client = meshd::ServiceClient::connect(socket, service).map_err(refused)?;
    for (i, bytes) in messages.iter().enumerate() {
        if bytes.len() > client.msg_size() {
            return Err(refused(anyhow!(
                "service {service:?}: request {} is {} bytes, more than the service's request size ({} bytes)",
                i + 1,
                bytes.len(),
                client.msg_size()
            )));
        }
    }
    let timeout = Duration::from_millis(timeout_ms);
    let mut reply = vec![0u8; client.reply_size()];
    let stdout = std::io::stdout();
    for bytes in &messages {
        client.request(bytes, &mut reply, timeout).map_err(|e| {
            if matches!(e.downcast_ref::<ShmError>(), Some(ShmError::Timeout { .. })) {
                Exit(4, e.context(format!("service {service:?}: no reply (is a program serving it?)")))
            } else {
                refused(e)
            }
        })?;
        writeln!(stdout.lock(), "{}", printable(&reply, hex)).map_err(refused)?;
    }
    client.detach().map_err(refused)
}

/// A message as `meshd recv` and `meshd service request` print it: hex, or text without its
/// trailing zero bytes.
fn printable(buf: &[u8], hex: bool) -> String {
    if hex {
        hex::encode(buf)
    } else {
        let end = buf.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }
}

/// `meshd send` / `recv` speak ll, index and bulk; a service's channels need a service client.
fn plain_channel(channel: &str, protocol: Protocol) -> Result<(), Exit> {
    if matches!(protocol, Protocol::FanIn | Protocol::Group) {
        return Err(refused(anyhow!(
            "channel {channel:?} is one of a service's channels (protocol {}): `meshd send` and `meshd recv` \
             work on ll, index and bulk channels; talk to a service through a service client \
             (`meshd service request`, meshd::ServiceClient, the Python meshd.Service, C's mesh_service_connect)",
            protocol
        )));
    }
    Ok(())
}

fn send(socket: &Path, channel: &str, messages: &[String], hex: bool, timeout_ms: u64) -> Result<(), Exit> {
    let mailbox = open_mailbox(socket)?;
    let protocol = mailbox.channel(channel).map_err(refused)?.protocol;
    plain_channel(channel, protocol)?;
    let bulk = protocol == Protocol::Bulk;
    // Every message's hex first (bad usage, exit 2), before an end is claimed or anything sent.
    let messages = message_bytes(messages, hex)?;
    let timeout = Duration::from_millis(timeout_ms);
    let mut ends = if bulk {
        (None, Some(BulkProducer::claim(&mailbox, channel).map_err(refused)?))
    } else {
        (Some(Producer::claim(&mailbox, channel).map_err(refused)?), None)
    };
    for bytes in messages {
        match &mut ends {
            (Some(tx), _) => tx.send(&bytes, timeout),
            (_, Some(tx)) => tx.send(&bytes, timeout),
            (None, None) => unreachable!("one end was claimed above"),
        }
        .map_err(shm_exit)?;
    }
    Ok(())
}

fn recv(socket: &Path, channel: &str, count: usize, hex: bool, timeout_ms: u64) -> Result<(), Exit> {
    let mailbox = open_mailbox(socket)?;
    let info = mailbox.channel(channel).map_err(refused)?;
    plain_channel(channel, info.protocol)?;
    let timeout = Duration::from_millis(timeout_ms);
    let mut ends = if info.protocol == Protocol::Bulk {
        (None, Some(BulkConsumer::claim(&mailbox, channel).map_err(refused)?))
    } else {
        (Some(Consumer::claim(&mailbox, channel).map_err(refused)?), None)
    };
    let mut buf = vec![0u8; info.msg_size as usize];
    let stdout = std::io::stdout();
    for _ in 0..count {
        match &mut ends {
            (Some(rx), _) => rx.recv(&mut buf, timeout),
            (_, Some(rx)) => rx.recv(&mut buf, timeout),
            (None, None) => unreachable!("one end was claimed above"),
        }
        .map_err(shm_exit)?;
        writeln!(stdout.lock(), "{}", printable(&buf, hex)).map_err(refused)?;
    }
    Ok(())
}

fn info(socket: &Path) -> Result<(), Exit> {
    let info = call(socket, &Request::Info, &[])?.info.ok_or_else(|| refused(anyhow!("meshd sent no info")))?;
    print_whole(&serde_json::to_string_pretty(&info).map_err(refused)?)
}

/// Prints `text` and a newline in one write: a reader that stops at what it looks for (`grep -q`)
/// and closes the pipe then finds it whole, and meshd does not fail on the rest (a pipe the reader
/// closed is not meshd's error).
fn print_whole(text: &str) -> Result<(), Exit> {
    let line = format!("{text}\n");
    match std::io::stdout().lock().write_all(line.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(refused(anyhow!(e))),
        _ => Ok(()),
    }
}

fn shm_exit(e: ShmError) -> Exit {
    match e {
        ShmError::Timeout { .. } => Exit(4, e.into()),
        e => refused(e),
    }
}

/// The command line's messages as bytes: text as given, or hex decoded (bad hex: bad usage, exit 2).
fn message_bytes(messages: &[String], hex: bool) -> Result<Vec<Vec<u8>>, Exit> {
    if hex {
        messages.iter().map(|m| decode_hex(m)).collect::<Result<_>>().map_err(|e| Exit(2, e))
    } else {
        Ok(messages.iter().map(|m| m.as_bytes().to_vec()).collect())
    }
}

fn decode_hex(s: &str) -> Result<Vec<u8>> {
    hex::decode(s).map_err(|e| anyhow!("{s:?} is not hex ({e})"))
}

/// Reads an image, at most meshd's limit and one byte more: a larger file (or `/dev/zero`) is refused
/// by its path without being read whole into memory.
fn read_image(path: &Path) -> Result<Vec<u8>, Exit> {
    use std::io::Read;
    let limit = meshd::protocol::MAX_IMAGE;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limit as u64 + 1).read_to_end(&mut bytes))
        .with_context(|| format!("image {}", path.display()))
        .map_err(refused)?;
    if bytes.len() > limit {
        return Err(refused(anyhow!(
            "image {}: larger than {} MiB, meshd's limit for an image",
            path.display(),
            limit >> 20
        )));
    }
    Ok(bytes)
}

fn open_mailbox(socket: &Path) -> Result<Mailbox, Exit> {
    let info = call(socket, &Request::Info, &[])?.info.ok_or_else(|| refused(anyhow!("meshd sent no info")))?;
    Mailbox::open(&info.mailbox).map_err(refused)
}

// ---- Native GPU workers: `spawn`, `stop`, and their rows in `ps` ----

fn spawn(socket: &Path, name: String, bind: Vec<String>, ready_timeout: f64, command: Vec<String>) -> Result<(), Exit> {
    if !(ready_timeout.is_finite() && ready_timeout > 0.0) {
        return Err(Exit(2, anyhow!("--ready-timeout {ready_timeout}: expected a positive number of seconds")));
    }
    #[allow(clippy::cast_possible_truncation, reason = "positive and finite (checked above); a float cast saturates")]
    let ready_timeout_ms = (ready_timeout * 1000.0).ceil() as u64;
    let resp = call(socket, &Request::Spawn { name, bind, command, ready_timeout_ms }, &[])?;
    for n in resp.natives.as_deref().unwrap_or_default() {
        println!("spawned {} (pid {}, {} mode, channels [{}]): ready", n.name, n.pid, n.isolation, n.bind.join(", "));
        if n.isolation == "blink" {
            println!("note: {}", meshd::native::BLINK_NOTE);
        }
    }
    Ok(())
}

fn stop(socket: &Path, name: &str) -> Result<(), Exit> {
    let resp = call(socket, &Request::Stop { name: name.to_string() }, &[])?;
    for n in resp.natives.as_deref().unwrap_or_default() {
        println!("stopped {} (pid {}): {}", n.name, n.pid, n.state);
    }
    Ok(())
}

/// Native workers under `ps`'s programs, in the same columns (KIND `native`, WORKER its pid), then the command.
fn print_natives(natives: &[meshd::native::NativeRow]) {
    for n in natives {
        println!(
            "{:<20} {:>4} {:<24} {:>5} {:>14} {:>5} {:>8} {:<6} {}",
            n.name, "-", n.state, "-", "-", "-", n.pid, "native", n.command
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_entries_note_quotes_the_headers_limit() {
        // The note's twin of mesh.cuh's macro: the header is C, so the value is checked, not shared.
        // As mesh-shm ships it: a path into the tree would not exist in meshd's own package.
        let (_, header) = mesh_shm::device_header::PARTS
            .iter()
            .find(|(path, _)| *path == "mesh/service.cuh")
            .expect("mesh-shm ships mesh/service.cuh");
        let define = format!("#define MESH_GROUP_MAX_ENTRIES {MESH_GROUP_MAX_ENTRIES}u");
        assert!(header.contains(&define), "mesh.cuh no longer says `{define}`");
    }

    #[test]
    fn ps_says_each_channel_that_lost_messages_and_nothing_for_the_others() {
        let row = |name: &str, placement: &str, lost: u64| meshd::protocol::ChannelRow {
            name: name.into(),
            msg_size: 64,
            capacity: 16,
            placement: placement.into(),
            protocol: "ll".into(),
            parts: 1,
            lost,
            head: 12,
            tail: 12,
        };
        assert!(loss_lines(&[row("a", "host", 0), row("b", "device", 0)]).is_empty());
        let lines = loss_lines(&[row("a", "host", 0), row("dev", "device", 7), row("old", "", 1)]);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("channel dev (device): 7 message(s) lost"), "{lines:?}");
        assert!(lines[1].starts_with("channel old (host): 1 message(s) lost"), "an older meshd's row: {lines:?}");
    }

    #[test]
    fn ps_says_each_service_s_clients_and_the_slots_waiting_for_the_program() {
        use meshd::protocol::{ServiceClientRow, ServiceHold, ServiceRow};
        let rows = [
            ServiceRow {
                name: "kv".into(),
                entries: 8,
                bound: 2,
                awaiting_ack: 1,
                clients: vec![ServiceClientRow { id: 0x1_0000, pid: 41 }, ServiceClientRow { id: 0x2_0003, pid: 42 }],
                shards: 1,
                held_by: None,
                holds: Vec::new(),
                error: None,
                events: meshd::protocol::ServiceEvents {
                    attached: 9,
                    detached: 4,
                    died: 3,
                    skipped: 1,
                    stall_revoked: 2,
                    stall_killed: 1,
                },
            },
            ServiceRow { name: "idle".into(), entries: 4, ..ServiceRow::default() },
            ServiceRow {
                name: "stuck".into(),
                entries: 2,
                bound: 1,
                clients: vec![ServiceClientRow { id: 0x1_0001, pid: 43 }],
                held_by: Some(ServiceHold {
                    client: 0x1_0001,
                    pid: 43,
                    seq: 7,
                    since_ms: 120,
                    stopped: true,
                    shard: 0,
                }),
                ..ServiceRow::default()
            },
            ServiceRow {
                name: "wide".into(),
                entries: 8,
                bound: 1,
                shards: 4,
                clients: vec![ServiceClientRow { id: 0x1_0002, pid: 44 }],
                held_by: Some(ServiceHold { client: 0x1_0002, pid: 44, seq: 3, since_ms: 60, stopped: true, shard: 2 }),
                ..ServiceRow::default()
            },
            // Two shards held at once: every one said, by shard (`holds`; `held_by` is the first).
            ServiceRow {
                name: "both".into(),
                entries: 4,
                bound: 2,
                shards: 2,
                clients: vec![ServiceClientRow { id: 0x1_0000, pid: 45 }, ServiceClientRow { id: 0x1_0001, pid: 46 }],
                held_by: Some(ServiceHold { client: 0x1_0000, pid: 45, seq: 9, since_ms: 80, stopped: true, shard: 0 }),
                holds: vec![
                    ServiceHold { client: 0x1_0000, pid: 45, seq: 9, since_ms: 80, stopped: true, shard: 0 },
                    ServiceHold { client: 0x1_0001, pid: 46, seq: 4, since_ms: 70, stopped: false, shard: 1 },
                ],
                ..ServiceRow::default()
            },
        ];
        let lines = service_lines(&rows);
        assert_eq!(
            lines[0],
            "service kv: 2 of 8 client slot(s) bound (0x10000 pid 41, 0x20003 pid 42); 1 left by departed clients, \
             waiting for the serving program to acknowledge; since meshd started: 3 client(s) died, 1 killed by the \
             stall watcher, 1 request(s) cut off by a death, 2 reservation(s) revoked from stalled clients (sent again)"
        );
        assert_eq!(lines[1], "service idle: 0 of 4 client slot(s) bound");
        assert_eq!(
            lines[2],
            "service stuck: 1 of 2 client slot(s) bound (0x10001 pid 43); fan-in stuck held at seq 7 by 0x10001 pid 43 \
             (stopped) for 120 ms, in the middle of writing a request: not revocable while it lives (`meshd run \
             --client-stall-kill-ms` kills such a client)"
        );
        assert!(
            lines[3].starts_with(
                "service wide (4 fan-in shards): 1 of 8 client slot(s) bound (0x10002 pid 44); fan-in wide shard 2 held \
                 at seq 3 by 0x10002"
            ),
            "{}",
            lines[3]
        );
        assert_eq!(
            lines[4],
            "service both (2 fan-in shards): 2 of 4 client slot(s) bound (0x10000 pid 45, 0x10001 pid 46); fan-in both \
             shard 0 held at seq 9 by 0x10000 pid 45 (stopped) for 80 ms, in the middle of writing a request; fan-in \
             both shard 1 held at seq 4 by 0x10001 pid 46 (not stopped: descheduled or slow) for 70 ms, in the middle \
             of writing a request: not revocable while their clients live (`meshd run --client-stall-kill-ms` kills \
             such clients)"
        );
    }

    #[test]
    fn ps_json_lists_native_workers_after_the_programs_marked_native() {
        let native = meshd::native::NativeRow {
            name: "feeder".into(),
            pid: 42,
            state: "running".into(),
            bind: vec!["to-gpu".into()],
            command: "/bin/feeder --fast".into(),
            isolation: "mps".into(),
        };
        let rows: Vec<serde_json::Value> = serde_json::from_str(&ps_json(&[], &[native]).unwrap()).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["native"], true);
        assert_eq!(rows[0]["name"], "feeder");
        assert_eq!(rows[0]["bind"][0], "to-gpu");
        assert_eq!(ps_json(&[], &[]).unwrap().trim(), "[]", "no natives: the programs' array as before");
    }
}
