//! The control-daemon protocol against a real child process: a stand-in `nvidia-cuda-mps-control`
//! (a shell script speaking the same command lines), so that CI, which has no MPS, checks the
//! directories, the foreground child, the commands, the membership check and `quit`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use mesh_mps::MpsControl;
use mesh_mps::orphans::OrphanPolicy;

const FAKE_CONTROL: &str = r#"#!/bin/sh
# Stand-in for nvidia-cuda-mps-control: `-f` is the daemon, otherwise one command on stdin.
if [ "$1" = "-f" ]; then
  echo "stand-in control daemon starting"
  : > "$CUDA_MPS_PIPE_DIRECTORY/control"
  while [ ! -e "$CUDA_MPS_PIPE_DIRECTORY/quit" ]; do sleep 0.02; done
  echo "stand-in control daemon quitting"
  exit 0
fi
read cmd arg rest
case "$cmd" in
  get_server_list) echo 4242 ;;
  get_client_list) if [ "$arg" = 4242 ]; then printf '100\n101\n'; else echo "Server $arg not found"; fi ;;
  terminate_client) case "$rest" in 9*) exec sleep 30 ;; esac; echo "$arg $rest" > "$CUDA_MPS_PIPE_DIRECTORY/terminated" ;;
  quit) : > "$CUDA_MPS_PIPE_DIRECTORY/quit" ;;
  *) echo "unknown command $cmd" >&2; exit 1 ;;
esac
"#;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn the_control_daemon_is_driven_through_its_command_protocol() {
    let bin = tempfile::tempdir().unwrap();
    let fake = bin.path().join("nvidia-cuda-mps-control");
    std::fs::write(&fake, FAKE_CONTROL).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    // SAFETY: this test binary has this one test; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("MESH_MPS_CONTROL", &fake) };

    let root = tempfile::tempdir().unwrap();
    let mps = root.path().join("mps");
    let control = MpsControl::start(Some(&mps)).unwrap();
    assert!(control.alive(), "the daemon runs as meshd's foreground child");
    assert_eq!((mode(&mps), mode(&control.pipe_dir()), mode(&control.log_dir())), (0o700, 0o700, 0o700));
    assert_eq!(control.servers().unwrap(), [4242]);
    assert_eq!(control.clients(4242).unwrap(), [100, 101]);
    assert_eq!(control.clients(7).unwrap(), Vec::<u32>::new(), "an error line names no client");
    assert_eq!(control.check_client(101).unwrap(), 4242);
    let err = control.check_client(555).unwrap_err().to_string();
    assert!(err.contains("process 555 is not a client of meshd's MPS server") && err.contains("4242"), "{err}");
    control.terminate_client(4242, 101, mesh_mps::TERMINATE_WITHIN).unwrap();
    assert_eq!(std::fs::read_to_string(control.pipe_dir().join("terminated")).unwrap().trim(), "4242 101");
    // A server busy with a fault can hold terminate_client for the daemon's whole 10 s timeout (seen on
    // the H200: "ending the clients 10267.3 ms"): each cut-off is bounded, and all are asked side by side.
    let failed = control.terminate_clients(&[(4242, 901), (4242, 101), (4242, 902)], mesh_mps::TERMINATE_WITHIN);
    let failed_pids: Vec<u32> = failed.iter().map(|(pid, _)| *pid).collect();
    assert_eq!(failed_pids, [901, 902], "the clients whose cut-off hung, and only those: {failed:?}");
    for (pid, e) in &failed {
        let e = e.to_string();
        assert!(e.contains(&format!("terminate_client 4242 {pid}")) && e.contains("no answer within 500 ms"), "{e}");
    }
    let err = control.command("frobnicate").unwrap_err().to_string();
    assert!(err.contains("frobnicate") && err.contains("unknown command"), "{err}");
    let err = MpsControl::start(Some(&mps)).unwrap_err().to_string();
    assert!(
        err.contains(&format!("is in use by the meshd with pid {}", std::process::id())),
        "a directory a live meshd holds is refused naming it: {err}"
    );
    control.quit();
    assert!(!control.alive(), "quit ends the daemon and waits for it");
    assert!(mps.exists(), "a --mps-dir given by the user is left in place");

    // The same directory again: the stand-in's `control` and `quit` files are still there (as the real
    // daemon leaves `control`, `control_lock` and `control_privileged`); a start removes them, so the
    // new daemon is not taken for the old one and does not see the old quit.
    let pipe = control.pipe_dir();
    drop(control); // the claim on the directory lasts as long as the MpsControl (meshd's life)
    assert!(pipe.join("control").exists() && pipe.join("quit").exists());
    let again = MpsControl::start(Some(&mps)).unwrap();
    assert!(again.alive(), "a daemon on a reused --mps-dir runs");
    assert_eq!(again.servers().unwrap(), [4242], "and answers");
    again.quit();

    // The default directory is meshd's own, and removed at quit.
    let owned = MpsControl::start(None).unwrap();
    let dir = owned.root().to_path_buf();
    assert!(dir.ends_with(format!("meshd-mps.{}", std::process::id())));
    owned.quit();
    assert!(!dir.exists(), "{} removed at quit", dir.display());

    // Under an orphan grace the daemon is detached: a session of its own (a crash of meshd, or a
    // signal to its process group, does not reach it), its output in a file of its log directory.
    let survives = root.path().join("survives");
    let policy = |dir: &Path| OrphanPolicy {
        grace: Duration::from_secs(3),
        stop_deadline: Duration::ZERO,
        rendezvous_dir: dir.join("orphans"),
        control: fake.clone(),
    };
    let detached = MpsControl::start_in(survives.clone(), false, Some(policy(&survives))).unwrap();
    let pid = detached.pid().unwrap();
    assert_eq!(session_of(pid), pid, "the detached daemon leads its own session");
    let output = detached.log_dir().join(mesh_mps::control::DAEMON_OUTPUT);
    assert!(std::fs::read_to_string(&output).unwrap().contains("stand-in control daemon starting"));
    // meshd "dies" without quitting it: the next start on the directory quits it before its own.
    drop(detached);
    assert!(process_runs(pid), "the daemon outlived its meshd");
    let next = MpsControl::start_in(survives.clone(), false, Some(policy(&survives))).unwrap();
    assert!(!process_runs(pid), "the previous daemon was quit first");
    assert!(next.alive() && next.pid() != Some(pid));
    next.quit();
    assert!(std::fs::read_to_string(&output).unwrap().contains("stand-in control daemon quitting"));
}

/// The session id of process `pid`.
fn session_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit_once(')').unwrap().1.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// Whether `pid` runs (a zombie does not).
fn process_runs(pid: u32) -> bool {
    mesh_mps_worker::orphan::process_alive(pid)
}
