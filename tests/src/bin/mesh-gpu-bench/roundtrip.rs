//! Round trips through meshd's own backends, the same code in both modes (`mesh-gpu-bench rt blink|mps`,
//! `mesh-gpu-bench g2g blink|mps`): the programs run where meshd runs them (blink: this process's
//! context; MPS: a worker process, an MPS client), the host end is this process.
//!
//! * host↔GPU: `echo_header` (the loop of mesh.cuh's opening comment, exactly) and `echo_warp` beside
//!   the raw relaxed mapped word (`raw_pingpong`), 20,000 round trips each, median and p99, by size.
//!   The LL probe (`tests/probes/ll_roundtrip.cu`) is run by the bundle's script in the same run.
//! * GPU↔GPU: `ping` ↔ `echo_header` on two channels, timed by the GPU (%globaltimer: mean, fastest,
//!   slowest), on host and on device channels. The raw two-kernel limit (`tests/probes/g2g.cu`) is run
//!   by the bundle's script in the same run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mesh_backend::{Backend, ProgramSpec};
use mesh_gpu_tests::stress;
use mesh_gpu_tests::{program, wait_until};
use mesh_shm::{Consumer, Mailbox, Placement, Producer};

use crate::{percentiles, us};

const ROUNDS: usize = 20_000;
const WARMUP: usize = 1_000;
const SIZES: [u32; 5] = [8, 64, 256, 1024, 4096];

/// A backend of either mode over its own mailbox.
pub struct Bench {
    pub mb: Mailbox,
    pub backend: Box<dyn Backend>,
    pub mode: &'static str,
    next: u32,
    _dir: tempfile::TempDir,
}

impl Bench {
    pub fn open(mps: bool) -> Self {
        Self::open_sized(mps, 64 << 20)
    }

    /// A backend over a mailbox of `size` bytes.
    pub fn open_sized(mps: bool, size: u64) -> Self {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        // 1024 channels: `rt-ab` makes a fresh one or two for each of some 150 measurements.
        let config = mesh_shm::MailboxConfig { size, slots: 64, channels: 1024 };
        let mb = Mailbox::create(dir.path().join("mb"), &config, mesh_shm::CreateMode::Exclusive).unwrap();
        let backend: Box<dyn Backend> = if mps {
            // No orphan grace: a bench that panics must not leave programs running into the next.
            let config = mesh_mps::MpsConfig {
                pool: 3,
                orphan_grace: std::time::Duration::ZERO,
                ..mesh_mps::MpsConfig::default()
            };
            Box::new(mesh_mps::MpsBackend::open(&mb, config).unwrap())
        } else {
            Box::new(mesh_cuda::BlinkBackend::open(&mb, mesh_cuda::BlinkConfig::default()).unwrap())
        };
        Self { mb, backend, mode: if mps { "mps" } else { "blink" }, next: 0, _dir: dir }
    }

    pub(crate) fn channel(&mut self, size: u32, capacity: u32, placement: Placement) -> String {
        self.next += 1;
        let name = format!("b{}", self.next);
        self.mb.create_channel_placed(&name, size, capacity, placement).unwrap();
        name
    }

    /// Loads `program` bound to `channels` (one block of one warp); returns its slot.
    fn load(&mut self, name: &str, program_name: &str, channels: &[&str]) -> u32 {
        self.load_block(name, program_name, channels, 32)
    }

    /// [`Bench::load`] with a block of `threads`.
    pub(crate) fn load_block(&mut self, name: &str, program_name: &str, channels: &[&str], threads: u32) -> u32 {
        let mut spec = ProgramSpec::new(name, program(program_name)).unwrap();
        spec.shape.block = [threads, 1, 1];
        spec.bindings = channels.iter().map(|c| c.to_string()).collect();
        self.backend.load(spec).unwrap_or_else(|e| panic!("load {program_name}: {e}")).slot
    }

    pub fn shutdown(mut self) {
        self.backend.shutdown().unwrap();
    }
}

fn stats(v: Vec<Duration>) -> (f64, f64) {
    let (median, p99, _) = percentiles(v);
    (us(median), us(p99))
}

