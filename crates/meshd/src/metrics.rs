//! meshd's Prometheus exposition: what the backend thread records as it works (change, recovery and blink-pause durations), and the text a scrape renders from the same snapshot `ps` and `info` read.
//!
//! Names follow Prometheus's conventions (`meshd_` prefix, base units in the name, counters
//! ending in `_total`, `_info` for metadata) and every series carries DCGM exporter's `gpu` and
//! `UUID` labels (where known), so that `on(UUID)` joins meshd's per-program figures with DCGM's
//! per-GPU ones. The text is the Prometheus text format 0.0.4, encoded by `prometheus-client`: what
//! Prometheus scrapes and what node_exporter's textfile collector reads.
//!
//! The server hands the recorder ([`Metrics`]) facts at a few call sites and implements
//! [`Source`] over its snapshot; everything else lives here and in [`crate::health`].

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mesh_backend::{BackendEvent, IsolationMode, ProgramStatus, RecoveryMethod, RecoveryOutcome};
use parking_lot::Mutex;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::health::{self, HealthConfig};
use crate::native::NativeRow;
use crate::protocol::{ChannelRow, Info, ProgramRow, Request};

/// The `Content-Type` of [`Monitor::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// A series' labels (besides the registry's constant `gpu` and `UUID`).
type Labels = Vec<(&'static str, String)>;

/// What a scrape reads: the rows `ps` and `info` answer with, taken at once.
#[derive(Debug, Clone)]
pub struct Scrape {
    /// `ps`'s programs (heartbeats read fresh from the slots).
    pub programs: Vec<ProgramRow>,
    /// `ps`'s native GPU workers.
    pub natives: Vec<NativeRow>,
    /// `info`; `Err` with why when it could not be read (the mailbox's channel table).
    pub info: Result<Info, String>,
    /// meshd is shutting down.
    pub stopping: bool,
}

/// Where a scrape's snapshot comes from: the control plane (the server implements it).
pub trait Source: Send + Sync {
    /// The rows `ps` and `info` would answer with now.
    fn scrape(&self) -> Scrape;
}

/// The heartbeat of one program's current launch as last seen, and when it last moved.
#[derive(Debug, Clone, Copy)]
struct Beat {
    generation: u32,
    value: u64,
    /// When `value` last changed, or when this launch was first seen.
    moved: Instant,
}

/// What meshd records between scrapes: durations and counts of what completed, heartbeats seen,
/// the backend thread's last pass (liveness), and which programs readiness leaves out.
/// Shared by the backend thread, the connection threads and the HTTP listener.
#[derive(Debug)]
pub struct Metrics {
    changes: Family<Labels, Histogram>,
    recoveries: Family<Labels, Counter>,
    recovery_seconds: Family<Labels, Histogram>,
    blink_pauses: Histogram,
    /// Relaunches by blinks, by program (only programs still present are shown).
    blink_relaunches: Mutex<HashMap<String, u64>>,
    beats: Mutex<HashMap<String, Beat>>,
    exempt: Mutex<HashSet<String>>,
    /// Nanoseconds after `origin` of the backend thread's last pass; 0: none yet (still opening).
    last_pass_ns: AtomicU64,
    origin: Instant,
    health: Mutex<HealthConfig>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// An empty recorder.
    pub fn new() -> Self {
        // Loads link in tens of ms and hit the cache in a fraction of one; recoveries take from a
        // few ms (in place) to seconds (a search by halves); a blink pauses for tens of µs to ms.
        // Decimal 1-2.5-5 steps: bucket bounds an operator reads as they are.
        fn changes() -> Histogram {
            Histogram::new(steps(1e-4, 30.0))
        }
        fn recoveries() -> Histogram {
            Histogram::new(steps(1e-3, 60.0))
        }
        Self {
            changes: Family::new_with_constructor(changes),
            recoveries: Family::default(),
            recovery_seconds: Family::new_with_constructor(recoveries),
            blink_pauses: Histogram::new(steps(1e-5, 2.5)),
            blink_relaunches: Mutex::new(HashMap::new()),
            beats: Mutex::new(HashMap::new()),
            exempt: Mutex::new(HashSet::new()),
            last_pass_ns: AtomicU64::new(0),
            origin: Instant::now(),
            health: Mutex::new(HealthConfig::default()),
        }
    }

    // ---- Recorded by the backend thread ----

    /// The backend thread is alive and between jobs (the liveness probe's evidence).
    pub fn backend_pass(&self) {
        let ns = (self.origin.elapsed().as_nanos() as u64).max(1);
        self.last_pass_ns.store(ns, Ordering::Release);
    }

    /// How long ago the backend thread last passed between jobs; `None` before its first pass.
    pub fn since_backend_pass(&self) -> Option<Duration> {
        match self.last_pass_ns.load(Ordering::Acquire) {
            0 => None,
            ns => Some(self.origin.elapsed().saturating_sub(Duration::from_nanos(ns))),
        }
    }

    /// A change (`op`, from [`op_of`]) was applied (`ok`) or refused, in `took` on the backend.
    pub fn change_done(&self, op: Option<&'static str>, ok: bool, took: Duration) {
        let Some(op) = op else { return };
        let result = if ok { "ok" } else { "refused" };
        self.changes.get_or_create(&vec![("op", op.to_string()), ("result", result.to_string())]).observe(secs(took));
    }

    /// What the backend reported since the last call: blink pauses and recoveries in place.
    pub fn backend_events(&self, mode: IsolationMode, events: Vec<BackendEvent>) {
        for e in events {
            match e {
                BackendEvent::BlinkPause { took, relaunched } => {
                    self.blink_pauses.observe(secs(took));
                    let mut counts = self.blink_relaunches.lock();
                    for name in relaunched {
                        *counts.entry(name).or_default() += 1;
                    }
                }
                BackendEvent::Recovery { method, outcome, took } => self.recovery(mode, method, outcome, took),
            }
        }
    }

    /// A recovery from a GPU fault ended (in place, or by replacing the process: then counted by
    /// the new image, `took` measured from the fault the old one noticed).
    pub fn recovery(&self, mode: IsolationMode, method: RecoveryMethod, outcome: RecoveryOutcome, took: Duration) {
        let labels = vec![
            ("mode", mode.to_string()),
            ("method", method.as_str().to_string()),
            ("outcome", outcome.as_str().to_string()),
        ];
        self.recoveries.get_or_create(&labels).inc();
        self.recovery_seconds.get_or_create(&labels).observe(secs(took));
    }

    /// Heartbeats as they are now (the snapshot's programs, read fresh from their slots).
    pub fn observe_heartbeats<'a>(&self, programs: impl IntoIterator<Item = (&'a str, u32, u64)>) {
        let now = Instant::now();
        let mut beats = self.beats.lock();
        let mut present = HashSet::new();
        for (name, generation, value) in programs {
            present.insert(name);
            let b = beats.entry(name.to_string()).or_insert(Beat { generation, value, moved: now });
            if b.generation != generation || b.value != value {
                *b = Beat { generation, value, moved: now };
            }
        }
        beats.retain(|n, _| present.contains(n.as_str()));
    }

    /// The programs whose heartbeat readiness leaves out (loaded with `--no-readiness`).
    pub fn set_exempt<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        let names: HashSet<String> = names.into_iter().map(str::to_string).collect();
        let mut exempt = self.exempt.lock();
        if *exempt != names {
            *exempt = names;
        }
    }

    // ---- Read by a scrape, a health probe ----

    /// How long ago `name`'s heartbeat last moved (or its launch was first seen).
    pub fn heartbeat_age(&self, name: &str) -> Option<Duration> {
        self.beats.lock().get(name).map(|b| b.moved.elapsed())
    }

    /// Whether readiness leaves `name` out.
    pub fn is_exempt(&self, name: &str) -> bool {
        self.exempt.lock().contains(name)
    }

    /// The health probes' thresholds.
    pub fn health(&self) -> HealthConfig {
        *self.health.lock()
    }

    /// Sets the health probes' thresholds (`--health-max-heartbeat-age`, `--health-live-deadline`).
    pub fn set_health(&self, config: HealthConfig) {
        *self.health.lock() = config;
    }
}

