//! The protocol between meshd (mesh-mps) and its MPS workers: one JSON line per command on the worker's
//! stdin, one JSON line per reply on its stdout; the first line a worker writes is its `ready` (or why not).
//!
//! Every message is an enum that serde encodes: a [`Command`], a [`Reply`] whose kernel state is a
//! [`KernelState`] and whose refusal carries a [`RefusalKind`], so neither side compares strings.

use mesh_cuda::{KernelFigures, KernelRun, StreamState};
use serde::{Deserialize, Serialize};

/// What meshd asks a worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// Load the cubin at `cubin` and probe its `mesh_main` for this launch shape.
    Load {
        /// A file meshd wrote (the worker reads it once).
        cubin: String,
        /// `mesh_main`'s grid, in blocks (x, y, z), as meshd's load request gave it.
        grid: [u32; 3],
        /// `mesh_main`'s block, in threads (x, y, z).
        block: [u32; 3],
        /// Dynamic shared memory per block.
        shared_mem: u32,
    },
    /// Launch the loaded `mesh_main` for mailbox slot `slot` (meshd has armed the slot).
    Launch {
        /// The program's slot.
        slot: u32,
    },
    /// Wait up to `timeout_ms` for the kernel to return; answers the stream's state.
    Wait {
        /// How long; 0 answers at once.
        timeout_ms: u64,
    },
    /// Unload the module (the kernel must have returned).
    Unload,
    /// Leave.
    Exit,
}

/// What the worker says once started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ready {
    /// The worker's pid.
    pub pid: u32,
    /// The GPU's name.
    pub device: String,
    /// `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` seen from inside the worker.
    pub mps_enabled: bool,
    /// SMs of the worker's context.
    pub sms: u32,
    /// Milliseconds its context creation took (the first client also starts the MPS server).
    pub context_ms: u64,
}

/// kcheck's figures for a loaded `mesh_main`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Probe {
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory per block.
    pub shared_bytes: u32,
    /// Largest block.
    pub max_threads_per_block: u32,
    /// Blocks of the asked shape resident per SM.
    pub per_sm: u32,
    /// SMs of the worker's context.
    pub sms: u32,
}

impl Probe {
    /// kcheck's figures for the shape the load asked about.
    pub fn figures(&self) -> KernelFigures {
        KernelFigures {
            registers: self.registers,
            shared_bytes: self.shared_bytes,
            max_threads_per_block: self.max_threads_per_block,
            per_sm: self.per_sm,
        }
    }
}

/// What the worker's kernel is doing, answered to `wait`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum KernelState {
    /// Nothing runs: the kernel returned, or none was launched.
    Idle,
    /// The kernel still runs.
    Busy,
    /// The kernel failed (or the worker cannot tell: it is gone, it did not answer).
    Failed {
        /// The driver's error, or what went wrong reaching the worker.
        reason: String,
    },
}

impl From<KernelState> for KernelRun {
    fn from(s: KernelState) -> Self {
        match s {
            KernelState::Idle => KernelRun::Returned,
            KernelState::Busy => KernelRun::Running,
            KernelState::Failed { reason } => KernelRun::Failed(reason),
        }
    }
}

impl From<StreamState> for KernelState {
    fn from(s: StreamState) -> Self {
        match s {
            StreamState::Idle => KernelState::Idle,
            StreamState::Busy => KernelState::Busy,
            StreamState::Failed(reason) => KernelState::Failed { reason },
        }
    }
}

/// Why a worker refused, as a kind meshd acts on.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RefusalKind {
    /// Bad command-line arguments (the first line; the worker then exits with status 2).
    Usage,
    /// The worker could not start: no driver, not an MPS client, the mailbox (exits with status 1).
    Start,
    /// A line that is no command.
    Malformed,
    /// A command that needs the kernel stopped while it runs.
    Busy,
    /// A launch with no module loaded.
    NotLoaded,
    /// The image has no `mesh_main`.
    NoEntry,
    /// Anything else the driver or the file system refused.
    Failed,
}

/// A refusal: its kind and the reason in words.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Refusal {
    /// What kind of refusal.
    pub kind: RefusalKind,
    /// Why, with the driver's message where there is one.
    pub message: String,
}

impl Refusal {
    /// A refusal of `kind` saying `message`.
    pub fn new(kind: RefusalKind, message: impl std::fmt::Display) -> Self {
        Self { kind, message: message.to_string() }
    }
}

/// A worker's answer: one per command, and the first line it writes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// The first line: started, registered, an MPS client.
    Ready(Ready),
    /// After `load`: the module is loaded, with kcheck's figures.
    Loaded(Probe),
    /// After `wait`.
    State {
        /// Idle (returned or never launched), busy, or failed with the driver's error.
        state: KernelState,
    },
    /// After `launch`, `unload` and `exit`.
    Done,
    /// The command, or the start, failed.
    Refused(Refusal),
}

impl Reply {
    /// A refusal of `kind`.
    pub fn refused(kind: RefusalKind, message: impl std::fmt::Display) -> Self {
        Self::Refused(Refusal::new(kind, message))
    }
}

/// The worker's JSON for one line (no newline).
pub fn encode<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("protocol types serialise")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_replies_round_trip() {
        let c = Command::Load { cubin: "/x".into(), grid: [1, 2, 3], block: [32, 1, 1], shared_mem: 0 };
        assert_eq!(serde_json::from_str::<Command>(&encode(&c)).unwrap(), c);
        assert_eq!(encode(&Command::Wait { timeout_ms: 5 }), r#"{"op":"wait","timeout_ms":5}"#);
        let replies = [
            Reply::State { state: KernelState::Idle },
            Reply::State { state: KernelState::Failed { reason: "CUDA_ERROR_ILLEGAL_ADDRESS".into() } },
            Reply::Done,
            Reply::refused(RefusalKind::NoEntry, "cuModuleGetFunction failed"),
            Reply::Loaded(Probe { registers: 8, shared_bytes: 0, max_threads_per_block: 1024, per_sm: 16, sms: 132 }),
            Reply::Ready(Ready { pid: 7, device: "H200".into(), mps_enabled: true, sms: 132, context_ms: 3 }),
        ];
        for r in replies {
            assert_eq!(serde_json::from_str::<Reply>(&encode(&r)).unwrap(), r);
        }
        assert_eq!(encode(&Reply::State { state: KernelState::Busy }), r#"{"reply":"state","state":"busy"}"#);
        assert!(serde_json::from_str::<Command>(r#"{"op":"dance"}"#).is_err());
    }

    #[test]
    fn a_kernel_state_maps_to_the_contracts_kernel_run() {
        assert_eq!(KernelRun::from(KernelState::Busy), KernelRun::Running);
        assert_eq!(KernelRun::from(KernelState::Idle), KernelRun::Returned);
        assert_eq!(KernelRun::from(KernelState::Failed { reason: "x".into() }), KernelRun::Failed("x".into()));
    }
}
