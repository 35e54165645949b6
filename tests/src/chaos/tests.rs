//! The chaos pieces checked on the host, without a GPU: the streams' exactly-once accounting, the schedule's replay, the log readers and the scraper.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use mesh_shm::{Consumer, CreateMode, Mailbox, MailboxConfig, Producer};

use super::*;
use crate::wait_until;

fn mailbox(dir: &Path) -> Mailbox {
    let config = MailboxConfig { size: 1 << 20, slots: 2, channels: 8 };
    Mailbox::create(dir.join("mb"), &config, CreateMode::Exclusive).expect("a mailbox")
}

fn join(end: HostEnd) -> Arc<Tally> {
    for t in end.threads {
        t.join().expect("a host end");
    }
    end.tally
}

#[test]
fn host_to_host_through_the_stream_ends_is_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(dir.path());
    mb.create_channel("s", 64, 16).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = (host_producer(&mb, "s", 64, &stop), host_consumer(&mb, "s", 64, &stop));
    assert!(wait_until(Duration::from_secs(20), || Tally::get(&rx.tally.delivered) >= 5000));
    stop.store(true, Ordering::Relaxed);
    let (tx, rx) = (join(tx), join(rx));
    assert_eq!((tx.failed(), rx.failed()), (None, None));
    assert_eq!(Tally::get(&rx.delivered), Tally::get(&tx.sent), "every message, once");
}

/// A host echo standing in for the GPU one: after 1000 messages it sends its last 3 replies again
/// (what a GPU consumer does after a crash), after 2000 it drops one (message 1999).
fn faulty_echo(mb: &Mailbox, stop: &Arc<AtomicBool>) -> JoinHandle<()> {
    let mut rx = Consumer::claim(mb, "to").unwrap();
    let mut tx = Producer::claim(mb, "from").unwrap();
    let stop = stop.clone();
    std::thread::spawn(move || {
        let (mut m, mut n, mut last) = ([0u8; 16], 0u64, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            if !rx.try_recv(&mut m).unwrap() {
                std::thread::sleep(Duration::from_micros(20));
                continue;
            }
            n += 1;
            if n == 2000 {
                continue;
            }
            tx.send(&m, Duration::from_secs(5)).unwrap();
            last.push(m);
            if n == 1000 {
                for again in &last[last.len() - 3..] {
                    tx.send(again, Duration::from_secs(5)).unwrap();
                }
            }
        }
    })
}

#[test]
fn the_round_trip_counts_repeats_and_fails_on_a_loss() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(dir.path());
    mb.create_channel("to", 16, 64).unwrap();
    mb.create_channel("from", 16, 64).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let echo = faulty_echo(&mb, &stop);
    let end = host_round_trip(&mb, "to", "from", 48, &stop);
    assert!(wait_until(Duration::from_secs(20), || end.tally.failed().is_some()), "the loss is caught");
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap();
    let tally = join(end);
    let why = tally.failed().unwrap();
    assert!(why.contains("reply 2000 came while 1999 was expected: lost"), "{why}");
    assert_eq!(Tally::get(&tally.repeated), 3, "the three replies sent again");
    assert_eq!(Tally::get(&tally.delivered), 1999, "messages 0..1999 came in order");
}

#[test]
fn a_seed_replays_the_same_schedule() {
    let (mut a, mut b) = (Rng(42), Rng(42));
    let xs: Vec<u64> = (0..100).map(|_| a.below(1000)).collect();
    let ys: Vec<u64> = (0..100).map(|_| b.below(1000)).collect();
    assert_eq!(xs, ys);
    assert!(xs.iter().any(|&x| x != xs[0]), "not constant");
    // splitmix64's published first output for seed 0.
    assert_eq!(Rng(0).next_u64(), 0xE220_A839_7B1D_CDAF);
}

#[test]
fn replay_bounds_are_read_off_the_log() {
    let log = "x WARN channel to-echo: a GPU consumer may receive again up to 12 message(s) from position 7 (it \
               had published)\ny WARN channel other: a GPU consumer may receive again up to 3 message(s) from \
               position 0\nz WARN channel to-echo: a GPU consumer may receive again up to 5 message(s) from \
               position 90";
    assert_eq!(logged_replay(log, "to-echo"), Some(17));
    assert_eq!(logged_replay(log, "other"), Some(3));
    assert_eq!(logged_replay(log, "h2g"), None);
}

#[test]
fn memory_is_a_leak_only_when_it_grows() {
    assert!(!memory_leaked(1, 0), "a decrease (the GPU run's 1 -> 0 MiB) is no leak");
    assert!(!memory_leaked(1000, 10), "nor a large one");
    assert!(!memory_leaked(0, MEMORY_SLACK_MIB), "the slack");
    assert!(memory_leaked(0, MEMORY_SLACK_MIB + 1));
    assert!(!memory_leaked(10_000, 10_000 + 100 + MEMORY_SLACK_MIB), "1% and the slack");
    assert!(memory_leaked(10_000, 10_000 + 101 + MEMORY_SLACK_MIB));
}

