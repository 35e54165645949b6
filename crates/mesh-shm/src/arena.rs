//! The ring arena's allocator: free space is the arena less the rings of the live descriptors, and a new ring takes the best-fitting free run.
//!
//! The descriptor table is the only record of what the arena holds: a ring's bytes are in use
//! exactly while a published descriptor (state 1) names them, each descriptor recording its ring's
//! offset and, through its message size, capacity, placement, protocol and parts word, its size
//! (`layout::ring_bytes_at`; a device ring takes its header alone, a fan-in channel all its shards, a
//! group its table and every reply ring). So this module keeps no state of its own in the file: at
//! every creation, under the table lock, the mailbox lists the live rings, and [`Arena::place`]
//! computes the free runs between them (sorting a few hundred ranges is cheap) and picks one.
//! Nothing is written until a descriptor is published, and publishing is the last store of a
//! creation, so a creator killed at any step leaves nothing to repair: a ring is in use if and only
//! if its descriptor is published, and a half-written unpublished one owns nothing. Freeing a ring
//! is unpublishing its descriptor, and neighbouring free runs merge by construction, since the runs
//! are the gaps between live rings.
//!
//! The header's `arena_used` word is the high-water mark: the mailbox keeps it at or past the end
//! of every live ring, so that a reader that still treats it as a bump cursor never places a ring
//! over a live one.
//!
//! Placement is best fit: the smallest free run the ring fits in, the lowest offset on ties, the
//! ring at the run's start (rounded up to the alignment, a line). While nothing is ever freed there
//! is one free run, the arena's tail, so every ring goes where a bump allocator would have put it.
//! Best fit keeps the large runs whole for large rings; a ring's size depends a little on where it
//! starts (a host ring's slots begin on the next page after its header), so the request is a
//! function from a start offset to the bytes the ring takes there.

/// A ring arena: `size` bytes from file offset `start`, every ring starting on a multiple of `align`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arena {
    start: u64,
    end: u64,
    align: u64,
}

/// Where the arena's bytes are: in use by live rings, free, and the longest free run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaSpace {
    /// Bytes of the arena taken by live rings (and by the padding up to the next aligned start).
    pub in_use: u64,
    /// Bytes of the arena no live ring takes: the arena's size less `in_use`.
    pub free: u64,
    /// Bytes of the longest free run: the largest ring that could be created now takes at most this.
    pub largest_free: u64,
}

/// What a mailbox's channel table and ring arena hold ([`crate::Mailbox::arena_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaUsage {
    /// Bytes of the ring arena taken by the rings of live channels (every protocol and placement).
    pub in_use: u64,
    /// Bytes of the ring arena that no live channel's ring takes.
    pub free: u64,
    /// Bytes of the longest free run of the arena: a ring of more cannot be created now, however
    /// much is free in all.
    pub largest_free: u64,
    /// Channel descriptors published (live channels, service channels included).
    pub descriptors_in_use: u32,
    /// Channel descriptors in the table, live or free.
    pub descriptors_total: u32,
}

/// Why a ring could not be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Fewer bytes are free in all than the ring needs.
    Full {
        /// Bytes the ring needs (at the start of the longest free run, or of the arena if none).
        asked: u64,
        /// Bytes free in all.
        free: u64,
    },
    /// Enough bytes are free in all, but no free run is long enough: the space is fragmented.
    Fragmented {
        /// Bytes the ring needs at the start of the longest free run.
        asked: u64,
        /// Bytes free in all.
        free: u64,
        /// Bytes of the longest free run.
        largest: u64,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Refusal::Full { asked, free } => {
                write!(f, "full: its ring needs {}, {} of the arena are free", bytes(asked), bytes(free))
            }
            Refusal::Fragmented { asked, free, largest } => write!(
                f,
                "fragmented: {} free in all, largest free run {}, asked {}",
                bytes(free),
                bytes(largest),
                bytes(asked)
            ),
        }
    }
}

