//! A million create and delete cycles of rings of every protocol on the ring arena's allocator: the arena returns to its starting figure, and how whole its free space stays is printed.

use mesh_shm::arena::{Arena, ArenaSpace, Refusal};
use mesh_shm::layout::{
    LINE, MAX_BULK_MSG_SIZE, MAX_MSG_SIZE, PLACEMENT_DEVICE, PLACEMENT_HOST, PROTOCOL_BULK, PROTOCOL_FANIN,
    PROTOCOL_GROUP, PROTOCOL_INDEX, PROTOCOL_LL, ring_bytes_at,
};

/// The default mailbox's arena (64 MiB less its header and tables, about 100 KiB), its channel
/// table's 256 descriptors, and the largest ring a cycle makes.
const ARENA: u64 = (64 << 20) - 25 * 4096;
const DESCRIPTORS: usize = 256;
const LARGEST_RING: u64 = 16 << 20;

/// splitmix64: a seeded, repeatable stream, so that a figure can be reproduced.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A power of two from `1 << lo` to `1 << hi`, its exponent uniform: sizes spread over decades.
    fn pow2(&mut self, lo: u32, hi: u32) -> u32 {
        1 << (lo + u32::try_from(self.below(u64::from(hi - lo + 1))).unwrap())
    }
}

/// A channel's shape: what its descriptor holds that sizes its ring.
#[derive(Debug, Clone, Copy)]
struct Shape {
    msg_size: u32,
    capacity: u32,
    placement: u32,
    protocol: u32,
    parts: u32,
}

impl Shape {
    fn bytes_at(self, at: u64) -> Option<u64> {
        ring_bytes_at(at, self.msg_size, self.capacity, self.placement, self.protocol, self.parts)
    }

    /// A random shape of one of the five formats (ll and bulk host or device; index, fan-in and
    /// group host), message sizes from 8 B to 16 MiB, whose ring takes at most [`LARGEST_RING`].
    fn random(rng: &mut Rng) -> Self {
        loop {
            let protocol = [PROTOCOL_LL, PROTOCOL_BULK, PROTOCOL_INDEX, PROTOCOL_FANIN, PROTOCOL_GROUP]
                [usize::try_from(rng.below(5)).unwrap()];
            let device = matches!(protocol, PROTOCOL_LL | PROTOCOL_BULK) && rng.below(4) == 0;
            let placement = if device { PLACEMENT_DEVICE } else { PLACEMENT_HOST };
            let (msg_size, parts) = match protocol {
                PROTOCOL_BULK => {
                    let parts = rng.pow2(0, 5);
                    (rng.pow2(4 + parts.trailing_zeros(), MAX_BULK_MSG_SIZE.trailing_zeros()), parts)
                }
                PROTOCOL_FANIN => (rng.pow2(3, MAX_MSG_SIZE.trailing_zeros()), rng.pow2(0, 6)),
                PROTOCOL_GROUP => (rng.pow2(3, 12), rng.pow2(0, 8)),
                _ => (rng.pow2(3, MAX_MSG_SIZE.trailing_zeros()), 1),
            };
            let shape = Self { msg_size, capacity: rng.pow2(0, 12), placement, protocol, parts };
            if shape.bytes_at(0).is_some_and(|b| b <= LARGEST_RING) {
                return shape;
            }
        }
    }
}

/// The live rings, kept sorted by offset (the allocator sorts otherwise; a mailbox reads them in
/// table order).
struct Live {
    arena: Arena,
    rings: Vec<(u64, u64)>,
}

impl Live {
    fn create(&mut self, shape: Shape) -> Result<(u64, u64), Refusal> {
        let ring = self.arena.place(&self.rings, |at| shape.bytes_at(at))?;
        let at = self.rings.partition_point(|r| r.0 < ring.0);
        self.rings.insert(at, ring);
        Ok(ring)
    }
    fn delete(&mut self, ring: (u64, u64)) {
        let at = self.rings.binary_search(&ring).expect("a live ring");
        self.rings.remove(at);
    }
    fn space(&self) -> ArenaSpace {
        self.arena.space(&self.rings)
    }
}

#[allow(clippy::cast_precision_loss, reason = "shares for people to read")]
fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 { 1.0 } else { part as f64 / whole as f64 }
}

/// What one run of cycles measured.
struct Figures {
    refused_full: u64,
    refused_fragmented: u64,
    samples: Vec<f64>,
    end: ArenaSpace,
}