/// The raw relaxed mapped word through a resident `raw_pingpong` (the host stores a number into one
/// word of the mailbox, the GPU copies it into another).
fn raw(b: &mut Bench) -> (f64, f64) {
    stats(raw_times(b, ROUNDS, WARMUP))
}

/// The client's own work between a reply and its next request, spun before each request and not timed:
/// `--host-delay-ns N` (N ns every time; default 0, the next request at once) or `LO-HI` (a
/// delay drawn uniformly from LO..=HI ns for each request). A one-warp loop's round trip depends on
/// where the request lands between its polls: a fixed delay moves that phase (the sawtooth), a range
/// at least one poll wide (`0-1500`) averages every path over it, as a client whose own time varies.
fn client_turnaround() {
    static DELAY: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
    thread_local! {
        static DRAW: std::cell::Cell<u64> = const { std::cell::Cell::new(0x9e37_79b9_7f4a_7c15) };
    }
    let (lo, hi) = *DELAY.get_or_init(|| {
        crate::opt("host-delay-ns").map_or((0, 0), |v| {
            parse_delay(&v).unwrap_or_else(|| panic!("--host-delay-ns {v:?}: neither N nor LO-HI (ns)"))
        })
    });
    let ns = if hi > lo {
        // xorshift64: a few instructions beside a microsecond round trip; the paths take turns drawing
        // from one stream, so each sees the same uniform distribution (not the same draws).
        let x = DRAW.with(|d| {
            let mut x = d.get();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            d.set(x);
            x
        });
        lo + x % (hi - lo + 1)
    } else {
        lo
    };
    if ns == 0 {
        return;
    }
    let (start, delay) = (Instant::now(), Duration::from_nanos(ns));
    while start.elapsed() < delay {
        std::hint::spin_loop();
    }
}

/// `--host-delay-ns`'s value: `N` as (N, N), `LO-HI` as (LO, HI) with LO <= HI.
fn parse_delay(v: &str) -> Option<(u64, u64)> {
    match v.split_once('-') {
        None => v.trim().parse().ok().map(|n| (n, n)),
        Some((lo, hi)) => {
            let (lo, hi): (u64, u64) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
            (lo <= hi).then_some((lo, hi))
        }
    }
}

/// `rounds` round trips of the raw word (after `warmup`), each timed.
fn raw_times(b: &mut Bench, rounds: usize, warmup: usize) -> Vec<Duration> {
    word_times(b, "raw_pingpong", rounds, warmup)
}

/// [`raw_times`] through `program`, a loop of raw_pingpong's contract.
fn word_times(b: &mut Bench, program: &str, rounds: usize, warmup: usize) -> Vec<Duration> {
    let scratch = b.channel(8, 2, Placement::Host);
    let info = b.mb.channel(&scratch).unwrap();
    b.load("raw", program, &[&scratch]);
    let (base, _) = b.mb.as_raw_parts();
    // SAFETY: the ring's head and tail lines lie inside the mapping, 8-aligned; used as plain words here.
    let (ping, pong) = unsafe {
        (
            AtomicU64::from_ptr(base.add(usize::try_from(info.ring_offset).unwrap()).cast()),
            AtomicU64::from_ptr(base.add(usize::try_from(info.ring_offset).unwrap() + 128).cast()),
        )
    };
    let mut times = Vec::with_capacity(rounds);
    for i in 1..=(rounds + warmup) as u64 {
        client_turnaround();
        let t = Instant::now();
        ping.store(i, Ordering::Release);
        while pong.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        if i > warmup as u64 {
            times.push(t.elapsed());
        }
    }
    ping.store(u64::MAX, Ordering::Release);
    // raw_pingpong ends itself on ~0; an unload of an ended program is refused by neither mode.
    let _ = b.backend.unload("raw");
    times
}

/// Round trips of `size`-byte messages through echo program `echo`, every reply checked.
fn echo(b: &mut Bench, echo: &str, size: u32) -> (f64, f64) {
    stats(echo_times(b, (echo, 32), size, ROUNDS, WARMUP))
}

