//! A channel's protocol: the format of its slots, and the descriptor value that names it.

use crate::layout::{MAX_MSG_SIZE, PROTOCOL_BULK, PROTOCOL_FANIN, PROTOCOL_GROUP, PROTOCOL_INDEX, PROTOCOL_LL};

/// The format of a channel's slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// A tag in every 8-byte word (NCCL's LL): one round trip per message for a GPU receiver, no
    /// fence; the ring costs twice its payload. Messages of 8 B to 64 KiB, multiples of 8.
    #[default]
    Ll,
    /// The payload as it is, a fence, then one flag per message (NCCL's Simple): for large messages,
    /// moved by a whole thread block or by wide host copies. Messages of 16 B to 16 MiB, multiples of 16.
    Bulk,
    /// The payload alone in each slot, the producer's index saying what is whole (Lamport's ring,
    /// rtrb's format): both ends host processes; the fastest host↔host (8 messages of 8 B per cache
    /// line against LL's 4); GPU programs cannot bind it. Messages of 8 B to 64 KiB, multiples of 8.
    Index,
    /// A fan-in ring: any number of host producers, each sending as the id meshd gave
    /// it, and one consumer (a GPU program or a host server); a dead or stopped producer's slot is
    /// completed as a skip. Host placement only. Messages of 8 B to 64 KiB, multiples of 8. Ends:
    /// [`crate::FanInSender`], [`crate::FanInReceiver`].
    FanIn,
    /// A channel group: one SPSC LL reply ring per client slot, handed to a client by meshd
    /// and taken back once the replying program acknowledged its departure. Host placement only.
    /// Replies of 8 B to 64 KiB, multiples of 8. Ends: [`crate::GroupServer`], [`crate::GroupClient`];
    /// meshd's side is [`crate::ServiceOwner`].
    Group,
}

impl Protocol {
    /// The descriptor's value ([`PROTOCOL_LL`], [`PROTOCOL_BULK`], [`PROTOCOL_INDEX`], [`PROTOCOL_FANIN`]
    /// or [`PROTOCOL_GROUP`]).
    pub fn code(self) -> u32 {
        match self {
            Protocol::Ll => PROTOCOL_LL,
            Protocol::Bulk => PROTOCOL_BULK,
            Protocol::Index => PROTOCOL_INDEX,
            Protocol::FanIn => PROTOCOL_FANIN,
            Protocol::Group => PROTOCOL_GROUP,
        }
    }

    /// The protocol a descriptor's value names, `None` for any other value.
    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            PROTOCOL_LL => Some(Protocol::Ll),
            PROTOCOL_BULK => Some(Protocol::Bulk),
            PROTOCOL_INDEX => Some(Protocol::Index),
            PROTOCOL_FANIN => Some(Protocol::FanIn),
            PROTOCOL_GROUP => Some(Protocol::Group),
            _ => None,
        }
    }

    /// The protocol a channel of `msg_size`-byte messages gets when none is named: LL up to
    /// [`MAX_MSG_SIZE`] (every channel that could exist before bulk channels keeps its format), bulk
    /// above.
    pub fn default_for(msg_size: u32) -> Self {
        if msg_size > MAX_MSG_SIZE { Protocol::Bulk } else { Protocol::Ll }
    }

    /// Whether a GPU program may bind a channel of this protocol (not [`Protocol::Index`], whose ends
    /// are both host processes). A fan-in channel (the program consumes) and a group (the program
    /// replies) are: their bindings are laid out (see `layout::MeshBinding::protocol`), though
    /// mesh.cuh has no calls for them yet and refuses them as it refuses any protocol it does not know.
    pub fn gpu_bindable(self) -> bool {
        self != Protocol::Index
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Ll => "ll",
            Protocol::Bulk => "bulk",
            Protocol::Index => "index",
            Protocol::FanIn => "fanin",
            Protocol::Group => "group",
        })
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "ll" => Ok(Protocol::Ll),
            "bulk" => Ok(Protocol::Bulk),
            "index" => Ok(Protocol::Index),
            // Not "fanin" nor "group": those are not made as one channel of a protocol (`meshd channel
            // create --protocol`) but as a service's two objects (`Mailbox::create_fanin` and
            // `Mailbox::create_group`; meshd's `service create`, to come).
            other => Err(format!("protocol {other:?}: must be ll, bulk or index")),
        }
    }
}

/// The suffix of a service's group: service `NAME` replies through the group `NAME.replies`.
pub const SERVICE_REPLIES_SUFFIX: &str = ".replies";
