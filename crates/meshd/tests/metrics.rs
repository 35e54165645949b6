//! The monitoring endpoint against a stand-in backend: `/metrics` scraped over loopback and parsed (names, types, labels, values following `ps`), `/livez` and `/readyz`, a long recovery in place seen at once by `ps`, `/readyz` and `/metrics`, `meshd metrics` over the control socket, and slow or silent HTTP clients that stall neither a scrape nor the control socket.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use common::{ListBackend, PTX, ask, load_req, wait_until, within};
use mesh_backend::{
    Backend, BackendEvent, IsolationMode, ProgramSpec, ProgramStatus, RecoveryBoard, RecoveryMethod, RecoveryOutcome,
};
use mesh_shm::{Mailbox, Producer};
use meshd::health::HealthConfig;
use meshd::http::{Endpoint, HttpLimits};
use meshd::protocol::Request;
use meshd::server::{Limits, Opened, Server, StopHandle};
use meshd::stand_in::RecoveryKnob;
use meshd::start::bind_socket;
use meshd::state::StateStore;

/// Generous: only a deadline for things that should take milliseconds.
const DEADLINE: Duration = Duration::from_secs(20);

/// The stand-in backend, plus events a test hands it to report (as blink's pauses and recoveries).
struct Evented {
    inner: ListBackend,
    events: Arc<Mutex<Vec<BackendEvent>>>,
}

impl Backend for Evented {
    fn mode(&self) -> IsolationMode {
        self.inner.mode()
    }
    fn load(&mut self, spec: ProgramSpec) -> mesh_backend::Result<ProgramStatus> {
        self.inner.load(spec)
    }
    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> mesh_backend::Result<ProgramStatus> {
        self.inner.upgrade(name, image)
    }
    fn unload(&mut self, name: &str) -> mesh_backend::Result<()> {
        self.inner.unload(name)
    }
    fn status(&self) -> Vec<ProgramStatus> {
        self.inner.status()
    }
    fn watch(&mut self) -> Vec<String> {
        self.inner.watch()
    }
    fn set_recovery_board(&mut self, board: RecoveryBoard) {
        self.inner.set_recovery_board(board);
    }
    fn shutdown(&mut self) -> mesh_backend::Result<()> {
        self.inner.shutdown()
    }
    fn host_atomics(&self) -> bool {
        false
    }
    fn take_events(&mut self) -> Vec<BackendEvent> {
        std::mem::take(&mut *self.events.lock().unwrap())
    }
}

struct Running {
    socket: PathBuf,
    mailbox: Mailbox,
    http: SocketAddr,
    stop: StopHandle,
    events: Arc<Mutex<Vec<BackendEvent>>>,
    server: Option<JoinHandle<bool>>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(health: HealthConfig, http: HttpLimits) -> Self {
        Self::start_gated(health, http, None)
    }

    /// With `gate`: a load of a program named `slow…` waits on the backend thread until the test sends on it.
    fn start_gated(health: HealthConfig, http: HttpLimits, gate: Option<mpsc::Receiver<()>>) -> Self {
        Self::start_with(health, http, gate, RecoveryKnob::new())
    }

    /// With `knob`: the test arms a long recovery in place that the next watchdog tick acts out.
    fn start_with(
        health: HealthConfig,
        http: HttpLimits,
        gate: Option<mpsc::Receiver<()>>,
        knob: RecoveryKnob,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sock");
        let mailbox = common::small_mailbox(dir.path());
        let store = StateStore::open(&dir.path().join("state")).unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let for_backend = events.clone();
        let server = Server::start(mailbox.clone(), Limits::default(), Some(store), move |mb| {
            let inner = match gate {
                Some(g) => ListBackend::new(mb).with_gate(g),
                None => ListBackend::new(mb),
            }
            .with_knob(knob);
            Ok(Opened {
                backend: Box::new(Evented { inner, events: for_backend }),
                device: "test double".into(),
                arch: None,
            })
        })
        .unwrap();
        let monitor = server.monitor();
        monitor.metrics().set_health(health);
        let endpoint = Endpoint::bind("127.0.0.1:0").unwrap();
        let http_addr = endpoint.local_addr();
        endpoint.serve(monitor, http).unwrap();
        let listener = bind_socket(&socket).unwrap();
        let stop = server.stop_handle();
        let server = Some(std::thread::spawn(move || server.run(listener).unwrap()));
        Self { socket, mailbox, http: http_addr, stop, events, server, _dir: dir }
    }

    fn get(&self, path: &str) -> (u16, String) {
        get(self.http, path)
    }

    /// Sets program slot `slot`'s heartbeat word, as its kernel would.
    fn beat(&self, slot: u32, value: u64) {
        let s = self.mailbox.slot(slot).unwrap();
        let words = self.mailbox.as_raw_parts().0;
        let at = usize::try_from(s.offset()).unwrap()
            + core::mem::offset_of!(mesh_shm::layout::Slot, status)
            + core::mem::offset_of!(mesh_shm::layout::SlotStatus, heartbeat);
        // SAFETY: the heartbeat word of this slot lies inside the mapping and is 8-aligned; only the
        // test writes it (the stand-in backend runs no kernel).
        unsafe { AtomicU64::from_ptr(words.add(at).cast()) }.store(value, Ordering::Release);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(h) = self.server.take() {
            let _ = within(DEADLINE, move || h.join());
        }
    }
}