/// `rounds` round trips (after `warmup`) of `size`-byte messages through `echo` (a program and its
/// block's threads), each timed and checked.
fn echo_times(b: &mut Bench, echo: (&str, u32), size: u32, rounds: usize, warmup: usize) -> Vec<Duration> {
    let (echo, threads) = echo;
    let (to, from) = (b.channel(size, 64, Placement::Host), b.channel(size, 64, Placement::Host));
    b.load_block("echo", echo, &[&to, &from], threads);
    let mut tx = Producer::claim(&b.mb, &to).unwrap();
    let mut rx = Consumer::claim(&b.mb, &from).unwrap();
    let (mut msg, mut back) = (vec![0u8; size as usize], vec![0u8; size as usize]);
    let mut times = Vec::with_capacity(rounds);
    for i in 0..(rounds + warmup) as u64 {
        stress::fill(&mut msg, i);
        client_turnaround();
        let t = Instant::now();
        while !tx.try_send(&msg).unwrap() {}
        while !rx.try_recv(&mut back).unwrap() {
            std::hint::spin_loop();
        }
        let took = t.elapsed();
        stress::check(&back, i).unwrap_or_else(|e| panic!("{echo} {size} B: {e}"));
        if i >= warmup as u64 {
            times.push(took);
        }
    }
    drop((tx, rx));
    b.backend.unload("echo").unwrap();
    times
}

/// The one-warp LL probe as a resident program (`raw_ll`): `rounds` round trips (after `warmup`) of
/// `size` payload bytes, as `size / 4` tagged 8-byte words written by this thread and stored back by
/// the GPU's warp once all of them arrived, each reply's payload checked. No ring, no index, no
/// protocol: the fastest one warp moves that many bytes there and back (tests/probes/ll_roundtrip.cu).
/// With `ll.ring` it walks 32 request / reply pairs of slots instead of one (faster at 4 KiB on the H200;
/// `raw_ll_ring` in the tables); `ll.program` is raw_ll or a variant of it; with
/// `ll.head_last` the request's first two words are stored last, as mesh-shm's producer stores a
/// message, instead of in order.
fn raw_ll_times(b: &mut Bench, size: u32, ll: &LlRun, rounds: usize, warmup: usize) -> Vec<Duration> {
    let pairs: u32 = if ll.ring { 32 } else { 1 };
    let scratch = b.channel(size, 2 * pairs, Placement::Host);
    let info = b.mb.channel(&scratch).unwrap();
    let program = ll.program.as_str();
    b.load(program, program, &[&scratch]);
    let words = (size / 4) as usize;
    let (base, _) = b.mb.as_raw_parts();
    let at = |k: usize| {
        // SAFETY: the channel's LL slots (capacity × 2 × size bytes, 8-aligned, inside the mapping) are
        // words shared with the GPU only, used as plain atomic words here and by raw_ll*.cu.
        unsafe { AtomicU64::from_ptr(base.add(usize::try_from(info.slots_offset).unwrap() + 8 * k).cast()) }
    };
    // Round trip i's request words and reply words: pair (i - 1) mod pairs.
    let pair = |i: u32| {
        let first = ((i - 1) % pairs) as usize * 2 * words;
        (
            (first..first + words).map(at).collect::<Vec<_>>(),
            (first + words..first + 2 * words).map(at).collect::<Vec<_>>(),
        )
    };
    let slots: Vec<_> = (1..=pairs).map(pair).collect();
    let word = |i: u32, k: u32| u64::from(i) << 32 | u64::from(i.wrapping_mul(7).wrapping_add(k));
    let mut times = Vec::with_capacity(rounds);
    let (warm, total) = (u32::try_from(warmup).unwrap(), u32::try_from(rounds + warmup).unwrap());
    for i in 1..=total {
        let (input, output) = &slots[((i - 1) % pairs) as usize];
        client_turnaround();
        let t = Instant::now();
        let first = if ll.head_last { 2.min(input.len()) } else { 0 };
        for (k, w) in (0u32..).zip(input).skip(first) {
            w.store(word(i, k), Ordering::Relaxed);
        }
        for (k, w) in (0u32..).zip(input).take(first) {
            w.store(word(i, k), Ordering::Relaxed);
        }
        let mut spins = 0u32;
        for w in output {
            while w.load(Ordering::Relaxed) >> 32 != u64::from(i) {
                std::hint::spin_loop();
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(4096) && t.elapsed() > Duration::from_secs(5) {
                    panic!("{program} {size} B: round trip {i} not back in 5 s");
                }
            }
        }
        let took = t.elapsed();
        for (k, w) in (0u32..).zip(output) {
            assert_eq!(w.load(Ordering::Relaxed), word(i, k), "{program} {size} B: round trip {i}, word {k}");
        }
        if i > warm {
            times.push(took);
        }
    }
    // The program ends itself on word 0 of the next request tagged ~0.
    slots[(total % pairs) as usize].0[0].store(u64::from(u32::MAX) << 32, Ordering::Relaxed);
    let _ = b.backend.unload(program);
    times
}