/// A byte count as people read it: exact bytes below 1 KiB, else KiB, MiB or GiB to two decimals
/// where they are not whole (the exact count follows in brackets).
fn bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if n >= size {
            return if n.is_multiple_of(size) {
                format!("{} {unit}", n / size)
            } else {
                #[allow(clippy::cast_precision_loss, reason = "a figure for people, two decimals")]
                let v = n as f64 / size as f64;
                format!("{v:.2} {unit} ({n} bytes)")
            };
        }
    }
    format!("{n} bytes")
}

impl Arena {
    /// The arena of `size` bytes from offset `start`, rings starting on multiples of `align` (a
    /// power of two; 0 reads as 1). A size that would overflow the offsets is cut at `u64::MAX`.
    pub fn new(start: u64, size: u64, align: u64) -> Self {
        let align = if align.is_power_of_two() { align } else { align.max(1).next_power_of_two() };
        Self { start, end: start.saturating_add(size), align }
    }

    /// The arena's size in bytes.
    pub fn size(&self) -> u64 {
        self.end - self.start
    }

    /// The free runs between the `live` ranges (`(start, end)` offsets, in any order), lowest
    /// first, each `(start, end)` with its start rounded up to the alignment. Ranges may overlap or
    /// reach outside the arena (a damaged table): what any of them covers is in use, and the arena's
    /// bounds clip them.
    pub fn free_runs(&self, live: &[(u64, u64)]) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = live.iter().copied().filter(|&(s, e)| s < e).collect();
        if !ranges.is_sorted() {
            ranges.sort_unstable();
        }
        let mut runs = Vec::with_capacity(ranges.len() + 1);
        let mut cursor = self.start;
        for (s, e) in ranges.into_iter().chain(std::iter::once((self.end, self.end))) {
            let gap_end = s.min(self.end);
            let from = self.align_up(cursor);
            if from < gap_end {
                runs.push((from, gap_end));
            }
            cursor = cursor.max(e);
            if cursor >= self.end {
                break;
            }
        }
        runs
    }

    /// Bytes in use, free, and in the longest free run, with `live` rings as in [`Arena::free_runs`].
    pub fn space(&self, live: &[(u64, u64)]) -> ArenaSpace {
        space_of(self.size(), &self.free_runs(live))
    }

    /// Places a ring among the `live` ones: `need(start)` is the bytes it takes when it starts at
    /// `start` (`None`: it cannot start there). Returns its range, at the start of the smallest free
    /// run it fits in (the lowest such run on ties), or why none fits.
    pub fn place(&self, live: &[(u64, u64)], need: impl Fn(u64) -> Option<u64>) -> Result<(u64, u64), Refusal> {
        let runs = self.free_runs(live);
        let mut best: Option<(u64, u64, u64)> = None;
        for &(s, e) in &runs {
            let Some(end) = need(s).and_then(|n| s.checked_add(n)) else { continue };
            if end <= e && best.is_none_or(|(_, _, len)| e - s < len) {
                best = Some((s, end, e - s));
            }
        }
        if let Some((s, end, _)) = best {
            return Ok((s, end));
        }
        let space = space_of(self.size(), &runs);
        let longest = runs.iter().copied().max_by_key(|&(s, e)| (e - s, std::cmp::Reverse(s)));
        let at = longest.map_or(self.align_up(self.start), |(s, _)| s);
        let asked = need(at).unwrap_or(u64::MAX);
        Err(if asked > space.free {
            Refusal::Full { asked, free: space.free }
        } else {
            Refusal::Fragmented { asked, free: space.free, largest: space.largest_free }
        })
    }

    fn align_up(&self, at: u64) -> u64 {
        at.checked_next_multiple_of(self.align).unwrap_or(u64::MAX)
    }
}

