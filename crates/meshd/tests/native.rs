//! Native GPU workers without a GPU: shell scripts as workers, through the control socket (spawn, ready, ps, stop, the ready timeout) and through `meshd::native` directly (the MPS membership check with a stand-in, SIGKILL after the grace period).

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{ListBackend, ask, wait_until};
use mesh_shm::Mailbox;
use meshd::native::{Membership, NativeRow, NativeSpec, Natives};
use meshd::protocol::{Request, Response};
use meshd::server::{Limits, Server, StopHandle};
use meshd::start::bind_socket;

/// Generous: only a deadline for things that should take milliseconds.
const DEADLINE: Duration = Duration::from_secs(20);

struct Running {
    socket: PathBuf,
    dir: tempfile::TempDir,
    stop: StopHandle,
    server: Option<std::thread::JoinHandle<bool>>,
}

impl Running {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sock");
        let mailbox = mailbox(dir.path());
        let server = Server::start(mailbox, Limits::default(), None, |mb| ListBackend::new(mb).opened()).unwrap();
        let listener = bind_socket(&socket).unwrap();
        let stop = server.stop_handle();
        let server = Some(std::thread::spawn(move || server.run(listener).unwrap()));
        Self { socket, dir, stop, server }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(h) = self.server.take() {
            let _ = h.join();
        }
    }
}

fn mailbox(dir: &Path) -> Mailbox {
    let mb = common::small_mailbox(dir);
    mb.create_channel("to-gpu", 16, 8).unwrap();
    mb.create_channel("from-gpu", 16, 8).unwrap();
    mb
}

fn sh(script: &str) -> Vec<String> {
    vec!["/bin/bash".into(), "-c".into(), script.into()]
}

fn spawn_req(name: &str, bind: &[&str], script: &str, ready_ms: u64) -> Request {
    Request::Spawn {
        name: name.into(),
        bind: bind.iter().map(|s| s.to_string()).collect(),
        command: sh(script),
        ready_timeout_ms: ready_ms,
    }
}

fn natives(r: &Response) -> Vec<NativeRow> {
    r.natives.clone().unwrap_or_default()
}

