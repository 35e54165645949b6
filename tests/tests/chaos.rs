//! Chaos on the GPU, in each mode for `MESH_CHAOS_SECS` (default 240): sequence-checked streams run
//! on every kind of channel while a seeded schedule of events hits meshd, and at the end every
//! message is accounted for and nothing is left behind.
//!
//! meshd runs as `deploy/meshd@.service` runs it (`meshd run --device 0 --keep-shm $MESHD_ARGS`,
//! with `--metrics-addr 127.0.0.1:0`, and `--isolation mps --pool 14 --pool-grow` in MPS mode, whose
//! standby is on by default: `--standby` defaults to the pool's size; `--socket` and `--state-dir` in
//! the test's directory), and a `kill -9` is followed at once by the same command. A thread scrapes
//! `/metrics` and `/readyz` at the endpoint each start announces in the log, all run long: an answer
//! slower than 3 s, or a status other than 200 and 503, fails the test; 503s are counted.
//!
//! Streams: host→GPU (`h2g`, checked by the GPU `sink`), GPU→host (`g2h` from `source`, checked
//! here against the host's own count), a host round trip through `echo` (`to-echo`/`from-echo`,
//! sequence-checked here), GPU→GPU `gsource`→`gsink` on a host channel (checked by the sink), the
//! GPU↔GPU round trip `ping`↔`pong` (echo_header; ping matches replies to requests by sequence
//! number: a wrong reply fails the test whenever it comes, a repeat is allowed only after a crash,
//! within the bound meshd logged for pp-a and pp-b plus the requests in flight), and
//! `dsource`→`dsink` on a device channel. Events: upgrades of stream programs, heartbeat bystanders
//! loaded, upgraded and unloaded, the `fault` program, `kill -9` of meshd (some while a bystander's
//! load is on its way: answered, it runs after the restart; cut off, it runs or left nothing, and no
//! slot stays in use without a program), `meshd handoff` (the same pid executing meshd again), in
//! MPS mode `kill -9` of a bystander's worker or of an idle worker of the standby server (replaced,
//! no program disturbed) and, once a run where the time left allows, a `kill -9`
//! of meshd left alone past the orphan grace (every program stops in order, every MPS process exits
//! and the GPU's memory in use comes back within the grace + 5 s; then meshd starts again and
//! relaunches them), native workers spawned and stopped, and channels and services created and
//! deleted under traffic (churn channels in the mailbox and, in blink mode, in device memory, some
//! left holding messages; a delete of a stream's channel refused naming who holds it; a service's
//! delete refused while a client is attached, done once it detached). After every event the test waits
//! until every program runs again and every stream has moved on (the event's recovery gap), then
//! checks: no stream lost, tore or reordered a message ever; a repeat only after a crash (kill -9,
//! fault, a worker killed), at most what meshd logged for that crash ("may receive again up to N")
//! or, where it logs nothing (an MPS recovery in place), the ring's capacity; a device ring's loss
//! in blink mode only after a crash, at most its capacity, and in MPS mode none (meshd's own context
//! keeps the ring through faults, adoptions and handoffs) but after a restart that adopted nothing.
//! At the end: every host message delivered, no meshd, MPS
//! worker, MPS daemon or native worker left, meshd's descriptors and threads no more than after the
//! setup, the GPU's memory in use grown by no more than 1% (plus a few MiB; less is fine), both
//! over the whole run and, in blink mode, from the setup to the end with every churn channel deleted
//! (a device ring's delete frees its GPU memory).
//!
//! A killed MPS worker (`KillWorker`, a busy bystander's): meshd relaunches every program, the killed
//! worker's included, in new workers; the test waits until every program runs again and the
//! bystander's worker pid changed. Only repeated deaths of one program's worker leave it stopped,
//! with a reason naming them: the test kills each bystander's worker once, so that should not happen,
//! but if meshd shows it so the test accepts it (and unloads the bystander, as it does after every
//! kill); stopped or faulted for any other reason (named the culprit) fails.
//!
//! The seed is printed first; `MESH_CHAOS_SEED=N` replays the schedule (the timing of a real GPU
//! differs run to run; the events and their order do not). MPS mode runs under meshd's default
//! orphan grace, so each `kill -9` of meshd leaves the programs running and the restart adopts them;
//! `MESH_CHAOS_ORPHAN_GRACE_MS=N` runs it with `--orphan-grace-ms N` (0: each kill relaunches them).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mesh_gpu_tests::chaos::{self, Churn, HostEnd, Rng, Scraper, Tally, UnitMeshd};
use mesh_gpu_tests::stress::{self, user};
use mesh_gpu_tests::{programs_dir, require_gpu, wait_until};
use mesh_mps_worker::orphan::WORKER_COMM;
use mesh_shm::layout::STATE_STOPPED;
use mesh_shm::{Mailbox, Producer};

/// A deadline for a recovery, never a measurement.
const DEADLINE: Duration = Duration::from_secs(60);
/// The echo's input ring: the most a GPU consumer can take again after a crash.
const ECHO_CAPACITY: u64 = 64;
/// The device ring's capacity: the most a crash can lose there.
const DEVICE_CAPACITY: u64 = 16;
const MAX_BYSTANDERS: usize = 3;
/// Faults within any 60 s: below meshd's bound on replacements of the process (8 within 60 s).
const MAX_FAULTS_PER_MINUTE: usize = 3;
/// Messages a native worker exchanges before it exits.
const NATIVE_COUNT: u64 = 20_000;
/// The capacity of ping↔pong's rings (pp-a, pp-b).
const PP_CAPACITY: u32 = 16;
/// Requests ping may have had in flight at a crash whose replies then count as repeats: the
/// outstanding one, and one owed to the launch before (ping.cu, user words 8-9).
const PP_IN_FLIGHT: u64 = 2;
/// ping's user words (tests/programs/ping.cu).
const PING_BAD: usize = 5;
const PING_REPEATS: usize = 7;
/// MPS: the pool (and, by default, as many standby workers again). Clients in all: 14 + 14 standby +
/// meshd's own context (device channels) + a native worker + a few pool growths (a killed worker
/// replaced) stay well within the H200's 48 (CUDA 13.0; mesh-mps MAX_CLIENTS). At most 9 stream
/// programs, 3 bystanders, the fault program and a native worker's echo run at once: 14.
const MPS_POOL: &str = "14";

fn ptx(name: &str) -> String {
    programs_dir().join(format!("{name}.ptx")).display().to_string()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    UpgradeStream,
    LoadBystander,
    UpgradeBystander,
    UnloadBystander,
    Fault,
    Kill9,
    /// A `kill -9` of meshd while a bystander's load is on its way.
    Kill9DuringLoad,
    /// `meshd handoff`: meshd executes its binary again in its own process (an upgrade of meshd).
    Handoff,
    KillWorker,
    /// MPS mode: a `kill -9` of an idle worker of the standby server (the one no program runs on):
    /// meshd discards and replaces it, and no program notices.
    KillStandbyWorker,
    /// MPS mode: a `kill -9` of meshd, and no restart until the orphan grace has passed: every
    /// program stops in order, every worker, the MPS server and its daemon exit and the GPU's memory
    /// is back where it was before meshd started; then meshd is started again and relaunches them.
    OrphanLimit,
    Spawn,
    Stop,
    ChannelCreate,
    ChannelDelete,
    ServiceCreate,
    ServiceDelete,
}

