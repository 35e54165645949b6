//! One meshd per GPU, without a GPU: how `--device` picks the socket a client reaches (a whole UUID
//! needs no driver; an ordinal needs one and says so), explicit flags winning, `meshd run --device`
//! refusing clearly without a driver, and `info`'s device and pool fields on the wire.

use std::process::Command;

use meshd::protocol::{GrowthRow, Info, InfoExtra, PoolRow};

const UUID: &str = "GPU-5f3a0011-2233-4455-6677-8899aabbccdd";

fn meshd(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .env_remove("MESHD_SOCKET")
        .env_remove("MESHD_DEVICE")
        .args(args)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn has_gpu_driver() -> bool {
    mesh_cuda::Device::get(0).is_ok()
}

#[test]
fn a_client_given_a_whole_uuid_derives_the_socket_without_the_driver() {
    let (code, err) = meshd(&["--device", &UUID.to_uppercase(), "ps"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains(&format!("/tmp/meshd-{UUID}.sock")), "the GPU's own socket, lowercased: {err}");
    // The same through the environment, after the subcommand too.
    let out = Command::new(env!("CARGO_BIN_EXE_meshd"))
        .env_remove("MESHD_SOCKET")
        .env("MESHD_DEVICE", UUID)
        .arg("info")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("/tmp/meshd-{UUID}.sock")));
}

#[test]
fn an_explicit_socket_wins_over_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("mine.sock");
    let (code, err) = meshd(&["--device", "3", "--socket", sock.to_str().unwrap(), "ps"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains(sock.to_str().unwrap()), "{err}");
    // Without --device: today's default.
    let (code, err) = meshd(&["ps"]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("/tmp/meshd.sock"), "{err}");
}

#[test]
fn an_ordinal_needs_the_driver_and_says_what_else_to_give() {
    if has_gpu_driver() {
        eprintln!("SKIPPED an_ordinal_needs_the_driver_and_says_what_else_to_give: this machine has a GPU");
        return;
    }
    let (code, err) = meshd(&["--device", "1", "ps"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with("meshd: --device 1: the GPU could not be found")
            && err.contains("or give --socket, MESHD_SOCKET or the GPU's whole UUID"),
        "{err}"
    );
}

#[test]
fn run_with_a_device_and_no_driver_is_refused_naming_the_device() {
    if has_gpu_driver() {
        eprintln!("SKIPPED run_with_a_device_and_no_driver_is_refused_naming_the_device: this machine has a GPU");
        return;
    }
    let (code, err) = meshd(&["run", "--device", "0", "--isolation", "mps"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--device 0: the GPU could not be found"), "{err}");
}

#[test]
fn run_lists_the_device_and_pool_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_meshd")).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--device", "--pool-grow", "--pool", "--mps-dir"] {
        assert!(help.contains(flag), "{flag} missing from run --help:\n{help}");
    }
}

#[test]
fn info_carries_the_device_and_the_pool_and_reads_old_answers() {
    let info = Info {
        mode: "mps".into(),
        mailbox: "/dev/shm/m".into(),
        device: "H200".into(),
        host_atomics: false,
        channels: Vec::new(),
        services: Vec::new(),
        arena: None,
        extra: InfoExtra {
            device_uuid: Some(UUID.into()),
            device_selector: Some("0".into()),
            pool: Some(PoolRow {
                size: 2,
                idle: 0,
                in_use: 3,
                client_limit: 48,
                client_limit_source: "CUDA 13.0 driver".into(),
                grow: true,
                stalls: 1,
                recent: vec![GrowthRow { seq: 1, program: "p".into(), op: "load".into(), stalled: 2, unix_ms: 5 }],
            }),
            version: Some("0.1.0 (state 1, mailbox layout 4, worker protocol 5)".into()),
            pid: Some(4242),
            started_unix_ms: Some(1_765_000_000_000),
        },
    };
    let json = serde_json::to_value(&info).unwrap();
    assert_eq!(json["device_uuid"], UUID, "flattened beside the other fields: {json}");
    assert_eq!(json["pool"]["stalls"], 1);
    assert_eq!(json["pool"]["client_limit"], 48);
    assert_eq!(serde_json::from_value::<Info>(json).unwrap(), info);
    // An answer from a meshd without these fields still reads.
    let old = r#"{"mode":"blink","mailbox":"m","device":"H200","host_atomics":false,"channels":[]}"#;
    assert_eq!(serde_json::from_str::<Info>(old).unwrap().extra, InfoExtra::default());
}
