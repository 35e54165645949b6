//! meshd's mailbox: one shared-memory file that every process of the mesh maps and every CUDA context registers.
//!
//! * [`layout`]: the bytes of the file, one writer per word, offsets never pointers.
//! * [`Mailbox`]: create (mode 0600, exclusive unless replacing), open (validates everything first),
//!   the channel table and the program slots.
//! * [`Producer`] / [`Consumer`]: claimed ends of single-producer single-consumer rings (protocols ll
//!   and index: [`ring`] and [`index_ring`] are their formats, [`indices`] the index logic all share).
//! * [`BulkProducer`] / [`BulkConsumer`]: claimed ends of channels of protocol bulk, for large
//!   messages ([`bulk`] is their format, [`copy`] how they copy).
//! * [`FanInSender`] / [`FanInReceiver`], [`GroupServer`] / [`GroupClient`], [`ServiceOwner`]: the
//!   ends of a service's fan-in channel and channel group, many clients to one server ([`service`]
//!   is the mailbox's side, [`fanin`] and [`group`] the formats and cores).
//! * [`device_header`]: `mesh.cuh`, the same layout for CUDA programs.
//! * [`WaitConfig`]: how every blocking call of these ends waits between polls (spin, then yield,
//!   then sleep), a setting of each end and of the [`Mailbox`] handle they are claimed from, whose
//!   default the environment variable `MESH_SPIN_US` may set for a whole process ([`wait`]);
//!   [`PollPause`] is one wait's pauses, public so that other bindings (the Python package) wait
//!   the same way.
//!
//! Modules depend on one another in one direction, from the bytes up: [`layout`] (sizes and
//! offsets, numbers only), [`indices`], the ring formats ([`ring`], [`index_ring`], [`bulk`]), the
//! service formats ([`fanin`], then [`group`]), the [`Mailbox`] that lays them out in the file, and
//! the host ends on top ([`channel`], [`bulk_channel`], [`service`]). The workspace's
//! `xtask/tests/module_cycles.rs` fails on any circle between the source files.
//!
//! # A host client
//!
//! meshd creates the mailbox (`meshd info` names its file) and the channels (`meshd channel create`);
//! a host process opens the file and claims one end of a channel. One producer and one consumer per
//! channel: a second claim of an end is refused while it is held (dropping the handle releases it; a
//! claim dies with its process, even by kill -9), and a new holder resumes where the last one stopped. Here the test makes the mailbox and channel itself, as meshd would:
//!
//! ```
//! use std::time::Duration;
//! use mesh_shm::{Consumer, Mailbox, Producer, Protocol};
//! # use mesh_shm::{CreateMode, MailboxConfig, Placement};
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("mailbox");
//! # let made = Mailbox::create(&path, &MailboxConfig::default(), CreateMode::Exclusive)?;
//! # made.create_channel("requests", 64, 16)?;
//! # made.create_channel_with("h2h", 8, 1024, Placement::Host, Protocol::Index)?;
//!
//! let mailbox = Mailbox::open(&path)?; // validates the whole file before anything is read
//! let mut tx = Producer::claim(&mailbox, "requests")?;
//! tx.send(b"hello, GPU", Duration::from_secs(1))?; // shorter than the message size: zero-padded
//!
//! // The other end (a GPU program's, usually: `mesh_chan_open` in mesh.cuh) receives it whole.
//! let mut rx = Consumer::claim(&mailbox, "requests")?;
//! let mut msg = [0u8; 64];
//! rx.recv(&mut msg, Duration::from_secs(1))?;
//! assert!(msg.starts_with(b"hello, GPU"));
//! assert!(!rx.try_recv(&mut msg)?, "nothing more");
//!
//! // Protocol index (`--protocol index`): the same calls, for two host ends (rtrb's format).
//! assert_eq!(mailbox.channel("h2h")?.protocol, Protocol::Index);
//! let (mut tx, mut rx) = (Producer::claim(&mailbox, "h2h")?, Consumer::claim(&mailbox, "h2h")?);
//! tx.send(&7u64.to_le_bytes(), Duration::from_secs(1))?;
//! let mut word = [0u8; 8];
//! rx.recv(&mut word, Duration::from_secs(1))?;
//! assert_eq!(u64::from_le_bytes(word), 7);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod arena;
pub mod bulk;
pub mod bulk_channel;
pub mod channel;
pub mod claim;
pub mod copy;
pub mod device_header;
pub mod error;
pub mod fanin;
pub mod group;
pub mod index_ring;
pub mod indices;
pub mod layout;
pub mod mailbox;
pub mod paths;
mod protocol;
#[cfg(test)]
#[allow(clippy::cast_possible_truncation, reason = "test sizes, counts and byte patterns are small")]
mod queue_model;
pub mod ring;
pub mod service;
pub mod wait;
pub mod window;

pub use bulk_channel::{BulkConsumer, BulkProducer, Peeked, Reserved};
pub use channel::{Consumer, EndClaim, Producer};
pub use copy::CopyConfig;
pub use error::{End, Result, ShmError};
pub use fanin::{Completion, Taken};
pub use group::{ClientId, Replied};
pub use layout::{MeshBinding, MeshCtx};
pub use mailbox::{
    ChannelInfo, CreateMode, Geometry, Mailbox, MailboxConfig, Placement, Protocol, SlotRef, SlotStatusSnapshot,
};
pub use service::{FanInProbe, FanInReceiver, FanInSender, GroupClient, GroupServer, ServiceOwner};
pub use wait::{PollPause, WaitConfig};
pub use window::ReplyWindow;
