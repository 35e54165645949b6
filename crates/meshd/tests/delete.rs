//! Deleting channels and services over meshd's real control socket and mailbox, around the stand-in backend: refusals naming the holder, `discard` counting what it drops, the name made again at once with another size, the backend told (a device ring's memory freed), `info` counting the room, and the desired state forgetting what was deleted.

mod common;

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use common::{ListBackend, PTX, ask, load_req, within};
use mesh_shm::{CreateMode, Mailbox, MailboxConfig, Producer};
use meshd::ServiceClient;
use meshd::protocol::{ArenaRow, Request, Response};
use meshd::server::{Limits, Server, StopHandle};
use meshd::stand_in::DeletedChannels;
use meshd::start::bind_socket;
use meshd::state::StateStore;

/// Generous: a deadline for what takes milliseconds.
const DEADLINE: Duration = Duration::from_secs(20);

struct Meshd {
    socket: PathBuf,
    mailbox: Mailbox,
    deleted: DeletedChannels,
    stop: StopHandle,
    server: Option<JoinHandle<bool>>,
    _dir: tempfile::TempDir,
}

impl Meshd {
    /// meshd on a new 4 MiB mailbox of 16 channels, recording to `state` where given.
    fn start(state: Option<&Path>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sock");
        let config = MailboxConfig { size: 4 << 20, slots: 8, channels: 16 };
        let mailbox = Mailbox::create(dir.path().join("mb"), &config, CreateMode::Exclusive).unwrap();
        let store = state.map(|s| StateStore::open(s).unwrap());
        let deleted = DeletedChannels::new();
        let told = deleted.clone();
        let server = Server::start(mailbox.clone(), Limits::default(), store, move |mb| {
            ListBackend::new(mb).with_deleted(told).opened()
        })
        .unwrap();
        let listener = bind_socket(&socket).unwrap();
        let stop = server.stop_handle();
        let server = Some(std::thread::spawn(move || server.run(listener).unwrap()));
        Self { socket, mailbox, deleted, stop, server, _dir: dir }
    }

    fn ask(&self, req: &Request) -> Response {
        ask(&self.socket, req, &[])
    }

    fn create(&self, name: &str, msg_size: u32, capacity: u32, placement: &str) -> Response {
        self.ask(&Request::ChannelCreate {
            name: name.into(),
            msg_size,
            capacity,
            placement: placement.into(),
            protocol: String::new(),
            parts: 1,
        })
    }

    fn delete(&self, name: &str, discard: bool) -> Response {
        self.ask(&Request::ChannelDelete { name: name.into(), discard })
    }

    fn service_create(&self, name: &str, clients: u32, msg_size: u32) -> Response {
        self.ask(&Request::ServiceCreate {
            name: name.into(),
            clients,
            msg_size,
            capacity: 16,
            reply_size: None,
            reply_capacity: 4,
            shards: 1,
        })
    }

    fn arena(&self) -> ArenaRow {
        self.ask(&Request::Info).info.unwrap().arena.expect("info carries the arena")
    }
}

impl Drop for Meshd {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(h) = self.server.take() {
            assert!(within(DEADLINE, move || h.join().unwrap()).is_some(), "the server did not stop");
        }
    }
}

fn refusal(r: Response) -> String {
    assert!(!r.ok, "refused, not {r:?}");
    r.error.unwrap()
}