/// One HTTP GET over loopback: status and body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(c, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut raw = String::new();
    c.read_to_string(&mut raw).unwrap();
    parse_response(&raw)
}

fn parse_response(raw: &str) -> (u16, String) {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP head in {raw:?}"));
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("status in {head:?}"));
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("Content-Length in {head:?}"));
    assert_eq!(body.len(), len, "the body is as long as the head says");
    (code, body.to_string())
}

/// One sample of the exposition.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The exposition parsed as the Prometheus text format 0.0.4: families' types and samples.
/// Panics (failing the test) on anything that format does not allow.
struct Exposition {
    types: HashMap<String, String>,
    samples: Vec<Sample>,
}

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").unwrap_or_else(|| panic!("label in {s:?}"));
        assert!(valid_name(key), "label name {key:?}");
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => panic!("escape at the end of {s:?}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value in {s:?}"),
            }
        };
        out.insert(key.to_string(), value);
        rest = after[end + 1..].strip_prefix(',').unwrap_or(&after[end + 1..]);
    }
    out
}

fn parse_exposition(text: &str) -> Exposition {
    let (mut types, mut samples) = (HashMap::new(), Vec::new());
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind), "{line}");
            assert!(types.insert(name.to_string(), kind.to_string()).is_none(), "{name} typed twice");
            continue;
        }
        if line.starts_with('#') {
            assert!(line.starts_with("# HELP "), "only HELP and TYPE comments: {line}");
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("sample {line:?}"));
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, parse_labels(l.strip_suffix('}').unwrap())),
            None => (series, BTreeMap::new()),
        };
        assert!(valid_name(name), "metric name {name:?}");
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.get(*f).is_some_and(|t| t == "histogram")))
            .unwrap_or(name);
        assert!(types.contains_key(family), "{name} has no TYPE line before it");
        samples.push(Sample { name: name.to_string(), labels, value });
    }
    Exposition { types, samples }
}

impl Exposition {
    /// The value of `name` with (at least) these labels; panics when there is not exactly one.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
            .collect();
        assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
        found[0].value
    }

    fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }
}

fn scrape(d: &Running) -> Exposition {
    let (code, text) = d.get("/metrics");
    assert_eq!(code, 200, "{text}");
    parse_exposition(&text)
}

/// /readyz fails soon after a heartbeat stops.
fn fast_readiness() -> HealthConfig {
    HealthConfig { max_heartbeat_age: Duration::from_millis(300), ..HealthConfig::default() }
}

/// /livez fails soon after the backend thread stops passing between jobs.
fn fast_liveness() -> HealthConfig {
    HealthConfig { live_deadline: Duration::from_millis(300), ..HealthConfig::default() }
}