/// A change request's `op` label; `None` for requests that change nothing on the backend.
pub fn op_of(req: &Request) -> Option<&'static str> {
    Some(match req {
        Request::Load { .. } => "load",
        Request::Upgrade { .. } => "upgrade",
        Request::Unload { .. } => "unload",
        Request::ChannelCreate { .. } => "channel_create",
        _ => return None,
    })
}

/// Bucket bounds 1, 2.5, 5 × 10^k from `from` up to `to` (both included), as short decimals.
fn steps(from: f64, to: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut decade = from;
    while decade <= to * 1.0001 {
        for m in [1.0, 2.5, 5.0] {
            // Rounded to 6 significant digits, so that 2.5e-5 prints as 0.000025, not 2.5000000000000004e-5.
            let v: f64 = format!("{:.5e}", decade * m).parse().unwrap_or(decade * m);
            if v <= to * 1.0001 {
                out.push(v);
            }
        }
        decade *= 10.0;
    }
    out
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// What the HTTP listener, the control socket's `metrics` and the health probes read: the
/// recorder and the snapshot's source. Cheap to clone.
#[derive(Clone)]
pub struct Monitor {
    metrics: Arc<Metrics>,
    source: Arc<dyn Source>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").field("metrics", &self.metrics).finish_non_exhaustive()
    }
}

