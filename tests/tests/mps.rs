//! MPS mode end to end: loads that halt no other program (a bystander's largest gap, beside blink mode),
//! no MPS client created during cycles, a load or upgrade past the pool refused (and with `--pool-grow`
//! the one stall it causes, measured and counted), the membership check, kill -9 leaving nothing, a
//! missing control binary refused, what a faulting program does to the others, and a stopped
//! (SIGSTOP) worker replaced alone.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use mesh_gpu_tests::harness::{Meshd, meshd_bin};
use mesh_gpu_tests::{program, programs_dir, require_gpu, wait_until};

fn ptx_file(name: &str) -> String {
    programs_dir().join(format!("{name}.ptx")).display().to_string()
}

/// Pids of running processes whose command name starts with `prefix` (from /proc/*/comm).
fn processes(prefix: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z'));
        if comm.trim().starts_with(prefix) && !zombie {
            out.push(pid);
        }
    }
    out
}

fn leftovers() -> Vec<(String, u32)> {
    // comm is cut to 15 characters: "nvidia-cuda-mps" covers the control daemon and the server.
    ["nvidia-cuda-mps", "mesh-mps-worker"]
        .iter()
        .flat_map(|p| processes(p).into_iter().map(|pid| (p.to_string(), pid)))
        .collect()
}

/// Our server's clients (sorted).
fn clients(pipe: &Path) -> Vec<u32> {
    mesh_gpu_tests::harness::mps_membership(pipe).1
}

/// `info`'s pool.
fn pool_info(d: &Meshd) -> serde_json::Value {
    let info: serde_json::Value = serde_json::from_str(&d.ok(&["info"])).unwrap();
    info["pool"].clone()
}

fn row<'a>(rows: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    rows.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("{name} not in ps: {rows:?}"))
}

fn ps(d: &Meshd) -> Vec<serde_json::Value> {
    serde_json::from_str(&d.ok(&["ps", "--json"])).unwrap()
}

/// The bystander's largest gap between iterations (ns), alone for `alone`, then during 50 cycles of
/// load / upgrade / unload of another program. Returns (alone, during, cycles' duration, bystander generations during).
fn bystander(d: &Meshd, alone: Duration) -> (u32, u32, Duration, u64) {
    let mailbox = d.mailbox();
    let gap = |d: &Meshd| {
        let slot = u32::try_from(row(&ps(d), "bystander")["slot"].as_u64().unwrap()).unwrap();
        mailbox.slot(slot).unwrap().user_words()[0]
    };
    d.ok(&["load", "bystander", &ptx_file("heartbeat")]);
    std::thread::sleep(alone);
    let gap_alone = gap(d);
    d.ok(&["unload", "bystander"]);
    d.ok(&["load", "bystander", &ptx_file("heartbeat")]);
    let g0 = row(&ps(d), "bystander")["generation"].as_u64().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let v2 = dir.path().join("v2.ptx");
    let mut bytes = program("heartbeat");
    bytes.extend_from_slice(b"\n// v2\n");
    std::fs::write(&v2, bytes).unwrap();
    let started = Instant::now();
    for _ in 0..50 {
        d.ok(&["load", "other", &ptx_file("heartbeat")]);
        d.ok(&["upgrade", "other", v2.to_str().unwrap()]);
        d.ok(&["unload", "other"]);
    }
    let took = started.elapsed();
    let rows = ps(d);
    let b = row(&rows, "bystander");
    assert_eq!(b["state"], "running");
    let generations = b["generation"].as_u64().unwrap() - g0;
    let gap_during = gap(d);
    d.ok(&["unload", "bystander"]);
    (gap_alone, gap_during, took, generations)
}