fn alive(pid: u32) -> bool {
    // A zombie still answers kill(0): read its state instead.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

#[test]
fn spawn_tells_the_worker_its_mailbox_and_channels_and_stop_ends_it() {
    let d = Running::start();
    let env_file = d.dir.path().join("env");
    let script = format!(
        "printf '%s\\n' \"$MESH_MAILBOX\" \"$MESH_CHANNELS\" \"$MESH_NATIVE_NAME\" \"$MESH_ISOLATION\" >{}; \
         echo ready >&$MESH_READY_FD; while :; do sleep 0.05; done",
        env_file.display()
    );
    let r = ask(&d.socket, &spawn_req("w1", &["to-gpu", "from-gpu"], &script, 10_000), &[]);
    assert!(r.ok, "{r:?}");
    let row = &natives(&r)[0];
    assert_eq!((row.name.as_str(), row.state.as_str(), row.isolation.as_str()), ("w1", "running", "blink"));
    assert_eq!(row.bind, ["to-gpu", "from-gpu"]);
    let env = std::fs::read_to_string(&env_file).unwrap();
    let lines: Vec<&str> = env.lines().collect();
    assert_eq!(lines, [d.dir.path().join("mb").to_str().unwrap(), "to-gpu,from-gpu", "w1", "blink"]);
    // ps lists it beside the programs (none here).
    let ps = ask(&d.socket, &Request::Ps, &[]);
    assert_eq!(natives(&ps).len(), 1);
    assert_eq!(natives(&ps)[0].pid, row.pid);
    let r = ask(&d.socket, &spawn_req("w1", &[], "echo ready >&$MESH_READY_FD; sleep 5", 10_000), &[]);
    assert!(!r.ok && r.error.unwrap().contains("already runs"), "one worker per name");
    let r = ask(&d.socket, &Request::Stop { name: "w1".into() }, &[]);
    assert!(r.ok, "{r:?}");
    assert_eq!(natives(&r)[0].state, "killed(signal 15)", "SIGTERM ended it");
    assert!(!alive(row.pid), "the worker is gone");
    assert!(natives(&ask(&d.socket, &Request::Ps, &[])).is_empty(), "stop forgets it");
    let r = ask(&d.socket, &Request::Stop { name: "w1".into() }, &[]);
    assert!(!r.ok && r.error.unwrap().contains("no native worker w1"));
}

#[test]
fn a_stop_of_a_name_no_worker_can_have_says_why() {
    let d = Running::start();
    for name in [String::new(), "x".repeat(49), "a b".into(), "\n".into()] {
        let r = ask(&d.socket, &Request::Stop { name: name.clone() }, &[]);
        let err = r.error.unwrap_or_default();
        assert!(
            !r.ok && err.contains(&format!("native worker name {name:?}")) && err.contains("1 to 48 characters"),
            "{name:?}: {err}"
        );
    }
}

#[test]
fn a_worker_that_never_says_ready_is_killed_and_refused() {
    let d = Running::start();
    let pid_file = d.dir.path().join("pid");
    let script = format!("echo $$ >{}; exec sleep 600", pid_file.display());
    let r = ask(&d.socket, &spawn_req("mute", &[], &script, 300), &[]);
    let err = r.error.clone().unwrap_or_default();
    assert!(!r.ok && err.contains("did not report ready within 0.3 s") && err.contains("MESH_READY_FD"), "{r:?}");
    let pid: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    assert!(wait_until(DEADLINE, || !alive(pid)), "the silent worker was killed");
    assert!(natives(&ask(&d.socket, &Request::Ps, &[])).is_empty(), "a refused worker is not listed");
    // A grandchild holding the ready pipe (a shell running a command) does not keep the refusal waiting.
    let r = ask(&d.socket, &spawn_req("tree", &[], "sleep 600; true", 300), &[]);
    assert!(!r.ok && r.error.unwrap().contains("did not report ready"));
}

#[test]
fn exits_and_bad_answers_before_ready_are_refused_with_the_reason() {
    let d = Running::start();
    let r = ask(&d.socket, &spawn_req("quits", &[], "exit 3", 10_000), &[]);
    assert!(!r.ok && r.error.clone().unwrap().contains("exited(3) before it reported ready"), "{r:?}");
    let r = ask(&d.socket, &spawn_req("chatty", &[], "echo hello >&$MESH_READY_FD; sleep 600", 10_000), &[]);
    assert!(!r.ok && r.error.clone().unwrap().contains("said \"hello\""), "{r:?}");
    let r = ask(&d.socket, &spawn_req("lost", &["nope"], "echo ready >&$MESH_READY_FD", 10_000), &[]);
    assert!(!r.ok && r.error.clone().unwrap().contains("no such channel"), "{r:?}");
    let bad = Request::Spawn { name: "x".into(), bind: vec![], command: vec![], ready_timeout_ms: 100 };
    assert!(!ask(&d.socket, &bad, &[]).ok);
    let missing = Request::Spawn {
        name: "x".into(),
        bind: vec![],
        command: vec!["/nonexistent/worker".into()],
        ready_timeout_ms: 100,
    };
    let r = ask(&d.socket, &missing, &[]);
    assert!(!r.ok && r.error.clone().unwrap().contains("/nonexistent/worker"), "{r:?}");
    // A worker that ends after ready stays listed with its exit until stopped.
    let r = ask(&d.socket, &spawn_req("brief", &[], "echo ready >&$MESH_READY_FD; exit 0", 10_000), &[]);
    assert!(r.ok, "{r:?}");
    assert!(wait_until(DEADLINE, || {
        natives(&ask(&d.socket, &Request::Ps, &[])).iter().any(|n| n.name == "brief" && n.state == "exited(0)")
    }));
    assert_eq!(natives(&ask(&d.socket, &Request::Stop { name: "brief".into() }, &[]))[0].state, "exited(0)");
}

#[test]
fn shutdown_ends_every_worker() {
    let mut d = Running::start();
    let r = ask(&d.socket, &spawn_req("w", &[], "echo ready >&$MESH_READY_FD; exec sleep 600", 10_000), &[]);
    assert!(r.ok, "{r:?}");
    let pid = natives(&r)[0].pid;
    assert!(ask(&d.socket, &Request::Shutdown, &[]).ok);
    let h = d.server.take().unwrap();
    assert!(common::within(DEADLINE, move || h.join().unwrap()).is_some());
    assert!(!alive(pid), "shutdown stopped the worker");
}

/// MPS mode's checks, stood in for: a pipe directory, and a verdict.
struct StandIn {
    dir: PathBuf,
    ours: bool,
    terminated: std::sync::Mutex<Vec<u32>>,
}

impl Membership for StandIn {
    fn pipe_dir(&self) -> Option<PathBuf> {
        Some(self.dir.clone())
    }
    fn check(&self, pid: u32) -> Result<(), String> {
        if self.ours { Ok(()) } else { Err(format!("pid {pid} is in no client list of the stand-in")) }
    }
    fn terminate(&self, pid: u32) {
        self.terminated.lock().unwrap().push(pid);
    }
}

fn spawn_direct(n: &Natives, spec: NativeSpec) -> Result<NativeRow, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    n.spawn(spec, move |r| {
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    rx.recv_timeout(DEADLINE).expect("an answer")
}

#[test]
fn mps_membership_is_checked_after_ready_and_a_stubborn_worker_is_killed_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(dir.path());
    let out = dir.path().join("pipe");
    let script = format!(
        "echo \"$CUDA_MPS_PIPE_DIRECTORY $MESH_ISOLATION\" >{}; echo ready >&$MESH_READY_FD; exec sleep 600",
        out.display()
    );
    let spec = |name: &str| NativeSpec {
        name: name.into(),
        bind: vec!["to-gpu".into()],
        command: sh(&script),
        ready_timeout: Duration::from_secs(10),
    };
    let outsider = Arc::new(StandIn { dir: "/tmp/our-pipes".into(), ours: false, terminated: Default::default() });
    let n = Natives::new(&mb).with_grace(Duration::from_millis(200));
    n.set_membership(outsider.clone());
    let err = spawn_direct(&n, spec("outsider")).unwrap_err();
    assert!(err.contains("not a client of meshd's MPS server") && err.contains("no client list"), "{err}");
    assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "/tmp/our-pipes mps", "started with our pipe directory");
    assert!(n.rows().is_empty());
    let member = Arc::new(StandIn { dir: "/tmp/our-pipes".into(), ours: true, terminated: Default::default() });
    n.set_membership(member.clone());
    let row = spawn_direct(&n, spec("member")).unwrap();
    assert_eq!((row.state.as_str(), row.isolation.as_str()), ("running", "mps"));
    // SIGTERM is ignored: SIGKILL after the grace period, once the worker is cut off its server.
    let stubborn = NativeSpec {
        command: sh("trap '' TERM; echo ready >&$MESH_READY_FD; while :; do sleep 0.05; done"),
        ..spec("stubborn")
    };
    let s = spawn_direct(&n, stubborn).unwrap();
    let stopped = n.stop("stubborn").unwrap();
    assert_eq!(stopped.state, "killed(signal 9)");
    assert!(member.terminated.lock().unwrap().contains(&s.pid), "terminate_client before SIGKILL");
    n.stop_all();
    assert!(!alive(row.pid) && n.rows().is_empty());
}

