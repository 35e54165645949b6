//! The control protocol's golden file for the Python client: every request kind and the answers' shapes, byte for byte as meshd writes them, plus meshd's refusal of a mailbox of another layout version.
//!
//! The file is `crates/mesh-py/tests/golden/protocol.json`: one JSON object whose keys name the cases
//! (`load.request`, `ps.response`, `default_capacity.json`, ...) and whose values are each case's exact
//! bytes as a string. The Python package's tests build the same requests with its client and compare
//! bytes, and parse the answers. This test fails when the protocol's encoding changes without the file;
//! `MESH_GOLDEN_WRITE=1 cargo test -p meshd --test golden_protocol` rewrites it (then run the Python
//! tests, which say what the client must follow).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use mesh_shm::{CreateMode, Mailbox, MailboxConfig};
use meshd::protocol::{Request, Response, write_request, write_response};
use meshd::start::{StartError, claim_mailbox};
use serde_json::{Value, json};

/// The image bytes every load and upgrade case carries.
const IMAGE: &[u8] = b".version 8.0\n.target sm_90\n";

fn golden_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mesh-py/tests/golden/protocol.json")
}

/// Held while the golden file is read and rewritten: the tests run on threads of one process.
static GOLDEN_FILE: Mutex<()> = Mutex::new(());

/// The golden file's cases by name; empty when there is no file yet (before a first write).
fn read_golden() -> BTreeMap<String, String> {
    let path = golden_path();
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not a JSON object of strings: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

/// Rewrites the golden file with `change` applied to its cases.
fn write_golden(change: impl FnOnce(&mut BTreeMap<String, String>)) {
    let _held = GOLDEN_FILE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cases = read_golden();
    change(&mut cases);
    let mut text = serde_json::to_string_pretty(&cases).unwrap();
    text.push('\n');
    std::fs::create_dir_all(golden_path().parent().unwrap()).unwrap();
    std::fs::write(golden_path(), text).unwrap();
}

fn writing() -> bool {
    std::env::var_os("MESH_GOLDEN_WRITE").is_some()
}

/// Compares `bytes` with the golden case `name`, or writes it when `MESH_GOLDEN_WRITE` is set.
/// Returns the names that differ instead of failing at the first, so one run lists them all.
fn golden(name: &str, bytes: &[u8], differ: &mut Vec<String>) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        differ.push(format!("{name}: not UTF-8, so not a JSON string: {}", String::from_utf8_lossy(bytes)));
        return;
    };
    if writing() {
        write_golden(|cases| {
            cases.insert(name.to_string(), text.to_string());
        });
        return;
    }
    match read_golden().get(name) {
        Some(old) if old == text => {}
        Some(old) => differ.push(format!("{name}:\n  file: {}\n  now:  {}", old.trim_end(), text.trim_end())),
        None => differ.push(format!("{name}: not in {}", golden_path().display())),
    }
}

fn assert_none_differ(differ: Vec<String>) {
    assert!(
        differ.is_empty(),
        "the control protocol no longer matches the Python client's golden file \
         (crates/mesh-py/tests/golden/protocol.json):\n{}\n\
         If the change is meant, rewrite it with MESH_GOLDEN_WRITE=1 cargo test -p meshd --test golden_protocol \
         and update the Python client (crates/mesh-py/python/meshd/control.py) until its tests pass",
        differ.join("\n")
    );
}

