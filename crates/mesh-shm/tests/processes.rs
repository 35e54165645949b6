//! Channels between separate processes: the test binary re-runs itself as the child (ipc-channel's pattern).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mesh_shm::{Consumer, CreateMode, Mailbox, MailboxConfig, Placement, Producer, Protocol, ShmError};

const ROLE: &str = "MESH_SHM_TEST_ROLE";
const PATH: &str = "MESH_SHM_TEST_PATH";
const COUNT: &str = "MESH_SHM_TEST_COUNT";

/// Re-runs this test binary, running only `test` with the child role set.
fn spawn_child(test: &str, role: &str, path: &std::path::Path, count: u64) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(PATH, path)
        .env(COUNT, count.to_string())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// The child side: what the parent asked for, then exit. Returns false in the parent.
fn child_role() -> bool {
    let Ok(role) = std::env::var(ROLE) else { return false };
    let mb = Mailbox::open(std::env::var(PATH).unwrap()).unwrap();
    let count: u64 = std::env::var(COUNT).unwrap().parse().unwrap();
    match role.as_str() {
        "producer" => {
            let mut p = Producer::claim(&mb, "seq").unwrap();
            let mut batch = vec![0u8; 16 * 64];
            // Where the last producer left off: a host producer publishes every message it sends, so
            // after a producer killed midway its successor continues the sequence without a gap.
            let mut next = mb.channel("seq").unwrap().head;
            while next < count {
                let n = (count - next).min(64);
                for (i, m) in batch.chunks_exact_mut(16).take(n as usize).enumerate() {
                    let v = next + i as u64;
                    m[..8].copy_from_slice(&v.to_le_bytes());
                    m[8..].copy_from_slice(&(!v).to_le_bytes());
                }
                // Mix single sends with batches so both paths cross the process boundary.
                if next.is_multiple_of(1024) {
                    p.send(&batch[..16], Duration::from_secs(30)).unwrap();
                    next += 1;
                } else {
                    next += p.try_send_batch(&batch[..n as usize * 16]).unwrap() as u64;
                }
            }
        }
        "echo" => {
            let mut rx = Consumer::claim(&mb, "ping").unwrap();
            let mut tx = Producer::claim(&mb, "pong").unwrap();
            let mut msg = [0u8; 8];
            for _ in 0..count {
                rx.recv(&mut msg, Duration::from_secs(30)).unwrap();
                tx.send(&msg, Duration::from_secs(30)).unwrap();
            }
        }
        "hold" => {
            let _p = Producer::claim(&mb, "seq").unwrap();
            println!("claimed");
            std::thread::sleep(Duration::from_secs(600));
        }
        other => panic!("unknown role {other}"),
    }
    true
}

fn wait_ok(mut child: Child) {
    let status = child.wait().unwrap();
    assert!(status.success(), "child failed: {status}");
}

#[test]
fn millions_of_messages_cross_processes_in_order() {
    if child_role() {
        return;
    }
    let count: u64 = 2_000_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb =
        Mailbox::create(&path, &MailboxConfig { size: 1 << 20, slots: 1, channels: 4 }, CreateMode::Exclusive).unwrap();
    mb.create_channel("seq", 16, 256).unwrap();
    let mut c = Consumer::claim(&mb, "seq").unwrap();
    let child = spawn_child("millions_of_messages_cross_processes_in_order", "producer", &path, count);
    let mut buf = vec![0u8; 16 * 100];
    let mut expect = 0u64;
    while expect < count {
        let n = c.recv_batch(&mut buf, Duration::from_secs(30)).unwrap();
        for m in buf.chunks_exact(16).take(n) {
            let a = u64::from_le_bytes(m[..8].try_into().unwrap());
            let b = u64::from_le_bytes(m[8..].try_into().unwrap());
            assert_eq!(a, expect, "lost, duplicated or reordered");
            assert_eq!(b, !a, "torn message {a}");
            expect += 1;
        }
    }
    assert!(c.try_recv(&mut [0; 16]).is_ok_and(|got| !got), "nothing beyond the count");
    wait_ok(child);
}