#[test]
fn a_scrape_over_loopback_follows_ps_and_info() {
    let d = Running::start(HealthConfig::default(), HttpLimits::default());
    assert!(
        ask(
            &d.socket,
            &Request::ChannelCreate {
                name: "in".into(),
                msg_size: 8,
                capacity: 16,
                placement: String::new(),
                protocol: String::new(),
                parts: 1,
            },
            &[]
        )
        .ok
    );
    assert!(ask(&d.socket, &load_req("a", &["in"]), PTX).ok);
    let mut quiet = load_req("quiet", &[]);
    if let Request::Load { no_readiness, .. } = &mut quiet {
        *no_readiness = true;
    }
    assert!(ask(&d.socket, &quiet, PTX).ok);
    assert!(!ask(&d.socket, &load_req("a", &[]), PTX).ok, "a refused load is counted as refused");
    assert!(ask(&d.socket, &Request::Upgrade { name: "a".into(), image_len: PTX.len() }, PTX).ok);
    let mut tx = Producer::claim(&d.mailbox, "in").unwrap();
    for i in 0..5u64 {
        tx.send(&i.to_le_bytes(), DEADLINE).unwrap();
    }
    drop(tx);
    d.beat(0, 4242);
    d.events.lock().unwrap().extend([
        BackendEvent::BlinkPause { took: Duration::from_micros(300), relaunched: vec!["a".into(), "quiet".into()] },
        BackendEvent::Recovery {
            method: RecoveryMethod::InPlace,
            outcome: RecoveryOutcome::Recovered,
            took: Duration::from_millis(40),
        },
        BackendEvent::Adoption { program: "a".into(), adopted: true },
        BackendEvent::Adoption { program: "b".into(), adopted: true },
        BackendEvent::Adoption { program: "c".into(), adopted: false },
    ]);
    // The backend thread hands events over between jobs (every watchdog tick).
    assert!(wait_until(DEADLINE, || scrape(&d).has("meshd_recoveries_total")), "the recovery reached the metrics");

    let ps = ask(&d.socket, &Request::Ps, &[]).programs.unwrap();
    let m = scrape(&d);
    for (name, kind) in [
        ("meshd_program_up", "gauge"),
        ("meshd_program_restarts_total", "counter"),
        ("meshd_program_heartbeats_total", "counter"),
        ("meshd_program_heartbeat_age_seconds", "gauge"),
        ("meshd_program_blink_relaunches_total", "counter"),
        ("meshd_channel_sent_messages_total", "counter"),
        ("meshd_channel_depth_messages", "gauge"),
        ("meshd_change_duration_seconds", "histogram"),
        ("meshd_blink_pause_duration_seconds", "histogram"),
        ("meshd_recovery_duration_seconds", "histogram"),
        ("meshd_recoveries_total", "counter"),
        ("meshd_programs_adopted_total", "counter"),
        ("meshd_build_info", "gauge"),
        ("meshd_gpu_info", "gauge"),
        ("meshd_native_workers", "gauge"),
    ] {
        assert_eq!(m.types.get(name).map(String::as_str), Some(kind), "{name}");
    }
    for (name, kind) in &m.types {
        assert!(name.starts_with("meshd_"), "{name}: every name has meshd's prefix");
        assert_eq!(kind == "counter", name.ends_with("_total"), "{name}: counters and only counters end in _total");
    }
    assert!(m.samples.iter().all(|s| s.labels.get("gpu").map(String::as_str) == Some("0")), "DCGM's gpu label");
    for p in &ps {
        let l = [("program", p.name.as_str())];
        assert_eq!(m.value("meshd_program_heartbeats_total", &l), p.heartbeat as f64, "{}", p.name);
        assert_eq!(m.value("meshd_program_generation", &l), f64::from(p.generation));
        assert_eq!(m.value("meshd_program_restarts_total", &l), f64::from(p.restarts));
        assert_eq!(m.value("meshd_program_up", &l), 1.0);
        assert_eq!(m.value("meshd_program_state", &[("program", &p.name), ("state", "running")]), 1.0);
        assert_eq!(m.value("meshd_program_state", &[("program", &p.name), ("state", "faulted")]), 0.0);
        assert_eq!(m.value("meshd_program_blink_relaunches_total", &l), 1.0);
    }
    assert_eq!(ps.iter().find(|p| p.name == "a").unwrap().heartbeat, 4242, "ps reads the slot fresh");
    assert_eq!(m.value("meshd_program_generation", &[("program", "a")]), 2.0, "the upgrade relaunched a");
    assert_eq!(m.value("meshd_program_readiness_exempt", &[("program", "quiet")]), 1.0);
    assert_eq!(m.value("meshd_program_readiness_exempt", &[("program", "a")]), 0.0);
    let ch = [("channel", "in"), ("placement", "host")];
    assert_eq!(m.value("meshd_channel_sent_messages_total", &ch), 5.0);
    assert_eq!(m.value("meshd_channel_received_messages_total", &ch), 0.0);
    assert_eq!(m.value("meshd_channel_depth_messages", &ch), 5.0);
    assert_eq!(m.value("meshd_channel_capacity_messages", &ch), 16.0);
    let count =
        |op: &str, result: &str| m.value("meshd_change_duration_seconds_count", &[("op", op), ("result", result)]);
    assert_eq!((count("load", "ok"), count("load", "refused"), count("upgrade", "ok")), (2.0, 1.0, 1.0));
    assert_eq!(count("channel_create", "ok"), 1.0);
    assert_eq!(
        m.value("meshd_change_duration_seconds_bucket", &[("op", "load"), ("result", "ok"), ("le", "+Inf")]),
        2.0
    );
    assert_eq!(m.value("meshd_blink_pause_duration_seconds_count", &[]), 1.0);
    let rec = [("mode", "blink"), ("method", "in_place"), ("outcome", "recovered")];
    assert_eq!(m.value("meshd_recoveries_total", &rec), 1.0);
    assert!((m.value("meshd_recovery_duration_seconds_sum", &rec) - 0.040).abs() < 1e-9);
    assert_eq!(m.value("meshd_programs_adopted_total", &[("outcome", "adopted")]), 2.0);
    assert_eq!(m.value("meshd_programs_adopted_total", &[("outcome", "stopped")]), 1.0);
    assert_eq!(m.value("meshd_build_info", &[("mode", "blink")]), 1.0);
    assert_eq!(m.value("meshd_gpu_info", &[("modelName", "test double")]), 1.0);
    assert_eq!(m.value("meshd_ready", &[]), 1.0);
    assert!(!m.has("meshd_mps_pool_workers"), "no pool in blink mode");

    // The control socket's `metrics` is the same exposition.
    let text = ask(&d.socket, &Request::Metrics, &[]).metrics.unwrap();
    let over_socket = parse_exposition(&text);
    assert_eq!(over_socket.types, m.types);
    assert_eq!(over_socket.value("meshd_channel_sent_messages_total", &ch), 5.0);

    // An unloaded program's series go with it.
    assert!(ask(&d.socket, &Request::Unload { name: "quiet".into() }, &[]).ok);
    let m = scrape(&d);
    assert!(!m.samples.iter().any(|s| s.labels.get("program").is_some_and(|p| p == "quiet")));
    assert_eq!(m.value("meshd_change_duration_seconds_count", &[("op", "unload"), ("result", "ok")]), 1.0);
}

