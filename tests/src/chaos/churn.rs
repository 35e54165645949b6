//! Channels and services the chaos test makes and deletes while the streams run: which live, what
//! each holds, and what meshd must answer to each delete. No stream program binds them, so no
//! stream may notice.

use std::collections::{BTreeMap, BTreeSet};

use super::schedule::Rng;

/// At most this many churn channels live at once (the mailbox's descriptors are shared with the
/// streams' channels and the native workers').
pub const MAX_CHURN_CHANNELS: usize = 8;
/// At most this many churn services live at once (two descriptors each).
pub const MAX_CHURN_SERVICES: usize = 2;

/// A channel made by the churn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChurnChannel {
    /// Bytes per message.
    pub msg_size: u32,
    /// Messages the ring holds.
    pub capacity: u32,
    /// `host` or `device` (a device ring's GPU memory is freed by its delete: the run's memory check
    /// sees a leak).
    pub placement: &'static str,
    /// Messages the test left on it (host channels only; nobody consumes them).
    pub queued: u64,
}

impl ChurnChannel {
    /// `meshd channel create`'s arguments for it.
    pub fn create_args(&self, name: &str) -> Vec<String> {
        let mut args: Vec<String> = ["channel", "create", name].iter().map(|s| (*s).to_string()).collect();
        for (flag, value) in [
            ("--msg-size", self.msg_size.to_string()),
            ("--capacity", self.capacity.to_string()),
            ("--placement", self.placement.to_string()),
        ] {
            args.extend([flag.to_string(), value]);
        }
        args
    }
}

/// What a delete must be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Deleted, dropping this many messages.
    Deleted(u64),
    /// Refused: it holds this many messages and the delete did not discard them (the refusal counts them).
    Queued(u64),
}

/// The churn's channels and services.
#[derive(Debug, Default)]
pub struct Churn {
    /// Channel name → what it is and holds.
    pub channels: BTreeMap<String, ChurnChannel>,
    /// Services (each its channels `NAME` and `NAME.replies`).
    pub services: BTreeSet<String>,
    next: u32,
}

impl Churn {
    /// A fresh name with `prefix`.
    pub fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }

    /// A new channel to create (not yet recorded: [`Churn::made`] records it once meshd made it), or
    /// `None` when [`MAX_CHURN_CHANNELS`] live. In device memory one time in three where `device` is
    /// allowed (blink mode); in the mailbox 8 B to 4 KiB messages, 2 to 256 of them.
    pub fn new_channel(&mut self, rng: &mut Rng, device: bool) -> Option<(String, ChurnChannel)> {
        if self.channels.len() >= MAX_CHURN_CHANNELS {
            return None;
        }
        let c = if device && rng.below(3) == 0 {
            // Large enough (256 KiB to 16 MiB of GPU memory) that rings never freed show in the
            // GPU's memory in use at the end.
            ChurnChannel {
                msg_size: 4096 << rng.below(5),
                capacity: 64 << rng.below(3),
                placement: "device",
                queued: 0,
            }
        } else {
            ChurnChannel { msg_size: 8 << rng.below(10), capacity: 2 << rng.below(8), placement: "host", queued: 0 }
        };
        Some((self.fresh("churn"), c))
    }

    /// Records a channel meshd made.
    pub fn made(&mut self, name: String, c: ChurnChannel) {
        self.channels.insert(name, c);
    }

    /// A host channel to leave messages on, if any, and how many more it holds.
    pub fn to_queue(&self, rng: &mut Rng) -> Option<(String, u64)> {
        let open: Vec<(&String, u64)> = self
            .channels
            .iter()
            .filter(|(_, c)| c.placement == "host")
            .map(|(n, c)| (n, u64::from(c.capacity).saturating_sub(c.queued)))
            .filter(|(_, room)| *room > 0)
            .collect();
        rng.pick(&open).map(|(n, room)| ((*n).clone(), *room))
    }

    /// Counts `n` messages left on channel `name`.
    pub fn queued(&mut self, name: &str, n: u64) {
        if let Some(c) = self.channels.get_mut(name) {
            c.queued += n;
        }
    }

    /// A channel to delete and whether to discard, if any live.
    pub fn to_delete(&self, rng: &mut Rng) -> Option<(String, bool)> {
        let names: Vec<&String> = self.channels.keys().collect();
        let name = (*rng.pick(&names)?).clone();
        Some((name, rng.below(2) == 0))
    }

    /// What deleting channel `name` (a churn channel) with `discard` must be answered.
    pub fn expect_delete(&self, name: &str, discard: bool) -> Expect {
        let queued = self.channels.get(name).map_or(0, |c| c.queued);
        if queued > 0 && !discard { Expect::Queued(queued) } else { Expect::Deleted(queued) }
    }

    /// Forgets a deleted channel.
    pub fn deleted(&mut self, name: &str) {
        self.channels.remove(name);
    }
}

/// The messages `meshd channel delete` or `meshd service delete` says it discarded: "(no message
/// discarded)", "(1 message discarded)", "(N messages discarded)". `None` when the output says
/// neither.
pub fn discarded_in(output: &str) -> Option<u64> {
    if output.contains("(no message discarded)") {
        return Some(0);
    }
    let (before, _) = output.split_once(" discarded)")?;
    let (_, count) = before.rsplit_once('(')?;
    count.split_whitespace().next()?.parse().ok()
}