/// Each request as the Python client writes it. Parsed into [`Request`] (meshd must accept it) and
/// written back by [`write_request`]: the golden file is that encoding. Given as JSON rather than as
/// struct literals so that a field added later with a serde default (which the client may leave out)
/// changes nothing here unless it changes the bytes.
fn request_cases() -> Vec<(&'static str, Value, &'static [u8])> {
    vec![
        (
            "load",
            json!({"op": "load", "name": "echo", "image_len": IMAGE.len(), "grid": [1, 1, 1], "block": [32, 1, 1],
                   "shared_mem": 0, "bind": ["to-gpu", "from-gpu"], "sms": null}),
            IMAGE,
        ),
        (
            "load_shaped",
            json!({"op": "load", "name": "wide", "image_len": IMAGE.len(), "grid": [4, 2, 1], "block": [128, 1, 1],
                   "shared_mem": 1024, "bind": [], "sms": 16}),
            IMAGE,
        ),
        ("upgrade", json!({"op": "upgrade", "name": "echo", "image_len": IMAGE.len()}), IMAGE),
        ("unload", json!({"op": "unload", "name": "echo"}), b""),
        ("ps", json!({"op": "ps"}), b""),
        ("info", json!({"op": "info"}), b""),
        ("shutdown", json!({"op": "shutdown"}), b""),
        ("metrics", json!({"op": "metrics"}), b""),
        ("channel_create", json!({"op": "channel_create", "name": "to-gpu", "msg_size": 64, "capacity": 16}), b""),
        (
            "channel_create_device",
            json!({"op": "channel_create", "name": "g2g", "msg_size": 64, "capacity": 16, "placement": "device"}),
            b"",
        ),
        (
            "channel_create_index",
            json!({"op": "channel_create", "name": "h2h", "msg_size": 8, "capacity": 1024, "protocol": "index"}),
            b"",
        ),
        // A bulk channel of 32 parts: `parts` is sent only above 1.
        (
            "channel_create_parts",
            json!({"op": "channel_create", "name": "wide", "msg_size": 1048576, "capacity": 4, "parts": 32}),
            b"",
        ),
        // A name outside ASCII: serde_json writes UTF-8 as it is, and so must the client.
        (
            "channel_create_utf8",
            json!({"op": "channel_create", "name": "entrée-é", "msg_size": 8, "capacity": 1024}),
            b"",
        ),
        (
            "spawn",
            json!({"op": "spawn", "name": "worker", "bind": ["to-gpu", "from-gpu"],
                   "command": ["./native-cuda", "--iterations", "3"], "ready_timeout_ms": 2500}),
            b"",
        ),
        ("stop", json!({"op": "stop", "name": "worker"}), b""),
        // A service as the client sends it: `capacity` and `reply_capacity` always (their
        // defaults when not given), `reply_size` only when given (absent: the request size).
        (
            "service_create",
            json!({"op": "service_create", "name": "kv", "clients": 8, "msg_size": 64, "capacity": 256,
                   "reply_capacity": 16}),
            b"",
        ),
        (
            "service_create_replies",
            json!({"op": "service_create", "name": "kv", "clients": 4, "msg_size": 64, "capacity": 64,
                   "reply_size": 256, "reply_capacity": 4}),
            b"",
        ),
        // A service of fan-in shards: `shards` is sent only above 1 (absent: the one ring of before).
        (
            "service_create_shards",
            json!({"op": "service_create", "name": "kv", "clients": 8, "msg_size": 64, "capacity": 256,
                   "reply_capacity": 16, "shards": 4}),
            b"",
        ),
        // Deletes: `discard` is sent only when true (absent: refused while messages are queued).
        ("channel_delete", json!({"op": "channel_delete", "name": "to-gpu"}), b""),
        ("channel_delete_discard", json!({"op": "channel_delete", "name": "to-gpu", "discard": true}), b""),
        ("service_delete", json!({"op": "service_delete", "name": "kv"}), b""),
        ("service_delete_discard", json!({"op": "service_delete", "name": "kv", "discard": true}), b""),
        // The lease's two requests: the attach that opens it, and the detach that ends it; and the
        // resume that takes back a lease which ended with a previous meshd.
        ("service_attach", json!({"op": "service_attach", "service": "kv"}), b""),
        ("detach", json!({"op": "detach"}), b""),
        ("service_resume", json!({"op": "service_resume", "service": "kv", "client": 65538}), b""),
    ]
}

/// A program's row, running or left stopped after a fault.
fn program(name: &str, slot: u32, fault: bool) -> Value {
    let mut row = json!({
        "name": name, "slot": slot, "state": if fault { "stopped" } else { "running" }, "generation": 3,
        "heartbeat": 123_456_789_012_u64, "worker_pid": if fault { Value::Null } else { json!(4242) },
        "sms": if fault { Value::Null } else { json!(16) }, "kind": "ptx", "grid": [1, 1, 1], "block": [32, 1, 1],
        "restarts": u32::from(fault),
    });
    if fault {
        row["last_fault"] = json!("CUDA_ERROR_ILLEGAL_ADDRESS (culprit: this program)");
        row["last_fault_unix_ms"] = json!(1_764_748_800_000_u64);
        row["stopped_why"] = json!("caused a GPU fault: left stopped; upgrade or reload it to run it again");
    }
    row
}

