//! Deleting channels and services from C: `mesh_channel_delete` and `mesh_service_delete` against meshd's own control plane (a stand-in backend, in this process), through the extern "C" functions and from a C program compiled against `mesh_shm.h`.

mod common;
use common::last_error;

use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::{null, null_mut};
use std::thread::JoinHandle;
use std::time::Duration;

use mesh_shm::{CreateMode, Mailbox, MailboxConfig, Producer};
use mesh_shm_c::*;
use serde_json::{Value, json};

/// A deadline for what takes milliseconds (never a measurement).
const PATIENCE: Duration = Duration::from_secs(30);

/// meshd's control plane over a stand-in backend, on a socket in `dir`, served by a thread of this process.
struct Meshd {
    socket: PathBuf,
    socket_c: CString,
    mailbox: Mailbox,
    stop: meshd::server::StopHandle,
    thread: Option<JoinHandle<()>>,
}

impl Meshd {
    fn start(dir: &Path) -> Self {
        let socket = dir.join("sock");
        let config = MailboxConfig { size: 4 << 20, slots: 8, channels: 8 };
        let mailbox = Mailbox::create(dir.join("mailbox"), &config, CreateMode::Exclusive).expect("mailbox");
        let server = meshd::server::Server::start(mailbox.clone(), meshd::server::Limits::default(), None, |mb| {
            Ok(meshd::server::Opened {
                backend: Box::new(meshd::stand_in::StandInBackend::new(mb)),
                device: "stand-in (no GPU)".into(),
                arch: None,
            })
        })
        .expect("meshd's control plane");
        let listener = meshd::start::bind_socket(&socket).expect("the control socket");
        let stop = server.stop_handle();
        let thread = std::thread::spawn(move || {
            server.run(listener).expect("meshd's control plane ran");
        });
        let socket_c = CString::new(socket.to_str().expect("a UTF-8 path")).expect("no NUL");
        Self { socket, socket_c, mailbox, stop, thread: Some(thread) }
    }

    /// One request line and meshd's answer, which must be a success.
    fn call(&self, request: Value) {
        let conn = UnixStream::connect(&self.socket).expect("meshd answers");
        conn.set_read_timeout(Some(PATIENCE)).expect("timeout");
        (&conn).write_all(format!("{request}\n").as_bytes()).expect("request written");
        let mut line = String::new();
        BufReader::new(&conn).read_line(&mut line).expect("answer read");
        let answer: Value = serde_json::from_str(&line).expect("a JSON answer");
        assert_eq!(answer["ok"], true, "{answer}");
    }

    fn channel_create(&self, name: &str) {
        self.call(json!({"op": "channel_create", "name": name, "msg_size": 64, "capacity": 16}));
    }

    fn service_create(&self, name: &str) {
        self.call(json!({"op": "service_create", "name": name, "clients": 2, "msg_size": 64, "capacity": 16,
                         "reply_capacity": 4}));
    }

    /// Puts `n` messages on channel `name` and lets its producer end go.
    fn fill(&self, name: &str, n: u8) {
        let mut tx = Producer::claim(&self.mailbox, name).expect("the producer end");
        for i in 0..n {
            assert!(tx.try_send(&[i; 64]).expect("a send"));
        }
    }
}

impl Drop for Meshd {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn channels_and_services_are_deleted_and_refusals_carry_meshds_reason() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = Meshd::start(dir.path());
    meshd.channel_create("jobs");
    meshd.fill("jobs", 3);
    let mut discarded = u64::MAX;
    // SAFETY: NUL-terminated strings; `discarded` is writable.
    let st = unsafe { mesh_channel_delete(meshd.socket_c.as_ptr(), c"jobs".as_ptr(), 0, &raw mut discarded) };
    assert_eq!(st, MESH_ERR_REFUSED);
    assert!(last_error().contains("3 message"), "{}", last_error());
    assert_eq!(discarded, u64::MAX, "nothing is written on a refusal");
    // SAFETY: as above.
    let st = unsafe { mesh_channel_delete(meshd.socket_c.as_ptr(), c"jobs".as_ptr(), 1, &raw mut discarded) };
    assert_eq!((st, discarded), (MESH_OK, 3), "{}", last_error());
    assert!(meshd.mailbox.channel("jobs").is_err(), "gone from the mailbox");
    meshd.channel_create("jobs");
    // SAFETY: NUL-terminated strings; a NULL count is not written.
    let st = unsafe { mesh_channel_delete(meshd.socket_c.as_ptr(), c"jobs".as_ptr(), 0, null_mut()) };
    assert_eq!(st, MESH_OK, "{}", last_error());
    // SAFETY: as above.
    let st = unsafe { mesh_channel_delete(meshd.socket_c.as_ptr(), c"jobs".as_ptr(), 0, null_mut()) };
    assert_eq!(st, MESH_ERR_REFUSED);
    assert!(last_error().contains("jobs"), "{}", last_error());

    meshd.service_create("kv");
    let mut svc = null_mut();
    // SAFETY: NUL-terminated strings; `svc` is writable.
    assert_eq!(unsafe { mesh_service_connect(meshd.socket_c.as_ptr(), c"kv".as_ptr(), &raw mut svc) }, MESH_OK);
    // SAFETY: as above.
    let st = unsafe { mesh_service_delete(meshd.socket_c.as_ptr(), c"kv".as_ptr(), 1, &raw mut discarded) };
    assert_eq!(st, MESH_ERR_REFUSED);
    assert!(last_error().contains(&format!("pid {}", std::process::id())), "{}", last_error());
    // SAFETY: connected above, closed once.
    unsafe { mesh_service_close(svc) };
    // SAFETY: as above.
    let st = unsafe { mesh_service_delete(meshd.socket_c.as_ptr(), c"kv".as_ptr(), 0, &raw mut discarded) };
    assert_eq!((st, discarded), (MESH_OK, 0), "{}", last_error());

    // SAFETY: a NULL name is refused, never read.
    assert_eq!(unsafe { mesh_service_delete(meshd.socket_c.as_ptr(), null(), 0, null_mut()) }, MESH_ERR_NULL);
    let gone = CString::new(dir.path().join("no.sock").to_str().unwrap()).unwrap();
    // SAFETY: NUL-terminated strings.
    let st = unsafe { mesh_channel_delete(gone.as_ptr(), c"jobs".as_ptr(), 0, null_mut()) };
    assert_eq!(st, MESH_ERR_UNREACHABLE, "{}", last_error());
}

#[test]
fn a_c_program_deletes_a_channel_and_a_service() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = common::build_c_program("delete", dir.path()) else { return };
    let meshd = Meshd::start(dir.path());
    meshd.channel_create("jobs");
    meshd.fill("jobs", 2);
    meshd.service_create("kv");
    let run = |channel: &str, service: &str| {
        Command::new(&exe).args([meshd.socket.to_str().unwrap(), channel, service]).output().unwrap()
    };
    let out = run("jobs", "kv");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout, "channel 2\nservice 0\n");
    let out = run("jobs", "kv");
    assert_eq!(out.status.code(), Some(2), "both are gone");
    assert!(String::from_utf8_lossy(&out.stderr).contains("jobs"), "{}", String::from_utf8_lossy(&out.stderr));
}
