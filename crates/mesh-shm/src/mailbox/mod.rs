//! The mailbox file: creation, validation on open, the channel table and the program slots.
//!
//! [`Mailbox`] is a handle to one mapping; its calls are spread over this module's files by job:
//! `file` creates and opens, `table` reads and checks the channel table, `channels` creates and
//! deletes channels, `claims` confirms a host end's claim against a concurrent delete, `services`
//! creates and deletes the fan-in channels and groups of a service, `rings` hands the host ends
//! their ring memory, `slots` holds the program slots and the kernel's argument; `crash` names the
//! steps of a creation and a deletion for the test that kills a process at each.

mod channels;
mod claims;
mod crash;
mod file;
mod geometry;
mod handle;
mod rings;
mod services;
mod slots;
mod table;

pub use crate::protocol::{Protocol, SERVICE_REPLIES_SUFFIX};
pub use geometry::{Geometry, MailboxConfig};
pub use handle::{ChannelInfo, CreateMode, Mailbox, Placement};
pub use slots::{SlotRef, SlotStatusSnapshot};

#[cfg(feature = "crash-points")]
#[doc(hidden)]
pub use crash::CRASH_STEPS;
