//! What a user reads back from meshd without a GPU: a program's user words (`ps --json`, `meshd user`) and a bulk channel's default capacity, through the CLI against a stand-in backend.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread::JoinHandle;

use common::{ListBackend, PTX, ask, load_req, poke};
use mesh_shm::{CreateMode, Mailbox, MailboxConfig};
use meshd::protocol::{Request, USER_WORDS};
use meshd::server::{Limits, Server, StopHandle};
use meshd::start::bind_socket;

struct Running {
    socket: PathBuf,
    mailbox: Mailbox,
    stop: StopHandle,
    server: Option<JoinHandle<bool>>,
    _dir: tempfile::TempDir,
}

impl Running {
    /// A server over a new mailbox of `size` bytes.
    fn start(size: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sock");
        let mailbox = Mailbox::create(
            dir.path().join("mb"),
            &MailboxConfig { size, slots: 8, channels: 8 },
            CreateMode::Exclusive,
        )
        .unwrap();
        let server =
            Server::start(mailbox.clone(), Limits::default(), None, |mb| ListBackend::new(mb).opened()).unwrap();
        let listener = bind_socket(&socket).unwrap();
        let stop = server.stop_handle();
        let server = Some(std::thread::spawn(move || server.run(listener).unwrap()));
        Self { socket, mailbox, stop, server, _dir: dir }
    }

    fn meshd(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_meshd")).arg("--socket").arg(&self.socket).args(args).output().unwrap()
    }

    /// Stores user words `w0` and `w1` of program slot `slot`, as its kernel's `mesh_user_store` would.
    fn store_user_pair(&self, slot: u32, w0: u32, w1: u32) {
        let at = self.mailbox.slot(slot).unwrap().offset() + core::mem::offset_of!(mesh_shm::layout::Slot, user) as u64;
        poke(&self.mailbox, at, u64::from(w0) | u64::from(w1) << 32);
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

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn socket_of(d: &Running) -> &Path {
    &d.socket
}

#[test]
fn a_programs_user_words_are_in_ps_and_in_meshd_user() {
    let d = Running::start(1 << 20);
    assert!(ask(socket_of(&d), &load_req("counter", &[]), PTX).ok);
    let slot = ask(socket_of(&d), &Request::Ps, &[]).programs.unwrap()[0].slot;
    d.store_user_pair(slot, 7, 0xdead_beef);

    let row = &ask(socket_of(&d), &Request::Ps, &[]).programs.unwrap()[0];
    assert_eq!(row.user.len(), USER_WORDS, "every word of the slot's user line");
    assert_eq!(&row.user[..3], &[7, 0xdead_beef, 0]);

    let out = d.meshd(&["ps", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["user"][1], 0xdead_beef_u32, "{}", text(&out.stdout));

    let out = d.meshd(&["user", "counter"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), USER_WORDS);
    assert_eq!(lines[0], "0 7");
    assert_eq!(lines[1], format!("1 {}", 0xdead_beef_u32));
    assert_eq!(lines[31], "31 0");

    let out = d.meshd(&["user", "counter", "--json"]);
    let words: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(words, row.user);

    // Words stored later are read then: nothing is cached.
    d.store_user_pair(slot, 8, 1);
    let out = d.meshd(&["user", "counter", "--json"]);
    let words: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(&words[..2], &[8, 1]);

    let out = d.meshd(&["user", "nothing"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("program \"nothing\": not loaded (loaded: counter)"), "{err}");
}

#[test]
fn a_bulk_channel_without_a_capacity_fits_and_a_ring_too_large_says_what_it_asked_and_what_is_free() {
    let d = Running::start(64 << 20);
    // 16 MiB messages: by the rule, 2 of them (1024 would ask for 16 GiB).
    let out = d.meshd(&["channel", "create", "big", "--msg-size", "16777216"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("2 messages of 16777216 bytes"), "{}", text(&out.stdout));
    let info = ask(socket_of(&d), &Request::Info, &[]).info.unwrap();
    let big = info.channels.iter().find(|c| c.name == "big").unwrap();
    assert_eq!((big.capacity, big.protocol.as_str()), (2, "bulk"));

    // 1 MiB messages: 16.
    let out = d.meshd(&["channel", "create", "mid", "--msg-size", "1048576"]);
    assert!(text(&out.stdout).contains("16 messages"), "{}{}", text(&out.stdout), text(&out.stderr));

    let out = d.meshd(&["channel", "create", "huge", "--msg-size", "16777216", "--capacity", "4"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("mailbox full") && err.contains("needs") && err.contains("are free"), "{err}");

    let out = d.meshd(&["channel", "create", "odd", "--msg-size", "1048576", "--capacity", "3"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("a power of two"), "{}", text(&out.stderr));

    // ll keeps its 1024.
    let out = d.meshd(&["channel", "create", "small", "--msg-size", "64"]);
    assert!(text(&out.stdout).contains("1024 messages of 64 bytes"), "{}", text(&out.stdout));
}