/// `cycles` cycles over `base` long-lived channels: each cycle creates one transient channel (a
/// refusal, full or fragmented, is counted, and a transient is deleted instead), then deletes a
/// random transient while more are live than the cycle's target (a random walk between 4 and 96).
/// `settle_at`: the cycle at which `late` more long-lived channels are created among the
/// transients, wherever best fit puts them. Every transient is deleted at the end.
fn churn(seed: u64, cycles: u64, base: usize, late: usize, settle_at: u64) -> Figures {
    let mut rng = Rng(seed);
    let mut live = Live { arena: Arena::new(25 * 4096, ARENA, LINE), rings: Vec::new() };
    let mut long_lived = 0;
    let mut make_long_lived = |live: &mut Live, rng: &mut Rng, n: usize| {
        for _ in 0..n {
            let shape = loop {
                let s = Shape::random(rng);
                if s.bytes_at(0).is_some_and(|b| b <= 1 << 20) {
                    break s;
                }
            };
            live.create(shape).expect("room for a long-lived channel");
            long_lived += 1;
        }
    };
    make_long_lived(&mut live, &mut rng, base);
    let start = live.space();
    let mut transients: Vec<(u64, u64)> = Vec::new();
    let mut figures = Figures { refused_full: 0, refused_fragmented: 0, samples: Vec::new(), end: start };
    let mut target = 32u64;
    for cycle in 0..cycles {
        if cycle == settle_at {
            make_long_lived(&mut live, &mut rng, late);
        }
        if cycle % 10_000 == 0 {
            target = (target + rng.below(33)).saturating_sub(16).clamp(4, 96);
        }
        let shape = Shape::random(&mut rng);
        let refused = if live.rings.len() >= DESCRIPTORS {
            true
        } else {
            match live.create(shape) {
                Ok(ring) => {
                    transients.push(ring);
                    false
                }
                Err(Refusal::Full { .. }) => {
                    figures.refused_full += 1;
                    true
                }
                Err(Refusal::Fragmented { .. }) => {
                    figures.refused_fragmented += 1;
                    true
                }
            }
        };
        if (refused || transients.len() as u64 > target) && !transients.is_empty() {
            let k = usize::try_from(rng.below(transients.len() as u64)).unwrap();
            live.delete(transients.swap_remove(k));
        }
        if cycle % 1_000 == 999 {
            let s = live.space();
            figures.samples.push(share(s.largest_free, s.free));
        }
    }
    for ring in transients.drain(..) {
        live.delete(ring);
    }
    assert_eq!(live.rings.len(), long_lived, "every transient deleted, the long-lived ones kept");
    figures.end = live.space();
    if late == 0 {
        assert_eq!(figures.end, start, "the arena returns to its starting figure: nothing leaked");
    }
    assert_eq!(figures.end.in_use, live.rings.iter().map(|&(s, e)| e - s).sum::<u64>(), "in use is the live rings");
    figures
}

fn report(what: &str, f: &Figures) {
    let mut sorted = f.samples.clone();
    sorted.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "an index into the samples")]
        let i = ((sorted.len() - 1) as f64 * q) as usize;
        sorted[i] * 100.0
    };
    #[allow(clippy::cast_precision_loss, reason = "a mean for people to read")]
    let mean = sorted.iter().sum::<f64>() / sorted.len() as f64 * 100.0;
    println!(
        "{what}: after the cycles {:.2} MiB in use, {:.2} MiB free, largest free run {:.1}% of the free bytes; \
         during the cycles largest/free min {:.1}%, p10 {:.1}%, median {:.1}%, mean {mean:.1}%; refusals: {} full, {} fragmented",
        share(f.end.in_use, 1 << 20),
        share(f.end.free, 1 << 20),
        share(f.end.largest_free, f.end.free) * 100.0,
        pick(0.0),
        pick(0.1),
        pick(0.5),
        f.refused_full,
        f.refused_fragmented,
    );
}

/// The measurement: a million cycles of every format's rings, 8 B to 16 MiB. With the long-lived
/// channels made first, deleting the transients gives back one free run, as at the start; with
/// some made halfway through, among the transients, what is left whole is the figure printed.
/// `MESH_ARENA_CYCLES` and `MESH_ARENA_SEED` change the run (a million cycles, seed 0x5eed).
#[test]
fn a_million_cycles_return_the_arena_to_its_start() {
    let cycles = std::env::var("MESH_ARENA_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let seed = std::env::var("MESH_ARENA_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5eed);
    let first = churn(seed, cycles, 8, 0, 0);
    report("long-lived channels made first", &first);
    assert_eq!(first.end.largest_free, first.end.free, "one free run again: neighbours merged");
    let late = churn(seed ^ 1, cycles, 4, 4, cycles / 2);
    report("long-lived channels made halfway, among the transients", &late);
    assert!(late.end.largest_free <= late.end.free && late.end.free + late.end.in_use == ARENA);
}
