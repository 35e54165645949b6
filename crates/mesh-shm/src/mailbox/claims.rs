//! A host end's claim taken under the table lock, the descriptor read again first: never a claim word written in a ring that a delete has freed.
//!
//! An end looks its channel up, then claims one of its ring's claim words. Between the two, the
//! channel can be deleted and its ring's bytes handed to another channel (or to a new channel of
//! the same name elsewhere): a CAS made then would write a process's id into another channel's
//! header or message slots. So the CAS is made under the table lock, which every creation and
//! deletion holds from its checks to its last store, right after the descriptor is read again and
//! found to be the one looked up (same slot of the table, name, ring offset and shape). A delete
//! either ran before (the end is refused with [`ShmError::Deleted`], and nothing was written) or
//! runs after and sees the claim (and refuses, naming the holder).
//!
//! A claim may wait for an exiting holder (`claim::DYING_HOLDER_WAIT`): it waits with the lock
//! released and reads the descriptor again at every try, so no creation waits behind it.

use std::sync::atomic::AtomicU64;
use std::time::Instant;

use super::channels::TableLock;
use super::handle::{ChannelInfo, Mailbox};
use crate::claim::{self, Attempt, Holder};
use crate::error::{End, Result, ShmError};

impl Mailbox {
    /// Claims `word` for `me`: a claim word of the ring of channel `info` (as looked up before),
    /// taken only while the channel is still live in the same descriptor with the same name, ring
    /// offset and shape. [`ShmError::Deleted`] when it is not (nothing written), and
    /// [`ShmError::Claimed`] when a live process holds the word; both name `channel` (the channel's
    /// name, or the part of it claimed) and `end`.
    pub(crate) fn claim_word(
        &self,
        info: &ChannelInfo,
        word: &AtomicU64,
        me: Holder,
        channel: &str,
        end: End,
    ) -> Result<Option<Holder>> {
        let mut dying_since: Option<Instant> = None;
        loop {
            let attempt = {
                let _lock = TableLock::take(&self.header().table_lock);
                if !self.still_the_channel(info) {
                    return Err(ShmError::Deleted { channel: channel.to_string(), end });
                }
                claim::claim_once(word, me)
            };
            match attempt {
                Attempt::Claimed(replaced) => return Ok(replaced),
                Attempt::Dying(_)
                    if dying_since.get_or_insert_with(Instant::now).elapsed() < claim::DYING_HOLDER_WAIT =>
                {
                    std::thread::sleep(claim::DYING_HOLDER_POLL);
                }
                Attempt::Dying(h) | Attempt::Held(h) => {
                    return Err(ShmError::Claimed { channel: channel.to_string(), end, pid: h.pid });
                }
            }
        }
    }

    /// Whether descriptor `info.index` still describes the channel `info` was read from (called
    /// under the table lock, so no creation or deletion is half done).
    fn still_the_channel(&self, info: &ChannelInfo) -> bool {
        self.live_desc(info.index).ok().flatten().is_some_and(|d| {
            (d.name.as_str(), d.ring_offset, d.msg_size, d.capacity, d.placement, d.protocol, d.parts)
                == (
                    info.name.as_str(),
                    info.ring_offset,
                    info.msg_size,
                    info.capacity,
                    info.placement,
                    info.protocol,
                    info.parts,
                )
        })
    }
}
