//! One meshd per GPU: `--device 0` and `--device <UUID of 0>` derive the same socket, mailbox and
//! state paths and the CLI reaches that meshd either way; two meshds on the one GPU of the test machine
//! (blink + MPS, then MPS + MPS) with their own sockets, mailboxes and MPS directories neither see nor
//! stop each other's programs, and a worker of one is no client of the other's server. (Their kernels
//! time-slice; that is expected and not what is tested here: files, processes and membership are.)

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mesh_gpu_tests::harness::{Meshd, meshd_bin};
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};

fn ptx_file(name: &str) -> String {
    programs_dir().join(format!("{name}.ptx")).display().to_string()
}

/// The CLI with `args`, MESHD_SOCKET and MESHD_DEVICE cleared: (exit code, stdout, stderr).
fn cli(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(meshd_bin())
        .env_remove("MESHD_SOCKET")
        .env_remove("MESHD_DEVICE")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn info_via(device: &str) -> serde_json::Value {
    let (code, out, err) = cli(&["--device", device, "info"]);
    assert_eq!(code, Some(0), "meshd --device {device} info: {err}");
    serde_json::from_str(&out).unwrap()
}

/// `meshd run --device DEVICE` with every path left to its default; waits until `--device DEVICE ps` answers.
fn run_on(device: &str, log: &Path) -> Child {
    let mut child = Command::new(meshd_bin())
        .env_remove("MESHD_SOCKET")
        .env_remove("MESHD_DEVICE")
        .args(["run", "--device", device])
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let up = wait_until(Duration::from_secs(30), || cli(&["--device", device, "ps"]).0 == Some(0));
    if !up {
        let _ = child.kill();
        let _ = child.wait();
        panic!("meshd run --device {device} did not come up:\n{}", std::fs::read_to_string(log).unwrap_or_default());
    }
    child
}

#[test]
fn device_0_by_ordinal_and_by_uuid_is_one_meshd_with_one_set_of_paths() {
    require_gpu!("device_0_by_ordinal_and_by_uuid_is_one_meshd_with_one_set_of_paths");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("meshd.log");
    let mut by_ordinal = run_on("0", &log);
    let info = info_via("0");
    let uuid = info["device_uuid"].as_str().unwrap().to_string();
    eprintln!("--device 0 is {uuid}: mailbox {}", info["mailbox"]);
    assert!(uuid.starts_with("GPU-") && uuid.len() == 40, "{info}");
    assert_eq!(info["device_selector"], "0");
    assert_eq!(info["mailbox"].as_str().unwrap(), format!("/dev/shm/meshd-{uuid}.mailbox"));
    assert!(Path::new(&format!("/tmp/meshd-{uuid}.sock")).exists());
    // The same daemon by UUID (no driver call on the client side), by a prefix, and in upper case.
    assert_eq!(info_via(&uuid)["mailbox"], info["mailbox"]);
    assert_eq!(info_via(&uuid[..12])["mailbox"], info["mailbox"]);
    assert_eq!(info_via(&uuid.to_uppercase())["mailbox"], info["mailbox"]);
    // A second meshd for the same GPU is refused (its mailbox is held), however the GPU is named.
    let (code, _, err) = cli(&["run", "--device", &uuid]);
    assert_eq!(code, Some(1), "{err}");
    eprintln!("a second meshd on GPU 0: {err}");
    assert!(err.contains("another meshd is listening") || err.contains("in use by meshd pid"), "{err}");
    assert_eq!(cli(&["--device", &uuid, "shutdown"]).0, Some(0));
    let _ = by_ordinal.wait();
    assert!(!Path::new(&format!("/tmp/meshd-{uuid}.sock")).exists(), "a clean stop removes the socket");

    // Started by UUID: the very same paths, reached by ordinal.
    let mut by_uuid = run_on(&uuid, &log);
    let again = info_via("0");
    assert_eq!((again["mailbox"].as_str(), again["device_uuid"].as_str()), (info["mailbox"].as_str(), Some(&uuid[..])));
    assert_eq!(again["device_selector"].as_str(), Some(&uuid[..]));
    assert_eq!(cli(&["--device", "0", "shutdown"]).0, Some(0));
    let _ = by_uuid.wait();
    assert!(!Path::new(&format!("/dev/shm/meshd-{uuid}.mailbox")).exists(), "a clean stop removes the mailbox");
}

/// Runs one MPS control command against the daemon whose pipe directory is `pipe`.
/// (servers, clients) of the MPS daemon whose pipe directory is `pipe`.
fn membership(pipe: &Path) -> (Vec<u32>, Vec<u32>) {
    mesh_gpu_tests::harness::mps_membership(pipe)
}

fn rows(d: &Meshd) -> Vec<serde_json::Value> {
    serde_json::from_str(&d.ok(&["ps", "--json"])).unwrap()
}

fn names(d: &Meshd) -> Vec<String> {
    rows(d).iter().map(|r| r["name"].as_str().unwrap().to_string()).collect()
}

fn worker_of(d: &Meshd, name: &str) -> u32 {
    u32::try_from(rows(d).iter().find(|r| r["name"] == name).unwrap()["worker_pid"].as_u64().unwrap()).unwrap()
}

fn beats_on(d: &Meshd, name: &str) -> bool {
    let beat = |d: &Meshd| rows(d).iter().find(|r| r["name"] == name).unwrap()["heartbeat"].as_u64().unwrap();
    let h0 = beat(d);
    wait_until(Duration::from_secs(3), || beat(d) > h0)
}

/// Two meshds on one GPU: A (`a_args`) and B (MPS, its own MPS directory).
fn two_on_one_gpu(what: &str, a_args: &[&str], a_mps: Option<&Path>) {
    let dir = tempfile::tempdir().unwrap();
    let b_mps = dir.path().join("b-mps");
    let a = Meshd::start(a_args);
    let b = Meshd::start(&["--isolation", "mps", "--pool", "2", "--mps-dir", b_mps.to_str().unwrap()]);
    let (ia, ib) = (a.ok(&["info"]), b.ok(&["info"]));
    let (ia, ib): (serde_json::Value, serde_json::Value) =
        (serde_json::from_str(&ia).unwrap(), serde_json::from_str(&ib).unwrap());
    assert_ne!(ia["mailbox"], ib["mailbox"]);
    a.ok(&["load", "a1", &ptx_file("heartbeat")]);
    b.ok(&["load", "b1", &ptx_file("heartbeat")]);
    // Same name on both: two meshds, two namespaces.
    a.ok(&["load", "same", &ptx_file("heartbeat")]);
    b.ok(&["load", "same", &ptx_file("heartbeat")]);
    assert_eq!(names(&a), ["a1", "same"], "A sees only its own programs");
    assert_eq!(names(&b), ["b1", "same"], "B sees only its own programs");
    let (b_servers, b_clients) = membership(&b_mps.join("pipe"));
    let b_workers = [worker_of(&b, "b1"), worker_of(&b, "same")];
    assert!(
        b_workers.iter().all(|w| b_clients.contains(w)),
        "B's workers are B's clients: {b_workers:?} {b_clients:?}"
    );
    assert!(!b_clients.contains(&a.child.id()), "A (pid {}) is no client of B's server {b_clients:?}", a.child.id());
    if let Some(a_mps) = a_mps {
        let (a_servers, a_clients) = membership(&a_mps.join("pipe"));
        let a_workers = [worker_of(&a, "a1"), worker_of(&a, "same")];
        eprintln!(
            "{what}: A's server {a_servers:?} clients {a_clients:?}; B's server {b_servers:?} clients {b_clients:?}"
        );
        assert!(a_workers.iter().all(|w| a_clients.contains(w)), "{a_workers:?} {a_clients:?}");
        assert!(a_clients.iter().all(|c| !b_clients.contains(c)), "no client of both: {a_clients:?} {b_clients:?}");
        assert!(a_servers.iter().all(|s| !b_servers.contains(s)), "two servers: {a_servers:?} {b_servers:?}");
        assert!(a_workers.iter().all(|w| !b_clients.contains(w)) && b_workers.iter().all(|w| !a_clients.contains(w)));
    } else {
        eprintln!("{what}: B's server {b_servers:?} clients {b_clients:?}; A (blink) pid {}", a.child.id());
    }
    // A unloads and stops: B's programs run on, its membership unchanged.
    a.ok(&["unload", "same"]);
    assert_eq!(names(&b), ["b1", "same"]);
    a.ok(&["shutdown"]);
    assert!(beats_on(&b, "b1") && beats_on(&b, "same"), "B's programs beat on after A stopped:\n{}", b.log_text());
    assert_eq!(membership(&b_mps.join("pipe")).1, b_clients, "B's clients are unchanged");
    b.ok(&["shutdown"]);
}

#[test]
fn a_blink_and_an_mps_meshd_on_one_gpu_keep_to_themselves() {
    require_gpu!("a_blink_and_an_mps_meshd_on_one_gpu_keep_to_themselves");
    two_on_one_gpu("blink + mps", &[], None);
}

#[test]
fn two_mps_meshds_on_one_gpu_keep_to_themselves() {
    require_gpu!("two_mps_meshds_on_one_gpu_keep_to_themselves");
    let dir = tempfile::tempdir().unwrap();
    let a_mps = dir.path().join("a-mps");
    two_on_one_gpu(
        "mps + mps",
        &["--isolation", "mps", "--pool", "2", "--mps-dir", a_mps.to_str().unwrap()],
        Some(&a_mps),
    );
}