/// A program a recovery in place holds: `recovering`, with the recovery's reason and age.
fn recovering(name: &str, slot: u32) -> Value {
    let mut row = program(name, slot, false);
    row["state"] = json!("recovering");
    row["recovery"] = json!({"reason": "the worker of bystander2 died (signal 9)",
                             "since_unix_ms": 1_764_748_800_000_u64, "elapsed_ms": 812});
    row
}

/// A running program that stored 7 in user word 0 and 0xdeadbeef in word 1.
fn user_row(name: &str, slot: u32) -> Value {
    let mut row = program(name, slot, false);
    let mut words = vec![0_u32; meshd::protocol::USER_WORDS];
    words[0] = 7;
    words[1] = 0xdead_beef;
    row["user"] = json!(words);
    row
}

fn native(name: &str) -> Value {
    json!({"name": name, "pid": 31337, "state": "running", "bind": ["to-gpu", "from-gpu"],
           "command": "./native-cuda --iterations 3", "isolation": "mps"})
}

/// Each answer's shape, parsed into [`Response`] and written back by [`write_response`].
fn response_cases() -> Vec<(&'static str, Value)> {
    let info = json!({
        "mode": "mps", "mailbox": "/dev/shm/meshd.mailbox", "device": "NVIDIA H200", "host_atomics": true,
        "channels": [
            {"name": "to-gpu", "msg_size": 64, "capacity": 16, "placement": "host", "lost": 0, "head": 10, "tail": 9},
            {"name": "entrée-é", "msg_size": 8, "capacity": 1024, "placement": "device", "lost": 3, "head": 0, "tail": 0},
        ],
        "arena": {"in_use_bytes": 266_240, "free_bytes": 66_842_624, "largest_free_bytes": 66_580_480,
                  "descriptors_in_use": 2, "descriptors_total": 256},
        "device_uuid": "GPU-00000000-1111-2222-3333-444444444444", "device_selector": "0",
        "pool": {"size": 2, "idle": 1, "in_use": 1, "client_limit": 48,
                 "client_limit_source": "CUDA 13.0 (48 clients from Volta on)", "grow": false, "stalls": 1,
                 "recent": [{"seq": 1, "program": "echo", "op": "load", "stalled": 2, "unix_ms": 1_764_748_800_000_u64}]},
    });
    // Services and their clients, as a meshd in blink mode lists them: each service's fan-in channel
    // and group among the channels (a group's `parts` are its client slots), then the services: one
    // with a slot left by a departed client, a client holding its fan-in ring mid-send (`held_by`)
    // and its clients' events since meshd started, one no client is attached to (no events: left
    // out), one whose group could not be read.
    let service_channels = |name: &str, entries: u32| {
        [
            json!({"name": name, "msg_size": 64, "capacity": 64, "placement": "host", "protocol": "fanin",
                   "lost": 0, "head": 12, "tail": 11}),
            json!({"name": format!("{name}.replies"), "msg_size": 64, "capacity": 16, "placement": "host",
                   "protocol": "group", "parts": entries, "lost": 0, "head": 0, "tail": 0}),
        ]
    };
    let channels: Vec<Value> = [("kv", 8), ("idle", 4), ("torn", 2)]
        .into_iter()
        .flat_map(|(name, entries)| service_channels(name, entries))
        .collect();
    let info_services = json!({
        "mode": "blink", "mailbox": "/dev/shm/meshd.mailbox", "device": "NVIDIA H200", "host_atomics": true,
        "channels": channels,
        "services": [
            {"name": "kv", "entries": 8, "bound": 2, "awaiting_ack": 1,
             "clients": [{"id": 65536, "pid": 41}, {"id": 131_075, "pid": 42}],
             "held_by": {"client": 131_075, "pid": 42, "seq": 7, "since_ms": 120, "stopped": true},
             "events": {"attached": 5, "detached": 1, "died": 2, "skipped": 1, "stall_revoked": 3, "stall_killed": 1}},
            {"name": "idle", "entries": 4, "bound": 0, "awaiting_ack": 0, "clients": []},
            {"name": "torn", "entries": 2, "bound": 0, "awaiting_ack": 0, "clients": [],
             "error": "channel \"torn.replies\": service group: entry 1: binding word 0x700000002 has state 7, \
                       not 0 free, 1 bound or 2 departed"},
        ],
        "device_uuid": "GPU-00000000-1111-2222-3333-444444444444",
    });
    // A service of 4 fan-in shards (the fan-in channel's `parts`, the row's `shards`), two of them
    // held at once: every hold by shard in `holds` (a hold of shard 0 leaves `shard` out), `held_by`
    // the first of them, as a client that reads only that saw one ring held before shards.
    let hold = |client: u32, pid: u32, seq: u64, shard: u32, stopped: bool| {
        let mut h = json!({"client": client, "pid": pid, "seq": seq, "since_ms": 80, "stopped": stopped});
        if shard > 0 {
            h["shard"] = json!(shard);
        }
        h
    };
    let info_services_shards = json!({
        "mode": "blink", "mailbox": "/dev/shm/meshd.mailbox", "device": "NVIDIA H200", "host_atomics": true,
        "channels": [
            {"name": "wide", "msg_size": 64, "capacity": 64, "placement": "host", "protocol": "fanin", "parts": 4,
             "lost": 0, "head": 0, "tail": 0},
            {"name": "wide.replies", "msg_size": 64, "capacity": 16, "placement": "host", "protocol": "group",
             "parts": 8, "lost": 0, "head": 0, "tail": 0},
        ],
        "services": [
            {"name": "wide", "entries": 8, "bound": 3, "shards": 4, "awaiting_ack": 0,
             "clients": [{"id": 65536, "pid": 40}, {"id": 65538, "pid": 42}, {"id": 65539, "pid": 43}],
             "held_by": hold(65536, 40, 9, 0, true),
             "holds": [hold(65536, 40, 9, 0, true), hold(65539, 43, 2, 3, false)]},
        ],
    });
    vec![
        ("ok", json!({"ok": true})),
        ("refused", json!({"ok": false, "error": "program \"zzz\": no such program", "backend_us": 87})),
        ("load", json!({"ok": true, "programs": [program("echo", 0, false)], "backend_us": 125_000})),
        (
            "ps",
            json!({"ok": true, "programs": [program("echo", 0, false), program("fault", 1, true)],
                   "natives": [native("worker")]}),
        ),
        ("ps_empty", json!({"ok": true, "programs": [], "natives": []})),
        // A program's user words (what its kernel stored with mesh_user_store), all 32 of them.
        ("ps_user", json!({"ok": true, "programs": [user_row("counter", 2)], "natives": []})),
        (
            "ps_recovering",
            json!({"ok": true, "programs": [recovering("echo", 0), program("bystander2", 1, false)], "natives": []}),
        ),
        ("info", json!({"ok": true, "info": info})),
        ("spawn", json!({"ok": true, "natives": [native("worker")]})),
        ("metrics", json!({"ok": true, "metrics": "# TYPE meshd_up gauge\nmeshd_up 1\n"})),
        ("info_services", json!({"ok": true, "info": info_services})),
        ("info_services_shards", json!({"ok": true, "info": info_services_shards})),
        // A service created: a change, so the backend's time comes with it.
        ("service_create", json!({"ok": true, "backend_us": 1830})),
        // A delete: a change, with the messages it dropped.
        ("delete", json!({"ok": true, "backend_us": 412, "discarded": 3})),
        // The client bound (slot 2 at epoch 1): its id and its two channels; the sizes are the
        // channels', which the client reads in the mailbox.
        ("service_attach", json!({"ok": true, "client": {"id": 65538, "requests": "kv", "replies": "kv.replies"}})),
    ]
}

