//! kcheck's arithmetic, once for both backends: can a launch be resident beside the programs already
//! running, and what share of the GPU does it then hold?
//!
//! A resident kernel loops until meshd stops it, so every block of every program must be on an SM at
//! once, or a block that never gets one never runs. Two SM counts enter the check, and which is
//! which is the one real difference between the modes, so it is spelled out in [`SmBudget`]:
//! the SMs of the program's *own context* (every block of the launch must fit there) and the SMs
//! that *all resident programs share* (the shares of all programs must add up to at most 1).
//! In blink mode both are the one context's SMs; in MPS mode each worker has its own context (a
//! green context of `--sms` SMs, or the whole GPU) while all workers share the device's SMs.

use crate::error::BackendError;
use crate::spec::LaunchShape;

/// What the driver says about a loaded `mesh_main` for one launch shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelFigures {
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block, bytes.
    pub shared_bytes: u32,
    /// Largest block `mesh_main` can be launched with.
    pub max_threads_per_block: u32,
    /// Blocks of the shape resident on one SM at once (the driver's occupancy calculation).
    pub per_sm: u32,
}

/// The SMs a residency check counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmBudget {
    /// SMs of the context the program runs in: every block of its launch must fit there.
    pub context: u32,
    /// SMs every resident program shares: shares are fractions of these.
    pub shared: u32,
}

impl SmBudget {
    /// Blink mode: every program in one context of `sms` SMs, which they all share.
    pub fn one_context(sms: u32) -> Self {
        Self { context: sms, shared: sms }
    }

    /// MPS mode: each program in its own context of `context` SMs, all on a device of `device` SMs.
    pub fn own_context(context: u32, device: u32) -> Self {
        Self { context, shared: device }
    }
}

/// Checks that `shape` of a kernel with `figures` is resident beside programs holding `held` (a
/// fraction of the shared SMs); returns the share the launch would hold. The refusal carries the
/// numbers.
pub fn check_resident(
    program: &str,
    shape: &LaunchShape,
    figures: &KernelFigures,
    sms: SmBudget,
    held: f64,
) -> Result<f64, BackendError> {
    let refuse = |detail: String| BackendError::NotResident { program: program.to_string(), detail };
    let threads = shape.threads_per_block();
    if threads > u64::from(figures.max_threads_per_block) {
        return Err(refuse(format!(
            "{threads} threads per block, mesh_main allows {} ({} registers per thread)",
            figures.max_threads_per_block, figures.registers
        )));
    }
    let per_sm = u64::from(figures.per_sm);
    let capacity = per_sm * u64::from(sms.context);
    let whole = per_sm * u64::from(sms.shared);
    let share = if whole == 0 { f64::INFINITY } else { shape.blocks() as f64 / whole as f64 };
    if shape.blocks() > capacity || held + share > 1.0 + 1e-9 {
        return Err(refuse(format!(
            "{} blocks of {threads} threads ({} registers, {} B static + {} B dynamic shared memory each): {per_sm} fit per SM, {capacity} on the context's {} SMs, so the launch needs {:.1}% of the {} SMs the programs share while the resident programs hold {:.1}%",
            shape.blocks(),
            figures.registers,
            figures.shared_bytes,
            shape.shared_mem,
            sms.context,
            share * 100.0,
            sms.shared,
            held * 100.0
        )));
    }
    Ok(share)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIGURES: KernelFigures =
        KernelFigures { registers: 32, shared_bytes: 0, max_threads_per_block: 1024, per_sm: 2 };

    fn blocks(n: u32) -> LaunchShape {
        LaunchShape { grid: [n, 1, 1], ..LaunchShape::default() }
    }

    #[test]
    fn in_one_context_the_share_is_of_that_contexts_sms() {
        // 16 SMs × 2 blocks: 8 blocks are a quarter of the context.
        let share = check_resident("p", &blocks(8), &FIGURES, SmBudget::one_context(16), 0.0).unwrap();
        assert!((share - 0.25).abs() < 1e-12, "{share}");
        let full = check_resident("p", &blocks(32), &FIGURES, SmBudget::one_context(16), 0.0).unwrap();
        assert!((full - 1.0).abs() < 1e-12, "a launch may fill the context exactly");
        let err = check_resident("p", &blocks(8), &FIGURES, SmBudget::one_context(16), 0.8).unwrap_err().to_string();
        assert!(err.contains("cannot be resident") && err.contains("fit per SM"), "{err}");
        assert!(err.contains("needs 25.0%") && err.contains("hold 80.0%"), "{err}");
    }

    #[test]
    fn in_its_own_context_the_share_is_of_the_devices_sms_and_the_blocks_must_fit_its_context() {
        // A worker of 16 SMs on a 132-SM device: 8 blocks fit its context and hold 8/264 of the GPU.
        let sms = SmBudget::own_context(16, 132);
        let share = check_resident("p", &blocks(8), &FIGURES, sms, 0.0).unwrap();
        assert!((share - 8.0 / 264.0).abs() < 1e-12, "{share}");
        // 40 blocks would be 15% of the device but do not fit the worker's 32 block places.
        let err = check_resident("p", &blocks(40), &FIGURES, sms, 0.0).unwrap_err().to_string();
        assert!(err.contains("32 on the context's 16 SMs"), "{err}");
        // The same launch in blink mode's one context of 16 SMs is refused the same way.
        assert!(check_resident("p", &blocks(40), &FIGURES, SmBudget::one_context(16), 0.0).is_err());
    }

    #[test]
    fn a_block_larger_than_mesh_main_allows_is_refused_first() {
        let shape = LaunchShape { block: [1024, 1, 1], ..blocks(1) };
        let small = KernelFigures { max_threads_per_block: 512, ..FIGURES };
        let err = check_resident("p", &shape, &small, SmBudget::one_context(16), 0.0).unwrap_err().to_string();
        assert!(err.contains("1024 threads per block, mesh_main allows 512 (32 registers per thread)"), "{err}");
    }

    #[test]
    fn a_kernel_that_fits_nowhere_is_refused_not_divided_by_zero() {
        let none = KernelFigures { per_sm: 0, ..FIGURES };
        assert!(check_resident("p", &blocks(1), &none, SmBudget::one_context(16), 0.0).is_err());
    }
}
