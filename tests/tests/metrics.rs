//! meshd's metrics on the GPU, in both modes: scraped over HTTP (`--metrics-addr`) and over the control socket (`meshd metrics`) during loads, an upgrade, host↔GPU messages and a GPU fault; the counters move as `ps` says, and `/readyz` names the faulted program until it is unloaded.
//!
//! Prints `metrics <mode>:` lines with the figures seen (change, blink-pause and recovery times).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use mesh_gpu_tests::harness::Meshd;
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};

fn ptx_file(name: &str) -> String {
    programs_dir().join(format!("{name}.ptx")).display().to_string()
}

/// A loopback port free now (meshd binds it a moment later).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// GET `path`: status and body; `None` while nothing answers (blink mode replaces its process after a fault).
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(c, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").ok()?;
    let mut raw = String::new();
    c.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    Some((head.split(' ').nth(1)?.parse().ok()?, body.to_string()))
}

/// The samples of an exposition: (name, labels) → value.
type Samples = BTreeMap<(String, BTreeMap<String, String>), f64>;

fn parse(text: &str) -> Samples {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value = if value == "+Inf" { f64::INFINITY } else { value.parse().unwrap() };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => {
                let labels = l
                    .trim_end_matches('}')
                    .split("\",")
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (k, v) = p.split_once("=\"").unwrap();
                        (k.to_string(), v.trim_end_matches('"').to_string())
                    })
                    .collect();
                (n.to_string(), labels)
            }
            None => (series.to_string(), BTreeMap::new()),
        };
        out.insert((name, labels), value);
    }
    out
}

/// The sum of `name`'s samples that carry these labels (0 when there is none).
fn sum(s: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    s.iter()
        .filter(|((n, l), _)| n == name && labels.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|(_, v)| v)
        .sum()
}

fn scrape(addr: SocketAddr) -> Option<Samples> {
    match get(addr, "/metrics")? {
        (200, text) => Some(parse(&text)),
        _ => None,
    }
}

