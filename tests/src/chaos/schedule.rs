//! The chaos schedule's seed and its generator: a seed printed by a failed run replays the same schedule.

use std::time::Duration;

/// A generator whose sequence is fixed by its seed for good (splitmix64, Steele et al. 2014): a seed
/// printed by a failed run replays the same schedule in any later build.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// One of `from`, if any.
    pub fn pick<'a, T>(&mut self, from: &'a [T]) -> Option<&'a T> {
        let n = u64::try_from(from.len()).ok()?;
        (n > 0).then(|| &from[usize::try_from(self.below(n)).unwrap_or(0)])
    }
}

/// `MESH_CHAOS_SEED` (decimal or 0x-hex), else a fresh one from the clock and the pid.
pub fn seed() -> u64 {
    match std::env::var("MESH_CHAOS_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("MESH_CHAOS_SEED={s}: not a number ({e})"))
        }
        Err(_) => {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            Rng(u64::from(t.subsec_nanos()) ^ t.as_secs() ^ (u64::from(std::process::id()) << 32)).next_u64()
        }
    }
}

/// The MPS run's `--orphan-grace-ms`: `MESH_CHAOS_ORPHAN_GRACE_MS`, else meshd's default
/// ([`mesh_mps::DEFAULT_ORPHAN_GRACE`]). Above 0, a `kill -9` of meshd leaves the programs running
/// and the restart adopts them; 0 relaunches them.
pub fn orphan_grace_ms() -> u64 {
    std::env::var("MESH_CHAOS_ORPHAN_GRACE_MS").ok().map_or(
        u64::try_from(mesh_mps::DEFAULT_ORPHAN_GRACE.as_millis()).unwrap_or(u64::MAX),
        |s| {
            s.trim()
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("MESH_CHAOS_ORPHAN_GRACE_MS={s}: not a whole number of ms ({e})"))
        },
    )
}

/// How long each mode runs: `MESH_CHAOS_SECS`, default 240 (4 minutes).
pub fn duration() -> Duration {
    let secs = std::env::var("MESH_CHAOS_SECS").ok().map(|s| {
        s.trim().parse::<u64>().unwrap_or_else(|e| panic!("MESH_CHAOS_SECS={s}: not a whole number of seconds ({e})"))
    });
    Duration::from_secs(secs.unwrap_or(240))
}
