//! The stress messages of `programs/stress.cuh`, computed on the host: what a GPU sink checks and a GPU source sends.
//!
//! Message `seq` of `W = size / 4` little-endian words: `w[0]` = low half of `seq`,
//! `w[1..W-1]` = [`word`]`(seq, k)`, `w[W-1]` = a position-dependent checksum of every other word
//! and of the high half of `seq`. A lost, repeated, reordered or torn message fails [`check`].

/// Word `k` (`0 < k < W-1`) of message `seq`.
pub fn word(seq: u64, k: u32) -> u32 {
    ((seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32) ^ k.wrapping_mul(0x85EB_CA77)
}

fn term(w: u32, k: u32) -> u32 {
    w.wrapping_add(0x7F4A_7C15u32.wrapping_mul(k)).wrapping_mul(k.wrapping_mul(2).wrapping_add(1))
}

fn finish(sum: u32, seq: u64) -> u32 {
    sum ^ ((seq >> 32) as u32).wrapping_mul(0x85EB_CA6B) ^ 0xC2B2_AE35
}

/// Writes message `seq` into `buf` (its length is the message size, a multiple of 8).
#[allow(
    clippy::cast_possible_truncation,
    reason = "word 0 is the low half of seq, as the GPU writes it; k < a message's words, far below 2^32"
)]
pub fn fill(buf: &mut [u8], seq: u64) {
    let words = buf.len() / 4;
    let mut sum = 0u32;
    for k in 0..words - 1 {
        let w = if k == 0 { seq as u32 } else { word(seq, k as u32) };
        sum = sum.wrapping_add(term(w, k as u32));
        buf[4 * k..4 * k + 4].copy_from_slice(&w.to_le_bytes());
    }
    buf[4 * (words - 1)..].copy_from_slice(&finish(sum, seq).to_le_bytes());
}

/// Whether `buf` is exactly message `seq`; `Err` says which word differs.
pub fn check(buf: &[u8], seq: u64) -> Result<(), String> {
    let mut want = vec![0u8; buf.len()];
    fill(&mut want, seq);
    match buf.chunks(4).zip(want.chunks(4)).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(k) => Err(format!(
            "message {seq} ({} bytes): word {k} is {:#010x}, expected {:#010x} (word 0 says message {})",
            buf.len(),
            u32::from_le_bytes(buf[4 * k..4 * k + 4].try_into().expect("4 bytes")),
            u32::from_le_bytes(want[4 * k..4 * k + 4].try_into().expect("4 bytes")),
            u32::from_le_bytes(buf[..4].try_into().expect("4 bytes")),
        )),
    }
}

/// User words of the stress programs (`STRESS_*` in stress.cuh).
pub mod user {
    /// Messages passed (sink) or sent (source): words 0 and 1.
    pub fn count(words: &[u32; 32]) -> u64 {
        u64::from(words[0]) | (u64::from(words[1]) << 32)
    }
    /// Messages that failed the sink's check.
    pub const ERRORS: usize = 2;
    /// Low half of the first failing position.
    pub const FIRST_BAD: usize = 3;
    /// Launches of the kernel.
    pub const LAUNCHES: usize = 4;
    /// Launches that found the channel's position different from the count kept (replay or loss).
    pub const RESUME: usize = 5;
}

/// User words of the bulk stream programs (`BULK_*` in bulk_stress.cuh): one count per block.
pub mod bulk {
    /// Launches of the kernel (block 0 counts them).
    pub const LAUNCHES: usize = 0;
    /// Blocks a bulk program reports for (one channel each).
    pub const MAX_BLOCKS: u32 = 8;
    /// A launch that found its channel's position different from the count kept adds this to `bad`.
    pub const RESUME_ONE: u32 = 1 << 20;

    /// Messages block `b` sent (source) or passed (sink).
    pub fn count(words: &[u32; 32], b: u32) -> u64 {
        let i = 8 + 3 * b as usize;
        u64::from(words[i]) | (u64::from(words[i + 1]) << 32)
    }

    /// Block `b`'s failures: (messages that failed the check, relaunches that resumed elsewhere).
    pub fn bad(words: &[u32; 32], b: u32) -> (u32, u32) {
        let w = words[10 + 3 * b as usize];
        (w % RESUME_ONE, w / RESUME_ONE)
    }
}

/// The knob message a stress program reads from its binding 1: a pause per message and the most
/// messages per warp call (`fixed`: a source fills its buffer once and changes only word 0).
pub fn knobs(pause_ns: u32, batch: u16, fixed: bool) -> [u8; 8] {
    let mut m = [0u8; 8];
    m[..4].copy_from_slice(&pause_ns.to_le_bytes());
    m[4..].copy_from_slice(&(u32::from(batch) | if fixed { 1 << 16 } else { 0 }).to_le_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_checks_and_any_change_fails() {
        for size in [8usize, 24, 64, 4096] {
            let mut m = vec![0u8; size];
            fill(&mut m, (1 << 33) + 7);
            assert!(check(&m, (1 << 33) + 7).is_ok());
            assert!(check(&m, 7).is_err(), "the high half of the sequence counts");
            assert!(check(&m, (1 << 33) + 8).is_err());
            for byte in [0, size / 2, size - 1] {
                let mut torn = m.clone();
                torn[byte] ^= 1;
                assert!(check(&torn, (1 << 33) + 7).is_err(), "byte {byte} of {size}");
            }
        }
    }
}