/// A server over `dir`'s mailbox with its desired state in `dir/state`, as `meshd run` has.
fn start_with_state(dir: &Path, mb: &Mailbox) -> (PathBuf, StopHandle, std::thread::JoinHandle<bool>) {
    let socket = dir.join(format!("sock-{}", std::time::SystemTime::now().elapsed().map_or(0, |d| d.as_nanos())));
    let store = meshd::state::StateStore::open(&dir.join("state")).unwrap();
    let server = Server::start(mb.clone(), Limits::default(), Some(store), |mb| ListBackend::new(mb).opened()).unwrap();
    let listener = bind_socket(&socket).unwrap();
    let stop = server.stop_handle();
    (socket, stop, std::thread::spawn(move || server.run(listener).unwrap()))
}

fn recorded_natives(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("state/state.json")).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v["natives"].as_array().map_or_else(Vec::new, |a| a.iter().map(|n| n["name"].as_str().unwrap().into()).collect())
}

#[test]
fn native_workers_are_in_the_desired_state_and_started_again_by_the_next_meshd() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(dir.path());
    let (socket, stop, server) = start_with_state(dir.path(), &mb);
    let script = "echo ready >&$MESH_READY_FD; exec sleep 600";
    let r = ask(&socket, &spawn_req("keeper", &["to-gpu"], script, 10_000), &[]);
    assert!(r.ok, "{r:?}");
    let first = natives(&r)[0].pid;
    assert!(
        wait_until(DEADLINE, || recorded_natives(dir.path()) == ["keeper"]),
        "recorded: {:?}",
        recorded_natives(dir.path())
    );
    let r = ask(&socket, &spawn_req("passing", &[], "echo ready >&$MESH_READY_FD; exec sleep 600", 10_000), &[]);
    assert!(r.ok, "{r:?}");
    assert!(wait_until(DEADLINE, || recorded_natives(dir.path()) == ["keeper", "passing"]));
    let r = ask(&socket, &Request::Stop { name: "passing".into() }, &[]);
    assert!(r.ok, "{r:?}");
    assert!(wait_until(DEADLINE, || recorded_natives(dir.path()) == ["keeper"]), "a stopped worker is forgotten");
    // meshd ends (its workers with it); the next one starts again what the state lists.
    stop.stop();
    assert!(server.join().unwrap());
    assert!(!alive(first), "the old worker ended with its meshd");
    assert_eq!(recorded_natives(dir.path()), ["keeper"], "a shutdown keeps what was wanted");
    let (socket, stop, server) = start_with_state(dir.path(), &mb);
    let running_again = wait_until(DEADLINE, || {
        natives(&ask(&socket, &Request::Ps, &[])).iter().any(|n| n.name == "keeper" && n.state == "running")
    });
    let rows = natives(&ask(&socket, &Request::Ps, &[]));
    assert!(running_again, "keeper was not started again: {rows:?}");
    assert_eq!(rows.len(), 1, "only what the state lists: {rows:?}");
    assert_eq!(rows[0].bind, ["to-gpu"], "with its bindings");
    assert_ne!(rows[0].pid, first, "a new process");
    stop.stop();
    assert!(server.join().unwrap());
}

