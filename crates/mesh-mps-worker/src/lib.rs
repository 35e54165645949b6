//! The protocol between meshd (mesh-mps) and its MPS workers: one JSON line per command on the worker's
//! stdin, one JSON line per reply on its stdout; the first line a worker writes is its `ready` (or why not).

use serde::{Deserialize, Serialize};

/// What meshd asks a worker.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Command {
    /// Load the cubin at `cubin` and probe its `mesh_main` for this launch shape.
    Load {
        /// A file meshd wrote (the worker reads it once).
        cubin: String,
        /// Grid.
        grid: [u32; 3],
        /// Block.
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

/// A worker's answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Reply {
    /// Whether the command succeeded.
    pub ok: bool,
    /// Why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The first line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<Ready>,
    /// After `load`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
    /// After `wait`: `idle`, `busy`, or `failed: …`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

impl Reply {
    /// A refusal.
    pub fn error(e: impl std::fmt::Display) -> Self {
        Self { ok: false, error: Some(e.to_string()), ..Self::default() }
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
        let r = Reply { ok: true, state: Some("idle".into()), ..Reply::default() };
        assert_eq!(serde_json::from_str::<Reply>(&encode(&r)).unwrap(), r);
        assert!(serde_json::from_str::<Command>(r#"{"op":"dance"}"#).is_err());
    }
}