/// A service's series follow its clients: slots, attached clients and shards from `info`, and a
/// client's departure that no program has acknowledged (the stand-in runs none) as a slot awaiting
/// its ack; nothing holds the ring.
#[test]
fn a_service_shows_its_clients_and_unacknowledged_departures() {
    let d = Running::start(HealthConfig::default(), HttpLimits::default());
    let create = Request::ServiceCreate {
        name: "kv".into(),
        clients: 4,
        msg_size: 64,
        capacity: 16,
        reply_size: None,
        reply_capacity: 4,
        shards: 2,
    };
    let r = ask(&d.socket, &create, &[]);
    assert!(r.ok, "{r:?}");
    let svc = [("service", "kv")];
    let m = scrape(&d);
    for name in [
        "meshd_service_client_slots",
        "meshd_service_clients",
        "meshd_service_awaiting_ack_slots",
        "meshd_service_shards",
        "meshd_service_held_shards",
        "meshd_service_held_seconds",
        "meshd_service_state_unreadable",
    ] {
        assert_eq!(m.types.get(name).map(String::as_str), Some("gauge"), "{name}");
    }
    assert_eq!(m.value("meshd_service_client_slots", &svc), 4.0);
    assert_eq!(m.value("meshd_service_shards", &svc), 2.0);
    assert_eq!(m.value("meshd_service_clients", &svc), 0.0);
    let a = meshd::ServiceClient::connect(&d.socket, "kv").unwrap();
    let _b = meshd::ServiceClient::connect(&d.socket, "kv").unwrap();
    assert_eq!(scrape(&d).value("meshd_service_clients", &svc), 2.0, "two attached");
    a.detach().unwrap();
    let gone = |m: &Exposition| {
        m.value("meshd_service_clients", &svc) == 1.0 && m.value("meshd_service_awaiting_ack_slots", &svc) == 1.0
    };
    assert!(wait_until(DEADLINE, || gone(&scrape(&d))), "the detached client's slot awaits the program's ack");
    let m = scrape(&d);
    assert_eq!(m.value("meshd_service_clients_attached_total", &svc), 2.0);
    assert_eq!(m.value("meshd_service_clients_detached_total", &svc), 1.0);
    assert_eq!(m.value("meshd_service_clients_died_total", &svc), 0.0);
    assert_eq!(m.types.get("meshd_service_stall_kills_total").map(String::as_str), Some("counter"));
    assert_eq!(m.value("meshd_service_held_shards", &svc), 0.0);
    assert_eq!(m.value("meshd_service_held_seconds", &svc), 0.0);
    assert_eq!(m.value("meshd_service_state_unreadable", &svc), 0.0);
}

