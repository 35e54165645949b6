//! MPS mode started again on the same MPS directory after every way a meshd ends: a clean shutdown,
//! and a kill -9 followed at once by the same command (the driver may still be tearing the dead
//! meshd's clients down). Both with `--mps-dir` and with `--device`'s derived directory. Each start
//! must run a program in a worker that is a client of the new daemon (meshd refuses any other).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mesh_gpu_tests::harness::{Meshd, meshd_bin};
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};

const UP: Duration = Duration::from_secs(30);

/// A client command: (succeeded, stdout, stderr).
type Cli<'a> = &'a dyn Fn(&[&str]) -> (bool, String, String);

/// Loads the heartbeat program, waits for its heartbeat to rise in a running state, unloads it.
fn runs_a_program(cli: Cli<'_>, when: &str) {
    let image = programs_dir().join("heartbeat.ptx");
    let (ok, _, err) = cli(&["load", "hb", image.to_str().unwrap()]);
    assert!(ok, "{when}: load refused: {err}");
    let beating = wait_until(UP, || {
        let (_, out, _) = cli(&["ps", "--json"]);
        let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap_or_default();
        rows.iter().any(|r| r["name"] == "hb" && r["state"] == "running" && r["heartbeat"].as_u64() > Some(0))
    });
    assert!(beating, "{when}: the program never beat: {}", cli(&["ps"]).1);
    let (ok, _, err) = cli(&["unload", "hb"]);
    assert!(ok, "{when}: unload refused: {err}");
    eprintln!("{when}: a program ran in a worker of the new MPS daemon");
}

fn cli_of(d: &Meshd) -> impl Fn(&[&str]) -> (bool, String, String) + '_ {
    move |args| {
        let out = d.cli(args);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

#[test]
fn mps_dir_reused_after_shutdown_and_after_kill_9() {
    require_gpu!("mps_dir_reused_after_shutdown_and_after_kill_9");
    let root = tempfile::tempdir().unwrap();
    let mps = root.path().join("mps");
    let mps_arg = mps.to_str().unwrap();
    // Without an orphan grace: the restart after the kill clears the directory rather than adopt.
    let mut d = Meshd::start(&["--isolation", "mps", "--pool", "1", "--mps-dir", mps_arg, "--orphan-grace-ms", "0"]);
    runs_a_program(&cli_of(&d), "--mps-dir, first start");
    d.ok(&["shutdown"]);
    d.restart();
    runs_a_program(&cli_of(&d), "--mps-dir, after a clean shutdown");
    d.kill9_and_restart();
    runs_a_program(&cli_of(&d), "--mps-dir, after kill -9 and an immediate restart");
    let log = d.log_text();
    assert!(log.contains("removed what a previous MPS daemon left"), "the restart says what it removed:\n{log}");
    // A second meshd on the same directory is refused, naming the one that holds it.
    let other = Meshd::try_start_refused(&["--isolation", "mps", "--pool", "1", "--mps-dir", mps_arg]);
    assert!(other.contains("is in use by the meshd with pid"), "{other}");
    d.ok(&["shutdown"]);
}

/// `meshd --socket S run --device 0 --isolation mps` with every path derived from the GPU's UUID.
struct DeviceMeshd {
    child: Child,
    socket: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl DeviceMeshd {
    fn start(dir: &Path) -> Self {
        let socket = dir.join("sock");
        let log = dir.join("meshd.log");
        let child = Command::new(meshd_bin())
            .arg("--socket")
            .arg(&socket)
            .args(["run", "--device", "0", "--isolation", "mps", "--pool", "1", "--orphan-grace-ms", "0"])
            .arg("--state-dir")
            .arg(dir.join("state"))
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap())
            .spawn()
            .unwrap();
        let d = Self { child, socket, log };
        assert!(wait_until(UP, || d.cli(&["ps"]).0), "meshd --device did not come up:\n{}", d.log_text());
        d
    }
    fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(meshd_bin())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for DeviceMeshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn device_mps_dir_reused_after_shutdown_and_after_kill_9() {
    require_gpu!("device_mps_dir_reused_after_shutdown_and_after_kill_9");
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let mut d = DeviceMeshd::start(dir.path());
    runs_a_program(&|a| d.cli(a), "--device, first start");
    assert!(d.cli(&["shutdown"]).0);
    let _ = d.child.wait();
    drop(d);
    let mut d = DeviceMeshd::start(dir.path());
    runs_a_program(&|a| d.cli(a), "--device, after a clean shutdown");
    let _ = d.child.kill();
    let _ = d.child.wait();
    drop(d);
    let d = DeviceMeshd::start(dir.path());
    runs_a_program(&|a| d.cli(a), "--device, after kill -9 and an immediate restart");
    assert!(d.cli(&["shutdown"]).0, "{}", d.log_text());
}