/// Turns of `mesh-gpu-bench rt-ab`, and round trips of each path in each turn.
const TURNS: usize = 5;
const TURN_ROUNDS: usize = 4_000;
const TURN_WARMUP: usize = 500;

/// How many of `rt-ab`'s paths are limits ([`TurnPath::limits`]).
const LIMITS: usize = 3;

/// How `raw_ll_times` runs an LL probe program.
struct LlRun {
    program: String,
    ring: bool,
    head_last: bool,
}

/// A path `rt-ab` measures, with its name in the tables and the `TURNS|` / `MEANS|` lines: a raw-word
/// loop (`raw_pingpong` or another program of its contract), a run of an LL probe, or an echo program
/// (up to `max` bytes, in a block of `threads`).
enum TurnPath {
    Word { label: String, program: String },
    Ll { label: String, run: LlRun },
    Echo { program: String, max: u32, threads: u32 },
}

impl TurnPath {
    /// The limits every other path is divided by, in the tables' order: the raw word, the LL probe at
    /// one pair of slots, the same walking 32 pairs.
    fn limits() -> [TurnPath; LIMITS] {
        let probe = |label: &str, ring| TurnPath::Ll {
            label: label.into(),
            run: LlRun { program: "raw_ll".into(), ring, head_last: false },
        };
        [
            TurnPath::Word { label: "raw word".into(), program: "raw_pingpong".into() },
            probe("raw_ll", false),
            probe("raw_ll_ring", true),
        ]
    }

    /// The path's name in the tables and the per-turn lines.
    fn label(&self) -> String {
        match self {
            TurnPath::Word { label, .. } | TurnPath::Ll { label, .. } => label.clone(),
            TurnPath::Echo { program, .. } => program.clone(),
        }
    }

    fn serves(&self, size: u32) -> bool {
        match self {
            TurnPath::Echo { max, .. } => size <= *max,
            _ => true,
        }
    }

    fn times(&self, b: &mut Bench, size: u32) -> Vec<Duration> {
        match self {
            TurnPath::Word { program, .. } => word_times(b, program, TURN_ROUNDS, TURN_WARMUP),
            TurnPath::Ll { run, .. } => raw_ll_times(b, size, run, TURN_ROUNDS, TURN_WARMUP),
            TurnPath::Echo { program, threads, .. } => {
                echo_times(b, (program, *threads), size, TURN_ROUNDS, TURN_WARMUP)
            }
        }
    }
}

/// The echo programs `rt-ab` puts beside the header's loop: `--variants`, comma-separated
/// `PROGRAM[:MAX_BYTES[:THREADS]]` (a program serving messages up to MAX_BYTES, default 4096, in a
/// block of THREADS, default 32), e.g. `echo_x_nodrain` or `echo_x_rarestop:4096:32`, or
/// `word:PROGRAM`, a raw-word loop beside `raw_pingpong`, or an LL probe run `ll:PROGRAM` (one pair of slots), `llring:PROGRAM`
/// (32 pairs), either with `-headlast` before the colon (the request's first two words stored last, as
/// mesh-shm stores a message): `llring-headlast:raw_ll`.
fn rt_ab_variants() -> Vec<TurnPath> {
    crate::opt_list("variants")
        .unwrap_or_default()
        .iter()
        .map(|v| {
            if let Some(program) = v.strip_prefix("word:") {
                return TurnPath::Word { label: v.to_string(), program: program.to_string() };
            }
            if let Some((kind, program)) = v.split_once(':')
                && let Some(run) = ll_run(kind, program)
            {
                return TurnPath::Ll { label: v.to_string(), run };
            }
            let mut fields = v.split(':');
            let program = fields.next().unwrap_or_default().to_string();
            let mut number = |default: u32, what: &str| {
                fields
                    .next()
                    .map_or(default, |n| n.parse().unwrap_or_else(|_| panic!("--variants {v:?}: {n:?} is not {what}")))
            };
            let (max, threads) = (number(4096, "a byte count"), number(32, "a thread count"));
            TurnPath::Echo { program, max, threads }
        })
        .collect()
}