impl Monitor {
    /// A monitor over `source`, recording into `metrics`.
    pub fn new(metrics: Arc<Metrics>, source: Arc<dyn Source>) -> Self {
        Self { metrics, source }
    }

    /// The recorder.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// A snapshot, its heartbeats noted (so that their ages are as fresh as the scrape).
    pub fn scrape(&self) -> Scrape {
        scrape(&self.metrics, &*self.source)
    }

    /// The exposition, in the Prometheus text format.
    pub fn render(&self) -> String {
        exposition(&self.metrics, &*self.source)
    }

    /// `/livez`: `Ok` with what was checked, or `Err` with why not.
    pub fn live(&self) -> Result<String, String> {
        health::live(&self.metrics)
    }

    /// `/readyz`: `Ok` with what was checked, or `Err` with the first reasons it is not ready.
    pub fn ready(&self) -> Result<String, String> {
        health::ready(&self.metrics, &self.scrape())
    }
}

/// A snapshot from `source`, its heartbeats noted in `metrics` (so that their ages are as fresh as the scrape).
pub fn scrape(metrics: &Metrics, source: &dyn Source) -> Scrape {
    let scrape = source.scrape();
    metrics.observe_heartbeats(scrape.programs.iter().map(|p| (p.name.as_str(), p.generation, p.heartbeat)));
    scrape
}

/// The exposition of `source` and `metrics` now, in the Prometheus text format.
pub fn exposition(metrics: &Metrics, source: &dyn Source) -> String {
    let scrape = scrape(metrics, source);
    let ready = health::ready(metrics, &scrape).is_ok();
    render(metrics, &scrape, ready)
}

/// The `gpu` and `UUID` labels DCGM exporter puts on every series: the ordinal `--device` gave
/// (none given: 0, the only GPU meshd sees in PCI order), and the GPU's UUID. An empty value is
/// left out (a UUID selector names no ordinal; the test double has no UUID).
fn dcgm_labels(info: Option<&Info>) -> Vec<(Cow<'static, str>, Cow<'static, str>)> {
    let Some(info) = info else { return Vec::new() };
    let gpu = match info.extra.device_selector.as_deref() {
        None => Some("0".to_string()),
        Some(s) if s.parse::<u32>().is_ok() => Some(s.to_string()),
        Some(_) => None,
    };
    let mut labels = Vec::new();
    if let Some(g) = gpu {
        labels.push((Cow::Borrowed("gpu"), Cow::Owned(g)));
    }
    if let Some(u) = info.extra.device_uuid.clone().filter(|u| !u.is_empty()) {
        labels.push((Cow::Borrowed("UUID"), Cow::Owned(u)));
    }
    labels
}

/// A program's state without its detail: `exited(3)` → `exited`, `faulted: …` → `faulted`.
pub fn state_name(state: &str) -> &str {
    let end = state.find(['(', ':', ' ']).unwrap_or(state.len());
    &state[..end]
}

/// The states `meshd_program_state` always lists (one of them 1).
const STATES: [&str; 4] = ["running", "stopped", "exited", "faulted"];