fn space_of(size: u64, runs: &[(u64, u64)]) -> ArenaSpace {
    let free: u64 = runs.iter().map(|&(s, e)| e - s).sum();
    let largest_free = runs.iter().map(|&(s, e)| e - s).max().unwrap_or(0);
    ArenaSpace { in_use: size - free, free, largest_free }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{LINE, ring_bytes_at};
    use proptest::prelude::*;

    #[test]
    fn runs_merge_neighbours_and_clip_damaged_ranges() {
        let a = Arena::new(4096, 4096, 128);
        assert_eq!(a.free_runs(&[]), vec![(4096, 8192)]);
        // Two freed neighbours between live rings are one run: the runs are the gaps.
        assert_eq!(a.free_runs(&[(4096, 4224), (4608, 8192)]), vec![(4224, 4608)]);
        // Overlapping and out-of-arena ranges (a damaged table) cover what they cover, no more.
        assert_eq!(a.free_runs(&[(0, 4352), (4224, 4480), (8000, 1 << 40)]), vec![(4480, 8000)]);
        // An unaligned end leaves the run starting at the next line.
        assert_eq!(a.free_runs(&[(4096, 4100)]), vec![(4224, 8192)]);
        assert_eq!(a.space(&[(4096, 4100)]), ArenaSpace { in_use: 128, free: 3968, largest_free: 3968 });
    }

    #[test]
    fn best_fit_takes_the_smallest_run_lowest_first() {
        let a = Arena::new(0, 10 * 128, 128);
        // Runs: [128, 384) of 2 lines, [512, 640) of 1, [768, 1024) of 2, [1152, 1280) of 1.
        let live = [(0, 128), (384, 512), (640, 768), (1024, 1152)];
        assert_eq!(a.place(&live, |_| Some(128)), Ok((512, 640)));
        assert_eq!(a.place(&live, |_| Some(256)), Ok((128, 384)));
        assert_eq!(a.place(&live, |_| Some(384)), Err(Refusal::Fragmented { asked: 384, free: 768, largest: 256 }));
        assert_eq!(a.place(&live, |_| Some(1024)), Err(Refusal::Full { asked: 1024, free: 768 }));
        let text = Refusal::Fragmented { asked: 4 << 20, free: 12 << 20, largest: 3 << 20 }.to_string();
        assert_eq!(text, "fragmented: 12 MiB free in all, largest free run 3 MiB, asked 4 MiB");
        assert!(Refusal::Full { asked: 1500, free: 100 }.to_string().contains("1.46 KiB (1500 bytes)"));
    }

    #[test]
    fn a_size_that_depends_on_the_start_is_asked_at_each_run() {
        // A host ring's slots start on the page after its header: it takes less where its header
        // ends on a page boundary. The run at 3712 (one line short of a page, less the header) fits.
        let a = Arena::new(0, 16384, LINE);
        let need = |at| ring_bytes_at(at, 8, 256, 0, 0, 1);
        let live = [(0, 3712), (3712 + 4480, 16384)];
        assert_eq!(need(3712), Some(384 + 4096));
        assert_eq!(a.place(&live, need), Ok((3712, 3712 + 4480)));
    }

    /// One random request: a ring of some protocol, placement and parts, sized as the mailbox sizes it.
    #[derive(Debug, Clone, Copy)]
    enum Op {
        Create { protocol: u32, placement: u32, msg_units: u32, cap_log: u32, parts: u32 },
        Delete(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u32..5, 0u32..2, 1u32..9, 0u32..5, 0u32..3).prop_map(|(protocol, dev, msg_units, cap_log, p)| {
                // Device placement only for the GPU's own protocols, as `check_placement` says.
                let placement = u32::from(dev == 1 && protocol <= 1);
                Op::Create { protocol, placement, msg_units, cap_log, parts: 1 << p }
            }),
            2 => any::<usize>().prop_map(Op::Delete),
        ]
    }

    /// The ring a request makes at `at`: every protocol's formula, with sizes valid for it.
    fn ring_need(op: Op, at: u64) -> Option<u64> {
        let Op::Create { protocol, placement, msg_units, cap_log, parts } = op else { return None };
        let msg = 16 * parts * msg_units;
        ring_bytes_at(at, msg, 1 << cap_log, placement, protocol, parts)
    }

    /// Walks the random operations against a byte map of the arena (one flag per line): every ring
    /// placed inside the arena, aligned, over free lines only and of the size asked; the run chosen
    /// is the best fit the map shows; a refusal only when no run of the map fits, with the map's
    /// figures; the figures of [`Arena::space`] those of the map at every step; and once every ring
    /// is freed the whole arena is one free run again.
    fn run_model(lines: u64, ops: &[Op]) -> Result<(), TestCaseError> {
        let start = 8 * 4096;
        let a = Arena::new(start, lines * LINE, LINE);
        let mut map = vec![false; usize::try_from(lines).unwrap()];
        let mut live: Vec<(u64, u64)> = Vec::new();
        let line_of = |at: u64| usize::try_from((at - start) / LINE).unwrap();
        for &op in ops {
            if let Op::Delete(k) = op {
                if !live.is_empty() {
                    let (s, e) = live.swap_remove(k % live.len());
                    map[line_of(s)..line_of(e)].iter_mut().for_each(|b| *b = false);
                }
            } else {
                // The map's free runs, by a plain walk of the flags.
                let mut runs = Vec::new();
                let mut i = 0;
                while i < map.len() {
                    if map[i] {
                        i += 1;
                        continue;
                    }
                    let j = (i..map.len()).find(|&j| map[j]).unwrap_or(map.len());
                    runs.push((start + i as u64 * LINE, start + j as u64 * LINE));
                    i = j;
                }
                prop_assert_eq!(&a.free_runs(&live), &runs);
                let fits = |&(s, e): &(u64, u64)| ring_need(op, s).is_some_and(|n| s + n <= e);
                let expected = runs.iter().filter(|r| fits(r)).min_by_key(|&&(s, e)| (e - s, s));
                match (a.place(&live, |at| ring_need(op, at)), expected) {
                    (Ok((s, e)), Some(&(rs, _))) => {
                        prop_assert_eq!(s, rs, "best fit, lowest on ties");
                        prop_assert_eq!(Some(e - s), ring_need(op, s));
                        prop_assert!(s % LINE == 0 && s >= start && e <= start + lines * LINE);
                        let lines = &mut map[line_of(s)..line_of(e.next_multiple_of(LINE))];
                        prop_assert!(lines.iter().all(|b| !b), "{:?} overlaps a live ring", (s, e));
                        lines.iter_mut().for_each(|b| *b = true);
                        live.push((s, e));
                    }
                    (Err(refusal), None) => {
                        let free = runs.iter().map(|&(s, e)| e - s).sum::<u64>();
                        let largest = runs.iter().map(|&(s, e)| e - s).max().unwrap_or(0);
                        match refusal {
                            Refusal::Full { free: f, asked } => prop_assert!(f == free && asked > free),
                            Refusal::Fragmented { free: f, largest: l, asked } => {
                                prop_assert!(f == free && l == largest && asked > largest && asked <= free);
                            }
                        }
                    }
                    (got, want) => prop_assert!(false, "placed {:?}, the map says {:?}", got, want),
                }
            }
            let free_lines = map.iter().filter(|b| !**b).count() as u64;
            let space = a.space(&live);
            prop_assert_eq!(space.free, free_lines * LINE, "every free byte is in a run");
            prop_assert_eq!(space.in_use + space.free, lines * LINE);
        }
        live.clear();
        prop_assert_eq!(a.free_runs(&live), vec![(start, start + lines * LINE)], "nothing leaks");
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 256 },
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Random create and delete sequences of every protocol against the byte map.
        #[test]
        fn random_creates_and_deletes_match_a_byte_map(
            pages in if cfg!(miri) { 8u64..24 } else { 8u64..400 },
            ops in proptest::collection::vec(op(), 1..if cfg!(miri) { 30 } else { 300 }),
        ) {
            run_model(pages * 4096 / LINE, &ops)?;
        }
    }
}