/// The LL probe run `--variants`' `KIND:PROGRAM` names, if KIND is one (see [`rt_ab_variants`]).
fn ll_run(kind: &str, program: &str) -> Option<LlRun> {
    let (ring, head_last) = match kind {
        "ll" => (false, false),
        "llring" => (true, false),
        "ll-headlast" => (false, true),
        "llring-headlast" => (true, true),
        _ => return None,
    };
    Some(LlRun { program: program.to_string(), ring, head_last })
}

/// `mesh-gpu-bench rt-ab MODE [--variants ...] [--host-delay-ns N|LO-HI]`: the header's loop (`echo_header`) and the
/// echo variants `--variants` names beside their two raw limits, the relaxed mapped word
/// (`raw_pingpong`) and the one-warp LL probe at one slot (`raw_ll`) and walking 32 pairs of slots
/// (`raw_ll` over a ring, `raw_ll_ring` in the tables), measured in turns: TURNS turns, in each of them
/// for each size every path, TURN_ROUNDS round trips each, one after the other. A drift of the
/// machine within the run (the raw word can move 10% between the start and the end of `rt`) then
/// falls on every path alike. Printed for each echo: the medians and p99s over every turn's round
/// trips, their ratios, and the range of the ratio of each turn's own medians; then each turn's median
/// (`TURNS|` lines) and mean (`MEANS|`) of every path.
pub fn host_round_trips_interleaved(mps: bool) {
    let mut b = Bench::open(mps);
    let mode = b.mode;
    let mut paths: Vec<TurnPath> = TurnPath::limits().into();
    paths.push(TurnPath::Echo { program: "echo_header".into(), max: 4096, threads: 32 });
    paths.extend(rt_ab_variants());
    // [size][path]: every turn's samples, and each turn's median.
    let mut pooled: Vec<Vec<Vec<Duration>>> =
        SIZES.iter().map(|_| paths.iter().map(|_| Vec::new()).collect()).collect();
    let mut turn_medians: Vec<Vec<Vec<f64>>> =
        SIZES.iter().map(|_| paths.iter().map(|_| Vec::new()).collect()).collect();
    let mut turn_means = turn_medians.clone();
    for _ in 0..TURNS {
        for (s, &size) in SIZES.iter().enumerate() {
            for (k, path) in paths.iter().enumerate().filter(|(_, p)| p.serves(size)) {
                let times = path.times(&mut b, size);
                turn_medians[s][k].push(stats(times.clone()).0);
                #[allow(clippy::cast_precision_loss, reason = "a few thousand samples")]
                turn_means[s][k].push(us(times.iter().sum::<Duration>()) / times.len().max(1) as f64);
                pooled[s][k].extend(times);
            }
        }
    }
    println!();
    println!(
        "Round trip host→GPU→host, {mode} mode, in turns: {TURNS} turns × {TURN_ROUNDS} round trips of each path \
         (after {TURN_WARMUP} warm-up), the paths one after the other in every turn; median / p99 µs over all turns."
    );
    println!("ratio [lo, hi]: of the medians over all turns, [lowest, highest] of each turn's own medians.");
    let delay = crate::opt("host-delay-ns");
    if let Some(ns) = &delay {
        println!(
            "The client spins {ns} ns (a range: drawn for each request) after each reply before its next request (not timed)."
        );
    }
    println!();
    println!(
        "| mode | size | echo | median / p99 | raw word | × raw word [lo, hi] | raw_ll (one-warp LL) | × raw_ll [lo, hi] | raw_ll_ring | × raw_ll_ring [lo, hi] |"
    );
    println!(
        "|------|-----:|------|-------------:|---------:|--------------------:|---------------------:|------------------:|------------:|-----------------------:|"
    );
    let range = |num: &[f64], den: &[f64]| {
        let r: Vec<f64> = num.iter().zip(den).map(|(n, d)| n / d).collect();
        (r.iter().copied().fold(f64::INFINITY, f64::min), r.iter().copied().fold(0.0, f64::max))
    };
    for (s, size) in SIZES.iter().enumerate() {
        let all: Vec<(f64, f64)> = std::mem::take(&mut pooled[s])
            .into_iter()
            .map(|t| if t.is_empty() { (f64::NAN, f64::NAN) } else { stats(t) })
            .collect();
        let (word, ll, ring) = (all[0], all[1], all[2]);
        for (k, path) in paths.iter().enumerate().skip(LIMITS) {
            if !path.serves(*size) {
                continue;
            }
            let program = path.label();
            let echo = all[k];
            let (w_lo, w_hi) = range(&turn_medians[s][k], &turn_medians[s][0]);
            let (l_lo, l_hi) = range(&turn_medians[s][k], &turn_medians[s][1]);
            let (r_lo, r_hi) = range(&turn_medians[s][k], &turn_medians[s][2]);
            println!(
                "| {mode} | {size} | {program} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} [{w_lo:.2}, {w_hi:.2}] | {:.2} / {:.2} | {:.2} [{l_lo:.2}, {l_hi:.2}] | {:.2} / {:.2} | {:.2} [{r_lo:.2}, {r_hi:.2}] |",
                echo.0,
                echo.1,
                word.0,
                word.1,
                echo.0 / word.0,
                ll.0,
                ll.1,
                echo.0 / ll.0,
                ring.0,
                ring.1,
                echo.0 / ring.0,
            );
            let client = delay.as_ref().map_or(String::new(), |ns| format!(", client {ns} ns"));
            crate::results::record(
                "rt-ab",
                &format!("{program}, {mode}, {size} B{client}"),
                echo.0,
                "µs",
                Some(("raw LL exchange (raw_ll)", ll.0)),
                crate::results::spread(&turn_medians[s][k]),
            );
        }
    }
    // Each turn's own median of every path: the phase of a one-warp loop against the host can flip
    // between turns (a lost race costs one empty poll), which the pooled medians above hide. And each
    // turn's mean: a wait that splits the round trips into two modes (a loop that waits for a slow
    // client) can move the median and leave the mean, or the reverse.
    for (tag, what, per_turn) in [("TURNS", "median", &turn_medians), ("MEANS", "mean", &turn_means)] {
        println!();
        println!("Each turn's {what} µs, by size and path:");
        for (s, size) in SIZES.iter().enumerate() {
            for (k, path) in paths.iter().enumerate().filter(|(_, p)| p.serves(*size)) {
                let turns: Vec<String> = per_turn[s][k].iter().map(|m| format!("{m:.2}")).collect();
                println!("{tag}|{mode}|{size}|{}|{}", path.label(), turns.join(" "));
            }
        }
    }
    b.shutdown();
}

