//! kill -9 at every step of a channel's or a service's creation and deletion: the mailbox that a takeover opens afterwards is whole every time.
//!
//! Built with the feature `crash-points` only (`cargo test -p mesh-shm --features crash-points
//! --test crash_steps`). Every step of `mesh_shm::mailbox::CRASH_STEPS` is run in a child process
//! (this test binary again, running [`crash_child`]) that kills itself there with SIGKILL, over a
//! mailbox holding live channels, queued messages, a service with a request queued, and a freed
//! ring full of stale messages for the new ring to land on. Then the mailbox is opened as a new
//! meshd opens it, and checked: it opens, every published descriptor validates, no two live rings
//! overlap, the arena's figures add up to its size and to the live rings, a neighbour's messages
//! are intact, the channel is either whole (a message goes through it) or absent (its name is
//! created again at once), and once everything is deleted the arena is empty: nothing leaked.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use mesh_shm::claim::Holder;
use mesh_shm::layout::{LINE, ring_bytes_at};
use mesh_shm::mailbox::CRASH_STEPS;
use mesh_shm::{
    BulkConsumer, BulkProducer, ClientId, Consumer, CreateMode, FanInReceiver, FanInSender, GroupClient, GroupServer,
    Mailbox, MailboxConfig, Placement, Producer, Protocol, ServiceOwner, ShmError, Taken,
};

const T: Duration = Duration::from_secs(2);
/// The operation a child runs, and the mailbox it runs it on.
const OP_VAR: &str = "MESH_CRASH_TEST_OP";
const PATH_VAR: &str = "MESH_CRASH_TEST_PATH";

/// What a child does: a creation of each protocol and placement, a service's two creations, the
/// deletion of a channel holding messages, the deletion of a service holding a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    CreateLl,
    CreateBulk,
    CreateIndex,
    CreateDevice,
    CreateFanIn,
    CreateGroup,
    CreateService,
    DeleteChannel,
    DeleteService,
}

const OPS: [Op; 9] = [
    Op::CreateLl,
    Op::CreateBulk,
    Op::CreateIndex,
    Op::CreateDevice,
    Op::CreateFanIn,
    Op::CreateGroup,
    Op::CreateService,
    Op::DeleteChannel,
    Op::DeleteService,
];

impl Op {
    fn name(self) -> String {
        format!("{self:?}")
    }

    fn parse(s: &str) -> Option<Self> {
        OPS.into_iter().find(|op| op.name() == s)
    }

    /// The values of `MESH_CRASH_AT` that kill this operation, one for each step it passes: a
    /// service's creation passes the creation steps twice (its fan-in channel, then its group).
    fn crash_ats(self) -> Vec<String> {
        let prefix = match self {
            Op::DeleteChannel => "delete:",
            Op::DeleteService => "service-delete:",
            _ => "create:",
        };
        let steps = CRASH_STEPS.iter().filter(|s| s.starts_with(prefix));
        if self == Op::CreateService {
            steps.flat_map(|s| [format!("{s}@1"), format!("{s}@2")]).collect()
        } else {
            steps.map(|s| (*s).to_string()).collect()
        }
    }

    /// The operation itself, with its crash point armed (in a child) or not (the parent redoing it).
    fn run(self, mb: &Mailbox) -> mesh_shm::Result<()> {
        match self {
            Op::CreateLl => mb.create_channel("new", 64, 64).map(drop),
            Op::CreateBulk => mb.create_channel_with("new", 4096, 4, Placement::Host, Protocol::Bulk).map(drop),
            Op::CreateIndex => mb.create_channel_with("new", 8, 256, Placement::Host, Protocol::Index).map(drop),
            Op::CreateDevice => mb.create_channel_placed("new", 64, 16, Placement::Device).map(drop),
            Op::CreateFanIn => mb.create_fanin("new", 64, 8, 2).map(drop),
            Op::CreateGroup => mb.create_group("new.replies", 4, 64, 4).map(drop),
            Op::CreateService => {
                mb.create_fanin("new", 64, 8, 1)?;
                mb.create_group("new.replies", 4, 64, 4).map(drop)
            }
            Op::DeleteChannel => mb.delete_channel("victim", true).map(drop),
            Op::DeleteService => mb.delete_service("svc", true).map(drop),
        }
    }
}