/// A channel's placement (`host`: its ring in the mailbox's host memory). Read through the row's
/// serialized form so that a `placement` field, once channels carry one, is shown as it is;
/// until then every ring is in host memory.
fn placement(c: &ChannelRow) -> String {
    serde_json::to_value(c)
        .ok()
        .and_then(|v| v.get("placement").and_then(|p| p.as_str().map(str::to_string)))
        .unwrap_or_else(|| "host".to_string())
}

/// A fresh family of `M`.
fn family<M: Default + prometheus_client::metrics::TypedMetric>() -> Family<Labels, M> {
    Family::default()
}

fn prog(name: &str) -> Labels {
    vec![("program", name.to_string())]
}

/// The text of one scrape: the snapshot's figures beside what `metrics` recorded.
pub fn render(metrics: &Metrics, scrape: &Scrape, ready: bool) -> String {
    let info = scrape.info.as_ref().ok();
    let mut reg = Registry::with_prefix_and_labels("meshd", dcgm_labels(info).into_iter());
    let mode = info.map_or_else(String::new, |i| i.mode.clone());

    let build: Family<Labels, Gauge> = family();
    build.get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_string()), ("mode", mode.clone())]).set(1);
    reg.register("build_info", "meshd's version and isolation mode (always 1)", build);
    if let Some(i) = info {
        let gpu: Family<Labels, Gauge> = family();
        let mut labels =
            vec![("modelName", i.device.clone()), ("mode", i.mode.clone()), ("mailbox", i.mailbox.clone())];
        if let Some(s) = &i.extra.device_selector {
            labels.push(("device_selector", s.clone()));
        }
        gpu.get_or_create(&labels).set(1);
        reg.register("gpu_info", "The GPU meshd serves: its name, meshd's isolation mode and mailbox (always 1)", gpu);
    }
    let up: Family<Labels, Gauge> = family();
    up.get_or_create(&vec![]).set(i64::from(ready));
    reg.register("ready", "1 when /readyz would answer 200: every program that should run beats", up);
    if let Some(age) = metrics.since_backend_pass() {
        let g: Gauge<f64, AtomicU64> = Gauge::default();
        g.set(secs(age));
        reg.register("backend_last_pass_age_seconds", "Seconds since the backend thread last passed between jobs", g);
    }

    render_programs(metrics, scrape, &mut reg);
    if let Some(i) = info {
        render_channels(&i.channels, &mut reg);
        render_pool(i, &mut reg);
    }
    render_natives(&scrape.natives, &mut reg);

    reg.register(
        "change_duration_seconds",
        "Backend time of each change (load, upgrade, unload, channel_create), applied or refused",
        metrics.changes.clone(),
    );
    reg.register(
        "blink_pause_duration_seconds",
        "Blink mode: how long every program stood stopped around a module change",
        metrics.blink_pauses.clone(),
    );
    reg.register(
        "recoveries",
        "Recoveries from GPU faults by isolation mode, method (in_place, process_replacement) and outcome",
        metrics.recoveries.clone(),
    );
    reg.register(
        "recovery_duration_seconds",
        "Time from a GPU fault noticed to the programs relaunched",
        metrics.recovery_seconds.clone(),
    );
    let mut text = String::new();
    // Writing to a String cannot fail; an encoder error would be a bug in a name or label here.
    if let Err(e) = prometheus_text::encode(&mut text, &reg) {
        tracing::error!("encoding the metrics: {e}");
    }
    text
}