/// `mesh-gpu-bench rt MODE`: the host↔GPU table of one mode.
pub fn host_round_trips(mps: bool) {
    let mut b = Bench::open(mps);
    let mode = b.mode;
    let (raw_median, raw_p99) = raw(&mut b);
    println!();
    println!("Round trip host→GPU→host, {mode} mode, µs, median / p99 of {ROUNDS} (after {WARMUP} warm-up).");
    println!("Raw relaxed mapped word (raw_pingpong, same run): {raw_median:.2} / {raw_p99:.2}");
    println!();
    println!("Variants (same run, same client; each tests/programs/echo_x_*.cu says what it changes):");
    println!("nodrain = no position store per message (every half ring),");
    println!("rarestop = stop checked every 4096th iteration only.");
    println!();
    println!("| mode | size | echo_header (header's loop) | ×raw | p99/median | echo_warp | nodrain | rarestop |");
    println!("|------|-----:|----------------------------:|-----:|-----------:|----------:|--------:|---------:|");
    for size in SIZES {
        let h = echo(&mut b, "echo_header", size);
        let cells: Vec<String> = ["echo_warp", "echo_x_nodrain", "echo_x_rarestop"]
            .iter()
            .map(|p| {
                let (m, p99) = echo(&mut b, p, size);
                format!("{m:.2} / {p99:.2}")
            })
            .collect();
        println!(
            "| {mode} | {size} | {:.2} / {:.2} | {:.2} | {:.2} | {} |",
            h.0,
            h.1,
            h.0 / raw_median,
            h.1 / h.0,
            cells.join(" | ")
        );
        let figure = format!("echo_header, {mode}, {size} B, client at once");
        crate::results::record("rt", &figure, h.0, "µs", Some(("raw mapped word", raw_median)), None);
    }
    let (raw2, _) = raw(&mut b);
    println!("Raw word again at the end: {raw2:.2} µs median (drift check)");
    b.shutdown();
}

