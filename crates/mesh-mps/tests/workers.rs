//! The worker protocol as meshd reads it, against stand-in workers (shell scripts speaking the pipe
//! protocol): events pushed and taken without asking, in the order the workers say them; a worker
//! that dies, one that garbles a line, one of another protocol version, one that says nothing —
//! each an error naming the worker, never a panic; the fd socket a real worker inherits; and
//! liveness: a worker that stops saying `alive` (mute, or really stopped with SIGSTOP) is broken off
//! past the bound, one that keeps saying it is not, and its `alive` lines wake nobody.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use mesh_mps::worker::{News, NewsSender, Worker, WorkerNews};
use mesh_mps_worker::{Event, KernelState, encode};

/// A stand-in worker. `MODE` says what it does after answering a launch: `ends` (says `EVENT` at
/// once), `waits` (says `EVENT` once `FLAG` exists), `dies` (exits), `garbles` (answers the launch
/// with a line that is no JSON), `binary` (with a line that is not UTF-8), `spews` (answers it with 2000 such lines, then exits); `silent`
/// never says `ready`; `PROTO` overrides its protocol
/// version (`@PROTOCOL@`, this protocol's, is filled in when the script is written), `noproto` leaves it out. It refuses to start unless its last argument names an open
/// unix socket (the `--fd-socket N` meshd appends).
const STAND_IN: &str = r#"#!/bin/sh
for a in "$@"; do last=$a; done
if [ ! -S "/proc/self/fd/$last" ]; then
  echo '{"reply":"refused","kind":"start","message":"no fd socket"}'; exit 1
fi
case "$MODE" in
  silent) while read -r line; do :; done; exit 0 ;;
  mute) printf '{"reply":"ready","protocol":@PROTOCOL@,"pid":%s,"device":"stand-in","mps_enabled":true,"sms":132,"context_ms":0}\n' $$
        while read -r line; do :; done; exit 0 ;;
  alive) printf '{"reply":"ready","protocol":@PROTOCOL@,"pid":%s,"device":"stand-in","mps_enabled":true,"sms":132,"context_ms":0}\n' $$
         while :; do echo '{"event":"alive"}' || exit 0; sleep 0.02; done ;;
  noproto) printf '{"reply":"ready","pid":%s,"device":"stand-in","mps_enabled":true,"sms":132,"context_ms":0}\n' $$ ;;
  *) printf '{"reply":"ready","protocol":%s,"pid":%s,"device":"stand-in","mps_enabled":true,"sms":132,"context_ms":0}\n' "${PROTO:-@PROTOCOL@}" $$ ;;
esac
while read -r line; do
  case "$line" in
    *'"op":"launch"'*)
      case "$MODE" in
        garbles) echo 'hello, meshd'; continue ;;
        binary) printf '\377\376 not utf-8\n'; continue ;;
        spews) i=0; while [ $i -lt 2000 ]; do echo "junk $i" || exit 0; i=$((i+1)); done; exit 0 ;;
      esac
      echo '{"reply":"done"}'
      case "$MODE" in
        ends) printf '%s\n' "$EVENT" ;;
        waits) while [ ! -e "$FLAG" ]; do sleep 0.01; done; printf '%s\n' "$EVENT" ;;
        dies) exit 3 ;;
      esac ;;
    *'"op":"exit"'*) exit 0 ;;
    *) echo '{"reply":"done"}' ;;
  esac
done
"#;

struct Bench {
    dir: tempfile::TempDir,
    script: PathBuf,
}

impl Bench {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("stand-in-worker");
        std::fs::write(&script, STAND_IN.replace("@PROTOCOL@", &mesh_mps_worker::PROTOCOL.to_string())).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self { dir, script }
    }

    fn flag(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn spawn(&self, news: &NewsSender, env: &[(&str, &str)]) -> Worker {
        // Through `sh`, not by exec'ing the script: a sibling test forking while this test's
        // `fs::write` held the file open for writing would make that exec fail with ETXTBSY
        // ("Text file busy"), as it once did in CI.
        let mut cmd = Command::new("sh");
        cmd.arg(&self.script);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Worker::spawn_command(&mut cmd, news).unwrap()
    }
}

const READY: Duration = Duration::from_secs(10);

const SEEN: u64 = 1_764_700_000_123_456_789;

fn ended(launch: u64, state: KernelState) -> String {
    encode(&Event::KernelEnded { launch, state, seen_unix_ns: SEEN })
}

