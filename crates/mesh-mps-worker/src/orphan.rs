//! Workers that outlive meshd: the rendezvous an orphan waits at, the version check of a meshd's hello, and the keeper that quits the MPS daemons once the last orphan is gone.
//!
//! Under `meshd run --orphan-grace-ms G` (G > 0) meshd starts its workers, its MPS control daemons
//! and one keeper (`mesh-mps-worker --keep ROOT`) without `PR_SET_PDEATHSIG`, each in a session of
//! its own, so that a crash of meshd (kill -9, an abort) ends none of them. Then:
//!
//! * A worker whose stdin ends while its kernel runs becomes an *orphan*: it binds
//!   `ROOT/orphans/<pid>.sock` ([`rendezvous`]) and waits up to G for a meshd. A connecting meshd
//!   says [`crate::Command::Hello`]; a version other than the worker's is refused naming both
//!   ([`check_hello`]). When the grace passes with nobody there, the worker stops its program in
//!   order (the stop asked through its slot, exactly once; the stop deadline; else the worker has the
//!   server cut it off) and exits. An idle worker (no kernel) exits at the end of its input, as ever.
//! * The keeper reads meshd's pipe too. An `exit` line is an orderly stop (meshd quits the daemons
//!   itself); the end of input means meshd died: the keeper waits until no worker of its pipe
//!   directories lives, then quits the daemons (the nested one first), waits for them, and removes
//!   the MPS directory when meshd had made it ([`keep`]). So nothing is left behind: no worker, no
//!   server, no daemon.
//! * A meshd that starts on the same MPS directory (its default derives from the mailbox, so a
//!   restart with the same arguments finds it) first ends the old keeper, then retires every orphan
//!   it finds at a rendezvous and waits until each has exited, then quits the old daemons: only
//!   then does it relaunch the recorded programs, so two generations of a program never run at once.

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::PROTOCOL;

/// The directory, under the MPS directory, of the orphans' rendezvous sockets.
pub const ORPHAN_DIR: &str = "orphans";
/// The file, under the MPS directory, holding the keeper's pid.
pub const KEEPER_PID: &str = "keeper.pid";
/// The variable naming an MPS server's pipe directory.
pub const PIPE_ENV: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// A worker's process name, as `/proc/PID/comm` shows it (15 characters, the kernel's most).
pub const WORKER_COMM: &str = "mesh-mps-worker";
/// How `/proc/PID/comm` begins for NVIDIA's MPS daemon and server (`nvidia-cuda-mps-control` and
/// `-server`, cut to 15 characters).
pub const MPS_COMM: &str = "nvidia-cuda-mps";

/// Whether a process of a pipe directory (see [`processes_using`]) named `comm` is a client (a
/// worker, whatever its binary is called, or a native GPU worker) rather than the daemon or server.
pub fn is_client(comm: &str) -> bool {
    !comm.starts_with(MPS_COMM)
}

/// Whether process `pid` is a keeper (`mesh-mps-worker --keep`), by its command line.
pub fn is_keeper(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == b"--keep"))
}
/// A Unix socket's path holds at most this many bytes (`sun_path`, its NUL excluded).
pub const MAX_SOCKET_PATH: usize = 107;
/// How long a keeper gives the daemons to leave after `quit` before it kills what is left.
pub const DAEMON_QUIT: Duration = Duration::from_secs(15);
/// Past the grace and the stop deadline, how long a keeper waits for orphans that are still there
/// (wedged in a driver call) before it kills them.
pub const WEDGED_AFTER: Duration = Duration::from_secs(10);

/// Orphan `pid`'s rendezvous socket in `dir` (`<dir>/<pid>.sock`).
pub fn rendezvous(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.sock"))
}

/// The pid a rendezvous socket's name carries, if it is one.
pub fn rendezvous_pid(path: &Path) -> Option<u32> {
    path.file_name()?.to_str()?.strip_suffix(".sock")?.parse().ok()
}

