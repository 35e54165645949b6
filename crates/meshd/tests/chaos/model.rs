//! What the chaos test asked meshd to hold (programs, native workers, channels, services, the
//! messages left queued), the mailbox's room as the test reads it from the descriptors, and the check
//! after every event that meshd and the mailbox hold exactly that.

use std::collections::{BTreeMap, BTreeSet};

use mesh_shm::layout::{LINE, ring_bytes_at};
use mesh_shm::{Mailbox, Placement, Protocol};
use meshd::protocol::{Info, Request};

use crate::DEADLINE;
use crate::common::wait_until;
use crate::daemon::{Daemon, try_ask};

/// A channel's shape, as the test asked for it (or, for a service's two, as the service makes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chan {
    pub msg_size: u32,
    pub capacity: u32,
    pub placement: Placement,
    pub protocol: Protocol,
    /// The descriptor's parts word: a bulk channel's parts, a fan-in channel's shards, a group's
    /// client slots; 1 otherwise.
    pub parts: u32,
}

impl Chan {
    /// Bytes its ring takes in the arena when it starts at `at` (the layout's own formula: what the
    /// model computes from it is where rings go and whether one fits, not the formula itself).
    pub fn bytes_at(&self, at: u64) -> Option<u64> {
        ring_bytes_at(at, self.msg_size, self.capacity, self.placement.code(), self.protocol.code(), self.parts)
    }

    fn of(c: &mesh_shm::ChannelInfo) -> Self {
        Self {
            msg_size: c.msg_size,
            capacity: c.capacity,
            placement: c.placement,
            protocol: c.protocol,
            parts: c.parts,
        }
    }

    /// Whether this process can send into it with a plain [`mesh_shm::Producer`] and read it back.
    pub fn host_plain(&self) -> bool {
        self.placement == Placement::Host && matches!(self.protocol, Protocol::Ll | Protocol::Index)
    }
}

/// What the test asked meshd to run.
#[derive(Debug, Default)]
pub struct Model {
    /// Program name → left stopped as a fault's culprit.
    pub programs: BTreeMap<String, bool>,
    /// Program name → the channels it binds.
    pub binds: BTreeMap<String, Vec<String>>,
    /// Every channel, a service's two included.
    pub channels: BTreeMap<String, Chan>,
    /// Messages this process sent into a channel that nobody consumes: still there, across every
    /// restart and crash, until the channel is deleted with discard.
    pub queued: BTreeMap<String, u64>,
    /// Channels whose two host ends this process holds for the run (the streams).
    pub streams: BTreeSet<String>,
    /// Services: each is channel `NAME` (fan-in) and channel `NAME.replies` (group).
    pub services: BTreeSet<String>,
    pub natives: BTreeSet<String>,
    pub next: u32,
}

impl Model {
    pub fn fresh(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}{}", self.next)
    }

    pub fn names(&self) -> Vec<String> {
        self.programs.keys().cloned().collect()
    }

    /// Channels a program may bind: ll and bulk (index channels have host ends only, a service's
    /// channels are bound by a serving program only).
    pub fn bindable(&self) -> Vec<String> {
        let ok = |c: &Chan| matches!(c.protocol, Protocol::Ll | Protocol::Bulk);
        self.channels.iter().filter(|(_, c)| ok(c)).map(|(n, _)| n.clone()).collect()
    }

    /// Index channels: a program binding one is refused.
    pub fn host_only(&self) -> Vec<String> {
        self.channels.iter().filter(|(_, c)| c.protocol == Protocol::Index).map(|(n, _)| n.clone()).collect()
    }

    /// Channels that are no service's: what `channel delete` may delete.
    pub fn plain_channels(&self) -> Vec<String> {
        let service = |c: &Chan| matches!(c.protocol, Protocol::FanIn | Protocol::Group);
        self.channels.iter().filter(|(_, c)| !service(c)).map(|(n, _)| n.clone()).collect()
    }

    /// Running programs that bind `channel` (a culprit left stopped holds no slot, so binds nothing).
    pub fn binders(&self, channel: &str) -> Vec<String> {
        let running = |p: &String| self.programs.get(p).is_some_and(|stopped| !stopped);
        self.binds
            .iter()
            .filter(|(p, b)| running(p) && b.iter().any(|c| c == channel))
            .map(|(p, _)| p.clone())
            .collect()
    }

    pub fn queued(&self, channel: &str) -> u64 {
        self.queued.get(channel).copied().unwrap_or(0)
    }

    /// Forgets channel `name` (deleted).
    pub fn drop_channel(&mut self, name: &str) {
        self.channels.remove(name);
        self.queued.remove(name);
    }
}

