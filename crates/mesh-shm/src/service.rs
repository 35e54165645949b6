//! Host ends of a fan-in channel and a channel group in the mailbox: a client's request sender, a host server's request receiver and reply sender, a client's reply receiver, and meshd's side of a service.
//!
//! Thin: each end is the layout-free core of `fanin` or `group` over the mailbox's mapping (which it
//! keeps alive), with its channel's name on every error and the same claim rules as the other ends.
//!
//! * [`FanInSender`]: a client's request end. Many per channel, so it claims nothing: its sender id
//!   (`slot | epoch << 16`, from [`ServiceOwner::connect`]) is what names it in the owner table.
//! * [`FanInReceiver`]: the single consumer (a host server), claiming the ring's consumer end.
//! * [`GroupServer`]: the program side of a group (replies, departures and their acknowledgements),
//!   claiming the group's producer end.
//! * [`GroupClient`]: one client's reply ring, claiming that ring's consumer end (the claim dies with
//!   the client, even by kill -9).
//! * [`ServiceOwner`]: meshd's side of a service (a fan-in channel and a group): connect, and the
//!   departure of a dead or detached client after its fan-in slots are completed (in every shard of
//!   a channel of shards: see `fanin::FanInShards`). One per mailbox:
//!   meshd's `flock` guarantees it, so it claims nothing. Its stall watcher revokes a live client
//!   that holds the fan-in ring ([`ServiceOwner::revoke_stalled`]), found through a [`FanInProbe`].
//!
//! ```
//! use std::time::Duration;
//! use mesh_shm::{FanInReceiver, FanInSender, GroupClient, GroupServer, ServiceOwner, Taken};
//! # use mesh_shm::{CreateMode, Mailbox, MailboxConfig};
//! # let dir = tempfile::tempdir()?;
//! # let mailbox = Mailbox::create(dir.path().join("mb"), &MailboxConfig::default(), CreateMode::Exclusive)?;
//! mailbox.create_fanin("kv", 64, 256, 1)?; // requests: 64 bytes, 256 in flight over all clients, one shard
//! mailbox.create_group("kv.replies", 8, 64, 16)?; // 8 clients, 16 replies of 64 bytes each
//!
//! // meshd binds a client (over the control socket, to come) and hands it its id.
//! let mut meshd = ServiceOwner::open(&mailbox, "kv", "kv.replies")?;
//! let id = meshd.connect(mesh_shm::claim::Holder::current())?;
//! let (mut tx, mut replies) = (FanInSender::open(&mailbox, "kv", id)?, GroupClient::claim(&mailbox, "kv.replies", id)?);
//!
//! // The server (a GPU program, usually).
//! let (mut rx, mut server) = (FanInReceiver::claim(&mailbox, "kv")?, GroupServer::claim(&mailbox, "kv.replies")?);
//!
//! tx.send(b"get a", Duration::from_secs(1))?;
//! let mut req = [0u8; 64];
//! assert_eq!(rx.take(&mut req, Duration::from_secs(1))?, Taken::Message { sender: id.0 });
//! server.reply(id, b"a = 1")?;
//! let mut rsp = [0u8; 64];
//! replies.recv(&mut rsp, Duration::from_secs(1))?;
//! assert!(rsp.starts_with(b"a = 1"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use crate::channel::EndClaim;
use crate::claim::{self, Holder};
use crate::error::{End, Result, ShmError};
use crate::fanin::{Completion, FanInCorrupt, FanInProducer, FanInShards, Hold, SendOp, ShardedConsumer, Step, Taken};
use crate::group::{ClientId, EntrySnapshot, GroupError, GroupMemory, GroupProgram, Replied, ReplyReceiver};
use crate::group::{ServiceMemory, ServiceMeshd};
use crate::mailbox::{ChannelInfo, Mailbox};
use crate::wait::{PollPause, WaitConfig, poll_until, poll_until_pausing};
use crate::window::ReplyWindow;

fn fanin_err(info: &ChannelInfo, corrupt: FanInCorrupt) -> ShmError {
    ShmError::FanIn { channel: info.name.clone(), corrupt }
}

/// An impossible state found in shard `shard` of a fan-in channel: the shard is named when there are several.
fn shard_err(info: &ChannelInfo, shard: u32, corrupt: FanInCorrupt) -> ShmError {
    if info.parts > 1 {
        ShmError::FanIn { channel: format!("{} (shard {shard} of {})", info.name, info.parts), corrupt }
    } else {
        fanin_err(info, corrupt)
    }
}