/// Refuses a rendezvous directory in which a socket of the longest pid would not fit a Unix
/// socket's path, naming the directory and the numbers.
pub fn check_rendezvous_dir(dir: &Path) -> Result<(), String> {
    let longest = rendezvous(dir, u32::MAX).as_os_str().len();
    if longest > MAX_SOCKET_PATH {
        return Err(format!(
            "the orphans' rendezvous directory {} makes socket paths of up to {longest} bytes, and a Unix socket's \
             path holds at most {MAX_SOCKET_PATH}: give a shorter --mps-dir",
            dir.display()
        ));
    }
    Ok(())
}

/// Checks a meshd's hello: its version must be this worker's; else why not, naming both.
pub fn check_hello(theirs: u32) -> Result<(), String> {
    if theirs == PROTOCOL {
        return Ok(());
    }
    Err(format!(
        "this worker speaks protocol {PROTOCOL} and the connecting meshd {theirs}: the worker binary is not that \
         meshd's; it is not adopted"
    ))
}

/// An orphan's clock: from the end of its meshd to the end of its grace.
#[derive(Debug, Clone, Copy)]
pub struct Grace {
    since: Instant,
    grace: Duration,
}

impl Grace {
    /// A grace of `grace` counted from `since`.
    pub fn new(since: Instant, grace: Duration) -> Self {
        Self { since, grace }
    }

    /// How long it has been an orphan at `now`.
    pub fn orphaned(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.since)
    }

    /// What is left of the grace at `now` (zero once it passed).
    pub fn left(&self, now: Instant) -> Duration {
        self.grace.saturating_sub(self.orphaned(now))
    }

    /// Whether the grace has passed at `now`.
    pub fn passed(&self, now: Instant) -> bool {
        self.left(now).is_zero()
    }
}

/// Processes other than this one whose environment names `pipe_dir` as their MPS pipe directory:
/// that directory's daemon, server and clients. `(pid, command name)`, sorted.
pub fn processes_using(pipe_dir: &Path) -> Vec<(u32, String)> {
    let wanted = format!("{PIPE_ENV}={}", pipe_dir.display()).into_bytes();
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found: Vec<(u32, String)> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            // Unreadable (another user's, or gone) and empty (a zombie, or past the point where the
            // kernel dropped its memory) environments hold nothing of ours.
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == wanted.as_slice()))
        })
        .map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            (pid, comm.trim().to_string())
        })
        .collect();
    found.sort_unstable();
    found
}

/// Whether process `pid` still exists (a zombie counts as gone: it runs nothing).
pub fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()))
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// Runs one control command (`quit`, `get_server_list`, …) with `binary` on `pipe_dir`'s daemon;
/// its output, or why not. Killed if it does not answer within `within`.
pub fn control_command(binary: &Path, pipe_dir: &Path, line: &str, within: Duration) -> Result<String, String> {
    let mut child = Command::new(binary)
        .env(PIPE_ENV, pipe_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", binary.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = writeln!(stdin, "{line}");
    }
    let deadline = Instant::now() + within;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut out = String::new();
                if let Some(mut s) = child.stdout.take() {
                    let _ = s.read_to_string(&mut out);
                }
                return if status.success() { Ok(out) } else { Err(format!("{line:?}: {status}: {}", out.trim())) };
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{line:?}: no answer within {} ms", within.as_millis()));
            }
            Err(e) => return Err(format!("{line:?}: {e}")),
        }
    }
}

/// The pids of an MPS server or client list (`get_server_list`, `get_client_list`): one number per
/// line; any other line (an error message) is no pid.
pub fn pids(text: &str) -> Vec<u32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// Has this client cut off its server(s) (`terminate_client`), waiting up to a second for it: a
/// client that exits while its kernel runs fails every other client's kernel.
pub fn cut_off_self(control: &Path, pid: u32) {
    let Some(pipe) = std::env::var_os(PIPE_ENV).map(PathBuf::from) else { return };
    let servers = control_command(control, &pipe, "get_server_list", Duration::from_secs(2)).unwrap_or_default();
    for server in pids(&servers) {
        if let Err(e) =
            control_command(control, &pipe, &format!("terminate_client {server} {pid}"), Duration::from_secs(2))
        {
            eprintln!("mesh-mps-worker {pid}: cutting itself off server {server}: {e}");
        }
    }
    std::thread::sleep(Duration::from_millis(200));
}

