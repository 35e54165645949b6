//! Declared bindings (mesh.cuh's `MESH_BINDINGS`), in both modes: a load bound to a channel of another protocol is refused naming the binding, with nothing changed, and the same program bound rightly runs.
//!
//! `declared_bindings.cu` declares an LL channel and a bulk one; `service_x_simple.cu` a fan-in and a
//! group (a service). The wrong loads: a 64 KiB LL channel where the bulk end belongs (64 KiB is LL
//! unless created with `--protocol bulk`), and the fan-in bound again where the group belongs.

use std::time::Duration;

use mesh_backend::ImageKind;
use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::{Fixture, program, programs_dir, require_gpu, wait_until};

fn ptx(name: &str) -> String {
    programs_dir().join(format!("{name}.ptx")).display().to_string()
}

fn start(mps: bool, dir: &std::path::Path) -> Meshd {
    let mut args = vec!["--channels", "64", "--shm-size", "256M"];
    let mps_dir = dir.join("mps");
    if mps {
        args.extend(["--isolation", "mps", "--pool", "2", "--mps-dir", mps_dir.to_str().unwrap()]);
    }
    Meshd::start(&args)
}

/// The programs `ps` lists, by name.
fn names(d: &Meshd) -> Vec<String> {
    d.heartbeats().into_iter().map(|(name, _, _)| name).collect()
}

/// Waits until `name` runs with a heartbeat that moves.
fn runs(d: &Meshd, name: &str) {
    let beat = |d: &Meshd| d.heartbeats().into_iter().find(|(n, _, _)| n == name).map_or(0, |(_, b, _)| b);
    let first = {
        let mut b = 0;
        assert!(
            wait_until(Duration::from_secs(20), || {
                b = beat(d);
                b > 0
            }),
            "{name} never beat:\n{}",
            d.log_text()
        );
        b
    };
    assert!(wait_until(Duration::from_secs(20), || beat(d) > first), "{name}'s heartbeat stopped at {first}");
}

fn declared_bindings_are_checked_at_load(mps: bool) {
    let dir = tempfile::tempdir().unwrap();
    let d = start(mps, dir.path());
    let mode = if mps { "mps" } else { "blink" };
    d.ok(&["channel", "create", "small", "--msg-size", "64"]);
    d.ok(&["channel", "create", "big", "--msg-size", "65536", "--capacity", "4"]);
    d.ok(&["channel", "create", "blk", "--msg-size", "65536", "--capacity", "4", "--protocol", "bulk"]);
    d.ok(&["load", "bystander", &ptx("heartbeat")]);
    runs(&d, "bystander");

    // A bulk end on an LL channel: refused, naming the binding, and nothing changes.
    let err = d.refused(&["load", "p", &ptx("declared_bindings"), "--bind", "small", "--bind", "big"]);
    assert!(
        err.contains("binding 1 (`big`): the program expects a bulk channel, `big` is an LL channel"),
        "{mode}: {err}"
    );
    assert_eq!(names(&d), vec!["bystander".to_string()], "{mode}: a refused load left a program behind");
    runs(&d, "bystander");
    // Too few channels: refused too.
    let err = d.refused(&["load", "p", &ptx("declared_bindings"), "--bind", "small"]);
    assert!(err.contains("binding 1: the program expects a bulk channel"), "{mode}: {err}");

    // Bound rightly, it runs and sees the protocols it declared.
    d.ok(&["load", "p", &ptx("declared_bindings"), "--bind", "small", "--bind", "blk"]);
    runs(&d, "p");
    let mb = d.mailbox();
    assert_eq!(d.user_words(&mb, "p")[0], 1 << 4, "{mode}: binding 0 LL (0), binding 1 bulk (1)");
    d.ok(&["unload", "p"]);

    // A service whose group binding is given the fan-in: refused; bound rightly over a grid, it runs.
    d.ok(&["service", "create", "svc", "--clients", "4", "--msg-size", "64", "--shards", "2"]);
    let err = d.refused(&["load", "s", &ptx("service_x_simple"), "--bind", "svc", "--bind", "svc"]);
    assert!(
        err.contains("binding 1 (`svc`): the program expects a channel group, `svc` is a fan-in channel"),
        "{mode}: {err}"
    );
    d.ok(&[
        "load",
        "s",
        &ptx("service_x_simple"),
        "--grid",
        "4",
        "--block",
        "64",
        "--bind",
        "svc",
        "--bind",
        "svc.replies",
    ]);
    runs(&d, "s");
    d.ok(&["unload", "s"]);
    runs(&d, "bystander");
}

#[test]
fn a_wrong_protocol_binding_is_refused_in_blink_mode() {
    require_gpu!("a_wrong_protocol_binding_is_refused_in_blink_mode");
    declared_bindings_are_checked_at_load(false);
}

#[test]
fn a_wrong_protocol_binding_is_refused_in_mps_mode() {
    require_gpu!("a_wrong_protocol_binding_is_refused_in_mps_mode");
    declared_bindings_are_checked_at_load(true);
}

/// The table nvcc and nvJitLink make of `MESH_BINDINGS` is where meshd reads it: the linked cubin's
/// symbol `mesh_bindings`, with its initial bytes, read without a GPU; a program without it declares
/// nothing.
#[test]
fn the_declared_table_is_read_from_the_linked_cubin() {
    require_gpu!("the_declared_table_is_read_from_the_linked_cubin");
    let f = Fixture::new();
    let linked = f.jit.link("declared_bindings", program("declared_bindings"), ImageKind::Ptx).unwrap();
    assert_eq!(mesh_cuda::bindings::declared(&linked.cubin), Ok(Some(vec![0, 1])), "LL, then bulk");
    let service = f.jit.link("service_x_simple", program("service_x_simple"), ImageKind::Ptx).unwrap();
    assert_eq!(mesh_cuda::bindings::declared(&service.cubin), Ok(Some(vec![3, 4])), "fan-in, then group");
    let plain = f.jit.link("heartbeat", program("heartbeat"), ImageKind::Ptx).unwrap();
    assert_eq!(mesh_cuda::bindings::declared(&plain.cubin), Ok(None));
}