fn group_err(info: &ChannelInfo, error: GroupError) -> ShmError {
    ShmError::Group { channel: info.name.clone(), error }
}

fn size_error(info: &ChannelInfo, got: usize) -> ShmError {
    ShmError::MessageSize { channel: info.name.clone(), size: info.msg_size as usize, got }
}

fn timeout(info: &ChannelInfo, op: &'static str, waited: Duration) -> ShmError {
    ShmError::Timeout { channel: info.name.clone(), op, waited_ms: waited.as_millis() }
}

/// A client's request end of a fan-in channel: sends as its id, one message at a time, always into
/// the same shard (its client slot modulo the channel's shards), so its messages stay in order.
#[derive(Debug)]
pub struct FanInSender {
    core: FanInProducer,
    shard: u32,
    info: ChannelInfo,
    wait: WaitConfig,
    _mailbox: Mailbox,
}

impl FanInSender {
    /// The request end of fan-in channel `name` for the client meshd bound as `id` (its low 16 bits
    /// name it in the owner table: no other live sender may use them). Claims nothing.
    pub fn open(mailbox: &Mailbox, name: &str, id: ClientId) -> Result<Self> {
        let info = mailbox.channel(name)?;
        let shards = mailbox.fanin_memory(&info)?;
        let shard = shards.shard_of(id.0);
        let wait = mailbox.wait_config();
        Ok(Self { core: shards.producer(id.0), shard, info, wait, _mailbox: mailbox.clone() })
    }

    /// The shard it sends into: its client slot modulo the channel's shards (0 for one shard).
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The channel as it was when opened.
    pub fn info(&self) -> &ChannelInfo {
        &self.info
    }

    /// How this end's blocking calls wait: its mailbox handle's setting when it was opened, unless
    /// set since ([`set_wait_config`](Self::set_wait_config)).
    pub fn wait_config(&self) -> WaitConfig {
        self.wait
    }

    /// Sets how this end's blocking calls wait from now on (how long they spin before they yield).
    pub fn set_wait_config(&mut self, wait: WaitConfig) {
        self.wait = wait;
    }

    /// The sender id every message carries.
    pub fn id(&self) -> ClientId {
        ClientId(self.core.sender())
    }

    /// Sends one message (at most the message size; shorter is zero-padded); `false` when the ring
    /// has no room now. A `true` means it is committed exactly once (a reservation revoked under it
    /// is sent again).
    pub fn try_send(&mut self, msg: &[u8]) -> Result<bool> {
        if msg.len() > self.info.msg_size as usize {
            return Err(size_error(&self.info, msg.len()));
        }
        self.core.try_send(msg).map_err(|c| shard_err(&self.info, self.shard, c))
    }

    /// Sends one message, waiting for room up to `timeout`.
    pub fn send(&mut self, msg: &[u8], timeout_after: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout_after;
        match poll_until(deadline, self.wait, || Ok(self.try_send(msg)?.then_some(())))? {
            Some(()) => Ok(()),
            None => Err(timeout(&self.info, "send", timeout_after)),
        }
    }

    /// Advances the send `op` by one reservation, CAS or store ([`FanInProducer::step`]): what a test
    /// uses to stop a client at a chosen point of a send (between its reservation and its first
    /// store, or in the middle of its copy) and see what meshd does about it. Pass the same `msg`
    /// until [`Step::Sent`]; a [`Step::Revoked`] means the reservation was revoked under it and the
    /// next step sends the message anew.
    pub fn step(&mut self, op: &mut SendOp, msg: &[u8]) -> Result<Step> {
        if msg.len() > self.info.msg_size as usize {
            return Err(size_error(&self.info, msg.len()));
        }
        self.core.step(op, msg).map_err(|c| shard_err(&self.info, self.shard, c))
    }
}

/// The consumer end of a fan-in channel, for a host server: every message with its sender, and a
/// skip where a sender's send was cut off. A channel of shards is taken from round-robin, one slot at
/// a time from the next shard that has one: every sender's messages in its order, and no order
/// across senders of different shards.
#[derive(Debug)]
pub struct FanInReceiver {
    core: ShardedConsumer,
    info: ChannelInfo,
    wait: WaitConfig,
    _claim: EndClaim,
}

impl FanInReceiver {
    /// Claims the consumer end of fan-in channel `name` (the claim word of its shard 0's header, for
    /// every shard); each shard resumes at its published position.
    pub fn claim(mailbox: &Mailbox, name: &str) -> Result<Self> {
        let info = mailbox.channel(name)?;
        let shards = mailbox.fanin_memory(&info)?;
        let claim = EndClaim::take_of(mailbox, &info, End::Consumer)?;
        Ok(Self { core: ShardedConsumer::new(&shards), info, wait: mailbox.wait_config(), _claim: claim })
    }