/// The child's side: runs the operation named in the environment (and is killed in it). Does
/// nothing when run as an ordinary test.
#[test]
fn crash_child() {
    let (Ok(op), Ok(path)) = (std::env::var(OP_VAR), std::env::var(PATH_VAR)) else { return };
    let op = Op::parse(&op).expect("an operation this test knows");
    let mb = Mailbox::open(path).expect("the child opens the mailbox");
    op.run(&mb).expect("the operation succeeds when not killed");
}

/// A mailbox as a running meshd leaves it: live channels (one with messages queued next to a
/// freed ring full of stale messages), a channel to delete with messages, and a service with a
/// dead client's request queued.
fn setup(dir: &Path) -> PathBuf {
    let path = dir.join("mb");
    let config = MailboxConfig { size: 4 << 20, slots: 4, channels: 32 };
    let mb = Mailbox::create(&path, &config, CreateMode::Exclusive).unwrap();
    mb.create_channel("keep", 64, 16).unwrap();
    mb.create_channel("hole", 64, 1024).unwrap();
    mb.create_channel("after", 8, 16).unwrap();
    let mut tx = Producer::claim(&mb, "keep").unwrap();
    for i in 0..3u8 {
        tx.send(&[i + 1; 64], T).unwrap();
    }
    let mut hole = Producer::claim(&mb, "hole").unwrap();
    for i in 0..1024u32 {
        hole.send(&[u8::try_from(i % 251).unwrap() + 1; 64], T).unwrap();
    }
    drop((tx, hole));
    assert_eq!(mb.delete_channel("hole", true).unwrap(), 1024);
    mb.create_channel("victim", 64, 16).unwrap();
    let mut tx = Producer::claim(&mb, "victim").unwrap();
    tx.send(b"one", T).unwrap();
    tx.send(b"two", T).unwrap();
    drop(tx);
    mb.create_fanin("svc", 64, 8, 2).unwrap();
    mb.create_group("svc.replies", 4, 64, 4).unwrap();
    let mut owner = ServiceOwner::open(&mb, "svc", "svc.replies").unwrap();
    let id = owner.connect(dead_holder()).unwrap();
    FanInSender::open(&mb, "svc", id).unwrap().send(b"request", T).unwrap();
    path
}

/// A process that has exited: what a client killed before its service is deleted leaves bound.
fn dead_holder() -> Holder {
    let mut child = Command::new("true").spawn().unwrap();
    let holder = Holder::of_pid(child.id());
    child.wait().unwrap();
    holder
}

/// What a takeover checks first: the file opens, every published descriptor validates, no two
/// rings overlap, and the arena's figures are those of the live rings.
fn check_whole(mb: &Mailbox, what: &str) {
    let channels = mb.channels().unwrap_or_else(|e| panic!("{what}: a descriptor does not validate: {e}"));
    let mut rings: Vec<(u64, u64, String)> = channels
        .iter()
        .map(|c| {
            let bytes =
                ring_bytes_at(c.ring_offset, c.msg_size, c.capacity, c.placement.code(), c.protocol.code(), c.parts);
            (c.ring_offset, c.ring_offset + bytes.unwrap(), c.name.clone())
        })
        .collect();
    rings.sort();
    for pair in rings.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "{what}: rings {:?} and {:?} overlap", pair[0], pair[1]);
    }
    let u = mb.arena_usage();
    let g = mb.geometry();
    assert_eq!(u.in_use + u.free, g.arena_size, "{what}: {u:?}");
    let live: u64 = rings.iter().map(|(s, e, _)| e.next_multiple_of(LINE) - s).sum();
    assert_eq!(u.in_use, live, "{what}: in use is exactly the live rings: {u:?}");
    assert_eq!(u.descriptors_in_use as usize, channels.len(), "{what}: a descriptor published but not listed");
}

