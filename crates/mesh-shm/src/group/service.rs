//! A service's core over raw memory: a fan-in ring of requests paired with a group of reply rings, for meshd, a client and a host server.

use std::time::{Duration, Instant};

use super::meshd::GroupMeshd;
use core::sync::atomic::Ordering;

use super::memory::{ClientId, EntryState, GroupError, GroupMemory, Replied};
use super::program::{GroupProgram, ReplyReceiver};
use crate::claim::Holder;
use crate::fanin::{Completion, FanInProducer, FanInShards, ShardedConsumer, Taken};

/// A service's two objects: the fan-in ring of requests and the group of reply rings.
#[derive(Debug, Clone, Copy)]
pub struct ServiceMemory {
    /// The requests: any number of clients, one consumer (the program), over one or more shards.
    pub fanin: FanInShards,
    /// The replies: one ring per client slot.
    pub group: GroupMemory,
}

/// meshd's side of a service: connect, and departures with the completion of the client's fan-in
/// slots first (the entry is departed, and so reusable, only once no fan-in slot is the client's).
#[derive(Debug)]
pub struct ServiceMeshd {
    svc: ServiceMemory,
    group: GroupMeshd,
}

impl ServiceMeshd {
    /// meshd's handle on a service.
    pub fn new(svc: ServiceMemory) -> Self {
        Self { svc, group: GroupMeshd::new(svc.group) }
    }

    /// Binds a new client (see [`GroupMeshd::connect`]).
    pub fn connect(&mut self, holder: Holder) -> Result<ClientId, GroupError> {
        self.group.connect(holder)
    }

    /// A dead client (its pidfd readable): completes its fan-in slots, then departs its entry.
    pub fn depart_dead(&mut self, id: ClientId) -> Result<Completion, GroupError> {
        self.check_bound(id)?;
        let done = self.svc.fanin.complete_dead(id.0);
        self.group.depart(id)?;
        Ok(done)
    }

    /// A live client that detached (said goodbye, or closed its socket): revokes what it may still
    /// hold, then departs its entry; refused while it is between the begin and the commit of a send.
    pub fn detach(&mut self, id: ClientId) -> Result<Completion, GroupError> {
        self.check_bound(id)?;
        let done = self.svc.fanin.revoke_live(id.0);
        if done.stuck > 0 {
            return Err(GroupError::StillSending { id: id.0, stuck: done.stuck });
        }
        self.group.depart(id)?;
        Ok(done)
    }

    /// A live client that holds the fan-in ring (meshd's stall watcher found it stalled): revokes
    /// what can be revoked while it lives ([`crate::fanin::revoke_live`], over every shard: a
    /// reservation not begun becomes a skip, a committed slot is finished; one between begin and
    /// commit is counted in `stuck`). Its entry stays bound: the client goes on, and sends a revoked
    /// request again.
    pub fn revoke(&mut self, id: ClientId) -> Result<Completion, GroupError> {
        self.check_bound(id)?;
        Ok(self.svc.fanin.revoke_live(id.0))
    }

    fn check_bound(&self, id: ClientId) -> Result<(), GroupError> {
        let (_, epoch, state) = self.svc.group.binding_of(id.slot(), Ordering::Relaxed).map_err(|err| match err {
            GroupError::UnknownClient { entries, .. } => GroupError::UnknownClient { id: id.0, entries },
            err => err,
        })?;
        if state != EntryState::Bound || ClientId::new(id.slot(), epoch) != id {
            return Err(GroupError::NotBound { id: id.0, epoch, state });
        }
        Ok(())
    }

    /// The group's side (for a restarted meshd's checks).
    pub fn group(&self) -> &GroupMeshd {
        &self.group
    }
}

/// A client of a service: its fan-in producer (sending as its id) and its own reply ring.
#[derive(Debug)]
pub struct ServiceClient {
    fanin: FanInShards,
    tx: FanInProducer,
    rx: ReplyReceiver,
}

/// Waits for `f` to say yes, yielding between tries, until `timeout`.
fn wait(timeout: Duration, mut f: impl FnMut() -> Result<bool, GroupError>) -> Result<(), GroupError> {
    let start = Instant::now();
    loop {
        if f()? {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(GroupError::Timeout);
        }
        std::thread::yield_now();
    }
}

impl ServiceClient {
    /// The client meshd bound as `id`.
    pub fn new(svc: &ServiceMemory, id: ClientId) -> Result<Self, GroupError> {
        Ok(Self { fanin: svc.fanin, tx: svc.fanin.producer(id.0), rx: ReplyReceiver::new(&svc.group, id)? })
    }

    /// Its id.
    pub fn id(&self) -> ClientId {
        self.rx.id()
    }

    /// Sends one request (shorter ones are zero-padded); `false` when the fan-in ring has no room.
    pub fn try_send(&mut self, msg: &[u8]) -> Result<bool, GroupError> {
        let msg_size = self.fanin.msg_size();
        if msg.len() > msg_size {
            return Err(GroupError::TooLong { len: msg.len(), msg_size });
        }
        Ok(self.tx.try_send(msg)?)
    }

    /// Sends one request, waiting for room up to `timeout`.
    pub fn send(&mut self, msg: &[u8], timeout: Duration) -> Result<(), GroupError> {
        wait(timeout, || self.try_send(msg))
    }

    /// Receives one reply (`out`: exactly the reply size); `false` when there is none yet.
    pub fn try_recv(&mut self, out: &mut [u8]) -> Result<bool, GroupError> {
        self.rx.try_recv(out)
    }

    /// Receives one reply, waiting up to `timeout`.
    pub fn recv(&mut self, out: &mut [u8], timeout: Duration) -> Result<(), GroupError> {
        wait(timeout, || self.rx.try_recv(out))
    }
}

/// A host server of a service (the program's role): the fan-in consumer and the group's program side.
#[derive(Debug)]
pub struct ServiceServer {
    fanin: FanInShards,
    rx: ShardedConsumer,
    group: GroupProgram,
}

impl ServiceServer {
    /// Takes over the server's side (at the fan-in ring's published `tail`, each reply ring where the
    /// last server left it).
    pub fn new(svc: &ServiceMemory) -> Self {
        Self { fanin: svc.fanin, rx: ShardedConsumer::new(&svc.fanin), group: GroupProgram::new(svc.group) }
    }

    /// Takes the next request (into `out`, exactly the request size) with its sender, or a skip (a
    /// sender cut off by its death or revoked), or `None`.
    pub fn try_take(&mut self, out: &mut [u8]) -> Result<Option<Taken>, GroupError> {
        let msg_size = self.fanin.msg_size();
        if out.len() != msg_size {
            return Err(GroupError::BadBuffer { len: out.len(), msg_size });
        }
        Ok(self.rx.try_take(out).map_err(|(_, c)| c)?.map(|(_, t)| t))
    }

    /// Replies to `sender` (the id a taken request carried). See [`GroupProgram::reply`].
    pub fn reply(&mut self, sender: u32, msg: &[u8]) -> Result<Replied, GroupError> {
        self.group.reply(ClientId(sender), msg)
    }

    /// The clients that left since the last call, acknowledged (see [`GroupProgram::departures`]).
    pub fn departures(&mut self) -> Result<Vec<ClientId>, GroupError> {
        self.group.departures()
    }

    /// The group's program side, for step-by-step use.
    pub fn group(&mut self) -> &mut GroupProgram {
        &mut self.group
    }
}