/// Counts the wakes `news` gives meshd's backend thread.
fn count_wakes(news: &NewsSender) -> Arc<AtomicUsize> {
    let woken = Arc::new(AtomicUsize::new(0));
    let counter = woken.clone();
    news.set_wake(Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
    }));
    woken
}

/// The next piece of news (generous deadline: only a hang fails it).
fn next(rx: &Receiver<WorkerNews>) -> WorkerNews {
    rx.recv_timeout(Duration::from_secs(10)).expect("news within 10 s")
}

#[test]
fn events_are_taken_in_the_order_the_workers_say_them() {
    let bench = Bench::new();
    let (news, rx) = NewsSender::channel();
    let woken = count_wakes(&news);
    let flag = bench.flag("fault");
    let fault = KernelState::Failed { reason: "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access".into() };
    let returns = ended(1, KernelState::Idle);
    let faults = ended(1, fault.clone());
    let mut a = bench.spawn(&news, &[("MODE", "ends"), ("EVENT", &returns)]).handshake(READY).unwrap();
    let flag_text = flag.display().to_string();
    let mut b =
        bench.spawn(&news, &[("MODE", "waits"), ("EVENT", &faults), ("FLAG", &flag_text)]).handshake(READY).unwrap();
    assert_eq!((a.ready.protocol, b.ready.sms), (mesh_mps_worker::PROTOCOL, 132));

    b.launch(0).unwrap();
    b.refresh();
    assert_eq!(b.kernel(), KernelState::Busy, "launched, and it said nothing since");
    a.launch(1).unwrap();
    let first = next(&rx);
    let returned = News::KernelEnded { launch: 1, state: KernelState::Idle, seen_unix_ns: SEEN };
    assert_eq!(first, WorkerNews { pid: a.pid(), news: returned });
    b.refresh();
    assert_eq!(b.kernel(), KernelState::Busy, "a's news says nothing of b");
    std::fs::write(&flag, "").unwrap();
    let second = next(&rx);
    let failed = News::KernelEnded { launch: 1, state: fault.clone(), seen_unix_ns: SEEN };
    assert_eq!(second, WorkerNews { pid: b.pid(), news: failed });
    a.refresh();
    b.refresh();
    assert_eq!((a.kernel(), b.kernel()), (KernelState::Idle, fault));
    assert_eq!((a.failed_at(), b.failed_at()), (None, Some(SEEN)), "when the worker saw the fault");
    // The news is sent before the wake is called: wait for the wake (a deadline, not a measurement).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while woken.load(Ordering::SeqCst) < 2 {
        assert!(std::time::Instant::now() < deadline, "each piece of news wakes the backend");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    a.exit();
    b.exit();
}

#[test]
fn a_stale_event_of_an_earlier_launch_changes_nothing() {
    let bench = Bench::new();
    let (news, rx) = NewsSender::channel();
    // It says launch 7 ended, but this is its first launch.
    let stale = ended(7, KernelState::Failed { reason: "old".into() });
    let mut w = bench.spawn(&news, &[("MODE", "ends"), ("EVENT", &stale)]).handshake(READY).unwrap();
    w.launch(0).unwrap();
    assert!(matches!(next(&rx).news, News::KernelEnded { launch: 7, .. }));
    w.refresh();
    assert_eq!(w.kernel(), KernelState::Busy);
    w.exit();
}

#[test]
fn a_worker_that_dies_is_gone_and_named() {
    let bench = Bench::new();
    let (news, rx) = NewsSender::channel();
    let mut w = bench.spawn(&news, &[("MODE", "dies")]).handshake(READY).unwrap();
    let pid = w.pid();
    w.launch(0).unwrap();
    let gone = next(&rx);
    assert_eq!(gone, WorkerNews { pid, news: News::Gone("its output ended (EOF)".into()) });
    w.refresh();
    let KernelState::Failed { reason } = w.kernel() else { panic!("{:?}", w.kernel()) };
    assert!(reason.contains(&format!("worker {pid}")) && reason.contains("EOF"), "{reason}");
    let e = w.unload().unwrap_err().to_string();
    assert!(e.contains(&pid.to_string()), "{e}");
    w.kill();
}