impl Kind {
    /// Events after which a GPU consumer may take messages again (at-least-once after a crash).
    fn crash(self) -> bool {
        // A handoff in blink mode stops and relaunches every program, its device rings renewed with
        // the context: judged as a crash (MPS mode's adopts them, and its bounds are never reached).
        matches!(
            self,
            Self::Fault | Self::Kill9 | Self::Kill9DuringLoad | Self::Handoff | Self::KillWorker | Self::OrphanLimit
        )
    }

    /// A `kill -9` of meshd itself: the programs it leaves are adopted, or stopped in order at the
    /// orphan limit; neither takes a message again unless the log says so.
    fn kill9(self) -> bool {
        matches!(self, Self::Kill9 | Self::Kill9DuringLoad | Self::OrphanLimit)
    }
}

const WEIGHTS: [(Kind, u64); 17] = [
    (Kind::UpgradeStream, 14),
    (Kind::LoadBystander, 10),
    (Kind::UpgradeBystander, 6),
    (Kind::UnloadBystander, 8),
    (Kind::Fault, 4),
    (Kind::Kill9, 5),
    (Kind::Kill9DuringLoad, 2),
    (Kind::Handoff, 2),
    (Kind::KillWorker, 4),
    (Kind::KillStandbyWorker, 2),
    (Kind::OrphanLimit, 2),
    (Kind::Spawn, 4),
    (Kind::Stop, 4),
    (Kind::ChannelCreate, 5),
    (Kind::ChannelDelete, 5),
    (Kind::ServiceCreate, 2),
    (Kind::ServiceDelete, 2),
];

fn draw(rng: &mut Rng) -> Kind {
    let mut at = rng.below(WEIGHTS.iter().map(|w| w.1).sum());
    for (kind, w) in WEIGHTS {
        if at < w {
            return kind;
        }
        at -= w;
    }
    Kind::UpgradeStream
}

/// A program of the streams: name, image, bindings.
struct StreamProgram {
    name: &'static str,
    image: &'static str,
    bind: &'static [&'static str],
}

const STREAMS: [StreamProgram; 7] = [
    StreamProgram { name: "sink", image: "sink", bind: &["h2g", "h2g-k"] },
    StreamProgram { name: "source", image: "source", bind: &["g2h", "g2h-k"] },
    StreamProgram { name: "echo", image: "echo", bind: &["to-echo", "from-echo"] },
    StreamProgram { name: "gsink", image: "sink", bind: &["g2g", "gsink-k"] },
    StreamProgram { name: "gsource", image: "source", bind: &["g2g", "gsource-k"] },
    StreamProgram { name: "pong", image: "echo_header", bind: &["pp-a", "pp-b"] },
    StreamProgram { name: "ping", image: "ping", bind: &["pp-a", "pp-b"] },
];
/// GPU↔GPU through a ring in device memory (in MPS mode one that meshd's own context owns).
const DEVICE_STREAMS: [StreamProgram; 2] = [
    StreamProgram { name: "dsink", image: "sink", bind: &["dev", "dsink-k"] },
    StreamProgram { name: "dsource", image: "source", bind: &["dev", "dsource-k"] },
];

/// A native worker the test started.
struct Native {
    /// Its echo program (a GPU worker) or none (a shell stand-in).
    echo: Option<String>,
    result: PathBuf,
    /// A crash came while it ran: meshd started it again from the desired state, on channels that
    /// held the first one's messages, so its own check is not judged.
    interrupted: bool,
}

/// The mesh under chaos and what the test asked of it.
struct Chaos {
    d: UnitMeshd,
    mb: Mailbox,
    mps: bool,
    rng: Rng,
    dir: tempfile::TempDir,
    bystanders: BTreeMap<String, ()>,
    natives: BTreeMap<String, Native>,
    native_binary: Option<PathBuf>,
    native_pids: Vec<u32>,
    next: u32,
    faults: Vec<Instant>,
    h2g: HostEnd,
    g2h: HostEnd,
    echo: HostEnd,
    stop: Arc<AtomicBool>,
    /// `/metrics` and `/readyz`, scraped all run long.
    scraper: Option<Scraper>,
    /// Channels and services made and deleted under traffic.
    churn: Churn,
    /// The GPU's memory in use before meshd started (MiB): where the orphan limit must bring it back.
    memory_before: Option<u64>,
    /// When the run ends: the orphan limit is waited out only where it ends well before.
    ends: Instant,
    /// The orphan limit passed once already (it takes the grace and more: once a run).
    orphan_limit_passed: bool,
}

/// The stream positions that must move on after every event.
type Progress = BTreeMap<&'static str, u64>;

