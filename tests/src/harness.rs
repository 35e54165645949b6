//! A `meshd run` child for the end-to-end tests, and its command line as a client.

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use mesh_shm::Mailbox;

use crate::wait_until;

/// The meshd binary: `MESHD_BIN`, beside this test binary (a bundle's bin/), or in the target dir.
pub fn meshd_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("MESHD_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap();
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join("meshd");
        if candidate.is_file() {
            return candidate;
        }
    }
    PathBuf::from("meshd")
}

/// A running `meshd run`, stopped in order on drop (SIGTERM, as a service manager stops it).
#[derive(Debug)]
pub struct Meshd {
    /// The daemon process.
    pub child: Child,
    /// Its control socket.
    pub socket: PathBuf,
    log: PathBuf,
    extra: Vec<String>,
    /// Variables set in meshd's environment (kept for restarts).
    env: Vec<(String, String)>,
    dir: tempfile::TempDir,
}

impl Meshd {
    /// Starts `meshd run` with a mailbox and socket of its own, plus `extra` options; waits until it answers.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_with_env(extra, &[])
    }

    /// [`Meshd::start`] with `env` added to meshd's environment (and to every restart's).
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let socket = dir.path().join("sock");
        let log = dir.path().join("meshd.log");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let child = Self::spawn(dir.path(), &socket, &log, &extra, &env);
        let m = Self { child, socket, log, extra, env, dir };
        m.wait_up();
        m
    }

    /// Starts `meshd run` as [`Meshd::start`] does, expecting it to refuse to start; returns its log.
    pub fn try_start_refused(extra: &[&str]) -> String {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let log = dir.path().join("meshd.log");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut child = Self::spawn(dir.path(), &dir.path().join("sock"), &log, &extra, &[]);
        let ended = wait_until(Duration::from_secs(30), || child.try_wait().is_ok_and(|s| s.is_some()));
        if !ended {
            let _ = child.kill();
        }
        let status = child.wait().unwrap();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(ended && !status.success(), "meshd {extra:?} should have refused to start ({status}):\n{text}");
        text
    }

    fn spawn(
        dir: &std::path::Path,
        socket: &std::path::Path,
        log: &std::path::Path,
        extra: &[String],
        env: &[(String, String)],
    ) -> Child {
        Command::new(meshd_bin())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .args(["--socket"])
            .arg(socket)
            .args(["run", "--shm"])
            .arg(dir.join("mailbox"))
            // Recorded state inside the test's own directory, never the system's default.
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(extra)
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap())
            .spawn()
            .expect("start meshd")
    }

    /// Its MPS directory: `--mps-dir`'s, else the default for its mailbox.
    pub fn mps_dir(&self) -> PathBuf {
        self.extra
            .iter()
            .position(|a| a == "--mps-dir")
            .and_then(|i| self.extra.get(i + 1))
            .map_or_else(|| mesh_mps::mps_dir::default_root(&self.dir.path().join("mailbox")), PathBuf::from)
    }

    fn wait_up(&self) {
        assert!(
            wait_until(Duration::from_secs(30), || self.cli(&["ps"]).status.success()),
            "meshd did not come up:\n{}",
            self.log_text()
        );
    }

    /// Kills the daemon with SIGKILL (a crash: nothing of its own runs) and starts it again on the same
    /// mailbox, socket and state directory, with the same options; waits until it answers.
    pub fn kill9_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(self.dir.path(), &self.socket, &self.log, &self.extra, &self.env);
        self.wait_up();
    }

    /// [`Meshd::kill9_and_restart`] with `extra` as its options from now on.
    pub fn kill9_and_restart_with(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        self.kill9_and_restart();
    }

    /// After the daemon has ended (a `shutdown`, say), starts it again with the same options, mailbox,
    /// socket and state directory; waits until it answers.
    pub fn restart(&mut self) {
        let _ = self.child.wait();
        self.child = Self::spawn(self.dir.path(), &self.socket, &self.log, &self.extra, &self.env);
        self.wait_up();
    }

    /// Runs a client subcommand against this daemon.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(meshd_bin()).arg("--socket").arg(&self.socket).args(args).stdin(Stdio::null()).output().unwrap()
    }

    /// Runs a client command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "meshd {args:?} failed: {}\nlog:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a client command that must be refused (exit 1); returns its stderr.
    pub fn refused(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert_eq!(out.status.code(), Some(1), "meshd {args:?} should be refused: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's mailbox file (`info`'s `mailbox`).
    pub fn mailbox_path(&self) -> String {
        let info: serde_json::Value = serde_json::from_str(&self.ok(&["info"])).unwrap();
        info["mailbox"].as_str().unwrap().to_string()
    }

    /// The daemon's mailbox, mapped here.
    pub fn mailbox(&self) -> Mailbox {
        Mailbox::open(self.mailbox_path()).unwrap()
    }

    /// The user words of program `name` (its counters, in its mailbox slot), read through `mb`; the
    /// program must be running.
    pub fn user_words(&self, mb: &Mailbox, name: &str) -> [u32; 32] {
        let rows: Vec<serde_json::Value> = serde_json::from_str(&self.ok(&["ps", "--json"])).unwrap();
        let row = rows.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("{name} not in ps: {rows:?}"));
        assert_eq!(row["state"], "running", "{name}: {row}");
        mb.slot(u32::try_from(row["slot"].as_u64().unwrap()).unwrap()).unwrap().user_words()
    }

    /// (name, heartbeat, state) of every program, from `ps --json`.
    pub fn heartbeats(&self) -> Vec<(String, u64, String)> {
        let rows: Vec<serde_json::Value> = serde_json::from_str(&self.ok(&["ps", "--json"])).unwrap();
        rows.iter()
            .filter(|r| r["native"] != true)
            .map(|r| {
                (
                    r["name"].as_str().unwrap().to_string(),
                    r["heartbeat"].as_u64().unwrap(),
                    r["state"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }
}

impl Drop for Meshd {
    /// An orderly stop: SIGTERM ends every program, worker and MPS daemon. A kill would leave an
    /// MPS meshd's programs running through the orphan grace (a minute by default), time-slicing
    /// with the next test's. Past [`STOP_WITHIN`] it is killed, and so is every process left on its
    /// MPS directory.
    fn drop(&mut self) {
        let mps = self.mps_dir();
        if !matches!(self.child.try_wait(), Ok(None)) {
            // Gone already (killed by the test): whatever serves the socket now is asked to stop too.
            let _ = self.cli(&["shutdown"]);
        }
        stop_in_order(&mut self.child, &mps);
    }
}

/// How long a meshd a test drops gets to stop in order before it is killed.
pub const STOP_WITHIN: Duration = Duration::from_secs(20);

/// Stops the meshd `child` as a service manager does: SIGTERM, which ends every program, worker
/// and MPS daemon; past [`STOP_WITHIN`] it is killed, and so is every process left on MPS
/// directory `mps` (orphans would otherwise run through their grace beside the next test).
pub fn stop_in_order(child: &mut Child, mps: &std::path::Path) {
    if matches!(child.try_wait(), Ok(None)) {
        signal(child.id(), rustix::process::Signal::TERM);
        if wait_until(STOP_WITHIN, || !matches!(child.try_wait(), Ok(None))) {
            return;
        }
        eprintln!("meshd {} did not stop within {STOP_WITHIN:?} of SIGTERM: killed", child.id());
    }
    let _ = child.kill();
    let _ = child.wait();
    kill_mps_processes(mps);
}

/// Every process of MPS directory `mps`: its daemons, servers and workers (orphans included).
pub fn mps_processes(mps: &std::path::Path) -> Vec<(u32, String)> {
    mesh_mps::orphans::pipe_dirs(mps).iter().flat_map(|p| mesh_mps::mps_dir::processes_using(p)).collect()
}

/// SIGKILL to every process of MPS directory `mps` ([`mps_processes`]).
pub fn kill_mps_processes(mps: &std::path::Path) {
    for (pid, _) in mps_processes(mps) {
        signal(pid, rustix::process::Signal::KILL);
    }
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid.cast_signed()) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

impl Meshd {
    /// Runs a client command that must succeed; returns how long the CLI took (spawn to exit) and its stdout.
    pub fn timed_ok(&self, args: &[&str]) -> (Duration, String) {
        let started = std::time::Instant::now();
        let out = self.cli(args);
        let took = started.elapsed();
        assert!(
            out.status.success(),
            "meshd {args:?} failed: {}\nlog:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
        (took, String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// One command on the control pipe of the MPS daemon whose pipe directory is `pipe`; its answer.
pub fn mps_control(pipe: &std::path::Path, cmd: &str) -> String {
    use std::io::Write;
    let mut child = Command::new(mesh_mps::control::find_control().unwrap())
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{cmd}").unwrap();
    String::from_utf8_lossy(&child.wait_with_output().unwrap().stdout).into_owned()
}

/// (servers, clients sorted) of the MPS daemon whose pipe directory is `pipe`.
pub fn mps_membership(pipe: &std::path::Path) -> (Vec<u32>, Vec<u32>) {
    let servers: Vec<u32> =
        mps_control(pipe, "get_server_list").split_whitespace().filter_map(|s| s.parse().ok()).collect();
    let mut clients: Vec<u32> = servers
        .iter()
        .flat_map(|server| {
            mps_control(pipe, &format!("get_client_list {server}"))
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    clients.sort_unstable();
    (servers, clients)
}