#[test]
fn a_line_that_is_not_utf8_is_garbled_not_the_end_of_the_worker() {
    let bench = Bench::new();
    let (news, rx) = NewsSender::channel();
    let mut w = bench.spawn(&news, &[("MODE", "binary")]).handshake(READY).unwrap();
    let e = w.launch(0).unwrap_err().to_string();
    assert!(e.contains("garbled line"), "{e}");
    assert!(matches!(next(&rx).news, News::Garbled(_)), "garbled, not gone: the worker still runs");
    w.kill();
}

#[test]
fn a_garbled_line_is_an_error_naming_the_worker() {
    let bench = Bench::new();
    let (news, rx) = NewsSender::channel();
    let mut w = bench.spawn(&news, &[("MODE", "garbles")]).handshake(READY).unwrap();
    let pid = w.pid();
    let e = w.launch(0).unwrap_err().to_string();
    assert!(e.contains(&pid.to_string()) && e.contains("garbled line") && e.contains("hello, meshd"), "{e}");
    let News::Garbled(why) = next(&rx).news else { panic!("garbled news first") };
    assert!(why.contains("not a JSON object"), "{why}");
    w.refresh();
    assert!(matches!(w.kernel(), KernelState::Failed { reason } if reason.contains(&format!("worker {pid}"))));
    let e = w.unload().unwrap_err().to_string();
    assert!(e.contains("not spoken to any more") && e.contains("garbled"), "a broken worker is not asked again: {e}");
    w.kill();
}

#[test]
fn a_worker_that_spews_lines_is_heard_once_then_no_more() {
    // Broken at its first garbled line, it is not read further: its 1999 other lines neither
    // queue news nor wake meshd (each would be a job on the backend thread until it is killed).
    let bench = Bench::new();
    let (news, rx) = NewsSender::channel();
    let woken = count_wakes(&news);
    let mut w = bench.spawn(&news, &[("MODE", "spews")]).handshake(READY).unwrap();
    let pid = w.pid();
    let e = w.launch(0).unwrap_err().to_string();
    assert!(e.contains(&pid.to_string()) && e.contains("garbled line") && e.contains("junk 0"), "{e}");
    drop(news);
    // Everything its reader said, up to its end (the channel disconnects once no reader holds it).
    let mut heard = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(n) => heard.push(n),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => panic!("its reader still runs after 10 s"),
        }
    }
    assert_eq!(heard.len(), 1, "one piece of news, not one per line: {:?}", &heard[..heard.len().min(3)]);
    assert!(
        matches!(&heard[0], WorkerNews { pid: p, news: News::Garbled(why) } if *p == pid && why.contains("junk 0"))
    );
    assert_eq!(woken.load(Ordering::SeqCst), 1, "meshd woken once");
    w.refresh();
    assert!(matches!(w.kernel(), KernelState::Failed { reason } if reason.contains(&format!("worker {pid}"))));
    w.kill();
}

#[test]
fn a_worker_of_another_protocol_or_silent_is_refused_naming_it() {
    let bench = Bench::new();
    let (news, _rx) = NewsSender::channel();
    let w = bench.spawn(&news, &[("PROTO", "1")]);
    let pid = w.pid();
    let e = w.handshake(READY).unwrap_err().to_string();
    let now = mesh_mps_worker::PROTOCOL;
    assert!(e.contains(&pid.to_string()) && e.contains(&format!("speaks protocol 1 where meshd speaks {now}")), "{e}");
    // An older version's worker (version 2: no `alive`, no kernel_check_us in its ready; version 3:
    // no orphan rendezvous; version 4: no adoption) is refused for its version.
    for old in ["2", "3", "4"] {
        let w = bench.spawn(&news, &[("PROTO", old)]);
        let e = w.handshake(READY).unwrap_err().to_string();
        assert!(e.contains(&format!("speaks protocol {old} where meshd speaks {now}")), "{e}");
    }

    let w = bench.spawn(&news, &[("MODE", "noproto")]);
    let e = w.handshake(READY).unwrap_err().to_string();
    assert!(e.contains("a malformed reply") && e.contains("protocol"), "a ready without its version: {e}");

    let w = bench.spawn(&news, &[("MODE", "silent")]);
    let pid = w.pid();
    let e = w.handshake(Duration::from_millis(300)).unwrap_err().to_string();
    assert!(e.contains(&pid.to_string()) && e.contains("no answer within 300 ms"), "{e}");
}

