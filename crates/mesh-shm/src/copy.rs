//! Copies of large messages into and out of a bulk ring: wide or non-temporal stores, split over several threads where it pays.
//!
//! A plain copy is the C library's `memcpy` (through `copy_nonoverlapping`), which already uses the
//! widest vector stores the CPU has. A non-temporal copy streams 16-byte stores past the caches
//! (`movntdq`) and ends with `sfence`: it saves the read-for-ownership of every destination line, and
//! leaves the caches to the program, but a host consumer then reads the message from memory rather
//! than from the shared cache. Which pays, and how many threads, was measured on the development
//! machine (BENCHMARKS.md, "Bulk channels on the host"); the defaults follow it.

use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

/// How a bulk end copies messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyConfig {
    /// Threads that copy one message together, the caller's included (1: the caller alone).
    pub threads: usize,
    /// Smallest share of a message worth handing to another thread, in bytes.
    pub min_part: usize,
    /// Non-temporal stores into the ring (a producer's copy; a consumer's copy out of it always uses
    /// plain stores, since its destination is the program's own buffer).
    pub non_temporal: bool,
}

impl Default for CopyConfig {
    /// One thread, plain stores: the explicit setting of a caller that wants no helper threads. The
    /// ends' own default ([`crate::BulkProducer::claim`], [`crate::BulkConsumer::claim`]) is
    /// [`CopyConfig::for_msg_size`].
    fn default() -> Self {
        Self { threads: 1, min_part: 256 << 10, non_temporal: false }
    }
}

/// Below this message size one thread copies (a hand-off to a helper costs microseconds).
pub const SPLIT_FROM: usize = 256 << 10;
/// From this message size the copy is bound by DRAM, not by one core's stores.
pub const LARGE_FROM: usize = 4 << 20;

impl CopyConfig {
    /// How the host ends copy messages of `msg_size` bytes by default (what `claim` uses), chosen
    /// from the H200 machine's host↔GPU figures (BENCHMARKS.md, "Bulk channels, host ends by size"):
    ///
    /// * below [`SPLIT_FROM`] (64 KiB messages): one thread, streaming stores: host→GPU 64 KiB
    ///   12.9-13.1 GB/s streaming against 8.7-9.1 plain; a helper's hand-off is not worth it;
    /// * [`SPLIT_FROM`] to [`LARGE_FROM`] (1 MiB): two threads, plain stores: 31.1-32.4 GB/s host→GPU
    ///   against 14.2-15.0 with one thread, 28.7-30.2 with two streaming, 28.1-33.0 with four;
    ///   GPU→host copy-out 20.9-29.2 against 14.9-15.1;
    /// * from [`LARGE_FROM`] (16 MiB): eight threads, plain stores: the source and the ring no
    ///   longer fit in the caches, so the copy is bound by how many misses the cores keep in flight.
    ///   H200 machine (`mesh-gpu-bench bulk blink`, 16 MiB, capacity 4): host→GPU 44.5
    ///   GB/s with eight threads plain against 36.2 streaming, 35.7 / 37.2 with four plain /
    ///   streaming, 24.9 / 30.9 with two; GPU→host copy-out 41.6 against 34.3 with four. Streaming
    ///   stores stop paying once eight cores keep misses in flight.
    ///
    /// Threads never exceed the CPUs this process may run on. A consumer's copy-out always uses
    /// plain stores (its destination is the caller's buffer), with the same threads. This is a
    /// consumer's default ([`crate::BulkConsumer::claim`]); a producer's is
    /// [`CopyConfig::for_producer`], which differs from 256 KiB to 4 MiB.
    pub fn for_msg_size(msg_size: usize) -> Self {
        Self::for_msg_size_on(msg_size, available_cpus())
    }

    /// A producer's default ([`crate::BulkProducer::claim`]): [`CopyConfig::for_msg_size`], except
    /// from [`SPLIT_FROM`] to [`LARGE_FROM`] (1 MiB messages): four threads, streaming stores. On the
    /// H200 machine, four runs of `mesh-gpu-bench bulk blink` gave host→GPU at
    /// 1 MiB 30.0-33.2 GB/s with four streaming threads, the one setting above half of
    /// `cuMemcpyAsync` (45.2-46.4) in every run, against 20.1-38.6 with two plain (the former
    /// default), 25.1-31.4 two streaming, 14.6-36.5 four plain. Since the helpers spin between
    /// messages (two runs) four streaming gave 33.5 / 32.5, two plain 41.3 / 30.3, four
    /// plain 36.2 / 36.9: no setting wins both, and four streaming is the steadiest. A consumer's
    /// copy-out is best with two (40.9 / 30.3 against 25.8 / 26.1 with four), so the ends
    /// differ.
    pub fn for_producer(msg_size: usize) -> Self {
        Self::for_producer_on(msg_size, available_cpus())
    }