#[test]
fn a_deleted_channel_frees_its_room_and_its_name_for_any_size_at_once() {
    let d = Meshd::start(None);
    let empty = d.arena();
    assert_eq!((empty.descriptors_in_use, empty.descriptors_total), (0, 16));
    assert!(d.create("jobs", 64, 1024, "").ok);
    let one = d.arena();
    assert_eq!(one.descriptors_in_use, 1);
    assert!(one.in_use_bytes > 128 * 1024, "a ring of 1024 LL messages of 64 bytes: {one:?}");
    assert_eq!(one.in_use_bytes + one.free_bytes, empty.free_bytes);

    let r = d.delete("jobs", false);
    assert!(r.ok, "{r:?}");
    assert_eq!(r.discarded, Some(0), "the answer counts what was dropped, none here");
    assert_eq!(d.arena(), empty, "every byte and the descriptor are free again");
    // The name again, at once, with another size and protocol.
    assert!(d.create("jobs", 1 << 20, 2, "").ok);
    let info = d.ask(&Request::Info).info.unwrap();
    let jobs = info.channels.iter().find(|c| c.name == "jobs").unwrap();
    assert_eq!((jobs.msg_size, jobs.capacity, jobs.protocol.as_str()), (1 << 20, 2, "bulk"));
    assert!(d.delete("jobs", false).ok);

    let e = refusal(d.delete("jobs", false));
    assert!(e.contains("jobs"), "{e}");
    assert!(d.deleted.indices().len() == 2, "the backend is told of every delete: {:?}", d.deleted.indices());

    // The Rust client's calls: the count, or meshd's reason as the error.
    assert!(d.create("jobs", 64, 16, "").ok);
    let mut tx = Producer::claim(&d.mailbox, "jobs").unwrap();
    assert!(tx.try_send(&[7; 64]).unwrap());
    drop(tx);
    let e = meshd::control::channel_delete(&d.socket, "jobs", false).unwrap_err().to_string();
    assert!(e.contains("1 message"), "{e}");
    assert_eq!(meshd::control::channel_delete(&d.socket, "jobs", true).unwrap(), 1);
    assert!(d.service_create("kv", 2, 64).ok);
    assert_eq!(meshd::control::service_delete(&d.socket, "kv", false).unwrap(), 0);
    let e = meshd::control::service_delete(&d.socket, "kv", false).unwrap_err().to_string();
    assert!(e.contains("kv"), "{e}");
}

#[test]
fn a_delete_is_refused_naming_the_program_or_process_that_holds_the_channel() {
    let d = Meshd::start(None);
    assert!(d.create("in", 64, 16, "").ok);
    assert!(ask(&d.socket, &load_req("reader", &["in"]), PTX).ok);
    let e = refusal(d.delete("in", true));
    assert!(e.contains("slot 0") && e.contains("unload"), "{e}");
    assert!(d.ask(&Request::Unload { name: "reader".into() }).ok);

    let mut tx = Producer::claim(&d.mailbox, "in").unwrap();
    let e = refusal(d.delete("in", true));
    assert!(e.contains(&format!("pid {}", std::process::id())) && e.contains("producer"), "{e}");
    for i in 0..3u8 {
        assert!(tx.try_send(&[i; 64]).unwrap());
    }
    drop(tx);
    let e = refusal(d.delete("in", false));
    assert!(e.contains("3 message"), "a channel holding messages needs discard: {e}");
    assert!(d.ask(&Request::Info).info.unwrap().channels.iter().any(|c| c.name == "in"), "refusals leave it");
    let r = d.delete("in", true);
    assert_eq!((r.ok, r.discarded), (true, Some(3)), "{r:?}");
    assert!(d.deleted.indices() == [0], "told once, for the delete that happened");
}

#[test]
fn a_deleted_device_channel_is_handed_to_the_backend_to_free_its_ring() {
    let d = Meshd::start(None);
    assert!(d.create("host-side", 64, 16, "").ok);
    assert!(d.create("g2g", 64, 16, "device").ok);
    let index = d.mailbox.channel("g2g").unwrap().index;
    assert!(d.delete("g2g", false).ok);
    assert_eq!(d.deleted.indices(), [index], "the backend frees the device ring of that index");
    // The index is reused by the next channel, which the backend must not find a ring for.
    assert!(d.create("g2g-big", 4096, 64, "device").ok);
    assert_eq!(d.mailbox.channel("g2g-big").unwrap().index, index);
}

