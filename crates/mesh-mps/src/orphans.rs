//! meshd's side of workers that outlive it (`--orphan-grace-ms`): the keeper it starts, the hello and retire it says at an orphan's rendezvous, and the clearing of what a previous meshd left on its MPS directory.
//!
//! The design is in `mesh_mps_worker::orphan`. The rule above all: two generations of one program
//! never run at once. A meshd that starts on an MPS directory first ends the previous keeper (so
//! that it quits no daemon of ours), then retires every orphan at a rendezvous and waits until each
//! has exited, forces one that cannot be retired (another protocol version, no answer: cut off its
//! server, then killed), and quits the previous daemons; only then are daemons started and
//! programs relaunched.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use mesh_backend::BackendError;
use mesh_mps_worker::orphan::{self, KEEPER_PID, ORPHAN_DIR, process_alive, processes_using};
use mesh_mps_worker::{Command as WorkerCommand, Incoming, Orphan, PROTOCOL, Reply, decode, encode};
use parking_lot::Mutex;
use shared_child::SharedChild;

use crate::process;

/// How workers outlive meshd (`--orphan-grace-ms`).
#[derive(Debug, Clone)]
pub struct OrphanPolicy {
    /// How long an orphan waits for a meshd before it stops its program.
    pub grace: Duration,
    /// How long its program gets to stop.
    pub stop_deadline: Duration,
    /// Where orphans bind their rendezvous (`<mps dir>/orphans`).
    pub rendezvous_dir: PathBuf,
    /// `nvidia-cuda-mps-control`.
    pub control: PathBuf,
}

/// Where the orphans of MPS directory `root` wait.
pub fn rendezvous_dir(root: &Path) -> PathBuf {
    root.join(ORPHAN_DIR)
}

/// The pipe directories of MPS directory `root`'s daemons: the standby's (nested, so first: it is
/// quit first, while its pipes still exist) and the active one's.
pub fn pipe_dirs(root: &Path) -> [PathBuf; 2] {
    [root.join("standby").join("pipe"), root.join("pipe")]
}

/// The orphans' rendezvous sockets in `dir`, by path, sorted (nothing when there is no `dir`).
fn rendezvous_sockets(dir: &Path) -> Vec<PathBuf> {
    let mut sockets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| orphan::rendezvous_pid(p).is_some()).collect())
        .unwrap_or_default();
    sockets.sort();
    sockets
}

/// Connects to the orphan at `path` and says hello: its answer (what it runs) and the socket,
/// which from then on carries the worker protocol; else why not (a refusal names both versions).
pub fn hello(path: &Path, within: Duration) -> Result<(UnixStream, Orphan), String> {
    let stream = UnixStream::connect(path).map_err(|e| format!("connecting: {e}"))?;
    stream.set_read_timeout(Some(within)).map_err(|e| e.to_string())?;
    let mut w = &stream;
    w.write_all(format!("{}\n", encode(&WorkerCommand::Hello { protocol: PROTOCOL })).as_bytes())
        .map_err(|e| format!("saying hello: {e}"))?;
    match read_reply(&stream)? {
        Reply::Orphan(o) => Ok((stream, o)),
        Reply::Refused(r) => Err(format!("refused the hello: {}", r.message)),
        other => Err(format!("answered {other:?} to a hello")),
    }
}

