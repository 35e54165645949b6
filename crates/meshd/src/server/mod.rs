//! The control plane: every connection served on its own thread, changes applied one at a time on the backend thread, `ps` and `info` from a published snapshot.
//!
//! * **The backend thread** opens the backend and owns it until meshd ends. The MPS backend
//!   spawns its daemon and workers with `PR_SET_PDEATHSIG`, which fires when the *spawning thread*
//!   exits, so that thread must live as long as meshd; and one owner applies changes one at a time,
//!   in arrival order. After every change, and every [`Limits::refresh`], it publishes a snapshot.
//!   Between changes it is the **watchdog**: every [`Limits::watch`] (25 ms) it calls
//!   [`Backend::watch`], which polls the kernels and recovers from a fault with no request; while a
//!   recovery runs, `ps` answers from the last snapshot overlaid with the recovery board, which the
//!   backend marks from the moment it notices the fault ([`Backend::set_recovery_board`]). When the
//!   backend says the fault is sticky ([`Backend::take_replacement`], after every backend call), it
//!   records what the new process needs and replaces the process ([`crate::replace`]); the new
//!   image's backend thread relaunches the recorded programs but the culprit, which `ps` shows left
//!   stopped, and runs a culprit search's next question.
//! * **Connection threads** check the peer (SO_PEERCRED), read one bounded request, and either
//!   answer from the snapshot (`ps`, `info`, `metrics`: heartbeats read fresh from the mailbox's
//!   slots, so they never wait behind a slow client, a slow load or a backend call) or queue it for
//!   the backend thread and wait for its answer.
//! * **The accept loop** blocks in `poll` on the listener and a wake socket (written by SIGINT,
//!   SIGTERM and by the backend thread when it ends): no sleep between polls.
//! * **Services** (`services.rs`: the table, `service create`, `info`'s rows) and their **leases**
//!   (`leases.rs`): a connection that attached a client to a service stays open, outside the
//!   connection limit, until the client detaches, closes it or dies.
//! * **The stall watcher** (`stalls.rs`, [`Limits::client_stall`]): one thread, started when the
//!   server runs, that revokes (or reports) a service client holding its fan-in ring's consumer.
//!
//! **Layout.** This file only names the parts and re-exports what the crate uses; imports go one
//! way, from the top down: `listener` (the accept loop, the connection threads) → `plane`
//! ([`Server`]: start, stop) → `recovery` → `worker` (the backend thread) → `natives`, `jobs`,
//! `shared`, `leases` → `services` → `stalls` → `limits`, `waits`.
//!
//! [`Backend::watch`]: mesh_backend::Backend::watch
//! [`Backend::set_recovery_board`]: mesh_backend::Backend::set_recovery_board
//! [`Backend::take_replacement`]: mesh_backend::Backend::take_replacement

mod handoff;
mod jobs;
mod leases;
mod limits;
mod listener;
mod natives;
mod plane;
mod recovery;
mod services;
mod shared;
mod stalls;
mod waits;
mod worker;

pub use crate::protocol::HELD_SLOT;
pub use jobs::change_op;
pub use limits::Limits;
pub use listener::peer_allowed;
pub use plane::Server;
pub use shared::{StopHandle, Waker};
pub use worker::{Opened, Replacer};
