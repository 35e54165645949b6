//! meshd started the way its systemd unit starts it, killed with -9 and started again, and the replay bounds its log reports.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::harness::meshd_bin;
use crate::wait_until;

/// meshd as `deploy/meshd@.service` starts it on GPU 0 (`meshd run --device 0 --keep-shm
/// $MESHD_ARGS`: the mailbox and MPS directory derived from the GPU's UUID), plus `--socket` and
/// `--state-dir` inside the test's directory; every restart runs exactly this command again.
#[derive(Debug)]
pub struct UnitMeshd {
    /// The daemon process.
    pub child: Child,
    /// Every meshd pid this test started (each restart after a kill -9 is a new one).
    pub pids: Vec<u32>,
    /// `$MESHD_ARGS`.
    args: Vec<String>,
    socket: PathBuf,
    state: PathBuf,
    log: PathBuf,
}

impl UnitMeshd {
    /// The unit's command line, `--fresh` added on the first start only.
    fn command(&self, fresh: bool) -> Command {
        let mut cmd = Command::new(meshd_bin());
        cmd.arg("--socket").arg(&self.socket).args(["run", "--device", "0", "--keep-shm"]);
        cmd.arg("--state-dir").arg(&self.state).args(&self.args);
        if fresh {
            cmd.arg("--fresh");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("meshd's log"));
        cmd
    }

    /// Starts it in `dir` with `$MESHD_ARGS` = `args`; the first start adds `--fresh`, so that a
    /// mailbox an earlier run left at the derived path is replaced. Waits until it answers.
    pub fn start(dir: &Path, args: &[&str]) -> Self {
        let (socket, state, log) = (dir.join("sock"), dir.join("state"), dir.join("meshd.log"));
        let args: Vec<String> = args.iter().map(|s| (*s).to_string()).collect();
        let mut first = Self { child: Self::placeholder(), pids: Vec::new(), args, socket, state, log };
        let child = first.command(true).spawn().expect("start meshd");
        let mut placeholder = std::mem::replace(&mut first.child, child);
        let _ = placeholder.wait();
        first.pids.push(first.child.id());
        first.wait_up();
        first
    }

    /// A child that has already ended, until the first meshd is spawned from the fields it needs.
    fn placeholder() -> Child {
        Command::new("true").spawn().expect("a placeholder child (`true`)")
    }

    /// Its MPS directory: `/tmp/meshd-mps-<GPU UUID>`, which `--device 0` derives from the UUID
    /// `meshd info` names; `/nonexistent` if it does not answer.
    pub fn mps_dir(&self) -> PathBuf {
        let info = self.cli(&["info"]);
        serde_json::from_slice::<serde_json::Value>(&info.stdout)
            .ok()
            .and_then(|i| i["device_uuid"].as_str().map(|u| PathBuf::from(format!("/tmp/meshd-mps-{u}"))))
            .unwrap_or_else(|| PathBuf::from("/nonexistent"))
    }

    fn wait_up(&self) {
        let up = wait_until(Duration::from_secs(60), || self.cli(&["ps"]).status.success());
        assert!(up, "meshd did not come up:\n{}", self.log_tail(60));
    }

    /// `kill -9` of meshd, then the same command at once (what `Restart=on-failure` does, without
    /// its `RestartSec`); waits until it answers.
    pub fn kill9_and_restart(&mut self) {
        self.kill9();
        self.restart();
    }

    /// `kill -9` of meshd, reaped; nothing started in its place.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The same command again after meshd has ended (its first start's `--fresh` left out); waits
    /// until it answers.
    pub fn restart(&mut self) {
        self.child = self.command(false).spawn().expect("restart meshd");
        self.pids.push(self.child.id());
        self.wait_up();
    }

    /// `meshd shutdown`, then waits for the process to end; returns its exit status.
    pub fn shutdown(&mut self) -> std::process::ExitStatus {
        self.ok(&["shutdown"]);
        let ended = wait_until(Duration::from_secs(60), || self.child.try_wait().is_ok_and(|s| s.is_some()));
        assert!(ended, "meshd did not end after shutdown:\n{}", self.log_tail(60));
        self.child.wait().expect("meshd's exit status")
    }

    /// Runs a client subcommand against this meshd.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(meshd_bin())
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run the meshd client")
    }

    /// A client command that must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "meshd {args:?} failed: {}\nlog:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_tail(60)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `ps --json`; empty while nobody answers (meshd restarting, or being replaced).
    pub fn ps(&self) -> Vec<serde_json::Value> {
        let out = self.cli(&["ps", "--json"]);
        if !out.status.success() {
            return Vec::new();
        }
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    }

    /// `info`, if meshd answers.
    pub fn info(&self) -> Option<serde_json::Value> {
        let out = self.cli(&["info"]);
        out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
    }

    /// The control socket it serves.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// meshd's log file (every start appends to it).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The whole log so far (every start appends to it).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log's last `n` lines.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for UnitMeshd {
    /// An orderly stop, as the unit's `systemctl stop` (see [`crate::harness::stop_in_order`]).
    fn drop(&mut self) {
        let mps = self.mps_dir();
        crate::harness::stop_in_order(&mut self.child, &mps);
    }
}

/// The replay bounds meshd logged in `log` for `channel` after a crash: the sum of each start's "may
/// receive again up to N message(s)"; `None` when no line names it.
pub fn logged_replay(log: &str, channel: &str) -> Option<u64> {
    let prefix = format!("channel {channel}: a GPU consumer may receive again up to ");
    let found: Vec<u64> = log
        .lines()
        .filter_map(|l| l.split_once(&prefix).map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_whitespace().next()?.parse().ok())
        .collect();
    (!found.is_empty()).then(|| found.iter().sum())
}
