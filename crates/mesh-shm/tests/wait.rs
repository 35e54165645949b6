//! How the host ends wait: the spin is a setting of the mailbox handle and of each end, and
//! `MESH_SPIN_US` sets the default of every end of a process.

use std::process::Command;
use std::time::{Duration, Instant};

use mesh_shm::wait::DEFAULT_SPIN;
use mesh_shm::{
    BulkConsumer, BulkProducer, ClientId, Consumer, CreateMode, FanInReceiver, FanInSender, GroupClient, Mailbox,
    MailboxConfig, Placement, Producer, Protocol, ShmError, WaitConfig,
};

fn mailbox(dir: &tempfile::TempDir) -> Mailbox {
    let mb = Mailbox::create(
        dir.path().join("mb"),
        &MailboxConfig { size: 4 << 20, slots: 4, channels: 16 },
        CreateMode::Exclusive,
    )
    .unwrap();
    mb.create_channel("ll", 8, 16).unwrap();
    mb.create_channel_with("bulk", 4096, 4, Placement::Host, Protocol::Bulk).unwrap();
    mb.create_fanin("requests", 8, 16, 1).unwrap();
    mb.create_group("replies", 4, 8, 4).unwrap();
    mb
}

#[test]
fn every_end_starts_with_its_handles_wait_and_can_be_given_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let plain = mailbox(&dir);
    assert_eq!(plain.wait_config(), WaitConfig::default(), "a handle starts with the process's default");
    let set = WaitConfig::spinning(Duration::from_micros(3));
    let mb = plain.clone().with_wait_config(set);
    assert_eq!(plain.wait_config(), WaitConfig::default(), "a clone's setting is its own");
    assert_eq!(mb.clone().wait_config(), set, "a clone carries the setting");

    let mut tx = Producer::claim(&mb, "ll").unwrap();
    let mut rx = Consumer::claim(&mb, "ll").unwrap();
    let mut btx = BulkProducer::claim(&mb, "bulk").unwrap();
    let mut brx = BulkConsumer::claim(&mb, "bulk").unwrap();
    let mut ftx = FanInSender::open(&mb, "requests", ClientId::new(0, 1)).unwrap();
    let mut frx = FanInReceiver::claim(&mb, "requests").unwrap();
    let mut reply = GroupClient::claim(&mb, "replies", ClientId::new(0, 1)).unwrap();
    let seen = [
        tx.wait_config(),
        rx.wait_config(),
        btx.wait_config(),
        brx.wait_config(),
        ftx.wait_config(),
        frx.wait_config(),
        reply.wait_config(),
    ];
    assert_eq!(seen, [set; 7], "each end took its handle's setting when claimed");

    let own = WaitConfig::yielding();
    tx.set_wait_config(own);
    rx.set_wait_config(own);
    btx.set_wait_config(own);
    brx.set_wait_config(own);
    ftx.set_wait_config(own);
    frx.set_wait_config(own);
    reply.set_wait_config(own);
    let seen = [
        tx.wait_config(),
        rx.wait_config(),
        btx.wait_config(),
        brx.wait_config(),
        ftx.wait_config(),
        frx.wait_config(),
        reply.wait_config(),
    ];
    assert_eq!(seen, [own; 7]);
    assert_eq!(mb.wait_config(), set, "an end's setting does not change its handle's");
}

/// CPU time this thread has run, from the kernel's scheduler statistics.
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("/proc/thread-self/schedstat");
    let ns: u64 = stat.split_whitespace().next().and_then(|n| n.parse().ok()).expect("a run time in ns");
    Duration::from_nanos(ns)
}

/// The CPU time a receive on an empty channel takes to time out after `timeout`, waiting as `wait` says.
fn cpu_of_a_timed_out_recv(mb: &Mailbox, wait: WaitConfig, timeout: Duration) -> Duration {
    let mut rx = Consumer::claim(mb, "ll").unwrap();
    rx.set_wait_config(wait);
    let mut out = [0u8; 8];
    let (cpu, start) = (thread_cpu(), Instant::now());
    let err = rx.recv(&mut out, timeout).unwrap_err();
    assert!(matches!(err, ShmError::Timeout { .. }), "{err}");
    assert!(start.elapsed() >= timeout, "it waited the whole timeout");
    thread_cpu() - cpu
}

#[test]
fn an_ends_spin_is_how_its_blocking_calls_wait() {
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(&dir);
    let timeout = Duration::from_millis(150);
    // Spinning longer than the timeout keeps the CPU the whole wait (as much of it as the scheduler
    // gives); yielding at once gives it up after a millisecond of yields and sleeps the rest.
    let spinning = cpu_of_a_timed_out_recv(&mb, WaitConfig::spinning(Duration::from_secs(10)), timeout);
    let yielding = cpu_of_a_timed_out_recv(&mb, WaitConfig::yielding(), timeout);
    assert!(spinning > 4 * yielding, "spinning took {spinning:?} of CPU, yielding {yielding:?}");
}

/// The test a child process runs with its own `MESH_SPIN_US`: the default every handle and end
/// starts with, reported for the parent; run alone, it checks the same against this environment.
#[test]
fn child_reports_the_default_spin() {
    let expected = std::env::var("MESH_SPIN_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|us| *us <= 1_000_000)
        .map_or(DEFAULT_SPIN, Duration::from_micros);
    let dir = tempfile::tempdir().unwrap();
    let mb = mailbox(&dir);
    assert_eq!(WaitConfig::default().spin, expected);
    assert_eq!(mb.wait_config().spin, expected);
    assert_eq!(Producer::claim(&mb, "ll").unwrap().wait_config().spin, expected);
    println!("default spin {} ns", expected.as_nanos());
}

/// Runs [`child_reports_the_default_spin`] in a process whose `MESH_SPIN_US` is `value`.
fn default_spin_with(value: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_reports_the_default_spin", "--nocapture", "--test-threads=1"])
        .env("MESH_SPIN_US", value)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "the child failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

#[test]
fn mesh_spin_us_sets_the_default_of_every_end_of_a_process_and_a_bad_value_is_ignored() {
    assert!(default_spin_with("3").contains("default spin 3000 ns"));
    assert!(default_spin_with("0").contains("default spin 0 ns"));
    let default = format!("default spin {} ns", DEFAULT_SPIN.as_nanos());
    for bad in ["ten", "1000001", "-1"] {
        assert!(default_spin_with(bad).contains(&default), "MESH_SPIN_US={bad}");
    }
}
