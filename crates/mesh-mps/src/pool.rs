//! The worker pool's policy and counters: a load never creates an MPS client unannounced.
//!
//! Creating an MPS client stalls every running program once (measured on the H200: a running
//! program's largest gap went from 14 µs to 526 µs). So the pool (`--pool N`) is made before any
//! program runs, and a load or upgrade that finds it empty is refused with the reason, unless the
//! operator allowed growth (`--pool-grow`): then the client is created, and the stall is counted
//! here, logged, and shown by `info`, `ps` and the request's own reply. Growing the pool back to N
//! after workers were discarded needs the same permission. A fault recovery recreates clients
//! regardless (every client was dead anyway) and is not counted.
//!
//! The counters are a [`PoolFigures`] the backend hands meshd ([`mesh_backend::Backend::pool`]) and
//! read without the backend's lock, so `info` answers while a change or a recovery runs.

/// MPS client contexts per device on Volta and later (NVIDIA's MPS documentation).
pub const MAX_CLIENTS: u32 = 48;
/// The same from CUDA 13.1.
pub const MAX_CLIENTS_13_1: u32 = 60;

/// The client limit for a driver reporting `cuDriverGetVersion` = `version` (13010 for 13.1),
/// and where the figure comes from, for `info`.
pub fn client_limit(version: Option<i32>) -> (u32, String) {
    match version {
        Some(v) if v >= 13010 => {
            (MAX_CLIENTS_13_1, format!("CUDA {}.{} driver: 60 from CUDA 13.1", v / 1000, v % 1000 / 10))
        }
        Some(v) => (MAX_CLIENTS, format!("CUDA {}.{} driver: 48 before CUDA 13.1", v / 1000, v % 1000 / 10)),
        None => (MAX_CLIENTS, "driver version unknown: 48 assumed".into()),
    }
}

pub use mesh_backend::pool::{Growth, PoolFigures, PoolSnapshot};

/// Why a load or upgrade that found no idle worker is refused (growth not allowed).
/// `sms` is the program's ask (None: the whole GPU), `idle` what each idle worker was started with.
pub fn refusal(op: &str, program: &str, sms: Option<u32>, idle: &[Option<u32>], in_use: usize, size: u32) -> String {
    let what = match op {
        "upgrade" => format!(
            "upgrade of {program:?} refused: an MPS upgrade loads the new image in another (idle) worker while the \
             old one runs, and"
        ),
        _ => format!("load of {program:?} refused:"),
    };
    let shown: Vec<String> =
        idle.iter().map(|a| a.map_or_else(|| "the whole GPU".into(), |n| format!("{n} SMs"))).collect();
    let found = match (sms, idle.is_empty()) {
        (_, true) => format!("the pool is empty ({in_use} workers in use, --pool {size})"),
        (Some(n), false) => format!("no idle worker has {n} SMs (idle workers: {})", shown.join(", ")),
        (None, false) => format!("no idle worker has the whole GPU (idle workers: {})", shown.join(", ")),
    };
    format!(
        "{what} {found}; creating an MPS client now would stall every running program (measured: a running \
         program's largest gap went from 14 µs to 526 µs). Unload a program, start meshd with a larger --pool, \
         or allow growth with --pool-grow (the stall is then counted in info and ps)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_follows_the_driver() {
        assert_eq!(client_limit(Some(13000)).0, 48);
        assert!(client_limit(Some(13000)).1.contains("CUDA 13.0"));
        assert_eq!(client_limit(Some(13010)).0, 60);
        assert_eq!(client_limit(Some(12080)).0, 48);
        assert_eq!(client_limit(None), (48, "driver version unknown: 48 assumed".into()));
    }

    #[test]
    fn refusals_say_why_and_what_to_do() {
        let load = refusal("load", "p", None, &[], 2, 2);
        assert!(load.contains("load of \"p\" refused: the pool is empty (2 workers in use, --pool 2)"), "{load}");
        assert!(load.contains("stall every running program") && load.contains("--pool-grow"), "{load}");
        let up = refusal("upgrade", "p", None, &[], 1, 1);
        assert!(up.contains("upgrade of \"p\" refused: an MPS upgrade loads the new image in another (idle) worker"));
        assert!(up.contains("--pool-grow"), "{up}");
        let sms = refusal("load", "q", Some(16), &[None], 0, 1);
        assert!(sms.contains("no idle worker has 16 SMs (idle workers: the whole GPU)"), "{sms}");
        let whole = refusal("load", "r", None, &[Some(16), Some(32)], 0, 2);
        assert!(whole.contains("no idle worker has the whole GPU (idle workers: 16 SMs, 32 SMs)"), "{whole}");
    }
}
