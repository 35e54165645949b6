//! The standby server's bookkeeping against stand-ins (a control daemon and workers as shell scripts,
//! CI has no MPS): filled at start and checked to be its clients, taken all or nothing, the faulted
//! server's workers reaped without waiting, the roles swapped, and a new standby made tick by tick on
//! a server that refuses clients for a while, without blocking; a silent standby worker replaced; a
//! standby made in the background (a start with adopted programs) filled by the ticks. The GPU side is docs/explanation/modes.md's ("The standby server").

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{FAKE_CONTROL, script};
use mesh_mps::MpsControl;
use mesh_mps::standby::Standby;
use mesh_mps::worker::NewsSender;

/// A worker that is a client of the server its pipe directory names, unless that server refuses
/// clients (`refuse` in the pipe directory: a server whose old clients are not yet gone).
const FAKE_WORKER: &str = r#"#!/bin/sh
if [ -e "$CUDA_MPS_PIPE_DIRECTORY/refuse" ]; then
  echo '{"reply":"refused","kind":"start","message":"creating the context: CUDA_ERROR_MPS_SERVER_NOT_READY"}'; exit 1
fi
echo $$ >> "$CUDA_MPS_PIPE_DIRECTORY/clients"
printf '{"reply":"ready","protocol":@PROTOCOL@,"pid":%s,"device":"stand-in","mps_enabled":true,"sms":132,"context_ms":0}\n' $$
while read -r line; do
  case "$line" in
    *'"op":"exit"'*) exit 0 ;;
    *) echo '{"reply":"done"}' ;;
  esac
done
"#;

/// Ticks `standby` until `done` holds (or 20 s pass); returns its log lines.
fn tick_until(standby: &mut Standby, news: &NewsSender, mut done: impl FnMut(&Standby) -> bool) -> Vec<String> {
    let mut log = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done(standby) {
        assert!(std::time::Instant::now() < deadline, "the standby never got there; log: {log:?}");
        log.extend(standby.tick(Path::new("/nonexistent/mailbox"), None, news).0);
        std::thread::sleep(Duration::from_millis(10));
    }
    log
}

#[test]
fn the_standby_is_filled_taken_swapped_and_made_again_without_blocking() {
    let bin = tempfile::tempdir().unwrap();
    let control_bin = script(bin.path(), "nvidia-cuda-mps-control", FAKE_CONTROL);
    let worker_bin = script(
        bin.path(),
        "mesh-mps-worker",
        &FAKE_WORKER.replace("@PROTOCOL@", &mesh_mps_worker::PROTOCOL.to_string()),
    );
    // SAFETY: this test binary has this one test; nothing else reads the environment concurrently.
    unsafe {
        std::env::set_var("MESH_MPS_CONTROL", &control_bin);
        std::env::set_var("MESH_MPS_WORKER", &worker_bin);
    }
    let root = tempfile::tempdir().unwrap();
    let active = Arc::new(MpsControl::start(Some(&root.path().join("a"))).unwrap());
    let spare = Arc::new(MpsControl::start(Some(&root.path().join("a/standby"))).unwrap());
    let (news, _rx) = NewsSender::channel();
    let mailbox = Path::new("/nonexistent/mailbox");

    let mut standby = Standby::new(spare.clone(), 2);
    assert_eq!(standby.wanted(), 2);
    // At meshd's start the workers are started side by side by the backend and adopted; here the
    // ticks start them, each spawn counted (a client made while programs may run).
    let mut spawned = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while standby.ready() < 2 {
        assert!(Instant::now() < deadline, "the standby never filled");
        spawned += standby.tick(mailbox, None, &news).1;
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(spawned, 2, "each standby worker is counted once as it is spawned");
    assert!(standby.take(3).is_none(), "all or nothing");
    assert_eq!(standby.ready(), 2, "nothing taken by a refused take");
    let taken = standby.take(1).unwrap();
    assert_eq!((taken.len(), standby.ready()), (1, 1));
    assert_eq!(taken[0].server, 4242, "checked to be a client of the standby server");

    // A worker of the faulted server is buried: killed now, reaped by a later tick; the ticks also
    // replace the worker taken.
    let buried = taken.into_iter().next().unwrap();
    let buried_pid = buried.pid();
    standby.bury(buried);
    assert!(standby.pids().contains(&buried_pid));
    tick_until(&mut standby, &news, |s| !s.pids().contains(&buried_pid) && s.ready() == 2);

    // The standby takes the programs over: its server is the active one now, and the faulted one
    // refuses clients for a while: ticks retry without blocking until it takes them again.
    std::fs::write(active.pipe_dir().join("refuse"), "").unwrap();
    let (now_active, idle) = standby.swap(active.clone());
    assert_eq!(now_active.root(), spare.root(), "the standby's server is the active one");
    assert_eq!(idle.len(), 2, "its idle workers are the pool now");
    assert_eq!(standby.control().root(), active.root(), "the faulted server is the standby");
    for _ in 0..5 {
        assert!(standby.tick(mailbox, None, &news).0.iter().all(|l| !l.contains("ready again")));
    }
    assert_eq!(standby.ready(), 0, "a refusing server gives no worker");
    std::fs::remove_file(active.pipe_dir().join("refuse")).unwrap();
    let log = tick_until(&mut standby, &news, |s| s.ready() == 2);
    assert!(log.iter().any(|l| l.contains("MPS standby ready again: 2 idle worker(s)")), "{log:?}");

    // A standby worker that said nothing past the bound (these stand-ins never say alive) is
    // discarded, naming its silence, and replaced.
    let before = standby.pids();
    standby.check_silence(Instant::now() + Duration::from_secs(4), Duration::from_secs(3));
    let (log, _) = standby.tick(mailbox, None, &news);
    let discarded: Vec<&String> = log.iter().filter(|l| l.contains("discarded") && l.contains("silent for")).collect();
    assert_eq!(discarded.len(), 2, "{log:?}");
    tick_until(&mut standby, &news, |s| s.ready() == 2 && s.pids().iter().all(|p| !before.contains(p)));

    for w in idle {
        w.exit();
    }
    let control = standby.tear_down();
    assert_eq!(control.root(), active.root());

    // Made while meshd serves (it started with adopted programs running): the ticks fill it, and
    // its first fill says the standby server is ready, as a standby made at start does.
    let mut background = Standby::in_background(spare.clone(), 2);
    assert_eq!(background.ready(), 0, "nothing is made before the ticks");
    let log = tick_until(&mut background, &news, |s| s.ready() == 2);
    let ready: Vec<&String> =
        log.iter().filter(|l| l.contains("MPS standby server ready with 2 idle worker(s)")).collect();
    assert_eq!(ready.len(), 1, "{log:?}");
    assert!(ready[0].contains("made while meshd served"), "{log:?}");
    let taken = background.take(2).unwrap();
    let log = tick_until(&mut background, &news, |s| s.ready() == 2);
    assert!(
        log.iter().any(|l| l.contains("MPS standby ready again: 2 idle worker(s)")),
        "a refill after that: {log:?}"
    );
    for w in taken {
        w.exit();
    }
    background.tear_down();
    spare.quit();
    active.quit();
}