    /// [`CopyConfig::for_producer`] on a machine of `cpus` CPUs.
    pub fn for_producer_on(msg_size: usize, cpus: usize) -> Self {
        if (SPLIT_FROM..LARGE_FROM).contains(&msg_size) {
            // Four shares of a 1 MiB message; fewer for a shorter one (a share is at least 128 KiB).
            Self { threads: 4.min(cpus.max(1)), min_part: 128 << 10, non_temporal: true }
        } else {
            Self::for_msg_size_on(msg_size, cpus)
        }
    }

    /// [`CopyConfig::for_msg_size`] on a machine of `cpus` CPUs.
    pub fn for_msg_size_on(msg_size: usize, cpus: usize) -> Self {
        let (threads, min_part, non_temporal) = if msg_size < SPLIT_FROM {
            (1, SPLIT_FROM, true)
        } else if msg_size < LARGE_FROM {
            // Two shares of a 1 MiB message, one share of anything below 2 × 128 KiB.
            (2, 128 << 10, false)
        } else {
            (8, 1 << 20, false)
        };
        Self { threads: threads.min(cpus.max(1)), min_part, non_temporal }
    }
}

/// CPUs this process may run on (1 when the system cannot say), read once.
fn available_cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get))
}

/// One share of a copy, handed to a helper thread as addresses.
struct Job {
    dst: usize,
    src: usize,
    len: usize,
    non_temporal: bool,
}

/// The helper threads of a [`Copier`] with more than one thread.
struct Pool {
    jobs: Option<Sender<Job>>,
    done: Receiver<()>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    fn start(helpers: usize) -> std::io::Result<Self> {
        let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Job>();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let mut workers = Vec::with_capacity(helpers);
        for i in 0..helpers {
            let (jobs, done) = (jobs_rx.clone(), done_tx.clone());
            let worker = std::thread::Builder::new().name(format!("mesh-copy-{i}")).spawn(move || {
                while let Some(job) = next_within(&jobs, HELPER_SPIN) {
                    // SAFETY: `Copier::copy`'s caller promised both ranges for the duration of its call,
                    // which waits for this job's `done` before returning.
                    unsafe { copy_part(job.dst as *mut u8, job.src as *const u8, job.len, job.non_temporal) };
                    // The send orders this thread's stores (and, after the sfence of a non-temporal
                    // copy, its streamed ones) before the caller's receive.
                    if done.send(()).is_err() {
                        return;
                    }
                }
            })?;
            workers.push(worker);
        }
        Ok(Self { jobs: Some(jobs_tx), done: done_rx, workers })
    }
}

/// How long a helper spins for its next share before it sleeps on the channel. A stream of 1 MiB
/// messages hands a helper a share every 20-60 µs; waking a sleeping thread costs 5-50 µs (a futex
/// wake, then the scheduler), which is what two threads lost against one at 1 MiB GPU→host.
const HELPER_SPIN: std::time::Duration = std::time::Duration::from_micros(200);
/// How long the caller spins for its helpers' shares to be done before it sleeps.
const DONE_SPIN: std::time::Duration = std::time::Duration::from_millis(1);