    /// The channel as it was when claimed.
    pub fn info(&self) -> &ChannelInfo {
        &self.info
    }

    /// How this end's blocking calls wait: its mailbox handle's setting when it was claimed, unless
    /// set since ([`set_wait_config`](Self::set_wait_config)).
    pub fn wait_config(&self) -> WaitConfig {
        self.wait
    }

    /// Sets how this end's blocking calls wait from now on (how long they spin before they yield).
    pub fn set_wait_config(&mut self, wait: WaitConfig) {
        self.wait = wait;
    }

    /// Slots taken over the channel's life: for one shard the sequence number of the next slot to
    /// take; for several, the sum of their positions (modulo 2^64), [`FanInReceiver::positions`]
    /// saying each.
    pub fn position(&self) -> u64 {
        self.core.position()
    }

    /// Each shard's next sequence number to take, shard 0 first.
    pub fn positions(&self) -> Vec<u64> {
        self.core.positions()
    }

    /// The channel's shards.
    pub fn shards(&self) -> u32 {
        self.core.count()
    }

    /// Takes the next slot: a message (into `out`, exactly the message size) with its sender, a skip,
    /// or `None` when nothing is committed yet (in any shard).
    pub fn try_take(&mut self, out: &mut [u8]) -> Result<Option<Taken>> {
        Ok(self.try_take_shard(out)?.map(|(_, t)| t))
    }

    /// [`FanInReceiver::try_take`], saying which shard the slot was taken from.
    pub fn try_take_shard(&mut self, out: &mut [u8]) -> Result<Option<(u32, Taken)>> {
        if out.len() != self.info.msg_size as usize {
            return Err(size_error(&self.info, out.len()));
        }
        self.core.try_take(out).map_err(|(k, c)| shard_err(&self.info, k, c))
    }

    /// Takes the next slot, waiting up to `timeout`.
    pub fn take(&mut self, out: &mut [u8], timeout_after: Duration) -> Result<Taken> {
        let deadline = Instant::now() + timeout_after;
        poll_until(deadline, self.wait, || self.try_take(out))?
            .ok_or_else(|| timeout(&self.info, "take", timeout_after))
    }
}

/// The replying side of a group (a host server's; a GPU program's is mesh.cuh's, to come): a reply
/// to a client's id, and the departures it acknowledges.
#[derive(Debug)]
pub struct GroupServer {
    core: GroupProgram,
    info: ChannelInfo,
    _claim: EndClaim,
}

impl GroupServer {
    /// Claims the replying side of group `name` (the producer end of its header's claims); every
    /// reply ring resumes where the last server left it, and the first [`GroupServer::departures`]
    /// acknowledges what the last server had not.
    pub fn claim(mailbox: &Mailbox, name: &str) -> Result<Self> {
        let info = mailbox.channel(name)?;
        let group = mailbox.group_memory(&info)?;
        let claim = EndClaim::take_of(mailbox, &info, End::Producer)?;
        Ok(Self { core: GroupProgram::new(group), info, _claim: claim })
    }

    /// The group as it was when claimed.
    pub fn info(&self) -> &ChannelInfo {
        &self.info
    }

    /// Replies to client `to` (the sender a request carried): [`Replied::Gone`] when that client has
    /// left (its entry is no longer bound at its epoch), [`Replied::Full`] when its ring is full. An
    /// id beyond the table is an error naming the group.
    pub fn reply(&mut self, to: ClientId, msg: &[u8]) -> Result<Replied> {
        if msg.len() > self.info.msg_size as usize {
            return Err(size_error(&self.info, msg.len()));
        }
        self.core.reply(to, msg).map_err(|e| group_err(&self.info, e))
    }

    /// The clients that left since the last call, each acknowledged as it is returned: the caller
    /// drops their state and replies to them no more (their entries can then be reused).
    pub fn departures(&mut self) -> Result<Vec<ClientId>> {
        self.core.departures().map_err(|e| group_err(&self.info, e))
    }

    /// The core, for step-by-step use (`scan`, then `ack` after the last reply to that client).
    pub fn program(&mut self) -> &mut GroupProgram {
        &mut self.core
    }
}

/// One client's reply ring in a group: the consumer end of its own ring, claimed for this process.
#[derive(Debug)]
pub struct GroupClient {
    core: ReplyReceiver,
    info: ChannelInfo,
    wait: WaitConfig,
    mailbox: Mailbox,
    ring_offset: u64,
    holder: Holder,
}

