//! meshd's mailbox: one shared-memory file that every process of the mesh maps and every CUDA context registers.
//!
//! * [`layout`]: the bytes of the file, one writer per word, offsets never pointers.
//! * [`Mailbox`]: create (mode 0600, exclusive unless replacing), open (validates everything first),
//!   the channel table and the program slots.
//! * [`Producer`] / [`Consumer`]: claimed ends of single-producer single-consumer rings (protocols ll
//!   and index: [`ring`] and [`index_ring`] are their formats, [`indices`] the index logic all share).
//! * [`BulkProducer`] / [`BulkConsumer`]: claimed ends of channels of protocol bulk, for large
//!   messages ([`bulk`] is their format, [`copy`] how they copy).
//! * [`device_header`]: `mesh.cuh`, the same layout for CUDA programs.

pub mod bulk;
pub mod bulk_channel;
pub mod channel;
pub mod claim;
pub mod copy;
pub mod device_header;
pub mod error;
pub mod index_ring;
pub mod indices;
pub mod layout;
pub mod mailbox;
pub mod ring;

pub use bulk_channel::{BulkConsumer, BulkProducer};
pub use channel::{Consumer, EndClaim, Producer};
pub use copy::CopyConfig;
pub use error::{End, Result, ShmError};
pub use layout::{MeshBinding, MeshCtx};
pub use mailbox::{
    ChannelInfo, CreateMode, Geometry, Mailbox, MailboxConfig, Placement, Protocol, SlotRef, SlotStatusSnapshot,
};