/// GPU↔GPU: `ping` ↔ `echo_header` over two channels of `placement`, capacity 64. (mean, fastest, slowest)
/// µs, errors.
fn ping_pong(b: &mut Bench, size: u32, placement: Placement, n: u64, pair: (&str, &str)) -> (f64, f64, f64, u32) {
    ping_pong_cap(b, size, 64, placement, n, pair)
}

/// `ping_pong` over channels of `capacity` messages.
fn ping_pong_cap(
    b: &mut Bench,
    size: u32,
    capacity: u32,
    placement: Placement,
    n: u64,
    pair: (&str, &str),
) -> (f64, f64, f64, u32) {
    let (to, from) = (b.channel(size, capacity, placement), b.channel(size, capacity, placement));
    b.load("echo", pair.1, &[&to, &from]);
    let slot = b.load("ping", pair.0, &[&to, &from]);
    let words = || b.mb.slot(slot).unwrap().user_words();
    let got = wait_until(Duration::from_secs(60), || {
        let w = words();
        (u64::from(w[0]) | u64::from(w[1]) << 32) >= n
    });
    let w = words();
    assert!(got, "ping {size} B {placement}: {} of {n} round trips in 60 s", w[0]);
    let count = u64::from(w[0]) | u64::from(w[1]) << 32;
    let total = u64::from(w[2]) | u64::from(w[3]) << 32;
    b.backend.unload("ping").unwrap();
    b.backend.unload("echo").unwrap();
    (total as f64 / count as f64 / 1e3, f64::from(w[4]) / 1e3, f64::from(w[6]) / 1e3, w[5])
}

/// `mesh-gpu-bench g2g MODE`: GPU↔GPU round trips by placement.
pub fn gpu_round_trips(mps: bool) {
    // The raw limit first, in a process of its own, before this one opens the GPU (in MPS mode the
    // probe is then a plain context beside no server of ours).
    let raw = crate::probe::raw_g2g();
    let mut b = Bench::open(mps);
    let mode = b.mode;
    println!();
    match &raw {
        Ok(r) => {
            println!("Raw limit (tests/probes/g2g.cu, two plain kernels, this run), µs:");
            for ((memory, size), us) in r {
                println!("  {memory:?} {size} B: {us:.3}");
            }
        }
        Err(e) => println!("Raw limit (tests/probes/g2g.cu) not measured: {e}"),
    }
    let raw_at = |memory, size| {
        let name = match memory {
            crate::probe::Memory::Device => "two kernels on device memory (tests/probes/g2g.cu)",
            crate::probe::Memory::MappedHost => "two kernels on mapped host memory (tests/probes/g2g.cu)",
        };
        raw.as_ref().ok().and_then(|r| r.get(&(memory, size))).map(|&us| (name, us))
    };
    println!("GPU↔GPU round trip, {mode} mode: ping ↔ echo_header (both the header's loop), timed by the GPU");
    println!("(%globaltimer), µs: mean [fastest, slowest] over ≥ 100,000 round trips after 1,000 warm-up.");
    println!();
    println!("Variants on device channels: rarestop = ping_x_rarestop ↔ echo_x_rarestop (stop checked every");
    println!("4096th iteration), nodrain = ping_x_nodrain ↔ echo_x_nodrain (no position store per message).");
    println!();
    println!("| mode | size | device channels | host channels | device, rarestop | device, nodrain | errors |");
    println!("|------|-----:|----------------:|--------------:|-----------------:|----------------:|-------:|");
    // MPS mode serves device channels by default; only a GPU whose compute mode refuses meshd's own
    // context refuses them (the backend, open by now, says why).
    let refused = if mps { mesh_mps::device_channels_refusal() } else { None };
    let device = refused.is_none();
    let cell = |r: Option<(f64, f64, f64, u32)>| {
        r.map_or_else(
            || format!("(refused: {})", refused.as_deref().unwrap_or("-")),
            |(m, lo, hi, _)| format!("{m:.2} [{lo:.2}, {hi:.1}]"),
        )
    };
    for size in [8u32, 64, 256, 1024, 4096] {
        let n = 100_000;
        let dev = device.then(|| ping_pong(&mut b, size, Placement::Device, n, ("ping", "echo_header")));
        let host = ping_pong(&mut b, size, Placement::Host, n, ("ping", "echo_header"));
        let rare =
            device.then(|| ping_pong(&mut b, size, Placement::Device, n, ("ping_x_rarestop", "echo_x_rarestop")));
        let nodrain =
            device.then(|| ping_pong(&mut b, size, Placement::Device, n, ("ping_x_nodrain", "echo_x_nodrain")));
        let errors: u32 = [dev, Some(host), rare, nodrain].iter().flatten().map(|r| r.3).sum();
        use crate::probe::Memory;
        if let Some((mean, ..)) = dev {
            let figure = format!("device channels, {mode}, {size} B, mean");
            crate::results::record("g2g", &figure, mean, "µs", raw_at(Memory::Device, size), None);
        }
        let figure = format!("host channels, {mode}, {size} B, mean");
        crate::results::record("g2g", &figure, host.0, "µs", raw_at(Memory::MappedHost, size), None);
        println!(
            "| {mode} | {size} | {} | {} | {} | {} | {errors} |",
            cell(dev),
            cell(Some(host)),
            cell(rare),
            cell(nodrain)
        );
    }
    b.shutdown();
}

