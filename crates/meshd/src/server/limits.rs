//! The control plane's limits: connections, timeouts, the watchdog's tick, service leases and the stall watcher.

use std::time::Duration;

/// The control plane's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A client that sends nothing for this long is dropped.
    pub idle: Duration,
    /// How long writing an answer to a client may block.
    pub write: Duration,
    /// Connections served at once; more are answered with a refusal and closed.
    pub max_connections: usize,
    /// How often the backend thread refreshes the snapshot when no change comes.
    pub refresh: Duration,
    /// The watchdog's tick: how often the backend thread calls
    /// [`Backend::watch`](mesh_backend::Backend::watch) (at most 50 ms, so that a fault is noticed
    /// within 100 ms with no request).
    pub watch: Duration,
    /// Service leases held at once (each an attached client's open connection and its thread);
    /// they do not count against `max_connections`. A group's entries bound them too.
    pub max_leases: usize,
    /// The services' stall watcher: how long one client's reservation may hold a fan-in ring's
    /// consumer before it is revoked (not yet begun: the program takes a skip, the client sends the
    /// request again) or, between the begin and the commit of a send, reported. `None`: no watcher.
    /// `meshd run` sets it from `--client-stall-ms` (50 ms unless told); `Limits::default()` leaves
    /// it off, so that an embedding (a test) opts in.
    pub client_stall: Option<Duration>,
    /// With the watcher: kill (SIGKILL) a client that has held a fan-in ring this long between the
    /// begin and the commit of a send (what cannot be revoked while it lives); its death completes
    /// the slot. `None` (the default): never.
    pub client_stall_kill: Option<Duration>,
    /// Native workers (`meshd spawn`) are started in sessions of their own, outliving a crash of
    /// meshd, and a restarted meshd adopts those still running (`meshd run --orphan-grace-ms` > 0).
    /// Off: they die with meshd.
    pub natives_outlive_meshd: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            idle: Duration::from_secs(2),
            write: Duration::from_secs(5),
            max_connections: 128,
            refresh: Duration::from_millis(250),
            watch: mesh_backend::watch::TICK,
            max_leases: 4096,
            client_stall: None,
            client_stall_kill: None,
            natives_outlive_meshd: false,
        }
    }
}