fn load_upgrade_messages_and_a_fault(mode: &str, extra: &[&str]) {
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let port_arg = port.to_string();
    let mut args = vec!["--metrics-addr", port_arg.as_str()];
    args.extend_from_slice(extra);
    let d = Meshd::start(&args);
    let s = scrape(addr).expect("/metrics answers once meshd is up");
    assert_eq!(sum(&s, "meshd_build_info", &[("mode", mode)]), 1.0, "{s:?}");
    assert!(s.keys().any(|(n, l)| n == "meshd_gpu_info" && l.get("UUID").is_some_and(|u| u.starts_with("GPU-"))));

    // Loads and messages.
    d.ok(&["channel", "create", "to-gpu", "--msg-size", "64", "--capacity", "16"]);
    d.ok(&["channel", "create", "from-gpu", "--msg-size", "64", "--capacity", "16"]);
    d.ok(&["load", "echo", &ptx_file("echo"), "--bind", "to-gpu", "--bind", "from-gpu"]);
    d.ok(&["load", "beat0", &ptx_file("heartbeat")]);
    d.ok(&["load", "beat1", &ptx_file("heartbeat")]);
    d.ok(&["send", "to-gpu", "one", "two", "three"]);
    d.ok(&["recv", "from-gpu", "--count", "3"]);
    let s = scrape(addr).unwrap();
    assert_eq!(sum(&s, "meshd_change_duration_seconds_count", &[("op", "load"), ("result", "ok")]), 3.0);
    assert_eq!(sum(&s, "meshd_channel_sent_messages_total", &[("channel", "to-gpu")]), 3.0);
    assert_eq!(sum(&s, "meshd_channel_received_messages_total", &[("channel", "from-gpu")]), 3.0);
    assert_eq!(sum(&s, "meshd_channel_depth_messages", &[]), 0.0, "every message went through");
    assert_eq!(sum(&s, "meshd_program_up", &[]), 3.0);
    let beats = |s: &Samples| sum(s, "meshd_program_heartbeats_total", &[("program", "beat0")]);
    let first = beats(&s);
    assert!(wait_until(Duration::from_secs(5), || scrape(addr).is_some_and(|s| beats(&s) > first)), "beats rise");
    assert!(wait_until(Duration::from_secs(5), || get(addr, "/readyz").is_some_and(|r| r.0 == 200)));
    assert_eq!(get(addr, "/livez").map(|r| r.0), Some(200));

    // An upgrade.
    d.ok(&["upgrade", "beat0", &ptx_file("heartbeat")]);
    let s = scrape(addr).unwrap();
    assert_eq!(sum(&s, "meshd_change_duration_seconds_count", &[("op", "upgrade"), ("result", "ok")]), 1.0);
    assert!(sum(&s, "meshd_program_generation", &[("program", "beat0")]) >= 2.0);
    if mode == "blink" {
        assert!(sum(&s, "meshd_blink_pause_duration_seconds_count", &[]) >= 4.0, "a blink per change: {s:?}");
        assert!(sum(&s, "meshd_program_blink_relaunches_total", &[("program", "echo")]) >= 3.0);
    }
    let over_socket = parse(&d.ok(&["metrics"]));
    assert_eq!(
        sum(&over_socket, "meshd_change_duration_seconds_count", &[("op", "upgrade")]),
        1.0,
        "meshd metrics shows the same figures"
    );
    eprintln!(
        "metrics {mode}: load mean {:.2} ms, upgrade {:.2} ms, blink pauses {} of mean {:.3} ms",
        1e3 * sum(&s, "meshd_change_duration_seconds_sum", &[("op", "load"), ("result", "ok")]) / 3.0,
        1e3 * sum(&s, "meshd_change_duration_seconds_sum", &[("op", "upgrade")]),
        sum(&s, "meshd_blink_pause_duration_seconds_count", &[]),
        1e3 * sum(&s, "meshd_blink_pause_duration_seconds_sum", &[])
            / sum(&s, "meshd_blink_pause_duration_seconds_count", &[]).max(1.0),
    );

    // A fault: recovered (blink: by replacing the process, whose new image counts it), the culprit
    // left stopped and named, the others relaunched.
    std::thread::sleep(Duration::from_millis(1700)); // past the recency window: the fault's image names it
    d.ok(&["load", "fault", &ptx_file("fault")]);
    let mut seen = None;
    let recovered = wait_until(Duration::from_secs(30), || {
        seen = scrape(addr);
        seen.as_ref().is_some_and(|s| {
            sum(s, "meshd_recoveries_total", &[("outcome", "recovered")]) >= 1.0
                && sum(s, "meshd_program_state", &[("program", "fault"), ("state", "faulted")]) == 1.0
                && sum(s, "meshd_program_up", &[("program", "beat1")]) == 1.0
        })
    });
    let s = seen.unwrap_or_default();
    assert!(recovered, "no recovery seen in the metrics within 30 s: {s:?}\n{}", d.log_text());
    let method = if mode == "blink" { "process_replacement" } else { "in_place" };
    assert_eq!(sum(&s, "meshd_recoveries_total", &[("method", method), ("mode", mode)]), 1.0, "{s:?}");
    assert!(sum(&s, "meshd_program_restarts_total", &[("program", "beat1")]) >= 1.0);
    assert!(sum(&s, "meshd_program_last_fault_timestamp_seconds", &[("program", "fault")]) > 1.6e9);
    eprintln!(
        "metrics {mode}: recovery {method} in {:.1} ms (fault noticed to programs relaunched)",
        1e3 * sum(&s, "meshd_recovery_duration_seconds_sum", &[])
    );
    let (code, body) = get(addr, "/readyz").unwrap();
    assert_eq!(code, 503, "a faulted program is not ready: {body}");
    assert!(body.contains("program fault"), "{body}");
    d.ok(&["unload", "fault"]);
    assert!(
        wait_until(Duration::from_secs(10), || get(addr, "/readyz").is_some_and(|r| r.0 == 200)),
        "ready again without the culprit: {:?}",
        get(addr, "/readyz")
    );
    d.ok(&["shutdown"]);
}

#[test]
fn metrics_blink_follow_loads_an_upgrade_messages_and_a_fault() {
    require_gpu!("metrics_blink_follow_loads_an_upgrade_messages_and_a_fault");
    load_upgrade_messages_and_a_fault("blink", &[]);
}

#[test]
fn metrics_mps_follow_loads_an_upgrade_messages_and_a_fault() {
    require_gpu!("metrics_mps_follow_loads_an_upgrade_messages_and_a_fault");
    load_upgrade_messages_and_a_fault("mps", &["--isolation", "mps", "--pool", "6"]);
}
