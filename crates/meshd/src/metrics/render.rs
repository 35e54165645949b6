//! The exposition's text: the families a scrape renders from the snapshot (programs, channels,
//! services, the MPS pool, native workers) beside what [`Metrics`] recorded.

use std::borrow::Cow;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use mesh_backend::BoardView;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::recorder::{Labels, Metrics, secs};
use crate::native::NativeRow;
use crate::observe::{Scrape, state_name};
use crate::protocol::{ArenaRow, ChannelRow, HELD_SLOT, Info, ProgramRow, ServiceEvents, ServiceRow};

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

/// The states `meshd_program_state` always lists (one of them 1).
const STATES: [&str; 5] = ["running", "recovering", "stopped", "exited", "faulted"];

/// A channel's placement: `host` (its ring in the mailbox) or `device` (in GPU memory meshd owns);
/// a row from a meshd that did not say is in host memory.
fn placement(c: &ChannelRow) -> String {
    if c.placement.is_empty() { "host".to_string() } else { c.placement.clone() }
}

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
    render_identity(metrics, info, ready, &mut reg);
    render_programs(metrics, scrape, &mut reg);
    if let Some(i) = info {
        render_channels(&i.channels, &mut reg);
        if let Some(a) = &i.arena {
            render_arena(a, &mut reg);
        }
        render_services(&i.services, &mut reg);
        render_pool(i, &mut reg);
    }
    render_natives(&scrape.natives, &mut reg);
    render_recovery(&scrape.recovery, &mut reg);
    register_recorded(metrics, &mut reg);
    let mut text = String::new();
    // Writing to a String cannot fail; an encoder error would be a bug in a name or label here.
    if let Err(e) = prometheus_text::encode(&mut text, &reg) {
        tracing::error!("encoding the metrics: {e}");
    }
    text
}

/// Who answers: meshd's build and mode, the GPU, readiness and the backend thread's last pass.
fn render_identity(metrics: &Metrics, info: Option<&Info>, ready: bool, reg: &mut Registry) {
    let mode = info.map_or_else(String::new, |i| i.mode.clone());
    let build: Family<Labels, Gauge> = family();
    build.get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_string()), ("mode", mode)]).set(1);
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
}