#[test]
fn mps_loads_halt_no_other_program_and_create_no_client() {
    require_gpu!("mps_loads_halt_no_other_program_and_create_no_client");
    assert!(leftovers().is_empty(), "MPS processes before the test: {:?}", leftovers());
    let dir = tempfile::tempdir().unwrap();
    let mps_dir = dir.path().join("mps");
    let d = Meshd::start(&["--isolation", "mps", "--pool", "3", "--mps-dir", mps_dir.to_str().unwrap()]);
    let pipe = mps_dir.join("pipe");
    let pool = clients(&pipe);
    assert_eq!(pool.len(), 3, "the pool's workers are our server's clients: {pool:?}\n{}", d.log_text());
    let (alone, during, took, generations) = bystander(&d, Duration::from_secs(2));
    let after = clients(&pipe);
    eprintln!(
        "MPS: bystander largest gap alone {:.1} µs, during 50 load/upgrade/unload cycles {:.1} µs (ratio {:.2}); cycles took {took:?}; bystander relaunched {generations} times",
        alone as f64 / 1e3,
        during as f64 / 1e3,
        during as f64 / alone.max(1) as f64
    );
    eprintln!(
        "MPS sized pool (--pool 3): goal during <= 2x alone: {}",
        if during <= 2 * alone { "met" } else { "NOT met" }
    );
    assert_eq!(generations, 0, "in MPS mode the bystander is never stopped by other programs' loads");
    assert_eq!(after, pool, "no MPS client was created during the cycles (pool {pool:?}, after {after:?})");
    let p = pool_info(&d);
    assert_eq!((p["stalls"].as_u64(), p["size"].as_u64()), (Some(0), Some(3)), "a sized pool never stalls: {p}");
    d.ok(&["shutdown"]);
    assert!(
        wait_until(Duration::from_secs(15), || leftovers().is_empty()),
        "left behind after shutdown: {:?}",
        leftovers()
    );

    let b = Meshd::start(&[]);
    let (alone, during, took, generations) = bystander(&b, Duration::from_secs(2));
    eprintln!(
        "blink: bystander largest gap alone {:.1} µs, during the same cycles {:.1} µs (ratio {:.2}); cycles took {took:?}; bystander relaunched {generations} times",
        alone as f64 / 1e3,
        during as f64 / 1e3,
        during as f64 / alone.max(1) as f64
    );
    assert!(
        generations >= 150,
        "in blink mode every load, upgrade and unload relaunches the bystander ({generations})"
    );
    b.ok(&["shutdown"]);
}

#[test]
fn a_worker_outside_our_server_is_refused() {
    require_gpu!("a_worker_outside_our_server_is_refused");
    // The worker's own check: started without meshd's pipe directory, it is no MPS client.
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let mb = mesh_shm::Mailbox::create(
        dir.path().join("mb"),
        &mesh_shm::MailboxConfig { size: 1 << 20, slots: 2, channels: 2 },
        mesh_shm::CreateMode::Exclusive,
    )
    .unwrap();
    let worker = meshd_bin().with_file_name("mesh-mps-worker");
    let out =
        Command::new(&worker).arg("--mailbox").arg(mb.path()).env_remove("CUDA_MPS_PIPE_DIRECTORY").output().unwrap();
    let first = String::from_utf8_lossy(&out.stdout);
    eprintln!("worker without our pipe directory: {first}");
    assert_eq!(out.status.code(), Some(1));
    assert!(first.contains("not an MPS client"), "{first}");
    // meshd's check: a process that is no client of our server is refused by name.
    let control = mesh_mps::MpsControl::start(Some(&dir.path().join("mps"))).unwrap();
    let mut stranger = Command::new("sleep").arg("30").spawn().unwrap();
    let err = control.check_client(stranger.id()).unwrap_err().to_string();
    eprintln!("membership check: {err}");
    assert!(err.contains(&stranger.id().to_string()) && err.contains("not a client of meshd's MPS server"), "{err}");
    let _ = stranger.kill();
    let _ = stranger.wait();
    control.quit();
    assert!(wait_until(Duration::from_secs(10), || leftovers().is_empty()), "{:?}", leftovers());
}

#[test]
fn kill_9_of_meshd_leaves_nothing_behind() {
    require_gpu!("kill_9_of_meshd_leaves_nothing_behind");
    assert!(leftovers().is_empty(), "MPS processes before the test: {:?}", leftovers());
    // Without an orphan grace: under one (the default) the programs run on by design (mps_adopt.rs).
    let mut d = Meshd::start(&["--isolation", "mps", "--pool", "2", "--orphan-grace-ms", "0"]);
    d.ok(&["load", "beat", &ptx_file("heartbeat")]);
    let before = leftovers();
    eprintln!("running: {before:?}");
    assert!(before.iter().filter(|(n, _)| n == "mesh-mps-worker").count() >= 2, "{before:?}");
    assert!(before.iter().any(|(n, _)| n == "nvidia-cuda-mps"), "{before:?}");
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    let gone = wait_until(Duration::from_secs(20), || leftovers().is_empty());
    assert!(gone, "left behind after kill -9 of meshd: {:?}", leftovers());
}