impl GroupClient {
    /// Claims the reply ring of client `id` in group `name` (the consumer end of that ring); refused
    /// while a live process holds it. Its position is where meshd's connect put it.
    pub fn claim(mailbox: &Mailbox, name: &str, id: ClientId) -> Result<Self> {
        let info = mailbox.channel(name)?;
        let group = mailbox.group_memory(&info)?;
        let core = ReplyReceiver::new(&group, id).map_err(|e| group_err(&info, e))?;
        let ring_offset = group
            .reply_ring_offset(id.slot())
            .ok_or_else(|| group_err(&info, GroupError::UnknownClient { id: id.0, entries: group.entries() }))?;
        let holder = Holder::current();
        // Under the table lock, the group's descriptor read again first: never a claim on a
        // deleted service's ring.
        let part = format!("{name}[{}]", id.slot());
        mailbox.claim_word(&info, Self::word_at(mailbox, ring_offset), holder, &part, End::Consumer)?;
        Ok(Self { core, info, wait: mailbox.wait_config(), mailbox: mailbox.clone(), ring_offset, holder })
    }

    fn word_at(mailbox: &Mailbox, ring_offset: u64) -> &AtomicU64 {
        // The offset is a reply ring's, inside the group `group_memory` validated.
        &mailbox.ring_header(ring_offset).claims.consumer
    }

    /// The group as it was when claimed.
    pub fn info(&self) -> &ChannelInfo {
        &self.info
    }

    /// How this end's blocking calls wait: its mailbox handle's setting when it was claimed, unless
    /// set since ([`set_wait_config`](Self::set_wait_config)).
    pub fn wait_config(&self) -> WaitConfig {
        self.wait
    }

    /// Sets how this end's blocking calls wait from now on (how long they spin before they yield).
    pub fn set_wait_config(&mut self, wait: WaitConfig) {
        self.wait = wait;
    }

    /// The client's id.
    pub fn id(&self) -> ClientId {
        self.core.id()
    }

    /// Receives one reply into `out` (exactly the reply size); `false` when there is none yet.
    pub fn try_recv(&mut self, out: &mut [u8]) -> Result<bool> {
        if out.len() != self.info.msg_size as usize {
            return Err(size_error(&self.info, out.len()));
        }
        self.core.try_recv(out).map_err(|e| group_err(&self.info, e))
    }

    /// Receives one reply, waiting up to `timeout`.
    pub fn recv(&mut self, out: &mut [u8], timeout_after: Duration) -> Result<()> {
        let pause = self.wait.pause();
        self.recv_pausing(out, timeout_after, pause)
    }

    /// [`recv`](Self::recv) for a client that keeps `window` (requests sent, replies received):
    /// waiting as [`WaitConfig::pause_for_replies`] says for the requests it has in flight (a spin for its
    /// only one, a yield at once when it is streaming), and counting the reply in the window. What
    /// the clients of meshd's API (Rust and C) use.
    pub fn recv_in_window(&mut self, out: &mut [u8], timeout_after: Duration, window: &mut ReplyWindow) -> Result<()> {
        let pause = self.wait.pause_for_replies(window.unanswered());
        self.recv_pausing(out, timeout_after, pause)?;
        window.received();
        Ok(())
    }

    /// [`recv`](Self::recv), pausing between polls as `pause` says.
    fn recv_pausing(&mut self, out: &mut [u8], timeout_after: Duration, pause: PollPause) -> Result<()> {
        let deadline = Instant::now() + timeout_after;
        match poll_until_pausing(deadline, pause, || Ok(self.try_recv(out)?.then_some(())))? {
            Some(()) => Ok(()),
            None => Err(timeout(&self.info, "recv", timeout_after)),
        }
    }
}

impl Drop for GroupClient {
    fn drop(&mut self) {
        claim::release(Self::word_at(&self.mailbox, self.ring_offset), self.holder);
    }
}

/// meshd's side of a service: a fan-in channel of requests and a group of reply rings. It binds
/// clients and takes them back, completing a client's fan-in slots before its entry can be reused.
#[derive(Debug)]
pub struct ServiceOwner {
    core: ServiceMeshd,
    group: GroupMemory,
    fanin: FanInShards,
    fanin_info: ChannelInfo,
    group_info: ChannelInfo,
    _mailbox: Mailbox,
}