#[test]
fn the_endpoint_is_read_off_the_log_last_start_wins() {
    let log = "2026-12-03T17:27:21Z  INFO meshd::http: monitoring endpoint: http://127.0.0.1:40001/metrics, /livez, \
               /readyz\nx WARN other\n2026-12-03T17:28:00Z  INFO meshd::http: monitoring endpoint: \
               http://127.0.0.1:40002/metrics, /livez, /readyz";
    assert_eq!(endpoint_in_log(log), (Some("127.0.0.1:40002".parse().unwrap()), 2));
    assert_eq!(endpoint_in_log("nothing"), (None, 0));
}

/// A one-connection-at-a-time HTTP server answering `status` after `delay`.
fn server(status: u16, delay: Duration) -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let (mut buf, mut got) = ([0u8; 1024], Vec::new());
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf) {
                    Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                    _ => break,
                }
            }
            std::thread::sleep(delay);
            let _ = write!(c, "HTTP/1.1 {status} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    });
    addr
}

#[test]
fn a_get_tells_answers_from_nothing_listening_and_from_silence() {
    let short = Duration::from_millis(300);
    assert_eq!(http_get(server(200, Duration::ZERO), "/metrics", short), Got::Status(200));
    assert_eq!(http_get(server(503, Duration::ZERO), "/readyz", short), Got::Status(503));
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    assert!(matches!(http_get(free, "/metrics", short), Got::Unreachable(_)), "a closed port");
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let got = http_get(silent.local_addr().unwrap(), "/metrics", short);
    assert!(matches!(got, Got::Failed(ref w) if w.contains("no answer")), "{got:?}");
}

#[test]
fn the_scraper_counts_503s_and_fails_on_other_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("meshd.log");
    let announce = |addr: SocketAddr| format!("INFO meshd::http: monitoring endpoint: http://{addr}/metrics, /livez\n");
    std::fs::write(&log, announce(server(503, Duration::ZERO))).unwrap();
    let s = Scraper::start(log.clone(), Duration::from_millis(10));
    assert!(wait_until(Duration::from_secs(10), || Tally::get(&s.stats.unavailable) >= 4));
    assert_eq!(s.stats.failed(), None, "503 is an answer");
    // A restart announces another endpoint, which answers 500.
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str(&announce(server(500, Duration::ZERO)));
    std::fs::write(&log, text).unwrap();
    assert!(wait_until(Duration::from_secs(10), || s.stats.failed().is_some()));
    let stats = s.finish();
    assert!(stats.failed().unwrap().contains("status 500"), "{:?}", stats.failed());
}

#[test]
fn the_count_a_delete_prints_is_read_back() {
    assert_eq!(discarded_in("deleted channel churn3 (no message discarded)\n"), Some(0));
    assert_eq!(discarded_in("deleted channel churn3 (1 message discarded)\n"), Some(1));
    assert_eq!(discarded_in("deleted channel churn3 (17 messages discarded)\n"), Some(17));
    let service = "deleted service svc4: fan-in channel svc4 and group svc4.replies (3 messages discarded)\n";
    assert_eq!(discarded_in(service), Some(3));
    assert_eq!(discarded_in("deleted channel churn3\n"), None, "no count: not read as 0");
    assert_eq!(discarded_in("(many messages discarded)"), None);
}

#[test]
fn a_delete_is_expected_refused_only_while_messages_wait_and_are_not_discarded() {
    let mut churn = Churn::default();
    let mut rng = Rng(7);
    let (name, c) = churn.new_channel(&mut rng, false).expect("room for one");
    assert_eq!(c.placement, "host", "no device ring unless allowed");
    churn.made(name.clone(), c);
    assert_eq!(churn.expect_delete(&name, false), Expect::Deleted(0));
    churn.queued(&name, 3);
    assert_eq!(churn.expect_delete(&name, false), Expect::Queued(3));
    assert_eq!(churn.expect_delete(&name, true), Expect::Deleted(3));
    churn.deleted(&name);
    assert!(churn.channels.is_empty());
    assert_eq!(churn.to_delete(&mut rng), None, "nothing left to delete");
}

#[test]
fn the_churn_stays_within_its_bounds_and_queues_only_where_there_is_room() {
    let mut churn = Churn::default();
    let mut rng = Rng(42);
    let mut device = 0;
    while let Some((name, c)) = churn.new_channel(&mut rng, true) {
        assert!(c.capacity.is_power_of_two() && c.msg_size.is_multiple_of(8), "{c:?}");
        device += usize::from(c.placement == "device");
        churn.made(name, c);
    }
    assert_eq!(churn.channels.len(), MAX_CHURN_CHANNELS);
    assert!(device < MAX_CHURN_CHANNELS, "some host channels to queue on");
    // Fill every host channel: then there is nowhere left to queue.
    while let Some((name, room)) = churn.to_queue(&mut rng) {
        assert!(churn.channels[&name].placement == "host" && room > 0);
        churn.queued(&name, room);
    }
    assert!(churn.channels.values().all(|c| c.placement == "device" || c.queued == u64::from(c.capacity)));
    let args = churn.channels.iter().next().map(|(n, c)| c.create_args(n)).unwrap();
    assert_eq!(args[..3], ["channel", "create", "churn1"]);
    assert!(args.windows(2).any(|w| w[0] == "--placement" && (w[1] == "host" || w[1] == "device")), "{args:?}");
}