/// `mesh-gpu-bench g2g-lean MODE` (docs/explanation/channels.md): on device channels, `ping` ↔
/// `echo_header` beside `ping_x_lean` ↔ `echo_x_lean` (tests/programs/x_lean.cuh: one-pair receive, loop-free
/// send) at capacity 4, 16, 64, 256 (the credit read crosses PCIe once per ~capacity messages), 8 to 1024 B.
/// Needs the variants' PTX: the bundle's `run` compiles every program first (`./run lean` does all of it).
pub fn gpu_round_trips_lean(mps: bool) {
    let mut b = Bench::open(mps);
    let mode = b.mode;
    if let Some(why) = if mps { mesh_mps::device_channels_refusal() } else { None } {
        println!("g2g-lean {mode}: device channels refused: {why}");
        b.shutdown();
        return;
    }
    println!();
    println!("GPU↔GPU round trip on device channels, {mode} mode, by capacity: baseline = ping ↔ echo_header,");
    println!("lean = ping_x_lean ↔ echo_x_lean; µs, mean [fastest, slowest] over 100,000 after 1,000 warm-up.");
    println!();
    println!("| mode | size | capacity | baseline | lean | lean / baseline | errors |");
    println!("|------|-----:|---------:|---------:|-----:|----------------:|-------:|");
    for size in [8u32, 64, 256, 1024] {
        for capacity in [4u32, 16, 64, 256] {
            let n = 100_000;
            let base = ping_pong_cap(&mut b, size, capacity, Placement::Device, n, ("ping", "echo_header"));
            let lean = ping_pong_cap(&mut b, size, capacity, Placement::Device, n, ("ping_x_lean", "echo_x_lean"));
            println!(
                "| {mode} | {size} | {capacity} | {:.2} [{:.2}, {:.1}] | {:.2} [{:.2}, {:.1}] | {:.2} | {} |",
                base.0,
                base.1,
                base.2,
                lean.0,
                lean.1,
                lean.2,
                lean.0 / base.0,
                base.3 + lean.3
            );
        }
    }
    b.shutdown();
}

#[cfg(test)]
mod tests {
    use super::parse_delay;

    #[test]
    fn client_delay_is_a_number_or_a_range() {
        assert_eq!(parse_delay("700"), Some((700, 700)));
        assert_eq!(parse_delay("0-1500"), Some((0, 1500)));
        assert_eq!(parse_delay("1500-0"), None, "a range must not run backwards");
        assert_eq!(parse_delay("fast"), None);
        assert_eq!(parse_delay("1-x"), None);
    }
}