#[test]
fn requests_match_the_golden_file() {
    let mut differ = Vec::new();
    for (name, req, image) in request_cases() {
        let req: Request =
            serde_json::from_value(req).unwrap_or_else(|e| panic!("meshd refuses the {name} request: {e}"));
        let mut bytes = Vec::new();
        write_request(&mut bytes, &req, image).unwrap();
        golden(&format!("{name}.request"), &bytes, &mut differ);
    }
    assert_none_differ(differ);
}

#[test]
fn responses_match_the_golden_file() {
    let mut differ = Vec::new();
    for (name, resp) in response_cases() {
        let resp: Response = serde_json::from_value(resp).unwrap_or_else(|e| panic!("the {name} answer: {e}"));
        let mut bytes = Vec::new();
        write_response(&mut bytes, &resp).unwrap();
        // The file is what the client parses: it must read back as the same answer.
        let back = meshd::protocol::read_response(&mut std::io::Cursor::new(&bytes)).unwrap();
        assert_eq!(back, resp, "{name} does not survive its own encoding");
        golden(&format!("{name}.response"), &bytes, &mut differ);
    }
    assert_none_differ(differ);
}

/// The capacity a channel created without one gets, by message size and protocol: the Python
/// client computes the same (`meshd.control.default_capacity`), checked against this file.
#[test]
fn default_capacities_match_the_golden_file() {
    use mesh_shm::Protocol;
    let mut rows = Vec::new();
    for msg_size in [16, 4096, 16 << 10, 65_536, 65_552, 100_000, 1 << 20, 3 << 20, 4 << 20, 8 << 20, 16 << 20] {
        for (protocol, name) in [(Protocol::Bulk, "bulk"), (Protocol::Ll, "ll"), (Protocol::Index, "index")] {
            if protocol != Protocol::Bulk && msg_size > mesh_shm::layout::MAX_MSG_SIZE {
                continue;
            }
            rows.push(json!([msg_size, name, meshd::protocol::default_capacity(msg_size, protocol)]));
        }
    }
    // Left out, the protocol goes by size: what the client must pick too.
    for msg_size in [64_u32, 65_536, 65_552, 16 << 20] {
        let protocol = meshd::placement::protocol("", msg_size).unwrap();
        rows.push(json!([msg_size, null, meshd::protocol::default_capacity(msg_size, protocol)]));
    }
    let mut bytes = serde_json::to_vec(&rows).unwrap();
    bytes.push(b'\n');
    let mut differ = Vec::new();
    golden("default_capacity.json", &bytes, &mut differ);
    assert_none_differ(differ);
}