#[test]
fn a_missing_control_binary_is_refused_not_blinked() {
    require_gpu!("a_missing_control_binary_is_refused_not_blinked");
    let out = Command::new(meshd_bin())
        .args([
            "--socket",
            "/tmp/meshd-missing-mps.sock",
            "run",
            "--isolation",
            "mps",
            "--shm",
            "/dev/shm/meshd-missing-mps",
        ])
        .env("MESH_MPS_CONTROL", "/nonexistent/nvidia-cuda-mps-control")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("{err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("nvidia-cuda-mps-control not found"), "{err}");
    assert!(!err.contains("blink mode"), "no fallback: {err}");
    assert!(!Path::new("/dev/shm/meshd-missing-mps").exists(), "a refused start leaves no mailbox");
}

#[test]
fn a_faulting_program_is_left_stopped_and_the_others_relaunched() {
    require_gpu!("a_faulting_program_is_left_stopped_and_the_others_relaunched");
    let dir = tempfile::tempdir().unwrap();
    let mps_dir = dir.path().join("mps");
    let d = Meshd::start(&["--isolation", "mps", "--pool", "2", "--mps-dir", mps_dir.to_str().unwrap()]);
    d.ok(&["load", "beat", &ptx_file("heartbeat")]);
    std::thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    d.ok(&["load", "fault", &ptx_file("fault")]);
    // The fault reaches the clients some time after the launch; the watchdog notices it with no
    // request and recovers (ps reads the snapshot it publishes).
    let mut rows = ps(&d);
    let noticed = wait_until(Duration::from_secs(10), || {
        rows = ps(&d);
        row(&rows, "fault")["state"].as_str().unwrap().starts_with("faulted")
    });
    eprintln!("fault noticed and recovered from {:?} after its load", t.elapsed());
    assert!(noticed, "the fault was never noticed: {rows:?}\n{}", d.log_text());
    for r in &rows {
        eprintln!(
            "after the fault: {} {} generation {} (worker {})",
            r["name"], r["state"], r["generation"], r["worker_pid"]
        );
    }
    let fault = row(&rows, "fault")["state"].as_str().unwrap().to_string();
    assert!(
        fault.starts_with("faulted") && fault.contains("left stopped"),
        "the culprit is named and left stopped: {fault}\n{}",
        d.log_text()
    );
    let beat = row(&rows, "beat");
    assert_eq!(beat["state"], "running", "the other program was relaunched: {beat}\n{}", d.log_text());
    assert!(beat["generation"].as_u64().unwrap() >= 2, "{beat}");
    let h0 = beat["heartbeat"].as_u64().unwrap();
    assert!(
        wait_until(Duration::from_secs(2), || row(&ps(&d), "beat")["heartbeat"].as_u64().unwrap() > h0),
        "its heartbeat continues"
    );
    assert_eq!(clients(&mps_dir.join("pipe")).len(), 3, "the pool was refilled and beat has a worker");
    d.ok(&["unload", "fault"]);
    d.ok(&["unload", "beat"]);
    d.ok(&["shutdown"]);
    assert!(wait_until(Duration::from_secs(15), || leftovers().is_empty()), "{:?}", leftovers());
}

#[test]
fn a_program_that_ignores_stop_is_cut_off_and_the_others_live_on() {
    require_gpu!("a_program_that_ignores_stop_is_cut_off_and_the_others_live_on");
    // Three workers: beat's, stubborn's (discarded once cut off), and one for the load after.
    let d = Meshd::start(&["--isolation", "mps", "--pool", "3", "--stop-timeout-ms", "500"]);
    d.ok(&["load", "beat", &ptx_file("heartbeat")]);
    d.ok(&["load", "stubborn", &ptx_file("ignore_stop")]);
    let stubborn_worker = u32::try_from(row(&ps(&d), "stubborn")["worker_pid"].as_u64().unwrap()).unwrap();
    let t = Instant::now();
    d.ok(&["unload", "stubborn"]);
    eprintln!(
        "unload of a program that ignores stop took {:?} (deadline 500 ms, then terminate_client, then SIGKILL)",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    assert!(!processes("mesh-mps-worker").contains(&stubborn_worker), "its worker is gone");
    let rows = ps(&d);
    let beat = row(&rows, "beat");
    assert_eq!(beat["state"], "running", "the other program lives on: {beat}\n{}", d.log_text());
    let h0 = beat["heartbeat"].as_u64().unwrap();
    assert!(
        wait_until(Duration::from_secs(2), || row(&ps(&d), "beat")["heartbeat"].as_u64().unwrap() > h0),
        "and keeps beating"
    );
    // A fresh load still works, from the pool's last worker: the discarded one is not replaced
    // without --pool-grow (that would stall beat).
    d.ok(&["load", "again", &ptx_file("heartbeat")]);
    assert_eq!(pool_info(&d)["stalls"], 0, "{}", d.log_text());
    d.ok(&["shutdown"]);
    assert!(wait_until(Duration::from_secs(15), || leftovers().is_empty()), "{:?}", leftovers());
}

#[test]
fn an_empty_pool_refuses_and_growth_counts_the_stall_it_causes() {
    require_gpu!("an_empty_pool_refuses_and_growth_counts_the_stall_it_causes");
    assert!(leftovers().is_empty(), "MPS processes before the test: {:?}", leftovers());
    // Without --pool-grow: the second load, and an upgrade (it needs an idle worker), are refused.
    let d = Meshd::start(&["--isolation", "mps", "--pool", "1"]);
    d.ok(&["load", "bystander", &ptx_file("heartbeat")]);
    let err = d.refused(&["load", "second", &ptx_file("heartbeat")]);
    eprintln!("load past the pool: {err}");
    assert!(err.contains("load of \"second\" refused: the pool is empty (1 workers in use, --pool 1)"), "{err}");
    assert!(err.contains("stall every running program") && err.contains("--pool-grow"), "{err}");
    let err = d.refused(&["upgrade", "bystander", &ptx_file("heartbeat")]);
    eprintln!("upgrade with an empty pool: {err}");
    assert!(err.contains("an MPS upgrade loads the new image in another (idle) worker"), "{err}");
    assert!(err.contains("--pool-grow"), "{err}");
    let p = pool_info(&d);
    eprintln!("info's pool: {p}");
    assert_eq!((p["size"].as_u64(), p["idle"].as_u64(), p["in_use"].as_u64()), (Some(1), Some(0), Some(1)), "{p}");
    assert_eq!((p["stalls"].as_u64(), p["grow"].as_bool()), (Some(0), Some(false)), "{p}");
    let limit = p["client_limit"].as_u64().unwrap();
    assert!(limit == 48 || limit == 60, "{p}");
    assert_eq!(row(&ps(&d), "bystander")["state"], "running");
    d.ok(&["shutdown"]);
    assert!(wait_until(Duration::from_secs(15), || leftovers().is_empty()), "{:?}", leftovers());

    // With --pool-grow: the load creates a client; the bystander's largest gap shows the stall.
    let d = Meshd::start(&["--isolation", "mps", "--pool", "1", "--pool-grow"]);
    d.ok(&["load", "bystander", &ptx_file("heartbeat")]);
    let mailbox = d.mailbox();
    let gap = |d: &Meshd| {
        let slot = u32::try_from(row(&ps(d), "bystander")["slot"].as_u64().unwrap()).unwrap();
        mailbox.slot(slot).unwrap().user_words()[0]
    };
    std::thread::sleep(Duration::from_secs(2));
    let alone = gap(&d);
    let out = d.ok(&["load", "grown", &ptx_file("heartbeat")]);
    std::thread::sleep(Duration::from_millis(200));
    let after = gap(&d);
    eprintln!(
        "MPS --pool 1 --pool-grow: bystander largest gap alone {:.1} µs, after one client creation {:.1} µs (ratio {:.2})",
        alone as f64 / 1e3,
        after as f64 / 1e3,
        after as f64 / alone.max(1) as f64
    );
    eprintln!("the load's reply: {out}");
    assert!(out.contains("stalled 1 running program(s) (stall #1 of 1 since start)"), "{out}");
    let p = pool_info(&d);
    assert_eq!((p["stalls"].as_u64(), p["grow"].as_bool()), (Some(1), Some(true)), "{p}");
    let g = &p["recent"][0];
    assert_eq!(
        (g["program"].as_str(), g["op"].as_str(), g["stalled"].as_u64()),
        (Some("grown"), Some("load"), Some(1)),
        "{p}"
    );
    let table = d.ok(&["ps"]);
    assert!(table.contains("1 MPS client creation(s) stalled the running programs"), "{table}");
    // Back in the pool after the unload: the next load and an upgrade create nothing.
    d.ok(&["unload", "grown"]);
    d.ok(&["load", "again", &ptx_file("heartbeat")]);
    d.ok(&["unload", "again"]);
    let out = d.ok(&["upgrade", "bystander", &ptx_file("heartbeat")]);
    assert!(!out.contains("stalled"), "{out}");
    assert_eq!(pool_info(&d)["stalls"], 1, "{}", d.log_text());
    assert!(d.log_text().contains("stall #1 since start"), "the log says so:\n{}", d.log_text());
    d.ok(&["shutdown"]);
    assert!(wait_until(Duration::from_secs(15), || leftovers().is_empty()), "{:?}", leftovers());
}

#[test]
fn a_stopped_worker_is_replaced_alone_and_the_others_run_on() {
    require_gpu!("a_stopped_worker_is_replaced_alone_and_the_others_run_on");
    let d = Meshd::start(&["--isolation", "mps", "--pool", "3", "--mps-kernel-check-us", "2000"]);
    assert!(
        d.log_text().contains("checks a running kernel's stream every 2000 µs"),
        "each worker runs with the period meshd was given: {}",
        d.log_text()
    );
    d.ok(&["load", "beat", &ptx_file("heartbeat")]);
    d.ok(&["load", "victim", &ptx_file("heartbeat")]);
    let rows = ps(&d);
    let worker = u32::try_from(row(&rows, "victim")["worker_pid"].as_u64().unwrap()).unwrap();
    let beat_generation = row(&rows, "beat")["generation"].as_u64().unwrap();
    let t = Instant::now();
    let stopped = Command::new("kill").args(["-STOP", &worker.to_string()]).status().unwrap();
    assert!(stopped.success());
    // Its kernel runs on while its worker is stopped; the watchdog hears no `alive` for 3 s.
    let mut rows = ps(&d);
    let replaced = wait_until(Duration::from_secs(20), || {
        rows = ps(&d);
        let v = row(&rows, "victim");
        v["state"] == "running" && v["worker_pid"].as_u64() != Some(u64::from(worker))
    });
    eprintln!("stopped worker {worker} replaced {:?} after its SIGSTOP (bound 3 s)", t.elapsed());
    assert!(replaced, "the stopped worker was never replaced: {rows:?}\n{}", d.log_text());
    let log = d.log_text();
    assert!(
        log.lines().any(|l| l.contains(&format!("MPS worker {worker} of program victim was silent for"))),
        "the log names the worker, the program and the silence: {log}"
    );
    assert!(
        wait_until(Duration::from_secs(5), || !processes("mesh-mps-worker").contains(&worker)),
        "the stopped worker is killed"
    );
    let beat = row(&rows, "beat");
    assert_eq!(
        beat["generation"].as_u64(),
        Some(beat_generation),
        "the other program was not relaunched: {beat}\n{log}"
    );
    for name in ["beat", "victim"] {
        let h0 = row(&ps(&d), name)["heartbeat"].as_u64().unwrap();
        assert!(
            wait_until(Duration::from_secs(2), || row(&ps(&d), name)["heartbeat"].as_u64().unwrap() > h0),
            "{name} beats after the replacement\n{log}"
        );
    }
    d.ok(&["shutdown"]);
    assert!(wait_until(Duration::from_secs(15), || leftovers().is_empty()), "{:?}", leftovers());
}

#[test]
fn a_programs_own_sms_are_kept_across_an_upgrade_and_not_handed_on_after_its_unload() {
    require_gpu!("a_programs_own_sms_are_kept_across_an_upgrade_and_not_handed_on_after_its_unload");
    assert!(leftovers().is_empty(), "MPS processes before the test: {:?}", leftovers());
    // No global --sms: the pool's workers have the whole GPU; `small` asks 16 SMs of its own.
    let d = Meshd::start(&["--isolation", "mps", "--pool", "1", "--pool-grow"]);
    let sms = |d: &Meshd, name: &str| row(&ps(d), name)["sms"].as_u64();
    d.ok(&["load", "small", &ptx_file("heartbeat"), "--sms", "16"]);
    let own = sms(&d, "small");
    eprintln!("small loaded with --sms 16: ps says sms {own:?}");
    assert!(own.is_some_and(|n| (16..132).contains(&n)), "a green context of about 16 SMs: {own:?}");
    // An upgrade loads the new image in another worker: one with the same 16 SMs, not the pool's.
    d.ok(&["upgrade", "small", &ptx_file("heartbeat")]);
    assert_eq!(sms(&d, "small"), own, "the upgrade kept small's own SMs");
    assert_eq!(row(&ps(&d), "small")["state"], "running");
    // Its 16-SM worker goes back to the pool at the unload; a later whole-GPU load must not take it.
    d.ok(&["unload", "small"]);
    d.ok(&["load", "whole", &ptx_file("heartbeat")]);
    assert_eq!(sms(&d, "whole"), None, "a program without --sms has the whole GPU, not small's old worker");
    d.ok(&["shutdown"]);
    assert!(wait_until(Duration::from_secs(15), || leftovers().is_empty()), "{:?}", leftovers());
}