impl Chaos {
    fn streams(&self) -> Vec<&'static StreamProgram> {
        STREAMS.iter().chain(DEVICE_STREAMS.iter()).collect()
    }

    fn channel(d: &UnitMeshd, name: &str, size: u32, capacity: u32, placement: &str) {
        let (size, capacity) = (size.to_string(), capacity.to_string());
        d.ok(&["channel", "create", name, "--msg-size", &size, "--capacity", &capacity, "--placement", placement]);
    }

    fn load(d: &UnitMeshd, p: &StreamProgram) {
        let image = ptx(p.image);
        let mut args = vec!["load", p.name, &image];
        for b in p.bind {
            args.extend(["--bind", b]);
        }
        d.ok(&args);
    }

    fn start(mps: bool, seed: u64) -> Self {
        let dir = tempfile::tempdir_in("/dev/shm").expect("a test directory");
        // --pool-grow: a worker killed by the test is not replaced without it, and a pool run dry would
        // refuse the loads that follow.
        let mut args = vec!["--metrics-addr", "127.0.0.1:0"];
        let grace = chaos::orphan_grace_ms().to_string();
        if mps {
            args.extend(["--isolation", "mps", "--pool", MPS_POOL, "--pool-grow", "--orphan-grace-ms", &grace]);
        }
        let d = UnitMeshd::start(dir.path(), &args);
        let knobs = stress::knobs(0, 64, false);
        Self::channel(&d, "h2g", 64, 64, "host");
        Self::channel(&d, "g2h", 64, 64, "host");
        Self::channel(&d, "to-echo", 16, 64, "host");
        Self::channel(&d, "from-echo", 16, 64, "host");
        Self::channel(&d, "g2g", 64, 16, "host");
        Self::channel(&d, "pp-a", 64, PP_CAPACITY, "host");
        Self::channel(&d, "pp-b", 64, PP_CAPACITY, "host");
        Self::channel(&d, "dev", 64, 16, "device");
        let knob_channels = ["h2g-k", "g2h-k", "gsink-k", "gsource-k", "dsink-k", "dsource-k"];
        let info = d.info().expect("info");
        let mb = Mailbox::open(info["mailbox"].as_str().expect("the mailbox's path")).expect("map the mailbox");
        for k in knob_channels {
            Self::channel(&d, k, 8, 2, "host");
            Producer::claim(&mb, k).expect("knob channel").send(&knobs, Duration::from_secs(1)).expect("knobs");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let h2g = chaos::host_producer(&mb, "h2g", 64, &stop);
        let g2h = chaos::host_consumer(&mb, "g2h", 64, &stop);
        let echo = chaos::host_round_trip(&mb, "to-echo", "from-echo", 48, &stop);
        let native_binary = std::env::var_os("MESH_NATIVE_RUST").map(PathBuf::from).or_else(|| {
            let exe = std::env::current_exe().ok()?;
            exe.ancestors().skip(1).take(2).map(|d| d.join("mesh-native-rust")).find(|p| p.is_file())
        });
        let mut c = Self {
            d,
            mb,
            mps,
            rng: Rng(seed),
            dir,
            bystanders: BTreeMap::new(),
            natives: BTreeMap::new(),
            native_binary,
            native_pids: Vec::new(),
            next: 0,
            faults: Vec::new(),
            h2g,
            g2h,
            echo,
            stop,
            scraper: None,
            churn: Churn::default(),
            memory_before: None,
            ends: Instant::now(),
            orphan_limit_passed: false,
        };
        for p in c.streams() {
            Self::load(&c.d, p);
        }
        c.scraper = Some(Scraper::start(c.d.log_path().to_path_buf(), Duration::from_millis(100)));
        c
    }

    fn ps(&self) -> Vec<serde_json::Value> {
        self.d.ps()
    }

    /// A program's user words, from its slot (`None` when it holds none: not running).
    fn user_words(&self, rows: &[serde_json::Value], name: &str) -> Option<[u32; 32]> {
        let row = rows.iter().find(|r| r["name"] == name && r["native"] != true)?;
        let slot = u32::try_from(row["slot"].as_u64()?).ok()?;
        self.mb.slot(slot).ok().map(|s| s.user_words())
    }

    /// Where each stream stands: the host ends' own counts, and the GPU consumers' published
    /// positions (`info`'s tail) for the channels no host end sees.
    fn progress(&self) -> Option<Progress> {
        let info = self.d.info()?;
        let tail = |name: &str| {
            info["channels"].as_array()?.iter().find(|c| c["name"] == name).and_then(|c| c["tail"].as_u64())
        };
        let mut p = Progress::new();
        p.insert("h2g", tail("h2g")?);
        p.insert("g2h", Tally::get(&self.g2h.tally.delivered));
        p.insert("echo", Tally::get(&self.echo.tally.delivered));
        p.insert("g2g", tail("g2g")?);
        p.insert("pingpong", tail("pp-a")?);
        p.insert("dev", tail("dev")?);
        Some(p)
    }

    /// The device ring's messages lost so far.
    fn device_lost(&self) -> u64 {
        let info = self.d.info().unwrap_or_default();
        let dev = info["channels"].as_array().and_then(|a| a.iter().find(|c| c["name"] == "dev").cloned());
        dev.and_then(|c| c["lost"].as_u64()).unwrap_or(0)
    }

    /// A broken invariant that holds whatever happens: a host end's failure, a GPU checker's error.
    fn broken(&self, rows: &[serde_json::Value]) -> Option<String> {
        for (name, end) in [("h2g", &self.h2g), ("g2h", &self.g2h), ("echo", &self.echo)] {
            if let Some(f) = end.tally.failed() {
                return Some(format!("stream {name}: {f}"));
            }
        }
        for sink in ["sink", "gsink", "dsink"] {
            if let Some(w) = self.user_words(rows, sink)
                && w[user::ERRORS] != 0
            {
                return Some(format!(
                    "{sink} found {} bad messages, the first at position {}",
                    w[user::ERRORS],
                    w[user::FIRST_BAD]
                ));
            }
        }
        // ping drops the replies a crash repeats (and counts them); a wrong reply is one whose
        // content is wrong or that answers a request never sent, whenever it comes.
        if let Some(w) = self.user_words(rows, "ping")
            && w[PING_BAD] != 0
        {
            return Some(format!("ping saw {} wrong replies ({} repeats dropped)", w[PING_BAD], w[PING_REPEATS]));
        }
        if let Some(why) = self.scraper.as_ref().and_then(|s| s.stats.failed()) {
            return Some(format!("the monitoring endpoint: {why}"));
        }
        None
    }

    /// The repeats ping has dropped since its load (waits while meshd does not answer).
    fn ping_repeats(&self) -> u64 {
        let mut n = None;
        wait_until(DEADLINE, || {
            n = self.user_words(&self.ps(), "ping").map(|w| u64::from(w[PING_REPEATS]));
            n.is_some()
        });
        n.unwrap_or_else(|| panic!("ping is not in ps\n{}", self.d.log_tail(40)))
    }

    /// Judges ping's repeats since `from` against `pending` (the last event's name and the repeats it
    /// allows); returns ping's count now. Called a pause after the event, once every reply a crash
    /// repeated has come in (they come before the answer to any fresh request).
    fn judge_ping(&self, from: u64, pending: Option<(String, u64)>) -> u64 {
        let now = self.ping_repeats();
        if let Some((what, allowed)) = pending {
            // A meshd started again (kill -9) loads ping into a slot made anew, its user words zeroed:
            // a count below the last one started from 0 there (seen on the H200: 1 -> 0 at a Kill9).
            let repeated = now.checked_sub(from).unwrap_or(now);
            assert!(
                repeated <= allowed,
                "{what}: ping dropped {repeated} repeated replies, {allowed} allowed (0 after an orderly event)"
            );
        }
        now
    }

    /// Every stream program and bystander running (a fault's culprit, being unloaded, aside).
    fn all_running(&self, rows: &[serde_json::Value]) -> bool {
        let running = |name: &str| rows.iter().any(|r| r["name"] == name && r["state"] == "running");
        self.streams().iter().all(|p| running(p.name)) && self.bystanders.keys().all(|b| running(b))
    }

    /// Waits until every program runs and every stream moved past `before`; fails at once on a
    /// broken invariant. Returns how long it took.
    fn recovered(&mut self, before: &Progress, what: &str) -> Duration {
        let t = Instant::now();
        let mut last = (Vec::new(), None);
        let ok = wait_until(DEADLINE, || {
            let rows = self.ps();
            if let Some(why) = self.broken(&rows) {
                panic!("{what}: {why}\nps: {rows:#?}\nlog:\n{}", self.d.log_tail(80));
            }
            for r in rows.iter().filter(|r| r["native"] == true) {
                if let Some(pid) = r["pid"].as_u64().and_then(|p| u32::try_from(p).ok())
                    && !self.native_pids.contains(&pid)
                {
                    self.native_pids.push(pid);
                }
            }
            let now = self.progress();
            let moved = now.as_ref().is_some_and(|n| before.iter().all(|(k, v)| n.get(k).is_some_and(|x| x > v)));
            let running = self.all_running(&rows);
            last = (rows, now);
            running && moved
        });
        assert!(
            ok,
            "{what}: not recovered within {DEADLINE:?}: progress {:?} (before {before:?})\nps: {:#?}\nlog:\n{}",
            last.1,
            last.0,
            self.d.log_tail(80)
        );
        let took = t.elapsed();
        // Every echo message sent so far back: a crash's repeats (inputs taken again from the last
        // published position) all come before these, so they are counted against this event.
        let sent = Tally::get(&self.echo.tally.sent);
        let back = wait_until(DEADLINE, || Tally::get(&self.echo.tally.delivered) >= sent);
        assert!(back, "{what}: the echo delivered {} of {sent}", Tally::get(&self.echo.tally.delivered));
        took
    }

    /// A change that meshd may refuse for a moment after a crash (a recovery or a culprit search
    /// under way): retried until it is done.
    fn ok_eventually(&self, args: &[&str]) {
        let mut last = String::new();
        let done = wait_until(DEADLINE, || {
            let out = self.d.cli(args);
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            out.status.success()
        });
        assert!(done, "meshd {args:?} still refused after {DEADLINE:?}: {last}\n{}", self.d.log_tail(60));
    }

    /// MPS workers, idle and in use (`info`'s pool); 0 in blink mode.
    fn workers(&self) -> u64 {
        let info = self.d.info().unwrap_or_default();
        info["pool"]["idle"].as_u64().unwrap_or(0) + info["pool"]["in_use"].as_u64().unwrap_or(0)
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }

    /// Applies one event; returns when its disruption began (`None`: nothing to apply it to).
    fn apply(&mut self, kind: Kind) -> Option<Instant> {
        let mut began = Instant::now();
        match kind {
            Kind::UpgradeStream => {
                let streams = self.streams();
                let p = self.rng.pick(&streams)?;
                self.d.ok(&["upgrade", p.name, &ptx(p.image)]);
            }
            Kind::LoadBystander => {
                if self.bystanders.len() >= MAX_BYSTANDERS {
                    return None;
                }
                let name = self.fresh("bystander");
                self.d.ok(&["load", &name, &ptx("heartbeat")]);
                self.bystanders.insert(name, ());
            }
            Kind::UpgradeBystander | Kind::UnloadBystander => {
                let names: Vec<String> = self.bystanders.keys().cloned().collect();
                let name = self.rng.pick(&names).cloned()?;
                if kind == Kind::UpgradeBystander {
                    self.d.ok(&["upgrade", &name, &ptx("heartbeat")]);
                } else {
                    self.d.ok(&["unload", &name]);
                    self.bystanders.remove(&name);
                }
            }
            Kind::Fault => {
                self.faults.retain(|t| t.elapsed() < Duration::from_secs(60));
                if self.faults.len() >= MAX_FAULTS_PER_MINUTE {
                    return None;
                }
                self.faults.push(Instant::now());
                // No other image changed within 1.5 s of the fault: the recency rule names the culprit
                // at once (one replacement of the process in blink mode, no search by halves).
                std::thread::sleep(Duration::from_millis(1600));
                began = Instant::now();
                self.d.ok(&["load", "fault", &ptx("fault")]);
                let culprit = wait_until(DEADLINE, || {
                    self.ps()
                        .iter()
                        .any(|r| r["name"] == "fault" && r["state"].as_str().is_some_and(|s| s.starts_with("faulted")))
                });
                assert!(culprit, "the fault program was never named: {:#?}\n{}", self.ps(), self.d.log_tail(80));
                self.ok_eventually(&["unload", "fault"]);
                self.natives_interrupted();
            }
            Kind::Kill9 => {
                self.d.kill9_and_restart();
                self.natives_interrupted();
            }
            Kind::Kill9DuringLoad => {
                if self.bystanders.len() >= MAX_BYSTANDERS {
                    return None;
                }
                let name = self.fresh("bystander");
                let (socket, image, loaded) = (self.d.socket().to_path_buf(), ptx("heartbeat"), name.clone());
                let loading = std::thread::spawn(move || {
                    std::process::Command::new(mesh_gpu_tests::harness::meshd_bin())
                        .arg("--socket")
                        .arg(socket)
                        .args(["load", &loaded, &image])
                        .stdin(std::process::Stdio::null())
                        .output()
                        .is_ok_and(|o| o.status.success())
                });
                // A load takes tens of ms (link, module load, launch): the kill lands before, inside or after it.
                std::thread::sleep(Duration::from_millis(self.rng.below(60)));
                began = Instant::now();
                self.d.kill9_and_restart();
                self.natives_interrupted();
                let answered = loading.join().expect("the loading client");
                let present = self.ps().iter().any(|r| r["name"] == name.as_str());
                assert!(
                    present || !answered,
                    "{name}, whose load was answered, is gone after the kill -9: {:#?}\n{}",
                    self.ps(),
                    self.d.log_tail(60)
                );
                // A program the killed meshd bound but had not recorded leaves its slot by the first
                // tick of the new one (stopped, or its adopted worker retired).
                let stray = |c: &Self| {
                    let held: Vec<u64> = c.ps().iter().filter_map(|r| r["slot"].as_u64()).collect();
                    (0..c.mb.geometry().slot_count)
                        .filter(|&slot| c.mb.slot(slot).is_ok_and(|s| s.in_use()) && !held.contains(&u64::from(slot)))
                        .collect::<Vec<u32>>()
                };
                assert!(
                    wait_until(DEADLINE, || stray(self).is_empty()),
                    "slots {:?} in use after a kill -9 during the load of {name}, no program in them\n{}",
                    stray(self),
                    self.d.log_tail(60)
                );
                eprintln!(
                    "kill -9 during the load of {name}: {}",
                    match (answered, present) {
                        (true, _) => "answered, runs",
                        (false, true) => "not answered, runs",
                        (false, false) => "not answered, left nothing",
                    }
                );
                if present {
                    self.bystanders.insert(name, ());
                }
            }
            Kind::Handoff => {
                let pid = self.d.child.id();
                let said = self.d.ok(&["handoff"]);
                assert_eq!(self.d.child.id(), pid, "the handoff keeps meshd's pid");
                assert!(self.d.child.try_wait().is_ok_and(|s| s.is_none()), "meshd runs after the handoff: {said}");
                self.natives_interrupted();
            }
            Kind::KillWorker => {
                if !self.mps {
                    return None;
                }
                let rows = self.ps();
                let names: Vec<String> = self.bystanders.keys().cloned().collect();
                let name = self.rng.pick(&names).cloned()?;
                let pid = rows.iter().find(|r| r["name"] == name.as_str()).and_then(|r| r["worker_pid"].as_u64())?;
                let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
                assert!(killed.is_ok_and(|s| s.success()), "kill -9 of {name}'s worker {pid}");
                // meshd relaunches every program in new workers, this one's included (one death is
                // no fault of the program). Only repeated deaths leave it stopped, saying so: accepted
                // (the test never kills one program's worker twice, but meshd may count otherwise).
                // Named the culprit, or stopped for any other reason (a recovery that blamed a bystander), it never
                // settles: the assertion below shows ps and the log.
                let mut last = Vec::new();
                let settled = wait_until(DEADLINE, || {
                    let rows = self.ps();
                    let row = rows.iter().find(|r| r["name"] == name.as_str()).cloned();
                    let done = row.is_some_and(|r| {
                        let moved = r["worker_pid"].as_u64().is_some_and(|p| p != pid);
                        let why = format!("{} {}", r["state"], r["stopped_why"]).to_lowercase();
                        let state = r["state"].as_str().unwrap_or_default();
                        let stopped = state == "stopped" || state.starts_with("faulted") || state.starts_with("exited");
                        // meshd's reason: "its MPS worker died N times within S s ..."
                        let repeated = why.contains("died") && (why.contains("times") || why.contains("repeated"));
                        (moved && self.all_running(&rows)) || (stopped && repeated)
                    });
                    last = rows;
                    done
                });
                assert!(
                    settled,
                    "{name}'s worker {pid} killed: not every program relaunched (nor {name} stopped after \
                     repeated deaths) within {DEADLINE:?}\nps: {last:#?}\nlog:\n{}",
                    self.d.log_tail(80)
                );
                self.ok_eventually(&["unload", &name]);
                self.bystanders.remove(&name);
                self.natives_interrupted();
            }
            Kind::KillStandbyWorker => {
                if !self.mps {
                    return None;
                }
                self.kill_standby_worker()?;
            }
            Kind::OrphanLimit => {
                let grace = Duration::from_millis(chaos::orphan_grace_ms());
                // MPS under a grace only, once a run, with time left to wait it out; no native worker
                // (a client of meshd's MPS server that is the user's to stop, not an orphan).
                let room = self.ends.checked_duration_since(Instant::now()).unwrap_or_default();
                if !self.mps || grace.is_zero() || self.orphan_limit_passed || !self.natives.is_empty() {
                    return None;
                }
                if room < grace + Duration::from_secs(20) {
                    return None;
                }
                self.orphan_limit_passed = true;
                began = self.orphan_limit(grace);
                self.natives_interrupted();
            }
            Kind::Spawn => {
                if !self.spawn() {
                    return None;
                }
            }
            Kind::Stop => {
                let names: Vec<String> = self.natives.keys().cloned().collect();
                let name = self.rng.pick(&names).cloned()?;
                let n = self.natives.remove(&name).expect("listed");
                // A worker that ended by itself before a restart is forgotten by the restart: then
                // there is nothing to stop.
                let out = self.d.cli(&["stop", &name]);
                if !out.status.success() {
                    assert!(n.interrupted, "stop {name}: {}", String::from_utf8_lossy(&out.stderr));
                }
                if let Some(echo) = &n.echo {
                    self.d.ok(&["unload", echo]);
                }
                if !n.interrupted && n.echo.is_some() {
                    // It ran alone on its channels: whatever it finished, it checked.
                    let text = std::fs::read_to_string(&n.result).unwrap_or_default();
                    assert!(!text.contains("errors=") || text.contains("errors=0"), "native worker {name}: {text}");
                }
            }
            Kind::ChannelCreate => self.churn.create_channel(&self.d, &self.mb, &mut self.rng, !self.mps)?,
            Kind::ChannelDelete => self.churn.delete_channel(&self.d, &mut self.rng)?,
            Kind::ServiceCreate => self.churn.create_service(&self.d)?,
            Kind::ServiceDelete => self.churn.delete_service(&self.d, &mut self.rng)?,
        }
        Some(began)
    }

    /// A native worker: the Rust example (a GPU worker) exchanging messages with its own `echo_warp`
    /// on channels of its own; without that binary, in blink mode, a shell stand-in (no GPU).
    fn spawn(&mut self) -> bool {
        if !self.natives.is_empty() {
            return false;
        }
        let name = self.fresh("native");
        let result = self.dir.path().join(format!("{name}.result"));
        let echo = match (&self.native_binary, self.mps) {
            (Some(bin), _) => {
                let (to, from, echo) = (format!("{name}-to"), format!("{name}-from"), format!("{name}-echo"));
                Self::channel(&self.d, &to, 16, 1024, "host");
                Self::channel(&self.d, &from, 16, 1024, "host");
                self.d.ok(&["load", &echo, &ptx("echo_warp"), "--bind", &to, "--bind", &from]);
                let (bin, count, res) =
                    (bin.display().to_string(), NATIVE_COUNT.to_string(), result.display().to_string());
                self.d.ok(&["spawn", &name, "--bind", &to, "--bind", &from, "--", &bin, &count, &res]);
                Some(echo)
            }
            // An MPS native worker must be a client of meshd's server: a shell is refused.
            (None, true) => return false,
            (None, false) => {
                self.d.ok(&["spawn", &name, "--", "/bin/bash", "-c", "echo ready >&$MESH_READY_FD; exec sleep 100000"]);
                None
            }
        };
        self.natives.insert(name, Native { echo, result, interrupted: false });
        true
    }

    fn natives_interrupted(&mut self) {
        for n in self.natives.values_mut() {
            n.interrupted = true;
        }
    }

    /// A `kill -9` of one idle worker of the standby server (that of the MPS directory's two pipe
    /// directories where no program's worker runs); waits until the standby has as many live
    /// workers as before again, none of them the killed one. `None` when
    /// no standby worker runs (none configured, or being made).
    fn kill_standby_worker(&mut self) -> Option<()> {
        let busy: Vec<u64> = self.ps().iter().filter_map(|r| r["worker_pid"].as_u64()).collect();
        let workers_on = |dir: &std::path::Path| -> Vec<u32> {
            mesh_mps::mps_dir::processes_using(dir)
                .into_iter()
                .filter(|(pid, comm)| comm == WORKER_COMM && !mesh_mps::process::dying(*pid))
                .map(|(pid, _)| pid)
                .collect()
        };
        let dirs = mesh_mps::orphans::pipe_dirs(&self.d.mps_dir());
        let standby = dirs.into_iter().find(|d| {
            let w = workers_on(d);
            !w.is_empty() && w.iter().all(|p| !busy.contains(&u64::from(*p)))
        })?;
        let before = workers_on(&standby);
        let pid = *self.rng.pick(&before)?;
        let log0 = self.d.log_text().len();
        let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
        assert!(killed.is_ok_and(|s| s.success()), "kill -9 of standby worker {pid}");
        let replaced = wait_until(DEADLINE, || {
            let now = workers_on(&standby);
            !now.contains(&pid) && now.len() >= before.len()
        });
        assert!(
            replaced,
            "standby worker {pid} killed: not replaced within {DEADLINE:?} (standby workers before {before:?}, now \
             {:?})\n{}",
            workers_on(&standby),
            self.d.log_tail(40)
        );
        // A ready worker's death is logged (a starting one's is a refused start, retried).
        let log = self.d.log_text();
        let named = format!("standby MPS worker {pid} discarded");
        let line = log.get(log0..).unwrap_or_default().lines().find(|l| l.contains(&named));
        eprintln!(
            "standby worker {pid} killed and replaced; meshd said: {}",
            line.unwrap_or("(nothing: it was starting)")
        );
        Some(())
    }

    /// A `kill -9` of meshd left alone past the orphan grace: within the grace + 5 s every running
    /// program's slot says it stopped in order, no worker, MPS server or daemon is left, and the
    /// GPU's memory in use is back within 1% of what it was before meshd started. Then meshd starts
    /// again, finds no orphan and relaunches the recorded programs; returns when it was started,
    /// which the event's recovery gap counts from.
    fn orphan_limit(&mut self, grace: Duration) -> Instant {
        let running: Vec<(String, u32)> = self
            .ps()
            .iter()
            .filter(|r| r["state"] == "running" && r["native"] != true)
            .filter_map(|r| Some((r["name"].as_str()?.to_string(), u32::try_from(r["slot"].as_u64()?).ok()?)))
            .collect();
        let scraper = self.scraper.as_ref().expect("the scraper");
        scraper.meshd_down(true);
        let killed = Instant::now();
        self.d.kill9();
        let limit = grace + Duration::from_secs(5);
        let stopped = |c: &Self| {
            running.iter().all(|(_, slot)| c.mb.slot(*slot).is_ok_and(|s| s.status().state == STATE_STOPPED))
        };
        let all_stopped = wait_until(limit, || stopped(self));
        let programs_stopped = killed.elapsed();
        let gone = wait_until(limit.saturating_sub(killed.elapsed()), || chaos::leftovers().is_empty());
        let processes_gone = killed.elapsed();
        let memory = match self.memory_before {
            Some(before) => chaos::memory_settled(before, limit.saturating_sub(killed.elapsed())),
            None => None,
        };
        let memory_back = killed.elapsed();
        let states: Vec<(String, Option<u32>)> =
            running.iter().map(|(n, slot)| (n.clone(), self.mb.slot(*slot).ok().map(|s| s.status().state))).collect();
        assert!(
            all_stopped,
            "orphan limit ({grace:?}): not every program stopped in order within {limit:?} of the kill -9 (slot \
             states, {STATE_STOPPED} = stopped): {states:?}"
        );
        assert!(gone, "orphan limit ({grace:?}): left behind {limit:?} after the kill -9: {:?}", chaos::leftovers());
        if let (Some(before), Some(now)) = (self.memory_before, memory) {
            assert!(
                !chaos::memory_leaked(before, now),
                "orphan limit ({grace:?}): the GPU's memory in use is {now} MiB {memory_back:?} after the kill -9, \
                 {before} MiB before meshd started"
            );
        }
        eprintln!(
            "orphan limit (--orphan-grace-ms {}): {} program(s) stopped in order {programs_stopped:?} after the \
             kill -9, every worker, the MPS server and daemon gone after {processes_gone:?}, GPU memory {memory:?} \
             MiB ({:?} before meshd started) after {memory_back:?}",
            grace.as_millis(),
            running.len(),
            self.memory_before
        );
        let log0 = self.d.log_text().len();
        let restarted = Instant::now();
        self.d.restart();
        scraper.meshd_down(false);
        let log = self.d.log_text();
        let since = log.get(log0..).unwrap_or_default();
        assert!(
            !since.contains("adopted from the previous meshd"),
            "orphan limit: the restart adopted programs whose grace had passed:\n{}",
            self.d.log_tail(40)
        );
        restarted
    }
}