fn render_programs(metrics: &Metrics, scrape: &Scrape, reg: &mut Registry) {
    let (up, state, restarts, beats, age, fault, relaunches, sms, generation, info, exempt) = (
        family::<Gauge>(),
        family::<Gauge>(),
        family::<Counter>(),
        family::<Counter>(),
        family::<Gauge<f64, AtomicU64>>(),
        family::<Gauge<f64, AtomicU64>>(),
        family::<Counter>(),
        family::<Gauge>(),
        family::<Gauge>(),
        family::<Gauge>(),
        family::<Gauge>(),
    );
    let mut blinks = metrics.blink_relaunches.lock();
    blinks.retain(|n, _| scrape.programs.iter().any(|p| &p.name == n));
    for p in &scrape.programs {
        let l = prog(&p.name);
        let current = state_name(&p.state);
        up.get_or_create(&l).set(i64::from(current == "running"));
        for s in STATES {
            state
                .get_or_create(&vec![("program", p.name.clone()), ("state", s.to_string())])
                .set(i64::from(current == s));
        }
        restarts.get_or_create(&l).inc_by(u64::from(p.restarts));
        beats.get_or_create(&l).inc_by(p.heartbeat);
        if let Some(a) = metrics.heartbeat_age(&p.name) {
            age.get_or_create(&l).set(secs(a));
        }
        if let Some(ms) = p.last_fault_unix_ms {
            fault.get_or_create(&l).set(ms as f64 / 1e3);
        }
        relaunches.get_or_create(&l).inc_by(blinks.get(&p.name).copied().unwrap_or(0));
        if let Some(n) = p.sms {
            sms.get_or_create(&l).set(i64::from(n));
        }
        generation.get_or_create(&l).set(i64::from(p.generation));
        exempt.get_or_create(&l).set(i64::from(metrics.is_exempt(&p.name)));
        let slot = if p.slot == crate::server::HELD_SLOT { "-".to_string() } else { p.slot.to_string() };
        info.get_or_create(&vec![("program", p.name.clone()), ("kind", p.kind.clone()), ("slot", slot)]).set(1);
    }
    drop(blinks);
    reg.register("program_info", "A program's image kind and mailbox slot (always 1)", info);
    reg.register("program_up", "1 when the program's kernel runs", up);
    reg.register(
        "program_state",
        "The program's state: 1 for the current one of running, stopped, exited, faulted",
        state,
    );
    reg.register(
        "program_restarts",
        "Relaunches by the watchdog after GPU faults (carried across replacements)",
        restarts,
    );
    reg.register("program_heartbeats", "The program's heartbeat counter (mesh_heartbeat)", beats);
    reg.register(
        "program_heartbeat_age_seconds",
        "Seconds since the program's heartbeat last moved (or its launch was first seen)",
        age,
    );
    reg.register(
        "program_last_fault_timestamp_seconds",
        "When meshd noticed the last GPU fault that stopped the program, Unix time",
        fault,
    );
    reg.register(
        "program_blink_relaunches",
        "Times a blink stopped and relaunched the program (its own loads and upgrades included)",
        relaunches,
    );
    reg.register("program_sms", "SMs the program's context holds (absent: the whole GPU)", sms);
    reg.register("program_generation", "The program's launches so far in this process", generation);
    reg.register("program_readiness_exempt", "1 when the program was loaded with --no-readiness", exempt);
}

fn render_channels(channels: &[ChannelRow], reg: &mut Registry) {
    let (sent, received, capacity, depth, size) =
        (family::<Counter>(), family::<Counter>(), family::<Gauge>(), family::<Gauge>(), family::<Gauge>());
    for c in channels {
        let l = vec![("channel", c.name.clone()), ("placement", placement(c))];
        sent.get_or_create(&l).inc_by(c.head);
        received.get_or_create(&l).inc_by(c.tail);
        capacity.get_or_create(&l).set(i64::from(c.capacity));
        depth.get_or_create(&l).set(c.head.saturating_sub(c.tail).min(i64::MAX as u64) as i64);
        size.get_or_create(&l).set(i64::from(c.msg_size));
    }
    reg.register("channel_sent_messages", "Messages sent on the channel (its producer's position)", sent);
    reg.register("channel_received_messages", "Messages received from the channel (its consumer's position)", received);
    reg.register("channel_capacity_messages", "Messages the channel's ring holds", capacity);
    reg.register("channel_depth_messages", "Messages sent and not yet received", depth);
    reg.register("channel_message_size_bytes", "Payload bytes per message", size);
}

