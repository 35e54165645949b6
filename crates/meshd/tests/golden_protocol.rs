//! Golden files of the control protocol for the Python client: every request kind and the answers' shapes, byte for byte as meshd writes them, plus meshd's refusal of a mailbox of another layout version.
//!
//! The files live in `crates/mesh-py/tests/golden/`; the Python package's tests build the same
//! requests with its client and compare bytes, and parse the answers. This test fails when the
//! protocol's encoding changes without the files; `MESH_GOLDEN_WRITE=1 cargo test -p meshd --test
//! golden_protocol` rewrites them (then run the Python tests, which say what the client must follow).

use std::path::{Path, PathBuf};

use mesh_shm::{CreateMode, Mailbox, MailboxConfig};
use meshd::native::NativeRow;
use meshd::protocol::{
    ChannelRow, GrowthRow, Info, InfoExtra, PoolRow, ProgramRow, Request, Response, write_request, write_response,
};
use meshd::start::{StartError, claim_mailbox};

/// The image bytes every load and upgrade case carries.
const IMAGE: &[u8] = b".version 8.0\n.target sm_90\n";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../mesh-py/tests/golden")
}

/// Compares `bytes` with the golden file `name`, or writes it when `MESH_GOLDEN_WRITE` is set.
/// Returns the names that differ instead of failing at the first, so one run lists them all.
fn golden(name: &str, bytes: &[u8], differ: &mut Vec<String>) {
    let path = golden_dir().join(name);
    if std::env::var_os("MESH_GOLDEN_WRITE").is_some() {
        std::fs::create_dir_all(golden_dir()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        return;
    }
    match std::fs::read(&path) {
        Ok(old) if old == bytes => {}
        Ok(old) => differ.push(format!(
            "{name}:\n  file: {}\n  now:  {}",
            String::from_utf8_lossy(&old).trim_end(),
            String::from_utf8_lossy(bytes).trim_end()
        )),
        Err(e) => differ.push(format!("{name}: {e}")),
    }
}

fn assert_none_differ(differ: Vec<String>) {
    assert!(
        differ.is_empty(),
        "the control protocol no longer matches the Python client's golden files (crates/mesh-py/tests/golden):\n{}\n\
         If the change is meant, rewrite them with MESH_GOLDEN_WRITE=1 cargo test -p meshd --test golden_protocol \
         and update the Python client (crates/mesh-py/python/meshd/control.py) until its tests pass",
        differ.join("\n")
    );
}

fn request_cases() -> Vec<(&'static str, Request, &'static [u8])> {
    let s = |v: &str| v.to_string();
    vec![
        (
            "load",
            Request::Load {
                name: s("echo"),
                image_len: IMAGE.len(),
                grid: [1, 1, 1],
                block: [32, 1, 1],
                shared_mem: 0,
                bind: vec![s("to-gpu"), s("from-gpu")],
                sms: None,
            },
            IMAGE,
        ),
        (
            "load_shaped",
            Request::Load {
                name: s("wide"),
                image_len: IMAGE.len(),
                grid: [4, 2, 1],
                block: [128, 1, 1],
                shared_mem: 1024,
                bind: vec![],
                sms: Some(16),
            },
            IMAGE,
        ),
        ("upgrade", Request::Upgrade { name: s("echo"), image_len: IMAGE.len() }, IMAGE),
        ("unload", Request::Unload { name: s("echo") }, b""),
        ("ps", Request::Ps, b""),
        ("info", Request::Info, b""),
        ("shutdown", Request::Shutdown, b""),
        ("channel_create", Request::ChannelCreate { name: s("to-gpu"), msg_size: 64, capacity: 16 }, b""),
        // A name outside ASCII: serde_json writes UTF-8 as it is, and so must the client.
        ("channel_create_utf8", Request::ChannelCreate { name: s("entrée-é"), msg_size: 8, capacity: 1024 }, b""),
        (
            "spawn",
            Request::Spawn {
                name: s("worker"),
                bind: vec![s("to-gpu"), s("from-gpu")],
                command: vec![s("./native-cuda"), s("--iterations"), s("3")],
                ready_timeout_ms: 2500,
            },
            b"",
        ),
        ("stop", Request::Stop { name: s("worker") }, b""),
    ]
}

fn program(name: &str, slot: u32, fault: bool) -> ProgramRow {
    ProgramRow {
        name: name.into(),
        slot,
        state: if fault { "stopped".into() } else { "running".into() },
        generation: 3,
        heartbeat: 123_456_789_012,
        worker_pid: if fault { None } else { Some(4242) },
        sms: Some(16).filter(|_| !fault),
        kind: "ptx".into(),
        grid: [1, 1, 1],
        block: [32, 1, 1],
        restarts: u32::from(fault),
        last_fault: fault.then(|| "CUDA_ERROR_ILLEGAL_ADDRESS (culprit: this program)".into()),
        last_fault_unix_ms: fault.then_some(1_764_748_800_000),
        stopped_why: fault.then(|| "caused a GPU fault: left stopped; upgrade or reload it to run it again".into()),
    }
}

fn native(name: &str) -> NativeRow {
    NativeRow {
        name: name.into(),
        pid: 31337,
        state: "running".into(),
        bind: vec!["to-gpu".into(), "from-gpu".into()],
        command: "./native-cuda --iterations 3".into(),
        isolation: "mps".into(),
    }
}

fn response_cases() -> Vec<(&'static str, Response)> {
    let info = Info {
        mode: "mps".into(),
        mailbox: "/dev/shm/meshd.mailbox".into(),
        device: "NVIDIA H200".into(),
        host_atomics: true,
        channels: vec![
            ChannelRow { name: "to-gpu".into(), msg_size: 64, capacity: 16, head: 10, tail: 9 },
            ChannelRow { name: "entrée-é".into(), msg_size: 8, capacity: 1024, head: 0, tail: 0 },
        ],
        extra: InfoExtra {
            device_uuid: Some("GPU-00000000-1111-2222-3333-444444444444".into()),
            device_selector: Some("0".into()),
            pool: Some(PoolRow {
                size: 2,
                idle: 1,
                in_use: 1,
                client_limit: 48,
                client_limit_source: "CUDA 13.0 (48 clients from Volta on)".into(),
                grow: false,
                stalls: 1,
                recent: vec![GrowthRow {
                    seq: 1,
                    program: "echo".into(),
                    op: "load".into(),
                    stalled: 2,
                    unix_ms: 1_764_748_800_000,
                }],
            }),
        },
    };
    vec![
        ("ok", Response::ok()),
        ("refused", Response { backend_us: Some(87), ..Response::error("program \"zzz\": no such program") }),
        (
            "load",
            Response {
                ok: true,
                programs: Some(vec![program("echo", 0, false)]),
                backend_us: Some(125_000),
                ..Response::default()
            },
        ),
        (
            "ps",
            Response {
                ok: true,
                programs: Some(vec![program("echo", 0, false), program("fault", 1, true)]),
                natives: Some(vec![native("worker")]),
                ..Response::default()
            },
        ),
        ("ps_empty", Response { ok: true, programs: Some(vec![]), natives: Some(vec![]), ..Response::default() }),
        ("info", Response { ok: true, info: Some(info), ..Response::default() }),
        ("spawn", Response { ok: true, natives: Some(vec![native("worker")]), ..Response::default() }),
    ]
}

#[test]
fn requests_match_the_golden_files() {
    let mut differ = Vec::new();
    for (name, req, image) in request_cases() {
        let mut bytes = Vec::new();
        write_request(&mut bytes, &req, image).unwrap();
        golden(&format!("{name}.request"), &bytes, &mut differ);
    }
    assert_none_differ(differ);
}

#[test]
fn responses_match_the_golden_files() {
    let mut differ = Vec::new();
    for (name, resp) in response_cases() {
        let mut bytes = Vec::new();
        write_response(&mut bytes, &resp).unwrap();
        // The file is what the client parses: it must read back as the same answer.
        let back = meshd::protocol::read_response(&mut std::io::Cursor::new(&bytes)).unwrap();
        assert_eq!(back, resp, "{name} does not survive its own encoding");
        golden(&format!("{name}.response"), &bytes, &mut differ);
    }
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