/// A message goes through channel `name` (created by `op`), each end claimed anew; a service's
/// client is detached and its ends dropped after, so that it can be deleted.
fn check_usable(mb: &Mailbox, op: Op, name: &str, what: &str) {
    let mut buf = vec![0u8; 4096];
    match op {
        Op::CreateLl | Op::CreateIndex => {
            let size = mb.channel(name).unwrap().msg_size as usize;
            let (mut tx, mut rx) = (Producer::claim(mb, name).unwrap(), Consumer::claim(mb, name).unwrap());
            assert!(!rx.try_recv(&mut buf[..size]).unwrap(), "{what}: a new ring starts empty");
            tx.send(&[7; 8], T).unwrap();
            rx.recv(&mut buf[..size], T).unwrap();
            assert_eq!(&buf[..8], &[7; 8], "{what}");
        }
        Op::CreateBulk => {
            let (mut tx, mut rx) = (BulkProducer::claim(mb, name).unwrap(), BulkConsumer::claim(mb, name).unwrap());
            assert!(!rx.try_recv(&mut buf).unwrap(), "{what}: a new ring starts empty");
            tx.send(&[9; 4096], T).unwrap();
            rx.recv(&mut buf, T).unwrap();
            assert!(buf.iter().all(|&b| b == 9), "{what}");
        }
        Op::CreateDevice => {
            let c = mb.channel(name).unwrap();
            assert_eq!((c.placement, c.head, c.tail), (Placement::Device, 0, 0), "{what}");
        }
        Op::CreateFanIn => {
            let mut rx = FanInReceiver::claim(mb, name).unwrap();
            assert_eq!(rx.try_take(&mut buf[..64]).unwrap(), None, "{what}: a new ring starts empty");
            FanInSender::open(mb, name, ClientId(1)).unwrap().send(b"hi", T).unwrap();
            assert_eq!(rx.take(&mut buf[..64], T).unwrap(), Taken::Message { sender: 1 }, "{what}");
        }
        Op::CreateGroup => {
            let server = GroupServer::claim(mb, &format!("{name}.replies")).unwrap();
            assert_eq!(server.info().clients(), Some(4), "{what}");
        }
        Op::CreateService | Op::DeleteService => {
            let group = format!("{name}.replies");
            let mut owner = ServiceOwner::open(mb, name, &group).unwrap();
            let id = owner.connect(Holder::current()).unwrap();
            let mut rx = FanInReceiver::claim(mb, name).unwrap();
            let mut server = GroupServer::claim(mb, &group).unwrap();
            let mut client = GroupClient::claim(mb, &group, id).unwrap();
            // A request queued before the crash is taken first.
            while let Some(Taken::Message { sender }) = rx.try_take(&mut buf[..64]).unwrap() {
                if sender == id.0 {
                    break;
                }
            }
            FanInSender::open(mb, name, id).unwrap().send(b"ping", T).unwrap();
            assert_eq!(rx.take(&mut buf[..64], T).unwrap(), Taken::Message { sender: id.0 }, "{what}");
            server.reply(id, b"pong").unwrap();
            client.recv(&mut buf[..64], T).unwrap();
            assert!(buf.starts_with(b"pong"), "{what}");
            drop((rx, server, client));
            owner.detach(id).unwrap();
        }
        Op::DeleteChannel => {
            let mut rx = Consumer::claim(mb, name).unwrap();
            for want in [&b"one"[..], b"two"] {
                rx.recv(&mut buf[..64], T).unwrap();
                assert!(buf.starts_with(want), "{what}: the queued messages are whole");
            }
            drop(rx);
            let mut tx = Producer::claim(mb, name).unwrap();
            tx.send(b"three", T).unwrap();
        }
    }
}

/// Deletes what `op` made (a service or half of one, or a channel), with its messages.
fn delete(mb: &Mailbox, op: Op, name: &str) {
    match op {
        Op::CreateService | Op::DeleteService | Op::CreateFanIn | Op::CreateGroup => {
            mb.delete_service(name, true).unwrap();
        }
        _ => drop(mb.delete_channel(name, true).unwrap()),
    }
}