/// One event's figures.
#[derive(Default)]
struct Figures {
    count: usize,
    longest: Duration,
}

fn run(mode: &str, mps: bool) {
    let seed = chaos::seed();
    let length = chaos::duration();
    eprintln!(
        "chaos {mode}: seed {seed} ({}s; replay: MESH_CHAOS_SEED={seed} MESH_CHAOS_SECS={} MESH_GPU_TESTS=1, test chaos_{mode})",
        length.as_secs(),
        length.as_secs()
    );
    // An earlier test's MPS processes may still be ending (the driver takes up to ~2 s after a kill),
    // and under an orphan grace a failed run's orphans wait out the grace before they stop.
    let grace = Duration::from_millis(chaos::orphan_grace_ms());
    let clear = wait_until(Duration::from_secs(30) + grace, || chaos::leftovers().is_empty());
    assert!(clear, "meshd or MPS processes before the test: {:?}", chaos::leftovers());
    let memory_before = chaos::gpu_memory_mib();
    let mut c = Chaos::start(mps, seed);
    c.memory_before = memory_before;
    let mailbox_path = c.mb.path().to_path_buf();
    let first = c.progress().expect("progress");
    c.recovered(&first, "the setup");
    let base_pid = c.d.child.id();
    let base_counts = chaos::settled_counts(base_pid);
    let base_workers = c.workers();
    let memory_setup = chaos::gpu_memory_mib();
    eprintln!("chaos {mode}: set up; meshd pid {base_pid}: (descriptors, threads) {base_counts:?}");

    let mut figures: BTreeMap<Kind, Figures> = BTreeMap::new();
    let (mut max_gap, mut repeats_bound, mut lost_bound) = (Duration::ZERO, 0u64, 0u64);
    // ping's repeats: judged at the next event (or the end), a pause after the event that brought them.
    let (mut ping_from, mut ping_pending, mut ping_bound) = (c.ping_repeats(), None, 0u64);
    assert_eq!(ping_from, 0, "chaos {mode}: ping dropped repeats before any event");
    let started = Instant::now();
    c.ends = started + length;
    let mut i = 0;
    while started.elapsed() < length {
        let pause = Duration::from_millis(200 + c.rng.below(1800));
        std::thread::sleep(pause);
        ping_from = c.judge_ping(ping_from, ping_pending.take());
        let kind = draw(&mut c.rng);
        let Some(before) = c.progress() else { panic!("event {i}: meshd does not answer\n{}", c.d.log_tail(80)) };
        let (repeated0, lost0, log0) = (Tally::get(&c.echo.tally.repeated), c.device_lost(), c.d.log_text().len());
        let Some(began) = c.apply(kind) else { continue };
        let what = format!("chaos {mode} event {i} ({kind:?}; seed {seed})");
        c.recovered(&before, &what);
        let gap = began.elapsed();
        let (repeated, lost) = (Tally::get(&c.echo.tally.repeated) - repeated0, c.device_lost() - lost0);
        if kind.crash() {
            let log = c.d.log_text();
            let logged = chaos::logged_replay(log.get(log0..).unwrap_or_default(), "to-echo");
            let bound = match (kind, logged) {
                (_, Some(n)) => n,
                (k, None) if k.kill9() => 0,
                // A recovery in place (MPS) logs no bound: the ring's capacity is the most.
                (_, None) => ECHO_CAPACITY,
            };
            assert!(
                repeated <= bound,
                "{what}: the echo stream repeated {repeated} messages, bound {bound} ({logged:?} logged)"
            );
            // Blink mode renews the ring with meshd's context; MPS mode keeps it (meshd's own context
            // holds it through faults, adoptions and handoffs) unless meshd came back without adopting.
            let may_lose =
                if !mps || kind == Kind::OrphanLimit || chaos::orphan_grace_ms() == 0 { DEVICE_CAPACITY } else { 0 };
            assert!(
                lost <= may_lose,
                "{what}: the device ring lost {lost} messages (at most {may_lose} here; capacity {DEVICE_CAPACITY})"
            );
            repeats_bound += bound;
            lost_bound += may_lose;
            max_gap = max_gap.max(gap);
            // ping: pong takes requests again (pp-a's bound), ping receives replies again (pp-b's),
            // and the replies to what ping had in flight come to a new launch, as repeats.
            let since = log.get(log0..).unwrap_or_default();
            let pp = match (chaos::logged_replay(since, "pp-a"), chaos::logged_replay(since, "pp-b")) {
                (None, None) if kind.kill9() => 0,
                (None, None) => 2 * u64::from(PP_CAPACITY),
                (a, b) => a.unwrap_or(0) + b.unwrap_or(0),
            };
            ping_pending = Some((what.clone(), pp + PP_IN_FLIGHT));
            ping_bound += pp + PP_IN_FLIGHT;
        } else {
            assert_eq!((repeated, lost), (0, 0), "{what}: an orderly event repeated or lost messages");
            ping_pending = Some((what.clone(), 0));
        }
        let f = figures.entry(kind).or_default();
        f.count += 1;
        f.longest = f.longest.max(gap);
        i += 1;
    }

    // Back to the set-up state, then every message accounted for.
    for name in std::mem::take(&mut c.bystanders).into_keys() {
        c.d.ok(&["unload", &name]);
    }
    for name in c.natives.keys().cloned().collect::<Vec<_>>() {
        let _ = c.d.cli(&["stop", &name]);
        if let Some(echo) = c.natives.get(&name).and_then(|n| n.echo.clone()) {
            c.d.ok(&["unload", &echo]);
        }
    }
    c.natives.clear();
    c.churn.delete_all(&c.d);
    let now = c.progress().expect("progress");
    c.recovered(&now, "the end");
    std::thread::sleep(Duration::from_millis(500));
    let ping_repeats = c.judge_ping(ping_from, ping_pending.take());
    let pid = c.d.child.id();
    let end_counts = chaos::settled_counts(pid);
    let end_workers = c.workers();
    let memory_end = match (mps, memory_setup) {
        (false, Some(setup)) => chaos::memory_settled(setup, Duration::from_secs(30)),
        _ => chaos::gpu_memory_mib(),
    };
    c.stop.store(true, Ordering::Relaxed);
    let h2g_sent = {
        for t in std::mem::take(&mut c.h2g.threads) {
            t.join().expect("the host→GPU producer");
        }
        Tally::get(&c.h2g.tally.sent)
    };
    let drained = wait_until(DEADLINE, || {
        c.progress().is_some_and(|p| p["h2g"] >= h2g_sent)
            && c.echo.threads.iter().all(std::thread::JoinHandle::is_finished)
    });
    let rows = c.ps();
    if let Some(why) = c.broken(&rows) {
        panic!("chaos {mode} at the end: {why}");
    }
    assert!(
        drained,
        "chaos {mode}: the sink took {:?} of {h2g_sent}; the echo delivered {} of {}",
        c.progress(),
        Tally::get(&c.echo.tally.delivered),
        Tally::get(&c.echo.tally.sent)
    );
    for end in [&mut c.g2h, &mut c.echo] {
        for t in std::mem::take(&mut end.threads) {
            t.join().expect("a host end");
        }
    }
    let sink_words = c.user_words(&rows, "sink").expect("the sink runs");
    let (echo_sent, echo_delivered) = (Tally::get(&c.echo.tally.sent), Tally::get(&c.echo.tally.delivered));
    assert_eq!(echo_delivered, echo_sent, "chaos {mode}: every echo message came back");

    // The summary.
    eprintln!("chaos {mode} (seed {seed}): {i} events in {:.0} s", started.elapsed().as_secs_f64());
    eprintln!("| event | count | longest to recovered |");
    eprintln!("|---|---:|---:|");
    for (kind, f) in &figures {
        eprintln!("| {kind:?} | {} | {:.0} ms |", f.count, f.longest.as_secs_f64() * 1e3);
    }
    eprintln!(
        "max recovery gap after a crash (event to every program running and every stream moving): {:.0} ms",
        max_gap.as_secs_f64() * 1e3
    );
    if mps && chaos::orphan_grace_ms() > 0 {
        let grace = chaos::orphan_grace_ms();
        // meshd's log says each adoption, and why a program was not adopted.
        let log = c.d.log_text();
        let adopted = log.matches("adopted from the previous meshd").count();
        let not_adopted: Vec<&str> = log.lines().filter(|l| l.contains("not adopted:")).collect();
        eprintln!(
            "adoption (--orphan-grace-ms {grace}): {adopted} program(s) adopted after the kill -9s, {} not adopted{}",
            not_adopted.len(),
            not_adopted.first().map(|l| format!(" (the first: {l})")).unwrap_or_default()
        );
        // Where a restart's time goes until meshd answers (the programs ran on meanwhile): the
        // milestones of the last two starts, from meshd's log.
        const MILESTONES: [&str; 9] = [
            "taken over from meshd",
            "their rings are owned by meshd's own plain context",
            "adopting the previous meshd's MPS daemon",
            "while meshd went on",
            "program(s) of the previous meshd run on",
            "MPS pool of",
            "MPS standby server",
            "MPS mode: private daemon",
            "ready: mps mode",
        ];
        let marks: Vec<&str> = log.lines().filter(|l| MILESTONES.iter().any(|m| l.contains(m))).collect();
        // From the second last start on (a start's pool and standby may be made after it answers).
        let from = marks.iter().enumerate().filter(|(_, l)| l.contains(MILESTONES[0])).map(|(i, _)| i).rev().nth(1);
        eprintln!("the last two starts' milestones:");
        for line in &marks[from.unwrap_or(0)..] {
            eprintln!("  {}", line.chars().take(200).collect::<String>());
        }
    }
    eprintln!("| stream | sent | received | repeated (bound) | lost |");
    eprintln!("|---|---:|---:|---:|---:|");
    eprintln!(
        "| h2g host→sink | {h2g_sent} | {} (sink: {}) | - | 0 |",
        c.progress().map_or(0, |p| p["h2g"]),
        user::count(&sink_words)
    );
    let g2h = Tally::get(&c.g2h.tally.delivered);
    eprintln!("| g2h source→host | {g2h} | {g2h} | 0 | 0 |");
    eprintln!(
        "| echo host→GPU→host | {echo_sent} | {} | {} ({repeats_bound}) | 0 |",
        Tally::get(&c.echo.tally.received),
        Tally::get(&c.echo.tally.repeated)
    );
    let gsink = c.user_words(&rows, "gsink").expect("gsink runs");
    eprintln!(
        "| g2g gsource→gsink | {} | (gsink: {}) | - | 0 |",
        c.progress().map_or(0, |p| p["g2g"]),
        user::count(&gsink)
    );
    let ping_bad = c.user_words(&rows, "ping").map_or(0, |w| w[PING_BAD]);
    eprintln!(
        "| pp ping↔pong | {} | - | {ping_repeats} ({ping_bound}) | 0 (wrong replies: {ping_bad}) |",
        c.progress().map_or(0, |p| p["pingpong"])
    );
    eprintln!(
        "| dev dsource→dsink (device ring) | {} | - | - | {} ({lost_bound}) |",
        c.progress().map_or(0, |p| p["dev"]),
        c.device_lost()
    );
    eprintln!(
        "meshd (descriptors, threads): after the setup {base_counts:?} (pid {base_pid}), at the end {end_counts:?} (pid {pid})"
    );

    // Nothing leaked. With --pool-grow the MPS pool may end larger than it started (a load past it
    // creates a worker, which the unload keeps): each extra worker is allowed a few descriptors (its
    // pipes) and a thread; the same number or fewer workers, none.
    let extra = usize::try_from(end_workers.saturating_sub(base_workers)).unwrap_or(usize::MAX / 8);
    // Under an orphan grace the last meshd may hold what it adopted: the MPS control daemon and
    // each adopted worker by a pidfd, and each device ring an adopted worker mapped by the
    // descriptor it handed over.
    let held = if mps && chaos::orphan_grace_ms() > 0 {
        // Every worker the last start adopted may still be held, running its program or (after an
        // upgrade or unload gave it back) idle in the pool: the count its log gives.
        let log = c.d.log_text();
        let adopted = adopted_at_last_start(&log).max(c.ps().iter().filter(|r| r["adopted"] == true).count());
        let device_rings =
            c.mb.channels_each()
                .into_iter()
                .filter(|ch| ch.as_ref().is_ok_and(|ch| ch.placement == mesh_shm::Placement::Device))
                .count();
        eprintln!(
            "held from the adoptions: the daemon, {adopted} adopted worker(s), {device_rings} device ring(s) at most"
        );
        1 + adopted + device_rings
    } else {
        0
    };
    let (fd_allowed, thread_allowed) = (base_counts.0 + 4 * extra + held, base_counts.1 + extra);
    eprintln!("MPS workers: after the setup {base_workers}, at the end {end_workers}");
    eprintln!("GPU memory in use with meshd running: after the setup {memory_setup:?}, at the end {memory_end:?} MiB");
    // Blink mode holds one context whatever happened: what the run's device rings took must be back.
    // (MPS mode's pool may have grown, each worker a context of its own.)
    if let (false, Some(a), Some(b)) = (mps, memory_setup, memory_end) {
        assert!(
            !chaos::memory_leaked(a, b),
            "chaos {mode}: GPU memory in use with meshd running grew {a} -> {b} MiB over the run (more than 1% + {} \
             MiB): device rings deleted but not freed?",
            chaos::MEMORY_SLACK_MIB
        );
    }
    assert!(
        end_counts.0 <= fd_allowed && end_counts.1 <= thread_allowed,
        "chaos {mode}: meshd's descriptors or threads grew: {base_counts:?} -> {end_counts:?} ({extra} workers more)"
    );
    let scraped = c.scraper.take().expect("the scraper").finish();
    eprintln!(
        "monitoring endpoint: {} answers 200, {} answers 503, {} tries unreachable (restarts), slowest {:.1} ms",
        Tally::get(&scraped.ok),
        Tally::get(&scraped.unavailable),
        Tally::get(&scraped.unreachable),
        Tally::get(&scraped.slowest_us) as f64 / 1e3
    );
    assert_eq!(scraped.failed(), None, "chaos {mode}: the monitoring endpoint");
    assert!(Tally::get(&scraped.ok) > 0, "chaos {mode}: /metrics never answered 200");
    let status = c.d.shutdown();
    assert!(status.success(), "chaos {mode}: meshd's exit: {status}\n{}", c.d.log_tail(40));
    let gone = wait_until(Duration::from_secs(30), || {
        chaos::leftovers().is_empty() && c.native_pids.iter().chain(&c.d.pids).all(|p| !chaos::alive(*p))
    });
    assert!(
        gone,
        "chaos {mode}: left behind after the shutdown: {:?}, natives {:?}",
        chaos::leftovers(),
        c.native_pids.iter().filter(|p| chaos::alive(**p)).collect::<Vec<_>>()
    );
    // --keep-shm kept the mailbox and its lock: the test's to remove.
    let _ = std::fs::remove_file(&mailbox_path);
    let _ = std::fs::remove_file(format!("{}.lock", mailbox_path.display()));
    let memory_after = chaos::gpu_memory_mib();
    eprintln!("chaos {mode}: GPU memory in use {memory_before:?} -> {memory_after:?} MiB");
    if let (Some(a), Some(b)) = (memory_before, memory_after) {
        assert!(
            !chaos::memory_leaked(a, b),
            "chaos {mode}: GPU memory in use grew {a} -> {b} MiB (more than 1% + {} MiB)",
            chaos::MEMORY_SLACK_MIB
        );
    }
}

#[test]
fn chaos_blink() {
    require_gpu!("chaos_blink");
    run("blink", false);
}

#[test]
fn chaos_mps() {
    require_gpu!("chaos_mps");
    run("mps", true);
}

/// How many programs the last start of meshd adopted, from its log line `N program(s) of the
/// previous meshd run on, adopted`; 0 when no start adopted any.
fn adopted_at_last_start(log: &str) -> usize {
    const SAID: &str = " program(s) of the previous meshd run on, adopted";
    log.lines()
        .rev()
        .find_map(|l| l.find(SAID).map(|at| &l[..at]))
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn the_last_starts_adoptions_are_read_from_meshds_log() {
    let log = "x INFO mesh_mps::backend::api: 10 program(s) of the previous meshd run on, adopted; the relaunch claims\n\
               y INFO meshd::daemon: ready\n\
               z INFO mesh_mps::backend::api: 3 program(s) of the previous meshd run on, adopted; the relaunch claims\n";
    assert_eq!(adopted_at_last_start(log), 3);
    assert_eq!(adopted_at_last_start("ready: mps mode"), 0);
}