#[test]
fn readyz_follows_heartbeats_and_leaves_out_the_opted_out() {
    let d = Running::start(fast_readiness(), HttpLimits::default());
    assert!(wait_until(DEADLINE, || d.get("/readyz").0 == 200), "nothing loaded, the backend open: ready");
    assert!(ask(&d.socket, &load_req("a", &[]), PTX).ok);
    let mut quiet = load_req("quiet", &[]);
    if let Request::Load { no_readiness, .. } = &mut quiet {
        *no_readiness = true;
    }
    assert!(ask(&d.socket, &quiet, PTX).ok);
    // Nobody beats: a's heartbeat grows old; quiet is never named.
    assert!(wait_until(DEADLINE, || d.get("/readyz").0 == 503), "a program that stopped beating is not ready");
    let (_, body) = d.get("/readyz");
    assert!(body.contains("program a: heartbeat 0 unchanged") && body.contains("--health-max-heartbeat-age"), "{body}");
    assert!(!body.contains("quiet"), "{body}");
    assert_eq!(scrape(&d).value("meshd_ready", &[]), 0.0);
    // a beats again (a kernel's loop).
    let beating = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let beater = {
        let (beating, mailbox) = (beating.clone(), d.mailbox.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while beating.load(Ordering::Acquire) {
                n += 1;
                let s = mailbox.slot(0).unwrap();
                let at = usize::try_from(s.offset()).unwrap()
                    + core::mem::offset_of!(mesh_shm::layout::Slot, status)
                    + core::mem::offset_of!(mesh_shm::layout::SlotStatus, heartbeat);
                // SAFETY: slot 0's heartbeat word, inside the mapping and 8-aligned; only this thread writes it.
                unsafe { AtomicU64::from_ptr(mailbox.as_raw_parts().0.add(at).cast()) }.store(n, Ordering::Release);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    assert!(wait_until(DEADLINE, || d.get("/readyz").0 == 200), "a beating program is ready again");
    assert!(d.get("/readyz").1.contains("1 exempt"));
    beating.store(false, Ordering::Release);
    beater.join().unwrap();
    let (code, body) = d.get("/livez");
    assert_eq!(code, 200, "{body}");
    d.stop.stop();
    assert!(wait_until(DEADLINE, || d.get("/readyz").1.contains("shutting down")), "a stopping meshd is not ready");
}

#[test]
fn livez_fails_while_the_backend_thread_is_stuck_and_scrapes_still_answer() {
    let (open, gate) = mpsc::channel();
    let d = Running::start_gated(fast_liveness(), HttpLimits::default(), Some(gate));
    assert!(wait_until(DEADLINE, || d.get("/livez").0 == 200));
    let socket = d.socket.clone();
    let load = std::thread::spawn(move || ask(&socket, &load_req("slow", &[]), PTX));
    assert!(wait_until(DEADLINE, || d.get("/livez").0 == 503), "a backend thread held in one job is not live");
    let (_, body) = d.get("/livez");
    assert!(body.contains("has not passed between jobs") && body.contains("--health-live-deadline"), "{body}");
    // Neither a scrape nor ps waits for the backend.
    assert_eq!(d.get("/metrics").0, 200);
    assert!(ask(&d.socket, &Request::Ps, &[]).ok);
    open.send(()).unwrap();
    assert!(load.join().unwrap().ok);
    assert!(wait_until(DEADLINE, || d.get("/livez").0 == 200), "live again once the job is done");
}

/// `ps`'s row for `name`.
fn ps_row(d: &Running, name: &str) -> meshd::protocol::ProgramRow {
    let rows = ask(&d.socket, &Request::Ps, &[]).programs.unwrap();
    rows.into_iter().find(|p| p.name == name).unwrap_or_else(|| panic!("{name} in ps"))
}

/// GET `path`, timed: the answer and how long it took (printed by the caller, asserted by none).
fn timed_get(d: &Running, path: &str) -> ((u16, String), Duration) {
    let at = std::time::Instant::now();
    let answer = d.get(path);
    (answer, at.elapsed())
}

const FAULT: &str = "GPU fault (CUDA_ERROR_ILLEGAL_ADDRESS) in a";

#[test]
fn a_recovery_in_place_shows_at_once_in_ps_readyz_and_metrics_while_the_backend_thread_is_inside_it() {
    let knob = RecoveryKnob::new();
    let d = Running::start_with(HealthConfig::default(), HttpLimits::default(), None, knob.clone());
    assert!(ask(&d.socket, &load_req("a", &[]), PTX).ok);
    assert!(ask(&d.socket, &load_req("b", &[]), PTX).ok);
    assert!(wait_until(DEADLINE, || d.get("/readyz").0 == 200), "both just launched: ready");
    let m = scrape(&d);
    assert_eq!(m.value("meshd_recovery_in_progress", &[]), 0.0);
    assert_eq!(m.value("meshd_recoveries_begun_total", &[]), 0.0);

    // The next watchdog tick begins a recovery that holds every program until the test steps it
    // (or DEADLINE passes): the backend thread stays inside that one `watch` call throughout.
    knob.fault(FAULT, DEADLINE);
    assert!(
        wait_until(DEADLINE, || d.get("/readyz").0 == 503),
        "/readyz says so while the backend thread is still inside the recovery"
    );
    let ((code, body), took) = timed_get(&d, "/readyz");
    eprintln!("/readyz during the recovery: {code} in {:.2} ms: {body}", took.as_secs_f64() * 1e3);
    assert_eq!(code, 503, "{body}");
    assert!(body.contains(&format!("recovering from {FAULT} for ")) && body.contains("ms: programs a, b"), "{body}");
    let ((code, body), took) = timed_get(&d, "/livez");
    eprintln!("/livez during the recovery: {code} in {:.2} ms", took.as_secs_f64() * 1e3);
    assert_eq!(code, 200, "a recovery in progress is live: {body}");
    for name in ["a", "b"] {
        let row = ps_row(&d, name);
        assert_eq!((row.state.as_str(), row.restarts), ("recovering", 0), "{row:?}");
        let r = row.recovery.as_ref().unwrap_or_else(|| panic!("the recovery on {row:?}"));
        assert_eq!(r.reason, FAULT);
        assert!(r.since_unix_ms > 0, "{r:?}");
    }
    let socket = d.socket.clone();
    assert_eq!(within(DEADLINE, move || ask(&socket, &Request::Info, &[]).ok), Some(true), "info answers");
    let m = scrape(&d);
    assert_eq!(m.value("meshd_recovery_in_progress", &[]), 1.0);
    assert!(m.value("meshd_recovery_in_progress_seconds", &[]) >= 0.0);
    assert_eq!(m.value("meshd_recovery_in_progress_programs", &[]), 2.0);
    assert_eq!(m.value("meshd_recoveries_begun_total", &[]), 1.0);
    assert_eq!(m.value("meshd_program_state", &[("program", "a"), ("state", "recovering")]), 1.0);
    assert_eq!(m.value("meshd_program_state", &[("program", "a"), ("state", "running")]), 0.0);
    assert_eq!(m.value("meshd_program_up", &[("program", "b")]), 0.0);
    assert_eq!(m.value("meshd_ready", &[]), 0.0);

    // a is relaunched, b still held: a's restart shows at once, before the recovery ends.
    knob.step();
    assert!(wait_until(DEADLINE, || ps_row(&d, "a").state == "running"), "a relaunched");
    let a = ps_row(&d, "a");
    assert_eq!((a.restarts, a.recovery), (1, None), "counted when it happened");
    assert_eq!(ps_row(&d, "b").state, "recovering", "b waits for its own step");
    let m = scrape(&d);
    assert_eq!(m.value("meshd_program_restarts_total", &[("program", "a")]), 1.0);
    assert_eq!(m.value("meshd_recovery_in_progress", &[]), 1.0);
    assert_eq!(m.value("meshd_recovery_in_progress_programs", &[]), 1.0);
    let (code, body) = d.get("/readyz");
    assert!(code == 503 && body.contains("programs b") && !body.contains("programs a"), "{code} {body}");

    // b too: the recovery ends, all is back.
    knob.step();
    assert!(wait_until(DEADLINE, || d.get("/readyz").0 == 200), "ready again once the recovery ends");
    for name in ["a", "b"] {
        let row = ps_row(&d, name);
        assert_eq!((row.state.as_str(), row.restarts, row.generation), ("running", 1, 2), "{row:?}");
        assert!(row.recovery.is_none());
    }
    let m = scrape(&d);
    assert_eq!(m.value("meshd_recovery_in_progress", &[]), 0.0);
    assert_eq!(m.value("meshd_recovery_in_progress_seconds", &[]), 0.0);
    assert_eq!(m.value("meshd_recoveries_begun_total", &[]), 1.0);
    assert_eq!(m.value("meshd_program_restarts_total", &[("program", "b")]), 1.0);
    assert_eq!(m.value("meshd_program_state", &[("program", "b"), ("state", "running")]), 1.0);
    assert_eq!(m.value("meshd_ready", &[]), 1.0);

    // An unloaded program takes its restarts with it: a new one of that name starts from 0.
    assert!(ask(&d.socket, &Request::Unload { name: "a".into() }, &[]).ok);
    assert!(ask(&d.socket, &load_req("a", &[]), PTX).ok);
    assert_eq!(ps_row(&d, "a").restarts, 0);
}

#[test]
fn a_recovery_that_holds_the_backend_thread_for_2_s_is_seen_throughout_and_ends_by_itself() {
    let knob = RecoveryKnob::new();
    let d = Running::start_with(HealthConfig::default(), HttpLimits::default(), None, knob.clone());
    assert!(ask(&d.socket, &load_req("a", &[]), PTX).ok);
    assert!(wait_until(DEADLINE, || d.get("/readyz").0 == 200));
    let armed = std::time::Instant::now();
    knob.fault(FAULT, Duration::from_secs(2));
    assert!(wait_until(DEADLINE, || d.get("/readyz").0 == 503), "not ready while it runs");
    eprintln!("/readyz turned 503 {:.1} ms after the fault was armed", armed.elapsed().as_secs_f64() * 1e3);
    let mut answers = Vec::new();
    while d.get("/readyz").0 == 503 {
        let ((_, _), readyz) = timed_get(&d, "/readyz");
        let ((live, _), livez) = timed_get(&d, "/livez");
        assert_eq!(live, 200);
        answers.push((readyz, livez));
        std::thread::sleep(Duration::from_millis(100));
    }
    let slowest = |f: fn(&(Duration, Duration)) -> Duration| answers.iter().map(f).max().unwrap_or_default();
    eprintln!(
        "{} probes during the recovery; slowest /readyz {:.2} ms, /livez {:.2} ms; it ended {:.0} ms after being armed",
        answers.len(),
        slowest(|a| a.0).as_secs_f64() * 1e3,
        slowest(|a| a.1).as_secs_f64() * 1e3,
        armed.elapsed().as_secs_f64() * 1e3
    );
    assert!(wait_until(DEADLINE, || ps_row(&d, "a").state == "running"));
    assert_eq!(ps_row(&d, "a").restarts, 1);
    assert_eq!(scrape(&d).value("meshd_recovery_in_progress", &[]), 0.0);
}

#[test]
fn silent_and_slow_http_clients_stall_neither_a_scrape_nor_the_control_socket() {
    let d = Running::start(HealthConfig::default(), HttpLimits::default());
    assert!(ask(&d.socket, &load_req("a", &[]), PTX).ok);
    // One that sends nothing, one that trickles an unfinished head, one that never reads its answer.
    let silent = TcpStream::connect(d.http).unwrap();
    let mut trickle = TcpStream::connect(d.http).unwrap();
    trickle.write_all(b"GET /metr").unwrap();
    let mut deaf = TcpStream::connect(d.http).unwrap();
    deaf.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let http = d.http;
    let scraped = within(DEADLINE, move || get(http, "/metrics"));
    assert_eq!(scraped.map(|(c, _)| c), Some(200), "a scrape is served beside them");
    let socket = d.socket.clone();
    assert!(within(DEADLINE, move || ask(&socket, &Request::Ps, &[]).ok) == Some(true), "so is ps");
    // The silent and trickling clients are answered 408 and closed once their time is up.
    for mut c in [silent, trickle] {
        c.set_read_timeout(Some(DEADLINE)).unwrap();
        let mut raw = String::new();
        c.read_to_string(&mut raw).unwrap();
        let (code, body) = parse_response(&raw);
        assert_eq!(code, 408, "{body}");
    }
    drop(deaf);
}

#[test]
fn past_the_connection_limit_a_client_is_answered_at_once() {
    // Held connections never time out here: only the limit answers the next one.
    let limits = HttpLimits { max_connections: 2, idle: DEADLINE * 2, ..HttpLimits::default() };
    let d = Running::start(HealthConfig::default(), limits);
    let held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(d.http).unwrap()).collect();
    let (code, body) = d.get("/metrics");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("its limit"), "{body}");
    drop(held);
    assert!(wait_until(DEADLINE, || d.get("/metrics").0 == 200), "served again once they are gone");
}

#[test]
fn other_paths_and_methods_are_refused_with_their_reason() {
    let d = Running::start(HealthConfig::default(), HttpLimits::default());
    let (code, body) = d.get("/nothing");
    assert_eq!(code, 404);
    assert!(body.contains("/metrics, /livez and /readyz"), "{body}");
    let mut c = TcpStream::connect(d.http).unwrap();
    c.write_all(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").unwrap();
    let mut raw = String::new();
    c.read_to_string(&mut raw).unwrap();
    assert_eq!(parse_response(&raw).0, 405);
    assert!(raw.contains("Allow: GET, HEAD"), "{raw}");
    let mut c = TcpStream::connect(d.http).unwrap();
    c.write_all(b"HEAD /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut raw = String::new();
    c.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 200 OK\r\n") && raw.ends_with("\r\n\r\n"), "HEAD: no body: {raw}");
}

#[test]
fn a_bad_or_taken_metrics_address_refuses_the_start_before_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let shm = dir.path().join("mb");
    let run = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_meshd"))
            .arg("run")
            .arg("--shm")
            .arg(&shm)
            .arg("--socket")
            .arg(dir.path().join("sock"))
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&["--metrics-addr", "nine"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--metrics-addr \"nine\": expected PORT or HOST:PORT"), "{err}");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = run(&["--metrics-addr", &port]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("binding 127.0.0.1:{port}")), "a bare port is loopback's: {err}");
    assert!(!shm.exists(), "refused before the mailbox is made (and the GPU touched)");
    let out = run(&["--health-max-heartbeat-age", "0"]);
    assert_eq!(out.status.code(), Some(2), "bad usage: {}", String::from_utf8_lossy(&out.stderr));
}