/// Takes over after the child died at `at` during `op`, and checks the mailbox as the module's
/// comment says.
fn take_over(path: &Path, op: Op, at: &str) {
    let what = format!("{op:?} killed at {at}");
    let mb = Mailbox::open(path).unwrap_or_else(|e| panic!("{what}: the takeover cannot open the mailbox: {e}"));
    check_whole(&mb, &what);
    // The neighbour's messages are where they were.
    let mut rx = Consumer::claim(&mb, "keep").unwrap();
    let mut buf = [0u8; 64];
    for i in 0..3u8 {
        rx.recv(&mut buf, T).unwrap();
        assert_eq!(buf, [i + 1; 64], "{what}: channel keep's message {i}");
    }
    drop(rx);
    let (name, mut redo) = match op {
        Op::DeleteChannel => ("victim", false),
        Op::DeleteService => ("svc", false),
        _ => ("new", false),
    };
    let fanin = mb.channel(name);
    let group = mb.channel(&format!("{name}.replies"));
    match op {
        Op::CreateService | Op::DeleteService => match (&fanin, &group) {
            (Ok(_), Ok(_)) => {}
            // The one half-state: a fan-in channel without its group, which a service delete finishes.
            (Ok(_), Err(ShmError::NoSuchChannel(_))) => {
                mb.delete_service(name, true).unwrap_or_else(|e| panic!("{what}: the half service: {e}"));
                redo = true;
            }
            (Err(ShmError::NoSuchChannel(_)), Err(ShmError::NoSuchChannel(_))) => redo = true,
            other => panic!("{what}: a group without its fan-in channel, or an error: {other:?}"),
        },
        _ => match if op == Op::CreateGroup { group } else { fanin } {
            Ok(_) => {}
            Err(ShmError::NoSuchChannel(_)) => redo = true,
            Err(e) => panic!("{what}: {e}"),
        },
    }
    if redo {
        // The name is free at once: the operation done again, in full.
        match op {
            Op::DeleteChannel => {
                mb.create_channel("victim", 64, 16).unwrap();
                let mut tx = Producer::claim(&mb, "victim").unwrap();
                tx.send(b"one", T).unwrap();
                tx.send(b"two", T).unwrap();
            }
            Op::DeleteService => {
                mb.create_fanin("svc", 64, 8, 2).unwrap();
                mb.create_group("svc.replies", 4, 64, 4).unwrap();
            }
            op => op.run(&mb).unwrap_or_else(|e| panic!("{what}: the name cannot be created again: {e}")),
        }
        check_whole(&mb, &format!("{what}, made again"));
    }
    check_usable(&mb, op, name, &what);
    delete(&mb, op, name);
    check_whole(&mb, &format!("{what}, deleted"));
    // Everything else deleted too: the arena is empty, every descriptor free.
    mb.delete_channel("keep", true).unwrap();
    mb.delete_channel("after", true).unwrap();
    if op != Op::DeleteChannel {
        mb.delete_channel("victim", true).unwrap();
    }
    if op != Op::DeleteService {
        mb.delete_service("svc", true).unwrap();
    }
    let u = mb.arena_usage();
    assert_eq!((u.in_use, u.largest_free, u.descriptors_in_use), (0, mb.geometry().arena_size, 0), "{what}: {u:?}");
}

#[test]
fn kill_at_every_step_of_create_and_delete_leaves_a_whole_mailbox() {
    let exe = std::env::current_exe().unwrap();
    let mut killed = 0;
    let mut reached: Vec<&str> = Vec::new();
    for op in OPS {
        for at in op.crash_ats() {
            let dir = tempfile::tempdir().unwrap();
            let path = setup(dir.path());
            let status = Command::new(&exe)
                .args(["crash_child", "--exact", "--nocapture", "--test-threads", "1"])
                .env(OP_VAR, op.name())
                .env(PATH_VAR, &path)
                .env("MESH_CRASH_AT", &at)
                .output()
                .unwrap();
            assert_eq!(
                status.status.signal(),
                Some(9),
                "{op:?} at {at}: the child was to die by SIGKILL there; it ended {:?}: {}",
                status.status,
                String::from_utf8_lossy(&status.stdout)
            );
            take_over(&path, op, &at);
            killed += 1;
            let step = at.split('@').next().unwrap();
            reached.extend(CRASH_STEPS.iter().copied().filter(|s| *s == step));
        }
    }
    for step in CRASH_STEPS {
        assert!(reached.contains(step), "crash point {step} is reached by no operation of this test");
    }
    println!("{killed} kills, at {} steps", CRASH_STEPS.len());
}

/// The list and the code agree: every `crash_point("…")` in the mailbox's source names a step of
/// [`CRASH_STEPS`], and every step is in the source.
#[test]
fn every_crash_point_in_the_code_is_listed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for (at, _) in text.match_indices("crash_point(\"") {
                    let rest = &text[at + "crash_point(\"".len()..];
                    let name = &rest[..rest.find('"').unwrap()];
                    found.push(name.to_string());
                }
            }
        }
    }
    found.sort();
    let mut listed: Vec<String> = CRASH_STEPS.iter().map(|s| (*s).to_string()).collect();
    listed.sort();
    assert_eq!(found, listed, "the crash points in the source and CRASH_STEPS");
}
