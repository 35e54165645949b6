//! meshd's mailbox: one shared-memory file that every process of the mesh maps and every CUDA context registers.
//!
//! * [`layout`]: the bytes of the file, one writer per word, offsets never pointers.
//! * [`Mailbox`]: create (mode 0600, exclusive unless replacing), open (validates everything first),
//!   the channel table and the program slots.
//! * [`Producer`] / [`Consumer`]: claimed ends of single-producer single-consumer rings.
//! * [`device_header`]: `mesh.cuh`, the same layout for CUDA programs.

pub mod channel;
pub mod claim;
pub mod device_header;
pub mod error;
pub mod layout;
pub mod mailbox;
pub mod ring;

pub use channel::{Consumer, EndClaim, Producer};
pub use error::{End, Result, ShmError};
pub use layout::{MeshBinding, MeshCtx};
pub use mailbox::{ChannelInfo, CreateMode, Geometry, Mailbox, MailboxConfig, Placement, SlotRef, SlotStatusSnapshot};