#[test]
fn a_posix_sh_worker_says_ready_on_descriptor_3_even_when_meshd_has_many_open() {
    let d = Running::start();
    // Open enough descriptors in this process (meshd's, here) that the ready pipe's own number is
    // two digits: the worker must still see it as descriptor 3, which dash's `>&N` takes.
    let held: Vec<std::fs::File> = (0..16).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
    let posix_sh = ["/bin/dash", "/bin/sh"].into_iter().find(|p| Path::new(p).exists()).expect("a POSIX sh");
    let r = ask(
        &d.socket,
        &Request::Spawn {
            name: "dash".into(),
            bind: vec![],
            command: vec![
                posix_sh.into(),
                "-c".into(),
                "test \"$MESH_READY_FD\" = 3 && echo ready >&3; exec sleep 600".into(),
            ],
            ready_timeout_ms: 10_000,
        },
        &[],
    );
    drop(held);
    assert!(r.ok, "{posix_sh} worker: {r:?}");
    assert_eq!(natives(&r)[0].state, "running");
    assert!(ask(&d.socket, &Request::Stop { name: "dash".into() }, &[]).ok);
}

/// The session a process leads, from `/proc/PID/stat` (the 6th field).
fn session_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split_whitespace().nth(3)?.parse().ok()
}