/// An exposition with every family: a pool, a faulted program, a native worker, every kind of event.
fn everything() -> Exposition {
    use meshd::metrics::{Metrics, render};
    use meshd::observe::Scrape;
    use meshd::protocol::{ChannelRow, Info, InfoExtra, PoolRow, ProgramRow, ServiceHold, ServiceRow};
    let m = Metrics::new();
    m.change_done(Some("load"), true, Duration::from_millis(3));
    m.change_done(Some("load"), false, Duration::from_millis(1));
    m.backend_events(
        IsolationMode::Mps,
        vec![
            BackendEvent::BlinkPause { took: Duration::from_micros(80), relaunched: vec!["a".into()] },
            BackendEvent::Recovery {
                method: RecoveryMethod::InPlace,
                outcome: RecoveryOutcome::Failed,
                took: Duration::from_millis(9),
            },
            BackendEvent::Adoption { program: "a".into(), adopted: true },
        ],
    );
    m.backend_pass();
    let row = |name: &str, state: &str| ProgramRow {
        name: name.into(),
        slot: 0,
        state: state.into(),
        generation: 3,
        heartbeat: 10,
        worker_pid: Some(77),
        sms: Some(16),
        kind: "ptx".into(),
        grid: [1, 1, 1],
        block: [32, 1, 1],
        restarts: 1,
        last_fault: Some("GPU fault: CUDA_ERROR_ILLEGAL_ADDRESS".into()),
        last_fault_unix_ms: Some(1_700_000_000_000),
        stopped_why: None,
        recovery: None,
        user: Vec::new(),
        adopted: false,
    };
    let info = Info {
        mode: "mps".into(),
        mailbox: "/dev/shm/mb".into(),
        device: "NVIDIA H200".into(),
        host_atomics: false,
        channels: vec![ChannelRow {
            name: "c".into(),
            msg_size: 64,
            capacity: 8,
            placement: "host".into(),
            protocol: "ll".into(),
            parts: 1,
            lost: 0,
            head: 9,
            tail: 4,
        }],
        services: vec![
            ServiceRow {
                name: "kv".into(),
                entries: 64,
                bound: 3,
                shards: 4,
                awaiting_ack: 2,
                events: meshd::protocol::ServiceEvents {
                    attached: 9,
                    detached: 3,
                    died: 3,
                    skipped: 1,
                    stall_revoked: 4,
                    stall_killed: 1,
                },
                holds: [(1, 1500), (3, 250)]
                    .map(|(shard, since_ms)| ServiceHold { client: 7, pid: 70, seq: 5, shard, since_ms, stopped: true })
                    .to_vec(),
                ..ServiceRow::default()
            },
            ServiceRow {
                name: "torn".into(),
                entries: 8,
                shards: 1,
                error: Some("group word corrupt".into()),
                ..ServiceRow::default()
            },
        ],
        arena: Some(meshd::protocol::ArenaRow {
            in_use_bytes: 4096,
            free_bytes: 1 << 20,
            largest_free_bytes: 1 << 19,
            descriptors_in_use: 5,
            descriptors_total: 256,
        }),
        extra: InfoExtra {
            device_uuid: Some("GPU-5f3a".into()),
            device_selector: Some("GPU-5f3a".into()),
            pool: Some(PoolRow { size: 2, idle: 1, in_use: 1, client_limit: 48, stalls: 3, ..PoolRow::default() }),
            ..InfoExtra::default()
        },
    };
    let native = meshd::native::NativeRow {
        name: "n".into(),
        pid: 9,
        state: "exited(0)".into(),
        bind: vec![],
        command: "true".into(),
        isolation: "mps".into(),
    };
    let scrape = Scrape {
        programs: vec![row("a", "running"), row("b", "faulted: caused a GPU fault")],
        natives: vec![native],
        info: Ok(info),
        stopping: false,
        recovery: Default::default(),
    };
    m.observe_heartbeats(scrape.programs.iter().map(|p| (p.name.as_str(), p.generation, p.heartbeat)));
    let text = render(&m, &scrape, false);
    if std::env::var("PRINT_EXPOSITION").is_ok() {
        eprintln!("{text}");
    }
    parse_exposition(&text)
}