/// The mailbox's room for new channels, read from the descriptors this process maps: the free runs
/// between the live rings (each starting on a line), and the descriptors left.
#[derive(Debug)]
pub struct Room {
    runs: Vec<(u64, u64)>,
    pub free_descriptors: u32,
}

impl Room {
    /// Reads the live rings and checks them: every ring inside the arena, no two overlapping.
    pub fn read(mb: &Mailbox, what: &str) -> Self {
        let g = mb.geometry();
        let rings = live_rings(mb, what);
        let (start, end) = (g.arena_offset, g.arena_offset + g.arena_size);
        let mut runs = Vec::new();
        let mut cursor = start;
        for (s, e, name) in &rings {
            assert!(*s >= start && *e <= end, "{what}: the ring of {name} ({s}..{e}) lies outside the arena");
            let from = cursor.next_multiple_of(LINE);
            if from < *s {
                runs.push((from, *s));
            }
            cursor = *e;
        }
        let from = cursor.next_multiple_of(LINE);
        if from < end {
            runs.push((from, end));
        }
        let used = u32::try_from(rings.len()).unwrap_or(u32::MAX);
        Self { runs, free_descriptors: g.channel_count.saturating_sub(used) }
    }

    pub fn free(&self) -> u64 {
        self.runs.iter().map(|(s, e)| e - s).sum()
    }

    pub fn largest(&self) -> u64 {
        self.runs.iter().map(|(s, e)| e - s).max().unwrap_or(0)
    }

    /// Whether `rings`, made one after the other, all fit: a descriptor each, and each placed as the
    /// mailbox promises (best fit: the smallest free run it fits in, the lowest of equal ones, the
    /// ring at its start), what is left of that run staying free for the next.
    pub fn fits(&self, rings: &[Chan]) -> bool {
        if usize::try_from(self.free_descriptors).unwrap_or(0) < rings.len() {
            return false;
        }
        let mut runs = self.runs.clone();
        for ring in rings {
            let mut best: Option<(usize, u64)> = None;
            for (i, &(s, e)) in runs.iter().enumerate() {
                let Some(end) = ring.bytes_at(s).map(|n| s + n) else { return false };
                if end <= e && best.is_none_or(|(b, _)| e - s < runs[b].1 - runs[b].0) {
                    best = Some((i, end));
                }
            }
            let Some((i, end)) = best else { return false };
            runs[i].0 = end.next_multiple_of(LINE);
        }
        true
    }
}

/// The live rings, `(start, end, name)`, lowest first; fails the test on a descriptor that does not
/// read, and on two rings that overlap (a ring two channels share).
fn live_rings(mb: &Mailbox, what: &str) -> Vec<(u64, u64, String)> {
    let channels = mb.channels().unwrap_or_else(|e| panic!("{what}: the channel table does not read: {e}"));
    let mut rings: Vec<(u64, u64, String)> = channels
        .iter()
        .map(|c| {
            let bytes = Chan::of(c).bytes_at(c.ring_offset);
            let bytes = bytes.unwrap_or_else(|| panic!("{what}: channel {} has no size in this build", c.name));
            (c.ring_offset, c.ring_offset + bytes, c.name.clone())
        })
        .collect();
    rings.sort();
    for pair in rings.windows(2) {
        let ((_, end, a), (start, _, b)) = (&pair[0], &pair[1]);
        assert!(start >= end, "{what}: the rings of {a} (to {end}) and {b} (from {start}) overlap");
    }
    rings
}