/// The next item of `rx`, spinning for up to `spin` before a blocking receive; `None` once every
/// sender is gone.
fn next_within<T>(rx: &Receiver<T>, spin: std::time::Duration) -> Option<T> {
    let start = std::time::Instant::now();
    loop {
        match rx.try_recv() {
            Ok(item) => return Some(item),
            Err(crossbeam_channel::TryRecvError::Disconnected) => return None,
            Err(crossbeam_channel::TryRecvError::Empty) if start.elapsed() < spin => std::hint::spin_loop(),
            Err(crossbeam_channel::TryRecvError::Empty) => return rx.recv().ok(),
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("helpers", &self.workers.len()).finish()
    }
}

/// Copies messages with the configured stores and threads.
#[derive(Debug)]
pub struct Copier {
    config: CopyConfig,
    pool: Option<Pool>,
}

impl Copier {
    /// Starts `config.threads - 1` helper threads (none for 1). A thread the system refuses is an error.
    pub fn new(config: CopyConfig) -> std::io::Result<Self> {
        let config = CopyConfig { threads: config.threads.max(1), min_part: config.min_part.max(4096), ..config };
        let pool = if config.threads > 1 { Some(Pool::start(config.threads - 1)?) } else { None };
        Ok(Self { config, pool })
    }

    /// The configuration in force.
    pub fn config(&self) -> CopyConfig {
        self.config
    }

    /// Copies `len` bytes from `src` to `dst`, streaming the stores when `non_temporal` (and the
    /// configuration allows it), in up to `threads` shares of at least `min_part` bytes. Every store
    /// is visible to a later Release store of the calling thread when this returns.
    ///
    /// # Safety
    /// `src` must be valid for `len` reads and `dst` for `len` writes, the two ranges disjoint, and
    /// nothing else may write either range (or read `dst`) until this returns.
    pub unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, len: usize, non_temporal: bool) {
        let nt = non_temporal && self.config.non_temporal;
        let parts = (len / self.config.min_part).clamp(1, self.config.threads);
        let Some(pool) = self.pool.as_ref().filter(|_| parts > 1) else {
            // SAFETY: the caller's contract.
            unsafe { copy_part(dst, src, len, nt) };
            return;
        };
        // Shares on 64-byte boundaries, so that no cache line has two writers.
        let share = len.div_ceil(parts).div_ceil(64) * 64;
        let jobs = pool.jobs.as_ref().expect("open while the pool lives");
        let mut sent = 0;
        let mut at = share;
        while at < len {
            let n = share.min(len - at);
            // The addresses stay valid until the waits below: the caller's contract.
            let job = Job { dst: dst as usize + at, src: src as usize + at, len: n, non_temporal: nt };
            if jobs.send(job).is_err() {
                // No helper left (cannot happen while the pool lives): copy the rest here.
                // SAFETY: inside the caller's ranges.
                unsafe { copy_part(dst.add(at), src.add(at), len - at, nt) };
                break;
            }
            sent += 1;
            at += n;
        }
        // SAFETY: the first share, inside the caller's ranges; the helpers' shares are disjoint from it.
        unsafe { copy_part(dst, src, share.min(len), nt) };
        for _ in 0..sent {
            // Each helper sends once per job; the pool holds the receiver, so this cannot fail while
            // any helper lives, and helpers live as long as the pool. The shares are equal, so the
            // helpers finish about when this thread does: spin for them rather than sleep.
            let _ = next_within(&pool.done, DONE_SPIN);
        }
    }
}

/// One thread's copy.
///
/// # Safety
/// As [`Copier::copy`].
unsafe fn copy_part(dst: *mut u8, src: *const u8, len: usize, non_temporal: bool) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if non_temporal {
        // SAFETY: the caller's contract.
        unsafe { copy_streaming(dst, src, len) };
        return;
    }
    let _ = non_temporal;
    // SAFETY: the caller's contract.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, len) };
}

/// A copy whose stores bypass the caches (`movntdq`, 4 × 16 bytes an iteration), then `sfence`.
///
/// # Safety
/// As [`Copier::copy`].
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let head = dst.align_offset(16).min(len);
    // SAFETY: the caller's ranges; `head <= len`.
    unsafe { core::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    // SAFETY: every access below lies inside the caller's ranges (`i + 64 <= len`, `i + 16 <= len`);
    // `dst + i` is 16-byte aligned after the head, as `_mm_stream_si128` needs; SSE2 is part of x86-64.
    unsafe {
        while i + 64 <= len {
            let s = src.add(i).cast::<__m128i>();
            let (a, b, c, d) =
                (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)), _mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
            let o = dst.add(i).cast::<__m128i>();
            _mm_stream_si128(o, a);
            _mm_stream_si128(o.add(1), b);
            _mm_stream_si128(o.add(2), c);
            _mm_stream_si128(o.add(3), d);
            i += 64;
        }
        while i + 16 <= len {
            _mm_stream_si128(dst.add(i).cast(), _mm_loadu_si128(src.add(i).cast()));
            i += 16;
        }
        core::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
        // Streamed stores are weakly ordered: fence them before the flag's Release store.
        _mm_sfence();
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation, reason = "test patterns keep the low byte on purpose")]
mod tests {
    use super::*;

