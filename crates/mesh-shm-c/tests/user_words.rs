//! A program's user words from C: `mesh_program_user_words` by name through meshd's own control plane (a stand-in backend, in this process) and `mesh_shm_user_words` by slot from the mapped mailbox, through the extern "C" functions and from a C program compiled against `mesh_shm.h`.

mod common;
use common::last_error;

use std::ffi::{CStr, CString};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::null;
use std::thread::JoinHandle;
use std::time::Duration;

use mesh_shm::{CreateMode, Mailbox, MailboxConfig};
use mesh_shm_c::*;
use serde_json::Value;

/// A deadline for what takes milliseconds (never a measurement).
const PATIENCE: Duration = Duration::from_secs(30);

/// A tiny PTX image (enough for the stand-in backend's load).
const PTX: &[u8] = b".version 8.0\n.target sm_90\n";

/// meshd's control plane over a stand-in backend, on a socket in `dir`, served by a thread of this process.
struct Meshd {
    socket: PathBuf,
    socket_c: CString,
    mailbox: PathBuf,
    stop: meshd::server::StopHandle,
    thread: Option<JoinHandle<()>>,
}

impl Meshd {
    fn start(dir: &Path) -> Self {
        let (socket, mailbox) = (dir.join("sock"), dir.join("mailbox"));
        let config = MailboxConfig { size: 1 << 20, slots: 8, channels: 8 };
        let mb = Mailbox::create(&mailbox, &config, CreateMode::Exclusive).expect("mailbox");
        let server = meshd::server::Server::start(mb, meshd::server::Limits::default(), None, |mb| {
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

    /// Loads a program of the stand-in PTX; its slot.
    fn load(&self, name: &str) -> u32 {
        let conn = UnixStream::connect(&self.socket).expect("meshd answers");
        conn.set_read_timeout(Some(PATIENCE)).expect("timeout");
        let request = serde_json::json!({"op": "load", "name": name, "image_len": PTX.len(), "grid": [1, 1, 1],
                                         "block": [32, 1, 1], "shared_mem": 0, "bind": [], "sms": null});
        (&conn).write_all(format!("{request}\n").as_bytes()).expect("request written");
        (&conn).write_all(PTX).expect("image written");
        let mut line = String::new();
        BufReader::new(&conn).read_line(&mut line).expect("answer read");
        let answer: Value = serde_json::from_str(&line).expect("a JSON answer");
        assert_eq!(answer["ok"], true, "{answer}");
        u32::try_from(answer["programs"][0]["slot"].as_u64().expect("a slot")).unwrap()
    }

    /// Stores user word `i` of program slot `slot` through the file (the page cache every mapping
    /// shares), as the program's `mesh_user_store` would.
    fn store(&self, slot: u32, i: u64, v: u32) {
        let mb = Mailbox::open(&self.mailbox).unwrap();
        let at = mb.slot(slot).unwrap().offset() + core::mem::offset_of!(mesh_shm::layout::Slot, user) as u64;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.mailbox)
            .unwrap()
            .write_all_at(&v.to_le_bytes(), at + 4 * i)
            .unwrap();
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

fn user_words(meshd: &Meshd, program: &CStr, count: u32) -> Result<Vec<u32>, (MeshStatus, String)> {
    let mut words = vec![u32::MAX; count as usize];
    // SAFETY: NUL-terminated strings; `words` holds `count` u32s.
    let st = unsafe { mesh_program_user_words(meshd.socket_c.as_ptr(), program.as_ptr(), words.as_mut_ptr(), count) };
    if st == MESH_OK { Ok(words) } else { Err((st, last_error())) }
}

#[test]
fn user_words_are_read_by_name_through_meshd_and_by_slot_from_the_mailbox() {
    let dir = tempfile::tempdir().unwrap();
    let meshd = Meshd::start(dir.path());
    let slot = meshd.load("counter");
    assert_eq!(user_words(&meshd, c"counter", MESH_USER_WORDS).unwrap(), vec![0; 32], "a fresh slot's words");
    meshd.store(slot, 0, 7);
    meshd.store(slot, 1, 0xdead_beef);
    meshd.store(slot, 31, 5);
    let words = user_words(&meshd, c"counter", MESH_USER_WORDS).unwrap();
    assert_eq!((words[0], words[1], words[2], words[31]), (7, 0xdead_beef, 0, 5));
    // Fewer than all: the first `count`, nothing written past them.
    assert_eq!(user_words(&meshd, c"counter", 2).unwrap(), vec![7, 0xdead_beef]);

    let (st, why) = user_words(&meshd, c"nothing", 4).unwrap_err();
    assert_eq!(st, MESH_ERR_REFUSED);
    assert_eq!(why, "program \"nothing\": not loaded (loaded: counter)");
    assert_eq!(user_words(&meshd, c"counter", 33).unwrap_err().0, MESH_ERR_ARG);
    let mut w = [0u32; 1];
    // SAFETY: a NULL program is refused, never read.
    let st = unsafe { mesh_program_user_words(meshd.socket_c.as_ptr(), null(), w.as_mut_ptr(), 1) };
    assert_eq!(st, MESH_ERR_NULL);
    let gone = CString::new(dir.path().join("no.sock").to_str().unwrap()).unwrap();
    // SAFETY: NUL-terminated strings; `w` holds one u32.
    let st = unsafe { mesh_program_user_words(gone.as_ptr(), c"counter".as_ptr(), w.as_mut_ptr(), 1) };
    assert_eq!(st, MESH_ERR_UNREACHABLE, "{}", last_error());

    // By slot, from the mapped mailbox: no meshd asked.
    let path = CString::new(meshd.mailbox.to_str().unwrap()).unwrap();
    let mut mb = std::ptr::null_mut();
    // SAFETY: a NUL-terminated path; `mb` is writable.
    assert_eq!(unsafe { mesh_shm_open(path.as_ptr(), &raw mut mb) }, MESH_OK, "{}", last_error());
    let mut words = [0u32; 32];
    // SAFETY: a live mailbox; `words` holds 32 u32s.
    assert_eq!(unsafe { mesh_shm_user_words(mb, slot, words.as_mut_ptr(), 32) }, MESH_OK, "{}", last_error());
    assert_eq!((words[0], words[1], words[31]), (7, 0xdead_beef, 5));
    // SAFETY: as above; slot 8 is past the 8-slot table.
    assert_eq!(unsafe { mesh_shm_user_words(mb, 8, words.as_mut_ptr(), 32) }, MESH_ERR_ARG);
    assert!(last_error().contains('8'), "{}", last_error());
    // SAFETY: opened above, closed once.
    unsafe { mesh_shm_close(mb) };
}

#[test]
fn a_c_program_reads_a_programs_user_words() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = common::build_c_program("user_words", dir.path()) else { return };
    let meshd = Meshd::start(dir.path());
    let slot = meshd.load("counter");
    meshd.store(slot, 0, 41);
    meshd.store(slot, 2, 3);
    let run = |program: &str| {
        Command::new(&exe)
            .args([meshd.socket.to_str().unwrap(), program, meshd.mailbox.to_str().unwrap(), &slot.to_string()])
            .output()
            .unwrap()
    };
    let out = run("counter");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout, "name 41 0 3\nslot 41 0 3\n");
    let out = run("nothing");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not loaded (loaded: counter)"));
}