#[test]
fn an_index_stream_crosses_processes_in_order_across_a_producer_killed_midway() {
    let test = "an_index_stream_crosses_processes_in_order_across_a_producer_killed_midway";
    if child_role() {
        return;
    }
    let count: u64 = 2_000_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb =
        Mailbox::create(&path, &MailboxConfig { size: 1 << 20, slots: 1, channels: 4 }, CreateMode::Exclusive).unwrap();
    mb.create_channel_with("seq", 16, 256, Placement::Host, Protocol::Index).unwrap();
    let mut c = Consumer::claim(&mb, "seq").unwrap();
    let mut child = spawn_child(test, "producer", &path, count);
    let mut killed = false;
    let mut buf = vec![0u8; 16 * 100];
    let mut one = [0u8; 16];
    let mut expect = 0u64;
    while expect < count {
        if !killed && expect >= count / 4 {
            // kill -9 mid-stream, then a new producer process resumes where the killed one published.
            killed = true;
            child.kill().unwrap();
            child.wait().unwrap();
            child = spawn_child(test, "producer", &path, count);
        }
        // Singles and batches, so both receive paths see the other process's stores.
        let n = if expect.is_multiple_of(7) {
            c.recv(&mut one, Duration::from_secs(30)).unwrap();
            buf[..16].copy_from_slice(&one);
            1
        } else {
            c.recv_batch(&mut buf, Duration::from_secs(30)).unwrap()
        };
        for m in buf.chunks_exact(16).take(n) {
            let a = u64::from_le_bytes(m[..8].try_into().unwrap());
            let b = u64::from_le_bytes(m[8..].try_into().unwrap());
            assert_eq!(a, expect, "lost, duplicated or reordered");
            assert_eq!(b, !a, "torn message {a}");
            expect += 1;
        }
    }
    assert!(c.try_recv(&mut [0; 16]).is_ok_and(|got| !got), "nothing beyond the count");
    assert!(killed, "the first producer was killed midway");
    wait_ok(child);
    let info = mb.channel("seq").unwrap();
    assert_eq!((info.head, info.tail), (count, count));
}

#[test]
fn ping_pong_between_processes() {
    if child_role() {
        return;
    }
    let rounds = 20_000u64;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb =
        Mailbox::create(&path, &MailboxConfig { size: 1 << 20, slots: 1, channels: 4 }, CreateMode::Exclusive).unwrap();
    mb.create_channel("ping", 8, 2).unwrap();
    mb.create_channel("pong", 8, 2).unwrap();
    let mut tx = Producer::claim(&mb, "ping").unwrap();
    let mut rx = Consumer::claim(&mb, "pong").unwrap();
    let child = spawn_child("ping_pong_between_processes", "echo", &path, rounds);
    let mut msg = [0u8; 8];
    for i in 0..rounds {
        tx.send(&i.to_le_bytes(), Duration::from_secs(30)).unwrap();
        rx.recv(&mut msg, Duration::from_secs(30)).unwrap();
        assert_eq!(u64::from_le_bytes(msg), i);
    }
    wait_ok(child);
}

#[test]
fn an_end_held_by_a_killed_process_can_be_reclaimed() {
    if child_role() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mb");
    let mb =
        Mailbox::create(&path, &MailboxConfig { size: 1 << 20, slots: 1, channels: 4 }, CreateMode::Exclusive).unwrap();
    mb.create_channel("seq", 8, 4).unwrap();
    let mut child = spawn_child("an_end_held_by_a_killed_process_can_be_reclaimed", "hold", &path, 0);
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    while mb.channel("seq").unwrap().producer_pid != Some(pid) {
        assert!(Instant::now() < deadline, "the child never claimed the end");
        std::thread::sleep(Duration::from_millis(5));
    }
    match Producer::claim(&mb, "seq") {
        Err(ShmError::Claimed { pid: holder, .. }) => assert_eq!(holder, pid),
        other => panic!("a live holder must refuse, got {other:?}"),
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let p = Producer::claim(&mb, "seq").expect("a dead holder's end is reclaimed");
    assert_eq!(mb.channel("seq").unwrap().producer_pid, Some(std::process::id()));
    drop(p);
}