#[test]
fn outliving_meshd_a_worker_leads_its_own_session_and_is_adopted_only_as_the_process_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(dir.path());
    let spec = NativeSpec {
        name: "lasting".into(),
        bind: vec!["to-gpu".into()],
        command: sh("echo ready >&$MESH_READY_FD; exec sleep 600"),
        ready_timeout: Duration::from_secs(10),
    };
    let first = Natives::new(&mb).outliving_meshd(true).with_grace(Duration::from_millis(200));
    let row = spawn_direct(&first, spec.clone()).unwrap();
    assert_eq!(session_of(row.pid), Some(row.pid), "a session of its own: meshd's death signals it nothing");
    let wanted = first.wanted_with_process();
    let (_, process) = wanted.iter().find(|(s, _)| s.name == "lasting").unwrap();
    let (pid, ticks) = process.expect("its pid and start time are recorded");
    assert_eq!(pid, row.pid);

    // The next meshd: another start time is another process, left alone.
    let next = Natives::new(&mb).outliving_meshd(true).with_grace(Duration::from_millis(200));
    let e = next.adopt(&spec, pid, ticks + 1).unwrap_err();
    assert!(e.contains(&format!("process {pid} is gone (or the pid names another process now)")), "{e}");
    assert!(alive(pid) && next.rows().is_empty());
    // An MPS server that does not list it: it is ended, for a new one to start.
    let outsider = Arc::new(StandIn { dir: "/tmp/our-pipes".into(), ours: false, terminated: Default::default() });
    let strict = Natives::new(&mb).outliving_meshd(true).with_grace(Duration::from_millis(200));
    strict.set_membership(outsider);
    let other = spawn_direct(&first, NativeSpec { name: "other".into(), ..spec.clone() }).unwrap();
    let other_ticks = meshd::native::start_ticks(other.pid).unwrap();
    let e = strict.adopt(&NativeSpec { name: "other".into(), ..spec.clone() }, other.pid, other_ticks).unwrap_err();
    assert!(e.contains("not a client of meshd's MPS server") && e.contains("ended"), "{e}");
    assert!(wait_until(DEADLINE, || !alive(other.pid)), "ended before a new one may start");

    // The process it was: adopted, running, the same pid; a stop ends it through its pidfd.
    let adopted = next.adopt(&spec, pid, ticks).unwrap();
    assert_eq!(
        (adopted.pid, adopted.state.as_str(), adopted.bind.as_slice()),
        (pid, "running", &["to-gpu".to_string()][..])
    );
    let e = next.adopt(&spec, pid, ticks).unwrap_err();
    assert!(e.contains("already runs"), "one name, one worker: {e}");
    let stopped = next.stop("lasting").unwrap();
    assert!(!alive(pid), "stopped: {stopped:?}");
    assert_eq!(stopped.state, "exited", "its status went to its parent, not to the meshd that adopted it");
    first.stop_all();
}

#[test]
fn a_restarted_meshd_adopts_the_native_workers_that_outlived_the_last_one() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(dir.path());
    let limits = Limits { natives_outlive_meshd: true, ..Limits::default() };
    let start = |mb: &Mailbox| {
        let socket =
            dir.path().join(format!("sock-{}", std::time::SystemTime::now().elapsed().map_or(0, |d| d.as_nanos())));
        let store = meshd::state::StateStore::open(&dir.path().join("state")).unwrap();
        let server = Server::start(mb.clone(), limits, Some(store), |mb| ListBackend::new(mb).opened()).unwrap();
        let listener = bind_socket(&socket).unwrap();
        let stop = server.stop_handle();
        (socket, stop, std::thread::spawn(move || server.run(listener).unwrap()))
    };
    let (socket, stop, server) = start(&mb);
    let r =
        ask(&socket, &spawn_req("lasting", &["to-gpu"], "echo ready >&$MESH_READY_FD; exec sleep 600", 10_000), &[]);
    assert!(r.ok, "{r:?}");
    let pid = natives(&r)[0].pid;
    let recorded = || -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(dir.path().join("state/state.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v["natives"].as_array()?.first().map(|n| n["process"].clone())
    };
    assert!(
        wait_until(DEADLINE, || recorded().is_some_and(|p| p[0] == pid)),
        "its process is recorded: {:?}",
        recorded()
    );
    // A crash of meshd ends no worker: here the server's record is left as a crash leaves it (the
    // state as it was), and the worker, which leads its own session, is not stopped.
    let state = std::fs::read(dir.path().join("state/state.json")).unwrap();
    stop.stop();
    assert!(server.join().unwrap());
    let natives_left_running = Natives::new(&mb).outliving_meshd(true);
    let spec = NativeSpec {
        name: "lasting".into(),
        bind: vec!["to-gpu".into()],
        command: sh("echo ready >&$MESH_READY_FD; exec sleep 600"),
        ready_timeout: Duration::from_secs(10),
    };
    let survivor = spawn_direct(&natives_left_running, spec).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&state).unwrap();
    let ticks = meshd::native::start_ticks(survivor.pid).unwrap();
    v["natives"][0]["process"] = serde_json::json!([survivor.pid, ticks]);
    std::fs::write(dir.path().join("state/state.json"), serde_json::to_vec(&v).unwrap()).unwrap();

    let (socket, stop, server) = start(&mb);
    let rows = natives(&ask(&socket, &Request::Ps, &[]));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].pid, rows[0].state.as_str()), (survivor.pid, "running"), "adopted, not started again");
    stop.stop();
    assert!(server.join().unwrap());
    assert!(!alive(survivor.pid), "an orderly stop ends an adopted worker too");
}
