//! meshd's command line without a GPU: clear refusals, and exit codes a script can rely on.

use std::process::Command;

fn meshd(args: &[&str]) -> std::process::Output {
    // A directory that is there (`meshd run` refuses a socket in a missing one before anything
    // else), with no socket in it (clients find no daemon).
    let dir = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_meshd"))
        .env("MESHD_SOCKET", dir.path().join("no.sock"))
        .args(args)
        .output()
        .unwrap()
}

fn has_gpu_driver() -> bool {
    mesh_cuda::Device::get(0).is_ok()
}

#[test]
fn run_without_a_driver_exits_at_once_naming_what_is_missing() {
    if has_gpu_driver() {
        eprintln!("SKIPPED run_without_a_driver_exits_at_once_naming_what_is_missing: this machine has a GPU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("mb");
    let started = std::time::Instant::now();
    let out = meshd(&["run", "--shm", shm.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("libcuda") || err.contains("no usable GPU"), "{err}");
    assert!(started.elapsed().as_secs() < 10);
    assert!(!shm.exists(), "nothing is created before the GPU check");
}

#[test]
fn mps_mode_without_a_driver_is_refused_without_falling_back() {
    if has_gpu_driver() {
        eprintln!("SKIPPED mps_mode_without_a_driver_is_refused_without_falling_back: this machine has a GPU");
    } else {
        let out = meshd(&["run", "--isolation", "mps"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("libcuda"), "{err}");
        assert!(!err.contains("blink mode"), "no fallback: {err}");
    }
    let out = meshd(&["run", "--isolation", "fast"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "bad usage: {err}");
    assert!(err.contains("invalid value 'fast'") && err.contains("[possible values: blink, mps]"), "{err}");
}

#[test]
fn clients_without_a_daemon_exit_3() {
    for args in [&["ps"][..], &["unload", "x"], &["info"], &["shutdown"], &["send", "c", "hi"]] {
        let out = meshd(args);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach meshd"));
    }
}

#[test]
fn bad_usage_exits_2_and_a_missing_image_exits_1() {
    assert_eq!(meshd(&["load", "x", "img", "--grid", "1,zero"]).status.code(), Some(2));
    assert_eq!(meshd(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(meshd(&["run", "--shm-size", "lots"]).status.code(), Some(2));
    let out = meshd(&["load", "x", "/nonexistent/image.ptx"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/image.ptx"));
}

#[test]
fn run_help_names_fresh_and_the_old_flag_still_parses() {
    let help = String::from_utf8_lossy(&meshd(&["run", "--help"]).stdout).into_owned();
    assert!(help.contains("--fresh") && help.contains("--state-dir"), "{help}");
    assert!(!help.contains("--replace-shm "), "the old name is a hidden alias: {help}");
    // The alias parses (the start then fails for another reason, never as bad usage).
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("mb");
    let out = meshd(&[
        "run",
        "--replace-shm",
        "--shm",
        shm.to_str().unwrap(),
        "--state-dir",
        dir.path().join("s").to_str().unwrap(),
    ]);
    assert_ne!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn channel_create_names_its_protocols_and_refuses_others() {
    let help = String::from_utf8_lossy(&meshd(&["channel", "create", "--help"]).stdout).into_owned();
    assert!(help.contains("--protocol") && help.contains("bulk") && help.contains("16777216"), "{help}");
    let out = meshd(&["channel", "create", "c", "--msg-size", "1048576", "--protocol", "simple"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "bad usage: {err}");
    assert!(err.contains("[possible values: ll, bulk, index]"), "{err}");
    // A valid request gets as far as the socket (no daemon here).
    let out = meshd(&["channel", "create", "c", "--msg-size", "1048576", "--capacity", "4", "--protocol", "bulk"]);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_mps_kernel_check_period_says_its_trade_and_refuses_what_is_out_of_range() {
    let help = String::from_utf8_lossy(&meshd(&["run", "--help"]).stdout).into_owned();
    assert!(
        help.contains("--mps-kernel-check-us") && help.contains("[default: 5000]") && help.contains("CPU"),
        "{help}"
    );
    for bad in ["0", "49", "200001", "1ms"] {
        let out = meshd(&["run", "--isolation", "mps", "--mps-kernel-check-us", bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--mps-kernel-check-us"), "the refusal names the option: {err}");
    }
    // In range it parses (the start then fails for another reason here, never as bad usage).
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("mb");
    let out = meshd(&["run", "--isolation", "mps", "--mps-kernel-check-us", "5000", "--shm", shm.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_device_flag_outranks_meshd_socket_from_the_environment_and_a_socket_flag_outranks_both() {
    // A whole UUID names the GPU without a driver, so the socket it means is known here.
    let uuid = "GPU-12345678-1234-1234-1234-123456789abc";
    let said = |args: &[&str]| String::from_utf8_lossy(&meshd(args).stderr).into_owned();
    let err = said(&["--device", uuid, "ps"]);
    assert!(err.contains(&format!("meshd-{uuid}.sock")), "--device beats MESHD_SOCKET: {err}");
    let err = said(&["ps", "--device", uuid]);
    assert!(err.contains(&format!("meshd-{uuid}.sock")), "after the subcommand too: {err}");
    let err = said(&["--socket", "/nonexistent/flag.sock", "--device", uuid, "ps"]);
    assert!(err.contains("/nonexistent/flag.sock"), "--socket beats --device: {err}");
    let err = said(&["ps"]);
    assert!(err.contains("no.sock"), "MESHD_SOCKET without a flag: {err}");
}

#[test]
fn an_image_above_the_limit_is_refused_by_its_path_without_being_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.ptx");
    // Sparse: 257 MiB on paper, nothing on disk.
    std::fs::File::create(&big).unwrap().set_len((256 << 20) + (1 << 20)).unwrap();
    for target in [big.to_str().unwrap(), "/dev/zero"] {
        let out = meshd(&["load", "x", target]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{target}: {err}");
        assert!(err.contains(target) && err.contains("larger than 256 MiB"), "{target}: {err}");
    }
}

#[test]
fn a_stop_timeout_below_what_a_program_can_meet_is_bad_usage() {
    let out = meshd(&["run", "--stop-timeout-ms", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--stop-timeout-ms"), "{err}");
}

#[test]
fn mps_options_in_blink_mode_are_refused_by_name_not_ignored() {
    let out = meshd(&["run", "--pool", "4", "--standby", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--pool, --standby apply to MPS mode only") && err.contains("--isolation mps"), "{err}");
    let out = meshd(&["run", "--pool-grow"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--pool-grow applies to MPS mode only"), "{err}");
}