/// What the backend thread recorded as it worked: change, blink-pause and recovery figures.
fn register_recorded(metrics: &Metrics, reg: &mut Registry) {
    reg.register(
        "change_duration_seconds",
        "Backend time of each change (load, upgrade, unload, channel_create, channel_delete, service_create, \
         service_delete), applied or refused",
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
    reg.register(
        "programs_adopted",
        "MPS programs of a previous meshd still running at start (an orphan grace), by outcome: adopted (never \
         stopped) or stopped (it could not be adopted, and was relaunched if recorded)",
        metrics.adoptions.clone(),
    );
}

/// The per-program families of one scrape, filled a program at a time.
#[derive(Default)]
struct Programs {
    info: Family<Labels, Gauge>,
    up: Family<Labels, Gauge>,
    state: Family<Labels, Gauge>,
    restarts: Family<Labels, Counter>,
    beats: Family<Labels, Counter>,
    age: Family<Labels, Gauge<f64, AtomicU64>>,
    fault: Family<Labels, Gauge<f64, AtomicU64>>,
    relaunches: Family<Labels, Counter>,
    sms: Family<Labels, Gauge>,
    generation: Family<Labels, Gauge>,
    exempt: Family<Labels, Gauge>,
}

impl Programs {
    /// `p`'s series; `blinks`: its relaunches by blinks.
    fn add(&self, metrics: &Metrics, p: &ProgramRow, blinks: u64) {
        let l = prog(&p.name);
        let current = state_name(&p.state);
        self.up.get_or_create(&l).set(i64::from(current == "running"));
        for s in STATES {
            self.state
                .get_or_create(&vec![("program", p.name.clone()), ("state", s.to_string())])
                .set(i64::from(current == s));
        }
        self.restarts.get_or_create(&l).inc_by(u64::from(p.restarts));
        self.beats.get_or_create(&l).inc_by(p.heartbeat);
        if let Some(a) = metrics.heartbeat_age(&p.name) {
            self.age.get_or_create(&l).set(secs(a));
        }
        if let Some(ms) = p.last_fault_unix_ms {
            self.fault.get_or_create(&l).set(ms as f64 / 1e3);
        }
        self.relaunches.get_or_create(&l).inc_by(blinks);
        if let Some(n) = p.sms {
            self.sms.get_or_create(&l).set(i64::from(n));
        }
        self.generation.get_or_create(&l).set(i64::from(p.generation));
        self.exempt.get_or_create(&l).set(i64::from(metrics.is_exempt(&p.name)));
        let slot = if p.slot == HELD_SLOT { "-".to_string() } else { p.slot.to_string() };
        self.info.get_or_create(&vec![("program", p.name.clone()), ("kind", p.kind.clone()), ("slot", slot)]).set(1);
    }

    fn register(self, reg: &mut Registry) {
        reg.register("program_info", "A program's image kind and mailbox slot (always 1)", self.info);
        reg.register("program_up", "1 when the program's kernel runs", self.up);
        reg.register(
            "program_state",
            "The program's state: 1 for the current one of running, recovering, stopped, exited, faulted",
            self.state,
        );
        reg.register(
            "program_restarts",
            "Relaunches by the watchdog after GPU faults, counted as each happens (carried across replacements)",
            self.restarts,
        );
        reg.register("program_heartbeats", "The program's heartbeat counter (mesh_heartbeat)", self.beats);
        reg.register(
            "program_heartbeat_age_seconds",
            "Seconds since the program's heartbeat last moved (or its launch was first seen)",
            self.age,
        );
        reg.register(
            "program_last_fault_timestamp_seconds",
            "When meshd noticed the last GPU fault that stopped the program, Unix time",
            self.fault,
        );
        reg.register(
            "program_blink_relaunches",
            "Times a blink stopped and relaunched the program (its own loads and upgrades included)",
            self.relaunches,
        );
        reg.register("program_sms", "SMs the program's context holds (absent: the whole GPU)", self.sms);
        reg.register(
            "program_generation",
            "The program's launches so far, counted on across restarts of meshd",
            self.generation,
        );
        reg.register("program_readiness_exempt", "1 when the program was loaded with --no-readiness", self.exempt);
    }
}

fn render_programs(metrics: &Metrics, scrape: &Scrape, reg: &mut Registry) {
    let families = Programs::default();
    {
        let mut blinks = metrics.blink_relaunches.lock();
        blinks.retain(|n, _| scrape.programs.iter().any(|p| &p.name == n));
        for p in &scrape.programs {
            families.add(metrics, p, blinks.get(&p.name).copied().unwrap_or(0));
        }
    }
    families.register(reg);
}

fn render_channels(channels: &[ChannelRow], reg: &mut Registry) {
    let (sent, received, capacity, depth, size) =
        (family::<Counter>(), family::<Counter>(), family::<Gauge>(), family::<Gauge>(), family::<Gauge>());
    let lost = family::<Counter>();
    for c in channels {
        let l = vec![("channel", c.name.clone()), ("placement", placement(c))];
        sent.get_or_create(&l).inc_by(c.head);
        received.get_or_create(&l).inc_by(c.tail);
        capacity.get_or_create(&l).set(i64::from(c.capacity));
        depth.get_or_create(&l).set(i64::try_from(c.head.saturating_sub(c.tail)).unwrap_or(i64::MAX));
        size.get_or_create(&l).set(i64::from(c.msg_size));
        lost.get_or_create(&l).inc_by(c.lost);
    }
    reg.register("channel_sent_messages", "Messages sent on the channel (its producer's position)", sent);
    reg.register("channel_received_messages", "Messages received from the channel (its consumer's position)", received);
    reg.register("channel_capacity_messages", "Messages the channel's ring holds", capacity);
    reg.register("channel_depth_messages", "Messages sent and not yet received", depth);
    reg.register("channel_message_size_bytes", "Payload bytes per message", size);
    reg.register(
        "channel_lost_messages",
        "Messages a device channel lost with its GPU memory (a fault or a meshd crash), from its indices",
        lost,
    );
}

/// The mailbox's room for channels: what an operator alerts on before creations are refused
/// (descriptors running out, or free bytes left in runs too short for the rings asked for).
fn render_arena(a: &ArenaRow, reg: &mut Registry) {
    let gauge = |v: u64| {
        let g: Gauge = Gauge::default();
        g.set(i64::try_from(v).unwrap_or(i64::MAX));
        g
    };
    reg.register(
        "mailbox_channel_descriptors_in_use",
        "Channel descriptors in use (every live channel, a service's two included)",
        gauge(u64::from(a.descriptors_in_use)),
    );
    reg.register(
        "mailbox_channel_descriptors",
        "Channel descriptors in the mailbox, in use or free (meshd run --channels)",
        gauge(u64::from(a.descriptors_total)),
    );
    reg.register(
        "mailbox_arena_in_use_bytes",
        "Bytes of the ring arena taken by live channels' rings",
        gauge(a.in_use_bytes),
    );
    reg.register("mailbox_arena_free_bytes", "Bytes of the ring arena no live ring takes", gauge(a.free_bytes));
    reg.register(
        "mailbox_arena_largest_free_bytes",
        "Bytes of the longest free run of the ring arena: the largest ring that can be created now",
        gauge(a.largest_free_bytes),
    );
}

/// A counter of `info`'s service events: its name, its help, and its field.
type ServiceCounter = (&'static str, &'static str, fn(&ServiceEvents) -> u64);

/// Each service's clients and what holds it: the figures an operator alerts on (slots running out,
/// departures the program does not acknowledge, a client stopped in the middle of a send). Its fan-in
/// channel's traffic is already a channel's series (`channel` = the service's name).
fn render_services(services: &[ServiceRow], reg: &mut Registry) {
    let (slots, clients, awaiting, shards, held, held_for, unreadable) = (
        family::<Gauge>(),
        family::<Gauge>(),
        family::<Gauge>(),
        family::<Gauge>(),
        family::<Gauge>(),
        family::<Gauge<f64, AtomicU64>>(),
        family::<Gauge>(),
    );
    for s in services {
        let l = vec![("service", s.name.clone())];
        slots.get_or_create(&l).set(i64::from(s.entries));
        clients.get_or_create(&l).set(i64::from(s.bound));
        awaiting.get_or_create(&l).set(i64::from(s.awaiting_ack));
        shards.get_or_create(&l).set(i64::from(s.shards));
        // `holds` lists every held shard; a meshd before it said `held_by` alone.
        let holds: Vec<_> = if s.holds.is_empty() { s.held_by.iter().collect() } else { s.holds.iter().collect() };
        held.get_or_create(&l).set(i64::try_from(holds.len()).unwrap_or(i64::MAX));
        let longest_ms = holds.iter().map(|h| h.since_ms).max().unwrap_or(0);
        held_for.get_or_create(&l).set(Duration::from_millis(longest_ms).as_secs_f64());
        unreadable.get_or_create(&l).set(i64::from(s.error.is_some()));
    }
    reg.register("service_client_slots", "Clients the service can have attached at once (--clients)", slots);
    reg.register("service_clients", "Clients attached now", clients);
    reg.register(
        "service_awaiting_ack_slots",
        "Slots of departed clients the serving program has not acknowledged yet (not reusable until it does)",
        awaiting,
    );
    reg.register("service_shards", "Shards of the service's fan-in channel", shards);
    reg.register(
        "service_held_shards",
        "Fan-in shards held by a client stopped or descheduled in the middle of a send, past --client-stall-ms",
        held,
    );
    reg.register("service_held_seconds", "How long the longest of those holds has lasted (0: none)", held_for);
    let counters: [ServiceCounter; 6] = [
        ("service_clients_attached", "Clients attached since meshd started", |e| e.attached),
        ("service_clients_detached", "Clients that left alive (a detach, or a live process closing its lease)", |e| {
            e.detached
        }),
        ("service_clients_died", "Clients departed because their process was gone (killed, crashed, no detach)", |e| {
            e.died
        }),
        ("service_skipped_requests", "Requests cut off by a client's death, completed as skips for the program", |e| {
            e.skipped
        }),
        (
            "service_stall_revocations",
            "Reservations the stall watcher revoked from a live client stopped before writing (sent again later)",
            |e| e.stall_revoked,
        ),
        ("service_stall_kills", "Clients the stall watcher killed (--client-stall-kill-ms)", |e| e.stall_killed),
    ];
    for (name, help, of) in counters {
        let family = family::<Counter>();
        for s in services {
            family.get_or_create(&vec![("service", s.name.clone())]).inc_by(of(&s.events));
        }
        reg.register(name, help, family);
    }
    reg.register(
        "service_state_unreadable",
        "1 when the service's shared state could not be read (a corrupt group word: info says which)",
        unreadable,
    );
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

/// The recovery in place under way, read from the board the backend marks as it goes (not from the
/// snapshot, which the backend thread publishes only after the recovery's call returns).
fn render_recovery(view: &BoardView, reg: &mut Registry) {
    let on: Gauge = Gauge::default();
    on.set(i64::from(view.current.is_some()));
    reg.register("recovery_in_progress", "1 while a recovery in place from a GPU fault or a dead worker runs", on);
    let took: Gauge<f64, AtomicU64> = Gauge::default();
    took.set(view.current.as_ref().map_or(0.0, |c| secs(c.elapsed())));
    reg.register(
        "recovery_in_progress_seconds",
        "How long the recovery in place under way has run so far (0: none is)",
        took,
    );
    let held: Gauge = Gauge::default();
    held.set(view.current.as_ref().map_or(0, |c| i64::try_from(c.programs.len()).unwrap_or(i64::MAX)));
    reg.register(
        "recovery_in_progress_programs",
        "Programs the recovery in place under way has stopped and not yet relaunched",
        held,
    );
    let begun: Counter = Counter::default();
    begun.inc_by(view.begun);
    reg.register("recoveries_begun", "Recoveries in place begun since meshd started (ended or not)", begun);
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn changes_are_counted_by_op_and_result_and_reads_are_not() {
        let m = Metrics::new();
        // The labels the server gives (its `change_op`; `None` for a read, whose test is the server's).
        m.change_done(Some("unload"), true, Duration::from_millis(2));
        m.change_done(Some("unload"), false, Duration::from_millis(2));
        m.change_done(None, true, Duration::ZERO);
        let empty = Scrape {
            programs: vec![],
            natives: vec![],
            info: Err("no mailbox".into()),
            stopping: false,
            recovery: Default::default(),
        };
        let text = render(&m, &empty, false);
        assert!(text.contains("meshd_change_duration_seconds_count{op=\"unload\",result=\"ok\"} 1\n"), "{text}");
        assert!(text.contains("meshd_change_duration_seconds_count{op=\"unload\",result=\"refused\"} 1\n"));
        assert!(!text.contains("op=\"ps\""), "a read is no change");
    }
}