/// Waits until meshd shows exactly `m`: every program in its state, every native worker running,
/// every channel; then checks the mailbox against it (the channels' shapes, the messages queued,
/// the descriptors and the arena's bytes, as the mailbox and `info` report them). `what` names the
/// event for the failure message. Returns the native workers' pids.
pub fn agrees(d: &Daemon, mb: &Mailbox, m: &Model, what: &str) -> Vec<u32> {
    let mut last = String::new();
    let mut pids = Vec::new();
    let mut shown: Option<Info> = None;
    let same = wait_until(DEADLINE, || {
        let Some(ps) = try_ask(&d.socket(), &Request::Ps, &[]) else { return false };
        let Some(info) = try_ask(&d.socket(), &Request::Info, &[]).and_then(|r| r.info) else { return false };
        let programs: BTreeMap<String, bool> = ps
            .programs
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                let faulted = p.state.starts_with("faulted");
                (p.name, faulted)
            })
            .collect();
        let natives = ps.natives.unwrap_or_default();
        let running: BTreeSet<String> =
            natives.iter().filter(|n| n.state == "running").map(|n| n.name.clone()).collect();
        let channels: BTreeSet<&String> = info.channels.iter().map(|c| &c.name).collect();
        let services: BTreeSet<&String> = info.services.iter().map(|s| &s.name).collect();
        pids = natives.iter().map(|n| n.pid).collect();
        last = format!("programs {programs:?}, natives {natives:?}, channels {channels:?}, services {services:?}");
        let same = programs == m.programs
            && running == m.natives
            && natives.len() == m.natives.len()
            && channels == m.channels.keys().collect()
            && services == m.services.iter().collect();
        shown = Some(info);
        same
    });
    assert!(same, "after {what}: meshd shows {last}\nthe test asked for {m:?}\nmeshd's log:\n{}", d.log_text());
    let info = shown.expect("answered");
    for c in &info.channels {
        let Some(want) = m.channels.get(&c.name) else { continue };
        let shape = (c.msg_size, c.capacity, c.parts, c.placement.as_str());
        let placement = if want.placement == Placement::Host { "host" } else { "device" };
        // The fan-in channel's row gives its shards, the group's its client slots: the parts word.
        assert_eq!(shape, (want.msg_size, want.capacity, want.parts, placement), "after {what}: channel {}", c.name);
        if !m.streams.contains(&c.name) {
            assert_eq!(
                c.head.wrapping_sub(c.tail),
                m.queued(&c.name),
                "after {what}: messages queued on {} (nobody consumes them)",
                c.name
            );
        }
    }
    let room = Room::read(mb, what);
    let usage = mb.arena_usage();
    let arena = mb.geometry().arena_size;
    let count = u32::try_from(m.channels.len()).unwrap_or(u32::MAX);
    assert_eq!(
        (usage.descriptors_in_use, usage.free, usage.largest_free, usage.in_use),
        (count, room.free(), room.largest(), arena - room.free()),
        "after {what}: the mailbox's arena_usage (descriptors, free, largest free run, in use) against the rings \
         its descriptors name"
    );
    let row = info.arena.unwrap_or_else(|| panic!("after {what}: info has no arena row"));
    assert_eq!(
        (row.descriptors_in_use, row.descriptors_total, row.in_use_bytes, row.free_bytes, row.largest_free_bytes),
        (usage.descriptors_in_use, usage.descriptors_total, usage.in_use, usage.free, usage.largest_free),
        "after {what}: info's arena row against the mailbox's"
    );
    pids
}