#[test]
fn every_family_renders_with_dcgm_labels_and_the_dashboard_asks_only_for_those() {
    let m = everything();
    assert!(m.samples.iter().all(|s| s.labels.get("UUID").map(String::as_str) == Some("GPU-5f3a")), "UUID on all");
    assert!(m.samples.iter().all(|s| !s.labels.contains_key("gpu")), "a UUID selector names no ordinal");
    assert_eq!(m.value("meshd_mps_pool_workers", &[("state", "idle")]), 1.0);
    assert_eq!(m.value("meshd_mps_client_creation_stalls_total", &[]), 3.0);
    assert_eq!(m.value("meshd_program_state", &[("program", "b"), ("state", "faulted")]), 1.0);
    assert_eq!(m.value("meshd_program_up", &[("program", "b")]), 0.0);
    assert_eq!(m.value("meshd_program_last_fault_timestamp_seconds", &[("program", "a")]), 1_700_000_000.0);
    assert_eq!(m.value("meshd_program_sms", &[("program", "a")]), 16.0);
    assert_eq!(m.value("meshd_channel_depth_messages", &[("channel", "c")]), 5.0);
    assert_eq!(m.value("meshd_native_workers", &[("state", "exited")]), 1.0);
    assert_eq!(m.value("meshd_native_workers", &[("state", "running")]), 0.0);
    let rec = [("mode", "mps"), ("method", "in_place"), ("outcome", "failed")];
    assert_eq!(m.value("meshd_recoveries_total", &rec), 1.0);
    assert_eq!(m.value("meshd_ready", &[]), 0.0);
    assert_eq!(m.value("meshd_mailbox_channel_descriptors_in_use", &[]), 5.0);
    assert_eq!(m.value("meshd_mailbox_channel_descriptors", &[]), 256.0);
    assert_eq!(m.value("meshd_mailbox_arena_in_use_bytes", &[]), 4096.0);
    assert_eq!(m.value("meshd_mailbox_arena_free_bytes", &[]), f64::from(1 << 20));
    assert_eq!(m.value("meshd_mailbox_arena_largest_free_bytes", &[]), f64::from(1 << 19));
    let kv = [("service", "kv")];
    assert_eq!(m.value("meshd_service_client_slots", &kv), 64.0);
    assert_eq!(m.value("meshd_service_clients", &kv), 3.0);
    assert_eq!(m.value("meshd_service_awaiting_ack_slots", &kv), 2.0);
    assert_eq!(m.value("meshd_service_held_shards", &kv), 2.0, "every held shard counts");
    assert_eq!(m.value("meshd_service_held_seconds", &kv), 1.5, "the longest hold");
    assert_eq!(m.value("meshd_service_state_unreadable", &kv), 0.0);
    assert_eq!(m.value("meshd_service_state_unreadable", &[("service", "torn")]), 1.0);
    assert_eq!(m.value("meshd_service_clients_attached_total", &kv), 9.0);
    assert_eq!(m.value("meshd_service_clients_died_total", &kv), 3.0);
    assert_eq!(m.value("meshd_service_skipped_requests_total", &kv), 1.0);
    assert_eq!(m.value("meshd_service_stall_revocations_total", &kv), 4.0);
    assert_eq!(m.value("meshd_service_stall_kills_total", &kv), 1.0);
    assert_eq!(m.value("meshd_service_clients_died_total", &[("service", "torn")]), 0.0);

    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/grafana/meshd-dashboard.json");
    let dashboard = std::fs::read_to_string(path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    assert_eq!(json["uid"], "meshd-overview");
    let mut asked = Vec::new();
    for (i, _) in dashboard.match_indices("meshd_") {
        let name: String = dashboard[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        asked.push(name);
    }
    assert!(asked.len() > 20, "the dashboard queries meshd's metrics");
    for name in asked {
        let family = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name);
        assert!(m.types.contains_key(family), "the dashboard asks for {name}, which meshd does not export");
    }
}

#[test]
fn the_metrics_reference_page_names_every_family_and_no_other() {
    let m = everything();
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/reference/metrics.md")).unwrap();
    let missing: Vec<&String> = m.types.keys().filter(|f| !page.contains(&format!("`{f}`"))).collect();
    assert!(missing.is_empty(), "docs/reference/metrics.md does not document {missing:?}");
    for (i, _) in page.match_indices("`meshd_") {
        let name: String = page[i + 1..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        assert!(m.types.contains_key(&name), "docs/reference/metrics.md documents {name}, which meshd does not export");
    }
}