/// Binds the rendezvous socket (mode 0600, in a directory of mode 0700), replacing a stale file.
pub fn bind_rendezvous(dir: &Path, path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let _ = std::fs::remove_file(path);
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = std::os::unix::net::UnixListener::bind(path);
    rustix::process::umask(old);
    let listener = bound?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// SIGKILL to `pid` (gone already: nothing happens).
fn kill_pid(pid: u32) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// What a keeper watches and does (`mesh-mps-worker --keep ROOT …`).
#[derive(Debug, Clone)]
pub struct KeepPlan {
    /// The MPS directory.
    pub root: PathBuf,
    /// Its daemons' pipe directories.
    pub pipe_dirs: Vec<PathBuf>,
    /// `nvidia-cuda-mps-control`.
    pub control: PathBuf,
    /// After meshd's end, how long orphans may stay before they are killed as wedged: the workers'
    /// grace, their stop deadline and [`WEDGED_AFTER`].
    pub wedged_after: Duration,
    /// Remove `root` at the end (meshd made it: the default directory).
    pub remove_root: bool,
    /// How often it looks.
    pub every: Duration,
}

/// How a keeper ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// meshd said `exit`: an orderly stop, in which meshd ends everything itself.
    Released,
    /// meshd died and every orphan is gone: the daemons were quit. The lines say what was done.
    Reaped(Vec<String>),
}