/// The next reply on `stream` (events skipped), within its read timeout.
fn read_reply(stream: &UnixStream) -> Result<Reply, String> {
    use std::io::BufRead;
    let mut reader = std::io::BufReader::new(stream);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => return Err("the socket closed".into()),
            Ok(_) => {}
            Err(e) => return Err(format!("no answer: {e}")),
        }
        match decode(line.trim_end()) {
            Ok(Incoming::Reply(r)) => return Ok(r),
            Ok(Incoming::Event(_)) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Asks an orphan greeted on `stream` to stop its program in order and exit; waits for its `done`.
pub fn retire(stream: &UnixStream, within: Duration) -> Result<(), String> {
    stream.set_read_timeout(Some(within)).map_err(|e| e.to_string())?;
    let mut w = stream;
    w.write_all(format!("{}\n", encode(&WorkerCommand::Retire)).as_bytes())
        .map_err(|e| format!("asking it to retire: {e}"))?;
    match read_reply(stream)? {
        Reply::Done => Ok(()),
        other => Err(format!("answered {other:?} to retire")),
    }
}

/// Waits up to `within` for `pid` to be gone.
fn gone_within(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while process_alive(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

fn kill(pid: u32) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// Ends worker `pid` that could not be retired in order: cut off every server of `pipe_dirs`
/// first (a SIGKILL of a client whose kernel runs fails the others'), then killed; waits for it.
fn force(pid: u32, control: &Path, pipe_dirs: &[PathBuf]) -> bool {
    for dir in pipe_dirs.iter().filter(|d| d.join("control").exists()) {
        let servers =
            orphan::control_command(control, dir, "get_server_list", Duration::from_secs(2)).unwrap_or_default();
        for server in orphan::pids(&servers) {
            let _ = orphan::control_command(
                control,
                dir,
                &format!("terminate_client {server} {pid}"),
                Duration::from_secs(1),
            );
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    kill(pid);
    gone_within(pid, Duration::from_secs(5))
}

/// One pass over the rendezvous sockets in `dir`: each live orphan greeted, retired and waited for
/// (or forced), each stale socket removed.
fn retire_at_rendezvous(
    dir: &Path,
    control: &Path,
    pipe_dirs: &[PathBuf],
    stop_deadline: Duration,
    skip: &[u32],
    log: &mut Vec<String>,
) {
    for path in rendezvous_sockets(dir) {
        let Some(pid) = orphan::rendezvous_pid(&path) else { continue };
        if skip.contains(&pid) {
            continue;
        }
        if !process_alive(pid) {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let retired = hello(&path, Duration::from_secs(2)).and_then(|(stream, o)| {
            if o.pid != pid {
                return Err(format!("says it is pid {}", o.pid));
            }
            retire(&stream, stop_deadline + Duration::from_secs(5)).map(|()| o)
        });
        match retired {
            Ok(o) if gone_within(pid, Duration::from_secs(5)) => log.push(format!(
                "retired the previous meshd's worker {pid} (slot {}, generation {}, orphaned {} ms)",
                o.slot.map_or("-".into(), |s| s.to_string()),
                o.generation.map_or("-".into(), |g| g.to_string()),
                o.orphaned_ms
            )),
            Ok(_) => {
                let ended = force(pid, control, pipe_dirs);
                log.push(format!("the previous meshd's worker {pid} retired but did not exit; killed: {ended}"));
            }
            Err(why) => {
                let ended = force(pid, control, pipe_dirs);
                log.push(format!(
                    "the previous meshd's worker {pid} could not be retired ({why}); cut off and killed: {ended}"
                ));
            }
        }
        let _ = std::fs::remove_file(&path);
    }
}

/// Ends the previous meshd's keeper of `root`, if one runs (so that it quits no daemon of ours).
fn end_previous_keeper(root: &Path, log: &mut Vec<String>) {
    let keeper_file = root.join(KEEPER_PID);
    if let Some(pid) = std::fs::read_to_string(&keeper_file).ok().and_then(|s| s.trim().parse::<u32>().ok())
        && process_alive(pid)
        && orphan::is_keeper(pid)
    {
        kill(pid);
        let _ = gone_within(pid, Duration::from_secs(2));
        log.push(format!("ended the previous meshd's keeper {pid}"));
    }
    let _ = std::fs::remove_file(&keeper_file);
}

/// Retires the orphans at the rendezvous of `root` (but those in `skip`), passing again while
/// workers of `pipe_dirs` live that are not exiting, up to the stop deadline and 5 s: a worker busy
/// with a command when meshd died reaches its rendezvous a moment later, and an idle one may not
/// have begun to exit yet (past the bound, the caller's wait for the previous processes refuses the
/// start, naming them).
fn retire_all_but(
    root: &Path,
    control: &Path,
    pipe_dirs: &[PathBuf],
    stop_deadline: Duration,
    skip: &[u32],
    log: &mut Vec<String>,
) {
    let dir = rendezvous_dir(root);
    let bound = Instant::now() + stop_deadline + Duration::from_secs(5);
    loop {
        retire_at_rendezvous(&dir, control, pipe_dirs, stop_deadline, skip, log);
        // Workers only: a native worker (`meshd spawn`) outlives meshd by design and never comes
        // to a rendezvous. One already exiting (an idle worker whose meshd died, its context torn
        // down by the driver for a second or two) will run nothing again: not waited for.
        let workers_left = pipe_dirs
            .iter()
            .flat_map(|d| processes_using(d))
            .any(|(pid, comm)| comm == orphan::WORKER_COMM && !skip.contains(&pid) && !crate::process::dying(pid));
        if !workers_left || Instant::now() >= bound {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Tells the daemon of `dir`, if one runs there, to quit.
fn quit_daemon(control: &Path, dir: &Path, log: &mut Vec<String>) {
    let daemon_there = processes_using(dir).iter().any(|(_, comm)| !orphan::is_client(comm));
    if daemon_there && dir.join("control").exists() {
        match orphan::control_command(control, dir, "quit", Duration::from_secs(10)) {
            Ok(_) => log.push(format!("asked the previous meshd's MPS daemon of {} to quit", dir.display())),
            Err(e) => log.push(format!("quitting the previous meshd's MPS daemon of {}: {e}", dir.display())),
        }
    }
}

/// Tells the daemon of `dir`, if one runs there, to quit, on a thread of its own that logs when it
/// answered: nothing of this meshd waits for it (the new standby made in `dir` later waits for the
/// previous processes there to be gone, as every daemon's start does).
fn quit_in_background(control: &Path, dir: &Path) {
    let shown = dir.display().to_string();
    let (control, dir) = (control.to_path_buf(), dir.to_path_buf());
    let spawned = std::thread::Builder::new().name("mps-quit-previous".into()).spawn(move || {
        let began = Instant::now();
        let mut log = Vec::new();
        quit_daemon(&control, &dir, &mut log);
        for line in log {
            tracing::info!("{line} (answered in {:.1?}, while meshd went on)", began.elapsed());
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("quitting the previous meshd's MPS daemon of {shown}: no thread for it ({e})");
    }
}

/// Clears what a previous meshd left running on MPS directory `root`, before anything of this
/// meshd starts there: its keeper ended, every orphan at a rendezvous retired (or forced) and
/// waited for, its daemons told to quit (their end is then waited for with the usual teardown
/// wait). Returns lines for the log. `stop_deadline` is what each orphan's program gets to stop.
pub fn clear_previous(root: &Path, control: &Path, stop_deadline: Duration) -> Vec<String> {
    let mut log = Vec::new();
    end_previous_keeper(root, &mut log);
    let pipe_dirs = pipe_dirs(root);
    retire_all_but(root, control, &pipe_dirs, stop_deadline, &[], &mut log);
    // A native worker that outlived its meshd runs on a daemon that is quit now: cut off and
    // killed, for the new meshd starts it again from the desired state.
    for (pid, comm) in pipe_dirs.iter().flat_map(|d| processes_using(d)) {
        // Not a worker (past the bound, the start is refused naming it) nor one being torn down
        // (a client killed with its meshd lingers while the driver ends its context).
        if orphan::is_client(&comm) && comm != orphan::WORKER_COMM && !crate::process::dying(pid) {
            let ended = force(pid, control, &pipe_dirs);
            log.push(format!(
                "the previous meshd's MPS client {pid} ({comm}) is on a daemon that quits: cut off and killed: {ended}"
            ));
        }
    }
    for dir in pipe_dirs {
        quit_daemon(control, &dir, &mut log);
    }
    log
}

/// An orphan of the previous meshd that said hello and passed the checks made here (its pid, a
/// kernel that runs, a client of the adopted daemon's server). The backend checks it against the
/// mailbox, then adopts it ([`crate::worker::Worker::adopt`]) or retires it ([`Greeted::retire`]).
#[derive(Debug)]
pub struct Greeted {
    /// The rendezvous socket, its hello answered.
    pub stream: UnixStream,
    /// What it said it runs.
    pub orphan: Orphan,
    /// Its process, by a pidfd opened before the checks.
    pub held: crate::process::Held,
    /// The server it is a client of.
    pub server: u32,
}

impl Greeted {
    /// Retires it: its program stopped in order, the process waited for, forced if need be (cut
    /// off every server of `pipe_dirs`, then killed). Returns the line for the log.
    pub fn retire(self, control: &Path, pipe_dirs: &[PathBuf], stop_deadline: Duration, why: &str) -> String {
        let pid = self.held.id();
        let (slot, generation) = (self.orphan.slot, self.orphan.generation);
        match retire(&self.stream, stop_deadline + Duration::from_secs(5)) {
            Ok(()) if self.held.exited_within(Duration::from_secs(5)) => format!(
                "not adopted: the previous meshd's worker {pid} (slot {}, generation {}): {why}; retired",
                slot.map_or("-".into(), |s| s.to_string()),
                generation.map_or("-".into(), |g| g.to_string()),
            ),
            outcome => {
                let ended = force(pid, control, pipe_dirs);
                format!(
                    "not adopted: the previous meshd's worker {pid}: {why}; it did not retire in order ({}), cut off \
                     and killed: {ended}",
                    outcome.err().unwrap_or_else(|| "it did not exit".into())
                )
            }
        }
    }
}

/// The pid of the MPS control daemon (`nvidia-cuda-mps-control -f`) of pipe directory `dir`: by
/// its arguments, one naming the control binary (the first, or an interpreter's script) and `-f`.
fn daemon_of(dir: &Path) -> Option<u32> {
    processes_using(dir).into_iter().map(|(pid, _)| pid).find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
            let args: Vec<&[u8]> = c.split(|&b| b == 0).collect();
            args.iter().take(2).any(|a| a.ends_with(crate::mps_dir::MPS_CONTROL.as_bytes()))
                && args.iter().any(|a| *a == b"-f")
        })
    })
}

/// The clients of every server of the daemon of `dir`, each with its server: asked once per
/// daemon, not once per orphan (each question is a run of the control program; asked per orphan,
/// 10 orphans took 20-40 runs before the restart could answer).
fn clients_of(control: &Path, dir: &Path) -> BTreeMap<u32, u32> {
    let list = |line: &str| -> Vec<u32> {
        orphan::control_command(control, dir, line, Duration::from_secs(2))
            .map(|out| orphan::pids(&out))
            .unwrap_or_default()
    };
    let mut clients = BTreeMap::new();
    for server in list("get_server_list") {
        for client in list(&format!("get_client_list {server}")) {
            clients.insert(client, server);
        }
    }
    clients
}

/// What [`greet_previous`] found to adopt: the previous meshd's daemon that ran its programs,
/// and its orphans greeted at the rendezvous.
#[derive(Debug)]
pub struct Previous {
    /// That daemon's directory: the MPS directory itself, or its `standby/` after a GPU fault
    /// moved the programs to the standby server (whose daemon then was the active one).
    pub dir: PathBuf,
    /// The daemon's pid.
    pub daemon: u32,
    /// Its orphans that run a kernel as its server's clients.
    pub greeted: Vec<Greeted>,
}

/// What a previous meshd left on `root` that this one may adopt: the daemon its programs ran on
/// (of `root/pipe`, or of `root/standby/pipe` when a GPU fault had moved them to the standby
/// server), still running and answering, and the orphans greeted at the rendezvous that run a
/// kernel as its clients. Everything else of the previous meshd is retired, waited for, or told
/// to quit here: its keeper, the orphans that failed a check, those of the other daemon, and the
/// other daemon. `None` when there is nothing to adopt (then [`clear_previous`] clears all as
/// before). Lines for the log go to `log`.
pub fn greet_previous(root: &Path, control: &Path, stop_deadline: Duration, log: &mut Vec<String>) -> Option<Previous> {
    let pipe_dirs = pipe_dirs(root);
    let daemons = [daemon_of(&pipe_dirs[0]), daemon_of(&pipe_dirs[1])];
    if daemons.iter().all(Option::is_none) {
        return None;
    }
    let began = Instant::now();
    let sockets = rendezvous_sockets(&rendezvous_dir(root));
    end_previous_keeper(root, log);
    // Each daemon's clients, asked once (none when no orphan waits).
    let clients: [BTreeMap<u32, u32>; 2] = [0, 1].map(|i| {
        if sockets.is_empty() || daemons[i].is_none() { BTreeMap::new() } else { clients_of(control, &pipe_dirs[i]) }
    });
    // The orphans greeted, by the daemon whose client each is (the index into `pipe_dirs`).
    let mut on: [Vec<Greeted>; 2] = Default::default();
    for path in sockets {
        let Some(pid) = orphan::rendezvous_pid(&path) else { continue };
        // The pidfd first: every check below is then of this process, whatever happens to the pid.
        let Ok(held) = crate::process::Held::adopt(pid) else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let (stream, o) = match hello(&path, Duration::from_secs(2)) {
            Ok(answer) => answer,
            Err(why) => {
                let ended = force(pid, control, &pipe_dirs);
                log.push(format!("not adopted: the previous meshd's worker {pid}: {why}; cut off and killed: {ended}"));
                let _ = std::fs::remove_file(&path);
                continue;
            }
        };
        let why_not = if o.pid != pid {
            Some(format!("its rendezvous names pid {pid} and it says it is pid {}", o.pid))
        } else if o.kernel != mesh_mps_worker::KernelState::Busy {
            Some(format!("its kernel is not running ({:?})", o.kernel))
        } else {
            None
        };
        // The active daemon's directory first: the nested one ran programs only after a fault.
        let client_of = || [1, 0].into_iter().find_map(|i| clients[i].get(&pid).map(|&server| (i, server)));
        let side = if why_not.is_none() { client_of() } else { None };
        let mut g = Greeted { stream, orphan: o, held, server: 0 };
        match (why_not, side) {
            (None, Some((i, server))) => {
                g.server = server;
                on[i].push(g);
            }
            (Some(why), _) => log.push(g.retire(control, &pipe_dirs, stop_deadline, &why)),
            (None, None) => {
                let why = format!("it is a client of neither MPS daemon of {}", root.display());
                log.push(g.retire(control, &pipe_dirs, stop_deadline, &why));
            }
        }
    }
    // Every program ran on one daemon, the active one: after a GPU fault the standby's (nested)
    // daemon took them over. Orphans of the other one (none, but for a recovery cut short by the
    // crash) are retired, their programs relaunched.
    let active = if on[0].len() > on[1].len() { 0 } else { 1 };
    let other = 1 - active;
    for g in std::mem::take(&mut on[other]) {
        let why = format!(
            "it is a client of the MPS daemon of {}, and the previous meshd's programs ran on that of {}",
            pipe_dirs[other].display(),
            pipe_dirs[active].display()
        );
        log.push(g.retire(control, &pipe_dirs, stop_deadline, &why));
    }
    let greeted = std::mem::take(&mut on[active]);
    let daemon = daemons[active]?;
    if greeted.is_empty() {
        return None;
    }
    // Nothing else of the previous meshd may run on: late orphans retired, idle workers gone, and
    // the other daemon (a new standby is made) told to quit.
    let adopting: Vec<u32> = greeted.iter().map(|g| g.held.id()).collect();
    let greeted_in = began.elapsed();
    retire_all_but(root, control, &pipe_dirs, stop_deadline, &adopting, log);
    let others_gone_in = began.elapsed() - greeted_in;
    quit_in_background(control, &pipe_dirs[other]);
    log.push(format!(
        "adopting the previous meshd's MPS daemon {daemon} of {} and {} orphan(s) running a kernel: {adopting:?} \
         (greeted in {greeted_in:.1?}; its other workers gone {others_gone_in:.1?} later)",
        pipe_dirs[active].display(),
        greeted.len(),
    ));
    let dir = pipe_dirs[active].parent().map_or_else(|| root.to_path_buf(), Path::to_path_buf);
    Some(Previous { dir, daemon, greeted })
}

/// The keeper of an MPS directory (`mesh-mps-worker --keep`): detached, reading meshd's pipe, it
/// quits the daemons once meshd has died and the last orphan is gone.
#[derive(Debug)]
pub struct Keeper {
    child: SharedChild,
    stdin: Mutex<Option<ChildStdin>>,
    pid_file: PathBuf,
}

impl Keeper {
    /// Starts the keeper of `root` for the daemons of `pipe_dirs`; `remove_root` when meshd made it.
    pub fn start(
        root: &Path,
        pipe_dirs: &[PathBuf],
        policy: &OrphanPolicy,
        remove_root: bool,
    ) -> Result<Self, BackendError> {
        let binary = crate::process::worker_binary();
        let mut cmd = Command::new(&binary);
        cmd.arg("--keep").arg(root);
        for d in pipe_dirs {
            cmd.arg("--pipe-dir").arg(d);
        }
        cmd.arg("--mps-control")
            .arg(&policy.control)
            .arg("--orphan-grace-ms")
            .arg(policy.grace.as_millis().to_string())
            .arg("--stop-deadline-ms")
            .arg(policy.stop_deadline.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if remove_root {
            cmd.arg("--remove-root");
        }
        let child = process::spawn_detached(&mut cmd)
            .map_err(|e| BackendError::MpsDaemon(format!("starting the keeper {}: {e}", binary.display())))?;
        let pid_file = root.join(KEEPER_PID);
        if let Err(e) = std::fs::write(&pid_file, child.id().to_string()) {
            process::kill(&child);
            return Err(BackendError::MpsDaemon(format!("{}: {e}", pid_file.display())));
        }
        let stdin = Mutex::new(child.take_stdin());
        Ok(Self { child, stdin, pid_file })
    }

    /// The keeper's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An orderly stop: the keeper is told `exit` (it then touches nothing) and waited for.
    pub fn release(&self) {
        if let Some(mut stdin) = self.stdin.lock().take() {
            let _ = writeln!(stdin, "exit");
        }
        process::wait_or_kill(&self.child, Duration::from_secs(2));
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mesh_mps_worker::{KernelState, RefusalKind};
    use std::os::unix::net::UnixListener;

    /// A stand-in orphan: a `sleep` child for its pid, and a thread answering at its rendezvous as
    /// `answer` says, ending the `sleep` once it is asked to retire.
    fn orphan_at(dir: &Path, answer: &'static str) -> (std::process::Child, std::thread::JoinHandle<Vec<String>>) {
        let child = Command::new("/bin/sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        std::fs::create_dir_all(dir).unwrap();
        let listener = UnixListener::bind(orphan::rendezvous(dir, pid)).unwrap();
        let t = std::thread::spawn(move || {
            use std::io::BufRead;
            let (stream, _) = listener.accept().unwrap();
            let mut heard = Vec::new();
            let mut reader = std::io::BufReader::new(&stream);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                heard.push(line.trim_end().to_string());
                let reply = match (answer, heard.len()) {
                    ("old", 1) => Reply::refused(RefusalKind::Version, "this worker speaks protocol 3"),
                    (_, 1) => Reply::Orphan(Orphan {
                        protocol: PROTOCOL,
                        pid,
                        slot: Some(1),
                        generation: Some(7),
                        launches: 1,
                        kernel: KernelState::Busy,
                        orphaned_ms: 40,
                        grace_ms: 60_000,
                        ready: mesh_mps_worker::Ready {
                            protocol: PROTOCOL,
                            pid,
                            device: "stand-in".into(),
                            mps_enabled: true,
                            sms: 132,
                            context_ms: 0,
                            kernel_check_us: 5000,
                        },
                        asked_sms: None,
                        mailbox: mesh_mps_worker::FileId { dev: 0, ino: 0 },
                        loaded: None,
                        mapped: Vec::new(),
                    }),
                    _ => {
                        kill(pid);
                        Reply::Done
                    }
                };
                let mut s = &stream;
                writeln!(s, "{}", encode(&reply)).unwrap();
                line.clear();
            }
            heard
        });
        (child, t)
    }

    #[test]
    fn a_previous_orphan_is_greeted_retired_and_waited_for_and_a_stale_socket_removed() {
        let root = tempfile::tempdir().unwrap();
        let dir = rendezvous_dir(root.path());
        let (mut child, t) = orphan_at(&dir, "ours");
        let pid = child.id();
        // A socket file whose worker is gone (a pid that cannot exist).
        std::fs::write(orphan::rendezvous(&dir, 4_000_000), b"").unwrap();
        let log = clear_previous(root.path(), Path::new("/nonexistent/control"), Duration::from_secs(1));
        assert!(
            log.iter().any(|l| l.contains(&format!("retired the previous meshd's worker {pid} (slot 1, generation 7"))),
            "{log:?}"
        );
        let heard = t.join().unwrap();
        assert_eq!(heard, [format!(r#"{{"op":"hello","protocol":{PROTOCOL}}}"#), r#"{"op":"retire"}"#.to_string()]);
        assert!(child.try_wait().unwrap().is_some(), "gone before clear_previous returned");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "both sockets removed");
    }

    #[test]
    fn a_native_worker_left_on_a_daemon_that_quits_is_ended_and_named() {
        let root = tempfile::tempdir().unwrap();
        let pipe = root.path().join("pipe");
        std::fs::create_dir_all(&pipe).unwrap();
        let mut native = Command::new("/bin/sleep").arg("30").env(orphan::PIPE_ENV, &pipe).spawn().unwrap();
        let pid = native.id();
        // Until its environment shows: the exec may not have happened yet.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !processes_using(&pipe).iter().any(|(p, _)| *p == pid) {
            assert!(Instant::now() < deadline, "the stand-in never showed its pipe directory");
            std::thread::sleep(Duration::from_millis(5));
        }
        let log = clear_previous(root.path(), Path::new("/nonexistent/control"), Duration::from_secs(1));
        assert!(
            log.iter()
                .any(|l| l.contains(&format!("MPS client {pid} (sleep) is on a daemon that quits"))
                    && l.ends_with("true")),
            "{log:?}"
        );
        assert!(native.try_wait().unwrap().is_some(), "ended before clear_previous returned");
    }

    #[test]
    fn an_orphan_of_another_version_is_not_retired_but_ended_by_force() {
        let root = tempfile::tempdir().unwrap();
        let (mut child, t) = orphan_at(&rendezvous_dir(root.path()), "old");
        let pid = child.id();
        let log = clear_previous(root.path(), Path::new("/nonexistent/control"), Duration::from_secs(1));
        let line = log.iter().find(|l| l.contains(&format!("worker {pid}"))).unwrap();
        assert!(
            line.contains("could not be retired") && line.contains("protocol 3") && line.ends_with("killed: true"),
            "{line}"
        );
        let _ = child.wait();
        assert_eq!(t.join().unwrap().len(), 1, "only the hello was said");
    }
}