fn render_pool(info: &Info, reg: &mut Registry) {
    let Some(pool) = &info.extra.pool else { return };
    let workers: Family<Labels, Gauge> = family();
    workers.get_or_create(&vec![("state", "idle".to_string())]).set(i64::from(pool.idle));
    workers.get_or_create(&vec![("state", "in_use".to_string())]).set(i64::from(pool.in_use));
    reg.register("mps_pool_workers", "MPS workers by state", workers);
    let size: Gauge = Gauge::default();
    size.set(i64::from(pool.size));
    reg.register("mps_pool_size_workers", "--pool: MPS workers made at start", size);
    let limit: Gauge = Gauge::default();
    limit.set(i64::from(pool.client_limit));
    reg.register("mps_client_limit", "MPS clients the device takes", limit);
    let stalls: Counter = Counter::default();
    stalls.inc_by(pool.stalls);
    reg.register(
        "mps_client_creation_stalls",
        "MPS clients created while programs ran (--pool-grow): each stalled every running program once",
        stalls,
    );
}

fn render_natives(natives: &[NativeRow], reg: &mut Registry) {
    let by_state: Family<Labels, Gauge> = family();
    for s in ["starting", "running", "stopping", "exited", "killed"] {
        by_state.get_or_create(&vec![("state", s.to_string())]).set(0);
    }
    for n in natives {
        by_state.get_or_create(&vec![("state", state_name(&n.state).to_string())]).inc();
    }
    reg.register("native_workers", "Native GPU workers (meshd spawn) by state", by_state);
}

/// Helpers for [`crate::server`]'s call sites: the programs of a published status as
/// `(name, generation, heartbeat)`.
pub fn beats_of(programs: &[ProgramStatus]) -> impl Iterator<Item = (&str, u32, u64)> {
    programs.iter().map(|p| (p.name.as_str(), p.generation, p.heartbeat))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_step_by_1_2_5_and_print_short() {
        assert_eq!(
            steps(1e-5, 2.5),
            [1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]
        );
        assert_eq!(steps(1e-3, 60.0).last(), Some(&50.0));
        let all = [steps(1e-5, 2.5), steps(1e-4, 30.0), steps(1e-3, 60.0)].concat();
        assert!(all.iter().all(|b| b.to_string().len() <= 8), "no float noise such as 2.5000000000000004e-5: {all:?}");
    }

    #[test]
    fn a_state_loses_its_detail() {
        assert_eq!(state_name("running"), "running");
        assert_eq!(state_name("exited(3)"), "exited");
        assert_eq!(state_name("faulted: CUDA_ERROR_ILLEGAL_ADDRESS"), "faulted");
        assert_eq!(state_name("killed(signal 9)"), "killed");
        assert_eq!(state_name(""), "");
    }

    #[test]
    fn a_heartbeat_ages_until_it_moves_and_a_relaunch_starts_afresh() {
        let m = Metrics::new();
        m.observe_heartbeats([("a", 1, 5)]);
        let first = m.beats.lock()["a"].moved;
        m.observe_heartbeats([("a", 1, 5)]);
        assert_eq!(m.beats.lock()["a"].moved, first, "an unchanged heartbeat keeps its age");
        m.observe_heartbeats([("a", 1, 6)]);
        assert!(m.beats.lock()["a"].moved >= first);
        m.observe_heartbeats([("a", 2, 6)]);
        assert_eq!(m.beats.lock()["a"].generation, 2, "a new launch is tracked from its own first sight");
        m.observe_heartbeats([]);
        assert!(m.heartbeat_age("a").is_none(), "an unloaded program is forgotten");
    }

    #[test]
    fn changes_are_counted_by_op_and_result_and_reads_are_not() {
        let m = Metrics::new();
        let unload = op_of(&Request::Unload { name: "x".into() });
        m.change_done(unload, true, Duration::from_millis(2));
        m.change_done(unload, false, Duration::from_millis(2));
        m.change_done(op_of(&Request::Ps), true, Duration::ZERO);
        let empty = Scrape { programs: vec![], natives: vec![], info: Err("no mailbox".into()), stopping: false };
        let text = render(&m, &empty, false);
        assert!(text.contains("meshd_change_duration_seconds_count{op=\"unload\",result=\"ok\"} 1\n"), "{text}");
        assert!(text.contains("meshd_change_duration_seconds_count{op=\"unload\",result=\"refused\"} 1\n"));
        assert!(!text.contains("op=\"ps\""), "a read is no change");
        assert_eq!(op_of(&Request::Ps), None);
    }
}
