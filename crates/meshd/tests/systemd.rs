//! systemd's notifications as meshd sends them (`Type=notify`, `WatchdogSec=`): READY once, WATCHDOG pings only while the liveness check passes. Alone in its binary: it sets the environment systemd would.

use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

fn next(sock: &UnixDatagram) -> Option<String> {
    let mut buf = [0u8; 256];
    let n = sock.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[test]
fn ready_once_and_watchdog_pings_only_while_live() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // SAFETY: this binary's only test sets the variables before any thread of its own reads the
    // environment (sd-notify reads it inside the calls below).
    unsafe {
        std::env::set_var("NOTIFY_SOCKET", &path);
        std::env::set_var("WATCHDOG_USEC", "100000");
        std::env::set_var("WATCHDOG_PID", std::process::id().to_string());
    }
    meshd::health::notify_ready();
    assert_eq!(next(&sock).as_deref(), Some("READY=1\n"));
    let live = Arc::new(AtomicBool::new(true));
    let check = live.clone();
    let on = meshd::health::spawn_systemd_watchdog(move || {
        if check.load(Ordering::Acquire) { Ok("live".into()) } else { Err("not live".into()) }
    })
    .unwrap();
    assert!(on, "WATCHDOG_USEC for this pid turns the watchdog on");
    assert_eq!(next(&sock).as_deref(), Some("WATCHDOG=1\n"));
    live.store(false, Ordering::Release);
    // At most one ping was already on its way; after that, none for many periods (systemd would kill).
    sock.set_read_timeout(Some(Duration::from_millis(250))).unwrap();
    let _ = next(&sock);
    assert_eq!(next(&sock), None, "no ping while the backend thread is not live");
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    live.store(true, Ordering::Release);
    assert_eq!(next(&sock).as_deref(), Some("WATCHDOG=1\n"), "pings again once live");
    meshd::health::notify_stopping();
    let mut seen = next(&sock);
    while seen.as_deref() == Some("WATCHDOG=1\n") {
        seen = next(&sock);
    }
    assert_eq!(seen.as_deref(), Some("STOPPING=1\n"));
}