/// meshd's refusal of a mailbox of another layout version, with `{path}`, `{found}` and `{expected}`
/// in place of the values: the Python package raises the same text when it opens such a file.
#[test]
fn other_layout_version_refusal_matches_the_golden_file() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let config = MailboxConfig { size: 1 << 20, slots: 8, channels: 8 };
    drop(Mailbox::create(&path, &config, CreateMode::Exclusive).unwrap());
    let expected = mesh_shm::layout::LAYOUT_VERSION;
    let found = expected + 1;
    let at = core::mem::offset_of!(mesh_shm::layout::Header, version) as u64;
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&found.to_le_bytes(), at).unwrap();
    let err = claim_mailbox(&path, &config, false).unwrap_err();
    assert!(matches!(err, StartError::OtherVersion { .. }), "{err}");
    let text = err.to_string().replace(&path.display().to_string(), "{path}").replace(
        &format!("{found}, this build reads version {expected}"),
        "{found}, this build reads version {expected}",
    );
    assert!(text.contains("--fresh") && text.contains("{found}") && text.contains("{path}"), "{text}");
    let mut differ = Vec::new();
    golden("layout_version_error.txt", format!("{text}\n").as_bytes(), &mut differ);
    assert_none_differ(differ);
}

/// The golden file holds exactly the cases these tests make: a case no test makes any more would
/// pin the Python client to bytes meshd no longer writes. Rewriting drops such a case.
#[test]
fn the_golden_file_holds_every_case_and_no_other() {
    let mut made: Vec<String> = request_cases().into_iter().map(|(name, ..)| format!("{name}.request")).collect();
    made.extend(response_cases().into_iter().map(|(name, _)| format!("{name}.response")));
    made.extend(["default_capacity.json".to_string(), "layout_version_error.txt".to_string()]);
    if writing() {
        write_golden(|cases| cases.retain(|name, _| made.contains(name)));
        return;
    }
    let cases = read_golden();
    let stale: Vec<&String> = cases.keys().filter(|name| !made.contains(name)).collect();
    let missing: Vec<&String> = made.iter().filter(|name| !cases.contains_key(*name)).collect();
    assert!(
        stale.is_empty() && missing.is_empty(),
        "{}: cases no test makes: {stale:?}; cases missing: {missing:?} (MESH_GOLDEN_WRITE=1 rewrites it)",
        golden_path().display()
    );
    assert_eq!(cases.len(), made.len(), "a case made twice");
}