impl ServiceOwner {
    /// meshd's handle on the service made of fan-in channel `fanin` and group `group` (after a
    /// restart too: everything it needs is in the mailbox; run [`ServiceOwner::repair`] first then).
    pub fn open(mailbox: &Mailbox, fanin: &str, group: &str) -> Result<Self> {
        let fanin_info = mailbox.channel(fanin)?;
        let group_info = mailbox.channel(group)?;
        let ring = mailbox.fanin_memory(&fanin_info)?;
        let group_mem = mailbox.group_memory(&group_info)?;
        Ok(Self {
            core: ServiceMeshd::new(ServiceMemory { fanin: ring, group: group_mem }),
            group: group_mem,
            fanin: ring,
            fanin_info,
            group_info,
            _mailbox: mailbox.clone(),
        })
    }

    fn err(&self, e: GroupError) -> ShmError {
        match e {
            GroupError::FanIn(c) => fanin_err(&self.fanin_info, c),
            e => group_err(&self.group_info, e),
        }
    }

    /// Binds a new client (`holder`: its process, from the control socket's peer credentials):
    /// its id, or the reason no entry can be had (all bound, or waiting for the server's ack).
    pub fn connect(&mut self, holder: Holder) -> Result<ClientId> {
        self.core.connect(holder).map_err(|e| self.err(e))
    }

    /// A dead client (its pidfd readable): completes its fan-in slots, looking at every shard (the
    /// server takes a skip for a send it cut off), then departs its entry.
    pub fn depart_dead(&mut self, id: ClientId) -> Result<Completion> {
        self.core.depart_dead(id).map_err(|e| self.err(e))
    }

    /// A live client that detached: revokes its reservations, then departs its entry; refused while
    /// it is between the begin and the commit of a send.
    pub fn detach(&mut self, id: ClientId) -> Result<Completion> {
        self.core.detach(id).map_err(|e| self.err(e))
    }

    /// Writes the skip headers a completer that died left out, in every shard (a restarted meshd,
    /// first); returns how many.
    pub fn repair(&self) -> u32 {
        self.fanin.repair()
    }

    /// The fan-in channel's shards.
    pub fn shards(&self) -> u32 {
        self.fanin.count()
    }

    /// A live client that holds the fan-in ring (meshd's stall watcher): revokes what can be revoked
    /// while it lives (`fanin::revoke_live`); its entry stays bound. `stuck` counts a slot between
    /// its begin and its commit, which only the client's death can complete.
    pub fn revoke_stalled(&mut self, id: ClientId) -> Result<Completion> {
        self.core.revoke(id).map_err(|e| self.err(e))
    }

    /// A read-only view of the fan-in ring's stall words, for a watcher on another thread (it keeps
    /// the mapping alive and takes no lock: reading them never waits behind this owner).
    pub fn stall_probe(&self) -> FanInProbe {
        FanInProbe { ring: self.fanin, _mailbox: self._mailbox.clone() }
    }

    /// The bound clients and their holders (what a restarted meshd checks for liveness).
    pub fn bound(&self) -> Result<Vec<(ClientId, Option<Holder>)>> {
        self.core.group().bound().map_err(|e| self.err(e))
    }

    /// [`ServiceOwner::bound`] entry by entry: the bound clients of the entries that could be read,
    /// and an error naming each that could not (one damaged entry hides no other client).
    pub fn bound_each(&self) -> (Vec<(ClientId, Option<Holder>)>, Vec<ShmError>) {
        let (bound, corrupt) = self.core.group().bound_each();
        (bound, corrupt.into_iter().map(|e| self.err(e)).collect())
    }

    /// Entry `slot` as it stands.
    pub fn entry(&self, slot: u16) -> Result<EntrySnapshot> {
        self.group.snapshot(slot).map_err(|e| self.err(e))
    }
}

/// What meshd's stall watcher reads of a fan-in channel: in each shard, the reservation holding its
/// consumer, if any (`fanin::hold_at_tail`). Reads only; writes and claims nothing.
#[derive(Debug, Clone)]
pub struct FanInProbe {
    ring: FanInShards,
    _mailbox: Mailbox,
}

impl FanInProbe {
    /// The channel's shards.
    pub fn shards(&self) -> u32 {
        self.ring.count()
    }

    /// The reservation that holds shard `shard`'s consumer at its published position now, if one
    /// does; `None` too for a shard the channel does not have.
    pub fn hold(&self, shard: u32) -> Option<Hold> {
        (shard < self.ring.count()).then(|| crate::fanin::hold_at_tail(&self.ring.shard(shard))).flatten()
    }

    /// Every shard's hold, with the shard's index (shards that nothing holds left out).
    pub fn holds(&self) -> Vec<(u32, Hold)> {
        self.ring.holds()
    }
}