#[test]
fn a_service_is_deleted_once_no_client_is_attached_and_can_be_made_again() {
    let d = Meshd::start(None);
    let empty = d.arena();
    assert!(d.service_create("kv", 4, 64).ok);
    assert_eq!(d.arena().descriptors_in_use, 2, "a fan-in channel and a group");
    let client = ServiceClient::connect(&d.socket, "kv").unwrap();
    let e = refusal(d.ask(&Request::ServiceDelete { name: "kv".into(), discard: true }));
    assert!(e.contains(&format!("pid {}", std::process::id())) && e.contains("attached"), "{e}");
    // Its channels are the service's: a channel delete points to the service's.
    let e = refusal(d.delete("kv", true));
    assert!(e.contains("service"), "{e}");
    drop(client);
    let r = d.ask(&Request::ServiceDelete { name: "kv".into(), discard: false });
    assert_eq!((r.ok, r.discarded), (true, Some(0)), "{r:?}");
    assert_eq!(d.arena(), empty);
    assert!(d.ask(&Request::Info).info.unwrap().services.is_empty());
    assert_eq!(d.deleted.indices().len(), 2, "the backend is told of both channels");

    // At once, with other sizes; a client attaches to the new one.
    assert!(d.service_create("kv", 8, 256).ok);
    let client = ServiceClient::connect(&d.socket, "kv").unwrap();
    assert_eq!(client.msg_size(), 256);
    drop(client);
    let e = refusal(d.ask(&Request::ServiceDelete { name: "nope".into(), discard: false }));
    assert!(e.contains("nope"), "{e}");
}

#[test]
fn a_deleted_channel_or_service_is_gone_from_the_desired_state() {
    let state = tempfile::tempdir().unwrap();
    let at = state.path().join("state");
    {
        let d = Meshd::start(Some(&at));
        assert!(d.create("keep", 64, 16, "").ok);
        assert!(d.create("drop", 64, 16, "").ok);
        assert!(d.service_create("svc", 2, 64).ok);
        assert_eq!(StateStore::open(&at).unwrap().recorded().channels.len(), 4);
        assert!(d.delete("drop", false).ok);
        assert!(d.ask(&Request::ServiceDelete { name: "svc".into(), discard: false }).ok);
    }
    let names: Vec<String> =
        StateStore::open(&at).unwrap().recorded().channels.iter().map(|c| c.name.clone()).collect();
    assert_eq!(names, ["keep"]);
    // A restart on a new mailbox makes again only what is recorded.
    let dir = tempfile::tempdir().unwrap();
    let config = MailboxConfig { size: 4 << 20, slots: 8, channels: 16 };
    let mailbox = Mailbox::create(dir.path().join("mb"), &config, CreateMode::Exclusive).unwrap();
    assert_eq!(StateStore::open(&at).unwrap().restore_channels(&mailbox).unwrap(), 1);
    assert!(mailbox.channel("drop").is_err() && mailbox.channel("svc").is_err());
}

#[test]
fn a_native_worker_started_bound_to_a_channel_holds_it_until_it_is_stopped() {
    let d = Meshd::start(None);
    assert!(d.create("jobs", 64, 16, "").ok);
    let spawn = Request::Spawn {
        name: "sleeper".into(),
        bind: vec!["jobs".into()],
        command: ["sh", "-c", "echo ready >&$MESH_READY_FD; exec sleep 30"].map(String::from).to_vec(),
        ready_timeout_ms: 10_000,
    };
    let r = d.ask(&spawn);
    assert!(r.ok, "{r:?}");
    let e = refusal(d.delete("jobs", true));
    assert!(e.contains("native worker \"sleeper\"") && e.contains("meshd stop sleeper"), "{e}");
    assert!(d.ask(&Request::Stop { name: "sleeper".into() }).ok);
    let r = d.delete("jobs", false);
    assert!(r.ok, "{r:?}");
}
