//! `meshd ps` says which channels lost messages with a device ring's slots, against the stand-in backend: the binary's table beside `info`, and `ps --json` in its old shape.

mod common;

use std::path::Path;
use std::process::Command;

use common::{ListBackend, PTX, ask, load_req};
use mesh_shm::Placement;
use meshd::protocol::Request;
use meshd::server::{Limits, Server};
use meshd::start::bind_socket;

/// `meshd --socket SOCKET ARGS…`'s standard output; it must succeed.
fn meshd(socket: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_meshd")).arg("--socket").arg(socket).args(args).output().unwrap();
    assert!(out.status.success(), "meshd {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn ps_names_a_channel_that_lost_messages_and_its_json_keeps_its_shape() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("sock");
    let mailbox = common::small_mailbox(dir.path());
    let server = Server::start(mailbox.clone(), Limits::default(), None, |mb| ListBackend::new(mb).opened()).unwrap();
    let listener = bind_socket(&socket).unwrap();
    let stop = server.stop_handle();
    let running = std::thread::spawn(move || server.run(listener).unwrap());

    mailbox.create_channel("h", 64, 16).unwrap();
    let dev = mailbox.create_channel_placed("dev", 64, 16, Placement::Device).unwrap();
    let kept = mailbox.create_channel_placed("kept", 64, 16, Placement::Device).unwrap();
    assert!(ask(&socket, &load_req("p", &["h"]), PTX).ok);
    let before = meshd(&socket, &["ps"]);
    assert!(before.contains("\np ") && !before.contains("lost"), "nothing said while nothing was lost:\n{before}");

    // A GPU producer had published head 12 and its consumer tail 5 when the ring was made anew (as a
    // backend does at a start or after a GPU fault): 7 messages lost; `kept` lost none.
    let (base, _) = mailbox.as_raw_parts();
    let ring = usize::try_from(dev.ring_offset).unwrap();
    // SAFETY: the ring's header lies inside the mapping; head (its first word) and tail (128 bytes
    // on, its own line) are 8-aligned words that only this test writes now.
    unsafe {
        (base.add(ring) as *mut u64).write_volatile(12);
        (base.add(ring + 128) as *mut u64).write_volatile(5);
    }
    assert_eq!(mailbox.renew_device_ring(&dev).unwrap(), 7);
    assert_eq!(mailbox.renew_device_ring(&kept).unwrap(), 0);

    let after = meshd(&socket, &["ps"]);
    let said: Vec<&str> = after.lines().filter(|l| l.contains("lost")).collect();
    assert_eq!(said.len(), 1, "one line, for the channel that lost messages:\n{after}");
    assert!(said[0].starts_with("channel dev (device): 7 message(s) lost"), "{}", said[0]);
    let program = after.lines().position(|l| l.starts_with("p ")).unwrap();
    let loss = after.lines().position(|l| l.starts_with("channel dev")).unwrap();
    assert!(program < loss, "after the programs:\n{after}");

    // `ps --json` is still an array of the programs' rows; the loss is in `info`.
    let rows: serde_json::Value = serde_json::from_str(&meshd(&socket, &["ps", "--json"])).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["name"], "p");
    let info = ask(&socket, &Request::Info, &[]).info.unwrap();
    let lost: Vec<(&str, u64)> = info.channels.iter().map(|c| (c.name.as_str(), c.lost)).collect();
    assert_eq!(lost, [("h", 0), ("dev", 7), ("kept", 0)]);

    stop.stop();
    assert!(running.join().unwrap(), "a clean stop");
}