    fn pattern(len: usize, salt: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(salt)).collect()
    }

    #[test]
    fn every_mode_copies_every_byte() {
        // Lengths and offsets that leave unaligned heads and tails, and shares of uneven sizes.
        for threads in [1, 3] {
            for non_temporal in [false, true] {
                let config = CopyConfig { threads, min_part: 4096, non_temporal };
                let mut copier = Copier::new(config).unwrap();
                for (len, offset) in [(0, 0), (15, 1), (64, 0), (4096 * 3 + 17, 3), (100_000, 8), (1 << 20, 0)] {
                    let src = pattern(len + offset, len as u8);
                    let mut dst = vec![0xeeu8; len + 2 * 64];
                    // SAFETY: both ranges lie in their vectors and are disjoint.
                    unsafe { copier.copy(dst.as_mut_ptr().add(offset + 32), src.as_ptr().add(offset), len, true) };
                    assert_eq!(
                        &dst[offset + 32..offset + 32 + len],
                        &src[offset..],
                        "{threads} threads, nt {non_temporal}, {len} B"
                    );
                    assert!(dst[..offset + 32].iter().all(|&b| b == 0xee), "nothing written before the range");
                    assert!(dst[offset + 32 + len..].iter().all(|&b| b == 0xee), "nothing written past the range");
                }
            }
        }
    }

    #[test]
    fn the_default_by_size_follows_the_measured_table() {
        let at = |size, cpus| {
            let c = CopyConfig::for_msg_size_on(size, cpus);
            (c.threads, c.non_temporal)
        };
        // 64 KiB: one thread, streaming; 1 MiB: two threads, plain; 16 MiB: eight threads, plain.
        assert_eq!(at(64 << 10, 16), (1, true));
        assert_eq!(at(SPLIT_FROM - 16, 16), (1, true));
        assert_eq!(at(SPLIT_FROM, 16), (2, false));
        assert_eq!(at(1 << 20, 16), (2, false));
        assert_eq!(at(LARGE_FROM - 16, 16), (2, false));
        assert_eq!(at(LARGE_FROM, 16), (8, false));
        assert_eq!(at(16 << 20, 16), (8, false));
        // Never more threads than CPUs, and at least one.
        assert_eq!(at(1 << 20, 2), (2, false));
        assert_eq!(at(16 << 20, 2), (2, false));
        assert_eq!(at(16 << 20, 1), (1, false));
        assert_eq!(at(16 << 20, 0), (1, false));
        let auto = CopyConfig::for_msg_size(1 << 20);
        assert!((1..=2).contains(&auto.threads) && !auto.non_temporal);
    }

    #[test]
    fn a_producer_copies_1_mib_messages_with_four_streaming_threads_and_otherwise_as_a_consumer() {
        let at = |size, cpus| {
            let c = CopyConfig::for_producer_on(size, cpus);
            (c.threads, c.non_temporal)
        };
        assert_eq!(at(64 << 10, 16), (1, true));
        assert_eq!(at(SPLIT_FROM - 16, 16), (1, true));
        assert_eq!(at(SPLIT_FROM, 16), (4, true));
        assert_eq!(at(1 << 20, 16), (4, true));
        assert_eq!(at(LARGE_FROM - 16, 16), (4, true));
        assert_eq!(at(LARGE_FROM, 16), (8, false));
        assert_eq!(at(1 << 20, 2), (2, true));
        assert_eq!(at(1 << 20, 0), (1, true));
        for size in [64 << 10, 16 << 20] {
            assert_eq!(CopyConfig::for_producer_on(size, 16), CopyConfig::for_msg_size_on(size, 16));
        }
        // Four shares of a 1 MiB message, two of a 300 KiB one.
        let c = CopyConfig::for_producer_on(1 << 20, 16);
        assert_eq!(((1usize << 20) / c.min_part).clamp(1, c.threads), 4);
        assert_eq!(((300usize << 10) / c.min_part).clamp(1, c.threads), 2);
    }

    #[test]
    fn a_1_mib_message_is_split_in_two_and_a_small_one_is_not() {
        // The shares the copy makes: len / min_part, clamped to the threads.
        let parts = |size: usize, len: usize| {
            let c = CopyConfig::for_msg_size_on(size, 16);
            (len / c.min_part.max(4096)).clamp(1, c.threads)
        };
        assert_eq!(parts(1 << 20, 1 << 20), 2);
        assert_eq!(parts(1 << 20, 200 << 10), 1, "a short message in a 1 MiB channel: one share");
        assert_eq!(parts(16 << 20, 16 << 20), 8);
        assert_eq!(parts(16 << 20, 2 << 20), 2);
        assert_eq!(parts(64 << 10, 64 << 10), 1);
    }

    #[test]
    fn every_default_by_size_copies_every_byte() {
        for (size, config) in [64 << 10, 1 << 20, 5 << 20]
            .into_iter()
            .flat_map(|s| [(s, CopyConfig::for_msg_size_on(s, 4)), (s, CopyConfig::for_producer_on(s, 4))])
        {
            let mut copier = Copier::new(config).unwrap();
            let src = pattern(size, 7);
            let mut dst = vec![0u8; size];
            // SAFETY: both ranges lie in their vectors and are disjoint.
            unsafe { copier.copy(dst.as_mut_ptr(), src.as_ptr(), size, true) };
            assert!(dst == src, "{size} B");
        }
    }

    #[test]
    fn a_zero_thread_config_means_the_caller_alone() {
        let copier = Copier::new(CopyConfig { threads: 0, ..CopyConfig::default() }).unwrap();
        assert_eq!(copier.config().threads, 1);
    }
}