/// The keeper: waits on `input` (meshd's pipe); at its end (meshd died), waits until no worker of
/// the plan's pipe directories lives (killing those still there past the plan's `wedged_after`),
/// then quits the daemons, the nested directory first, kills what does not leave within
/// [`DAEMON_QUIT`], and removes the directory if asked.
pub fn keep(plan: &KeepPlan, input: impl Read) -> Kept {
    for line in std::io::BufReader::new(input).lines() {
        match line {
            Ok(l) if l.trim() == "exit" => return Kept::Released,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let mut done = Vec::new();
    let orphaned = Instant::now();
    let workers = |plan: &KeepPlan| -> Vec<u32> {
        plan.pipe_dirs
            .iter()
            .flat_map(|d| processes_using(d))
            .filter(|(_, comm)| is_client(comm))
            .map(|(pid, _)| pid)
            .collect()
    };
    let mut killed = false;
    loop {
        let left = workers(plan);
        if left.is_empty() {
            break;
        }
        if !killed && orphaned.elapsed() >= plan.wedged_after {
            done.push(format!(
                "killed worker(s) {left:?}, still there {} ms after meshd's end",
                plan.wedged_after.as_millis()
            ));
            left.into_iter().for_each(kill_pid);
            killed = true;
        }
        std::thread::sleep(plan.every);
    }
    let mut dirs = plan.pipe_dirs.clone();
    // The nested directory's daemon first, while its pipes still exist.
    dirs.sort_by_key(|d| std::cmp::Reverse(d.as_os_str().len()));
    for dir in &dirs {
        if dir.join("control").exists() && !processes_using(dir).is_empty() {
            match control_command(&plan.control, dir, "quit", Duration::from_secs(10)) {
                Ok(_) => done.push(format!("quit the MPS daemon of {}", dir.display())),
                Err(e) => done.push(format!("quitting the MPS daemon of {}: {e}", dir.display())),
            }
        }
    }
    let deadline = Instant::now() + DAEMON_QUIT;
    loop {
        let left: Vec<(u32, String)> = dirs.iter().flat_map(|d| processes_using(d)).collect();
        if left.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            done.push(format!("killed {left:?}, still there {} s after quit", DAEMON_QUIT.as_secs()));
            left.into_iter().for_each(|(pid, _)| kill_pid(pid));
            break;
        }
        std::thread::sleep(plan.every);
    }
    if plan.remove_root {
        let _ = std::fs::remove_dir_all(&plan.root);
    } else {
        let _ = std::fs::remove_file(plan.root.join(KEEPER_PID));
    }
    Kept::Reaped(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendezvous_is_named_by_pid_and_a_too_long_directory_is_refused() {
        let p = rendezvous(Path::new("/tmp/m/orphans"), 4242);
        assert_eq!(p, PathBuf::from("/tmp/m/orphans/4242.sock"));
        assert_eq!(rendezvous_pid(&p), Some(4242));
        assert_eq!(rendezvous_pid(Path::new("/tmp/m/orphans/x.sock")), None);
        assert_eq!(rendezvous_pid(Path::new("/tmp/m/orphans/42.lock")), None);
        assert!(check_rendezvous_dir(Path::new("/tmp/meshd-mps-1000-0123456789abcdef/orphans")).is_ok());
        let long = PathBuf::from(format!("/tmp/{}", "d".repeat(100)));
        let e = check_rendezvous_dir(&long).unwrap_err();
        assert!(e.contains("at most 107") && e.contains("--mps-dir"), "{e}");
    }

    #[test]
    fn clients_are_told_from_the_daemon_and_server_and_a_keeper_by_its_arguments() {
        assert!(is_client(WORKER_COMM) && is_client("my-worker") && is_client("python3"));
        assert!(!is_client("nvidia-cuda-mps") && !is_client("nvidia-cuda-mps-server"));
        assert!(!is_keeper(std::process::id()), "this test binary is no keeper");
        let mut c = Command::new("/bin/sh").args(["-c", "sleep 5; true", "--keep"]).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !is_keeper(c.id()) {
            assert!(Instant::now() < deadline, "a process with --keep is a keeper");
            std::thread::sleep(Duration::from_millis(5));
        }
        c.kill().unwrap();
        c.wait().unwrap();
    }

    #[test]
    fn a_hello_of_another_version_is_refused_naming_both() {
        assert!(check_hello(PROTOCOL).is_ok());
        let e = check_hello(PROTOCOL + 1).unwrap_err();
        assert!(e.contains(&format!("protocol {PROTOCOL}")) && e.contains(&format!("meshd {}", PROTOCOL + 1)), "{e}");
    }

    #[test]
    fn the_grace_runs_from_the_orphaning() {
        let t0 = Instant::now();
        let g = Grace::new(t0, Duration::from_secs(3));
        assert_eq!(g.left(t0), Duration::from_secs(3));
        assert!(!g.passed(t0 + Duration::from_millis(2999)));
        assert_eq!(g.orphaned(t0 + Duration::from_secs(1)), Duration::from_secs(1));
        assert!(g.passed(t0 + Duration::from_secs(3)));
        assert_eq!(g.left(t0 + Duration::from_secs(9)), Duration::ZERO);
        assert!(Grace::new(t0, Duration::ZERO).passed(t0), "grace 0: at once");
    }

    #[test]
    fn a_live_process_is_alive_and_a_reaped_one_is_not() {
        let mut c = Command::new("/bin/sleep").arg("30").spawn().unwrap();
        let pid = c.id();
        assert!(process_alive(pid));
        c.kill().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while process_alive(pid) {
            assert!(Instant::now() < deadline, "a killed child (a zombie) is not alive");
            std::thread::sleep(Duration::from_millis(5));
        }
        c.wait().unwrap();
        assert!(!process_alive(pid));
    }

    /// A stand-in daemon and a stand-in orphan (`sleep` copied under the daemon's and the worker's
    /// names, with the pipe variable) and a stand-in control binary whose `quit` kills the daemon.
    struct Scene {
        dir: tempfile::TempDir,
        pipe: PathBuf,
        daemon: std::process::Child,
        orphan: std::process::Child,
    }

    /// Spawns `cmd`, again while its file is busy: a sibling test's child, forked while the copy
    /// was open for writing here, holds it open until that child execs (ETXTBSY, "Text file busy").
    fn spawn_past_busy(cmd: &mut Command) -> std::process::Child {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                spawned => return spawned.unwrap(),
            }
        }
    }

    fn scene(orphan_secs: &str) -> Scene {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("pipe");
        std::fs::create_dir(&pipe).unwrap();
        std::fs::write(pipe.join("control"), b"").unwrap();
        let daemon_bin = dir.path().join("nvidia-cuda-mps-control");
        std::fs::copy("/bin/sleep", &daemon_bin).unwrap();
        let daemon = spawn_past_busy(Command::new(&daemon_bin).arg("60").env(PIPE_ENV, &pipe));
        std::fs::write(dir.path().join("daemon.pid"), daemon.id().to_string()).unwrap();
        let worker = dir.path().join(WORKER_COMM);
        std::fs::copy("/bin/sleep", &worker).unwrap();
        let orphan = spawn_past_busy(Command::new(&worker).arg(orphan_secs).env(PIPE_ENV, &pipe));
        let control = dir.path().join("control");
        let script = format!(
            "#!/bin/sh\nread -r line\n[ \"$line\" = quit ] && kill \"$(cat {})\"\nexit 0\n",
            dir.path().join("daemon.pid").display()
        );
        std::fs::write(&control, script).unwrap();
        std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Until they have exec'd, the children carry this process's environment and name.
        let deadline = Instant::now() + Duration::from_secs(5);
        while processes_using(&pipe).iter().filter(|(_, c)| c == MPS_COMM || c == WORKER_COMM).count() < 2 {
            assert!(Instant::now() < deadline, "the stand-ins were not found");
            std::thread::sleep(Duration::from_millis(5));
        }
        Scene { dir, pipe, daemon, orphan }
    }

    fn plan(s: &Scene, wedged_after: Duration) -> KeepPlan {
        KeepPlan {
            root: s.dir.path().join("root"),
            pipe_dirs: vec![s.pipe.clone()],
            control: s.dir.path().join("control"),
            wedged_after,
            remove_root: true,
            every: Duration::from_millis(10),
        }
    }

    #[test]
    fn the_keeper_waits_for_the_last_orphan_then_quits_the_daemon() {
        let mut s = scene("0.4");
        std::fs::create_dir(s.dir.path().join("root")).unwrap();
        let started = Instant::now();
        let kept = keep(&plan(&s, Duration::from_secs(30)), std::io::empty());
        let took = started.elapsed();
        let Kept::Reaped(lines) = kept else { panic!("meshd's end of input is a death: {kept:?}") };
        assert!(lines.iter().any(|l| l.starts_with("quit the MPS daemon")), "{lines:?}");
        assert!(took >= Duration::from_millis(300), "it waited for the orphan: {took:?}");
        assert!(s.orphan.try_wait().unwrap().is_some(), "the orphan left by itself first");
        let _ = s.daemon.wait();
        assert!(processes_using(&s.pipe).is_empty(), "the daemon is gone");
        assert!(!s.dir.path().join("root").exists(), "the MPS directory is removed");
    }

    #[test]
    fn an_exit_line_releases_the_keeper_and_a_wedged_orphan_is_killed() {
        let mut s = scene("60");
        assert_eq!(keep(&plan(&s, Duration::ZERO), &b"exit\n"[..]), Kept::Released);
        assert_eq!(processes_using(&s.pipe).len(), 2, "an orderly stop touches nothing");
        let started = Instant::now();
        let Kept::Reaped(lines) = keep(&plan(&s, Duration::from_millis(300)), std::io::empty()) else {
            panic!("meshd's end of input is a death")
        };
        assert!(lines[0].starts_with("killed worker(s)"), "{lines:?}");
        assert!(started.elapsed() >= Duration::from_millis(300), "not before the bound");
        let _ = s.orphan.wait();
        let _ = s.daemon.wait();
        assert!(processes_using(&s.pipe).is_empty());
    }
}