#[test]
fn a_worker_inherits_its_fd_socket() {
    // The stand-in refuses to start unless the descriptor `--fd-socket N` names is an open socket in
    // it; a plain `sh -c` without the socket shows the refusal is real.
    let bench = Bench::new();
    let (news, _rx) = NewsSender::channel();
    let w = bench.spawn(&news, &[]).handshake(READY).unwrap();
    w.exit();
    let mut no_socket = Command::new("sh");
    no_socket.arg(&bench.script).arg("--fd-socket").arg("99");
    let out = no_socket.output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("no fd socket"), "{out:?}");
    assert!(Path::new(&bench.script).exists());
}

#[test]
fn a_worker_silent_past_the_bound_is_broken_off_naming_it_and_how_long() {
    // `mute` says its ready and then nothing: judged at chosen instants, not by waiting.
    let bench = Bench::new();
    let (news, _rx) = NewsSender::channel();
    let mut w = bench.spawn(&news, &[("MODE", "mute")]).handshake(READY).unwrap();
    let pid = w.pid();
    let now = Instant::now();
    let heard = w.silent_for(now);
    assert_eq!(w.check_silence(now, heard + Duration::from_secs(1)), None, "within the bound");
    assert_eq!((w.broken(), w.kernel()), (None, KernelState::Idle));
    let later = now + Duration::from_secs(4);
    let silent = w.check_silence(later, Duration::from_secs(3)).expect("past the bound");
    assert!(silent > Duration::from_secs(3), "{silent:?}");
    assert_eq!(w.silenced(), Some(silent));
    let KernelState::Failed { reason } = w.kernel() else { panic!("{:?}", w.kernel()) };
    assert!(
        reason.contains(&format!("worker {pid}"))
            && reason.contains("silent for")
            && reason.contains("stopped or wedged"),
        "{reason}"
    );
    assert_eq!(w.check_silence(later + Duration::from_secs(10), Duration::from_secs(3)), None, "broken off once");
    let e = w.unload().unwrap_err().to_string();
    assert!(e.contains("not spoken to any more") && e.contains("silent for"), "{e}");
    assert!(w.alive(), "silent, not dead: the watchdog still has to cut it off and kill it");
    w.kill();
}

/// Waits (deadline 10 s) until `w` is heard from after this call: a line it said later than now.
fn heard_again(w: &Worker) {
    let since = Instant::now();
    let deadline = since + Duration::from_secs(10);
    loop {
        let now = Instant::now();
        if w.silent_for(now) < now.duration_since(since) {
            return;
        }
        assert!(now < deadline, "worker {} said nothing for 10 s", w.pid());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_worker_that_keeps_saying_alive_is_not_broken_and_wakes_nobody() {
    let bench = Bench::new();
    let (news, rx) = NewsSender::channel();
    let woken = count_wakes(&news);
    let mut w = bench.spawn(&news, &[("MODE", "alive")]).handshake(READY).unwrap();
    // Several `alive` lines after its ready, each one noted.
    for _ in 0..5 {
        heard_again(&w);
        assert_eq!(w.check_silence(Instant::now(), mesh_mps::SILENCE_LIMIT), None);
    }
    assert!(w.broken().is_none());
    assert!(rx.try_recv().is_err(), "an alive line is no news");
    assert_eq!(woken.load(Ordering::SeqCst), 0, "nor a wake-up of the backend");
    w.kill();
}

#[test]
fn a_stopped_worker_goes_silent_and_is_broken_off() {
    let bench = Bench::new();
    let (news, _rx) = NewsSender::channel();
    let mut w = bench.spawn(&news, &[("MODE", "alive")]).handshake(READY).unwrap();
    let pid = w.pid();
    heard_again(&w);
    let process = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    rustix::process::kill_process(process, rustix::process::Signal::STOP).unwrap();
    let bound = Duration::from_millis(300);
    let deadline = Instant::now() + Duration::from_secs(20);
    let silent = loop {
        if let Some(d) = w.check_silence(Instant::now(), bound) {
            break d;
        }
        assert!(Instant::now() < deadline, "a stopped worker was never found silent");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(silent > bound);
    assert!(w.alive(), "stopped, not dead");
    assert!(matches!(w.kernel(), KernelState::Failed { reason } if reason.contains(&format!("worker {pid}"))));
    // A stopped process dies of SIGKILL all the same, and is reaped.
    w.kill();
    assert!(w.exited());
}
