//! The chaos schedule's events: what each asks of meshd, and what meshd must answer given what the
//! model holds (a create that does not fit, or a delete of what is in use, refused with its reason).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mesh_shm::{Consumer, Mailbox, Placement, Producer, Protocol};
use meshd::protocol::{Request, Response};
use meshd::service_client::ServiceClient;

use crate::DEADLINE;
use crate::backend::FAULT_PTX;
use crate::common::{PTX, load_req, wait_until};
use crate::daemon::{Daemon, Rng};
use crate::model::{Chan, Model, Room, agrees};
use crate::streams::fill;
use crate::{PTX_V2, SLOTS};

/// A load of `name` whose image is `image` (`image_len` must match the bytes that follow).
pub fn load_of(name: &str, bind: &[&str], image: &[u8]) -> Request {
    match load_req(name, bind) {
        Request::Load { grid, block, shared_mem, bind, sms, no_readiness, .. } => Request::Load {
            name: name.into(),
            image_len: image.len(),
            grid,
            block,
            shared_mem,
            bind,
            sms,
            no_readiness,
        },
        other => other,
    }
}

pub fn spawn_req(name: &str) -> Request {
    Request::Spawn {
        name: name.into(),
        bind: Vec::new(),
        // exec: the worker is meshd's direct child, so PDEATHSIG reaches it when meshd is killed.
        // bash: dash (/bin/sh on Debian) cannot redirect to a descriptor above 9, and the ready pipe
        // of a meshd with many descriptors open is one.
        command: vec!["/bin/bash".into(), "-c".into(), "echo ready >&$MESH_READY_FD; exec sleep 1000".into()],
        ready_timeout_ms: 10_000,
    }
}

pub fn channel_req(name: &str, c: Chan) -> Request {
    Request::ChannelCreate {
        name: name.into(),
        msg_size: c.msg_size,
        capacity: c.capacity,
        placement: if c.placement == Placement::Device { "device" } else { "host" }.into(),
        protocol: c.protocol.to_string(),
        parts: c.parts,
    }
}

/// A service's two channels: its fan-in channel (requests) and its group (one reply ring per client).
pub fn service_rings(clients: u32, msg_size: u32, capacity: u32, reply_capacity: u32) -> [Chan; 2] {
    let host =
        |msg_size, capacity, protocol, parts| Chan { msg_size, capacity, placement: Placement::Host, protocol, parts };
    [host(msg_size, capacity, Protocol::FanIn, 1), host(msg_size, reply_capacity, Protocol::Group, clients)]
}

pub fn service_req(name: &str, clients: u32, msg_size: u32, capacity: u32, reply_capacity: u32) -> Request {
    Request::ServiceCreate {
        name: name.into(),
        clients,
        msg_size,
        capacity,
        reply_size: None,
        reply_capacity,
        shards: 1,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Load,
    Upgrade,
    Unload,
    RefusedLoad,
    ChannelCreate,
    ChannelDelete,
    Queue,
    ServiceCreate,
    ServiceDelete,
    Spawn,
    Stop,
    Fault,
    Kill9,
    /// A `kill -9` of meshd while a load is on its way.
    Kill9DuringLoad,
    Restart,
}

/// The schedule's weights: orderly changes most, crashes and faults now and then; as many channel
/// and service deletes as creates, so that the table and the arena fill up, empty and fill again.
const WEIGHTS: [(Kind, usize); 15] = [
    (Kind::Load, 14),
    (Kind::Upgrade, 12),
    (Kind::Unload, 12),
    (Kind::RefusedLoad, 4),
    (Kind::ChannelCreate, 10),
    (Kind::ChannelDelete, 12),
    (Kind::Queue, 4),
    (Kind::ServiceCreate, 3),
    (Kind::ServiceDelete, 3),
    (Kind::Spawn, 5),
    (Kind::Stop, 5),
    (Kind::Fault, 2),
    (Kind::Kill9, 5),
    (Kind::Kill9DuringLoad, 2),
    (Kind::Restart, 3),
];

pub fn draw(rng: &mut Rng) -> Kind {
    let total: usize = WEIGHTS.iter().map(|w| w.1).sum();
    let mut at = rng.below(total);
    for (kind, w) in WEIGHTS {
        if at < w {
            return kind;
        }
        at -= w;
    }
    Kind::Load
}

/// At most this many faults: meshd relaunches after at most 8 replacements of the process within 60 s.
const MAX_FAULTS: usize = 4;
/// At most this many native workers at once: every restart starts each again, so a long run that
/// let them pile up would time restarts, not meshd.
const MAX_NATIVES: usize = 6;

/// What one drawn event did.
pub enum Outcome {
    /// Nothing to apply it to (no program to upgrade, the faults' bound reached).
    Skipped,
    /// Applied; meshd stayed up.
    Done,
    /// Applied; meshd was away this long (a crash, a restart, a fault's replacement of the process).
    Away(Duration),
}

/// The daemon under chaos, the model of what it holds, and the tally of the refusals it gave.
pub struct Chaos {
    pub d: Daemon,
    pub m: Model,
    pub mb: Mailbox,
    pub rng: Rng,
    pub faults: usize,
    /// Refusals the model called for, by reason.
    pub refusals: BTreeMap<&'static str, usize>,
    /// Programs adopted after a `kill -9`.
    pub adoptions: usize,
    /// Loads a `kill -9` met: answered, run without an answer, left nothing.
    pub loads_cut: [usize; 3],
}

/// Each running program's slot, generation and whether it was adopted, as `ps` shows them.
fn running(d: &Daemon) -> BTreeMap<String, (u32, u32, bool)> {
    let rows = d.ok(&Request::Ps, &[]).programs.unwrap_or_default();
    rows.into_iter().filter(|r| r.state == "running").map(|r| (r.name, (r.slot, r.generation, r.adopted))).collect()
}

/// Whether `err` names one of `any`.
fn names(err: &str, any: &[&str]) -> bool {
    any.iter().any(|w| err.contains(w))
}

fn refused(r: Response, what: &str) -> String {
    assert!(!r.ok, "{what} must be refused, and meshd did it");
    r.error.unwrap_or_default()
}

impl Chaos {
    fn refusal(&mut self, why: &'static str) {
        *self.refusals.entry(why).or_default() += 1;
    }

    /// Applies one event.
    pub fn apply(&mut self, kind: Kind) -> Outcome {
        let rng = &mut self.rng;
        let channels = self.m.bindable();
        // A program left stopped holds no slot; a load, or its upgrade, takes one again.
        let full = self.m.programs.values().filter(|held| !**held).count() >= SLOTS as usize;
        let refused_for_slots = |r: Response, what: &str| {
            let err = refused(r, what);
            assert!(err.contains("slots"), "{what} with every slot taken is refused, naming why: {err}");
        };
        let (d, m) = (&mut self.d, &mut self.m);
        match kind {
            Kind::Load => {
                let name = m.fresh("p");
                let binds: Vec<&str> =
                    (0..rng.below(3)).filter_map(|_| rng.pick(&channels).map(String::as_str)).collect();
                if full {
                    refused_for_slots(d.ask(&load_req(&name, &binds), PTX), "a load");
                    self.refusal("load: every slot taken");
                    return Outcome::Done;
                }
                d.ok(&load_req(&name, &binds), PTX);
                m.binds.insert(name.clone(), binds.iter().map(|b| b.to_string()).collect());
                m.programs.insert(name, false);
            }
            Kind::Upgrade => {
                let Some(name) = rng.pick(&m.names()).cloned() else { return Outcome::Skipped };
                if full && m.programs[&name] {
                    // Left stopped, it runs again only in a slot of its own.
                    let r = d.ask(&Request::Upgrade { name: name.clone(), image_len: PTX_V2.len() }, PTX_V2);
                    refused_for_slots(r, &format!("the upgrade of {name}, left stopped,"));
                    self.refusal("upgrade: every slot taken");
                    return Outcome::Done;
                }
                let r = d.ok(&Request::Upgrade { name: name.clone(), image_len: PTX_V2.len() }, PTX_V2);
                assert_eq!(r.programs.unwrap_or_default()[0].state, "running", "upgrade of {name}");
                // An upgrade runs a program left stopped again.
                m.programs.insert(name, false);
            }
            Kind::Unload => {
                let Some(name) = rng.pick(&m.names()).cloned() else { return Outcome::Skipped };
                d.ok(&Request::Unload { name: name.clone() }, &[]);
                m.programs.remove(&name);
                m.binds.remove(&name);
            }
            Kind::RefusedLoad => {
                let name = m.fresh("bad");
                let host_only = m.host_only();
                let (r, why) = if rng.below(2) == 0 {
                    let junk = b"no image at all";
                    (d.ask(&load_of(&name, &[], junk), junk), "image")
                } else if let Some(h) = rng.pick(&host_only).filter(|_| rng.below(2) == 0) {
                    // A program binding an index channel (host ends only) is refused, naming it.
                    (d.ask(&load_req(&name, &[h.as_str()]), PTX), h.as_str())
                } else {
                    (d.ask(&load_req(&name, &["no-such-channel"]), PTX), "no-such-channel")
                };
                let err = refused(r, "a bad load");
                // With every slot taken the backend may name that first: a reason all the same.
                let named = err.contains(why) || (full && err.contains("slots"));
                assert!(named, "a bad load is refused with its reason: {err}");
            }
            Kind::ChannelCreate => {
                let name = m.fresh("c");
                let shape = self.draw_channel();
                self.create(&name, shape);
            }
            Kind::ChannelDelete => self.channel_delete(),
            Kind::Queue => return self.queue(),
            Kind::ServiceCreate => self.service_create(),
            Kind::ServiceDelete => return self.service_delete(),
            Kind::Spawn => {
                if m.natives.len() >= MAX_NATIVES {
                    return Outcome::Skipped;
                }
                let name = m.fresh("n");
                d.ok(&spawn_req(&name), &[]);
                m.natives.insert(name);
            }
            Kind::Stop => {
                let natives: Vec<String> = m.natives.iter().cloned().collect();
                let Some(name) = rng.pick(&natives).cloned() else { return Outcome::Skipped };
                d.ok(&Request::Stop { name: name.clone() }, &[]);
                m.natives.remove(&name);
            }
            Kind::Fault => {
                if self.faults >= MAX_FAULTS || full {
                    return Outcome::Skipped;
                }
                self.faults += 1;
                let name = m.fresh("fault");
                let pid = d.child.id();
                let t = Instant::now();
                d.ok(&load_of(&name, &[], FAULT_PTX), FAULT_PTX);
                m.programs.insert(name.clone(), true);
                m.binds.insert(name.clone(), Vec::new());
                agrees(d, &self.mb, m, &format!("the sticky fault of {name}"));
                assert_eq!(d.child.id(), pid, "the replacement keeps the pid");
                assert!(d.child.try_wait().unwrap().is_none(), "the replaced meshd still runs");
                return Outcome::Away(t.elapsed());
            }
            Kind::Kill9 => {
                // Half the kills are followed by a start that adopts what ran on (MPS mode under an
                // orphan grace), half by one that relaunches it.
                let adopt = rng.below(2) == 0;
                let before = running(d);
                let t = Instant::now();
                d.kill9_and_restart_adopting(adopt);
                let away = t.elapsed();
                let after = running(d);
                for (name, (slot, generation, _)) in &before {
                    let now = after.get(name).unwrap_or_else(|| panic!("{name} runs after the kill -9: {after:?}"));
                    if adopt {
                        assert_eq!(*now, (*slot, *generation, true), "{name} adopted in its slot, at its generation");
                    } else {
                        assert!(!now.2, "{name} relaunched, not adopted: {before:?} -> {now:?}");
                    }
                }
                self.adoptions += usize::from(adopt) * before.len();
                return Outcome::Away(away);
            }
            Kind::Kill9DuringLoad => {
                if full {
                    return Outcome::Skipped;
                }
                let name = m.fresh("p");
                let socket = d.socket();
                let req = load_req(&name, &[]);
                let loading = std::thread::spawn(move || crate::daemon::try_ask(&socket, &req, PTX));
                std::thread::sleep(Duration::from_micros(rng.below(3000) as u64));
                let adopt = rng.below(2) == 0;
                let t = Instant::now();
                d.kill9_and_restart_adopting(adopt);
                let away = t.elapsed();
                let answer = loading.join().expect("the loading client");
                let now = running(d);
                // Answered, the load is recorded and runs after the restart; cut off, it either ran
                // (recorded before the kill) or left nothing, never a slot without a program.
                let answered = answer.as_ref().is_some_and(|r| r.ok);
                if answered {
                    assert!(
                        now.contains_key(&name),
                        "{name}, whose load was answered, runs after the kill -9: {now:?}"
                    );
                }
                // A program the killed meshd bound but had not recorded runs on unclaimed after an
                // adopting start, which stops it and frees its slot at its first watch.
                let held: Vec<u32> = now.values().map(|p| p.0).collect();
                let stray = || {
                    (0..self.mb.geometry().slot_count)
                        .filter(|&slot| self.mb.slot(slot).is_ok_and(|s| s.in_use()) && !held.contains(&slot))
                        .collect::<Vec<u32>>()
                };
                assert!(
                    wait_until(DEADLINE, || stray().is_empty()),
                    "slots {:?} in use after a kill -9 during the load of {name}, and no program runs in them: {now:?}",
                    stray()
                );
                let outcome = match (answered, now.contains_key(&name)) {
                    (true, _) => 0,
                    (false, true) => 1,
                    (false, false) => 2,
                };
                self.loads_cut[outcome] += 1;
                if now.contains_key(&name) {
                    m.binds.insert(name.clone(), Vec::new());
                    m.programs.insert(name, false);
                }
                return Outcome::Away(away);
            }
            Kind::Restart => {
                let t = Instant::now();
                d.shutdown();
                d.restart();
                return Outcome::Away(t.elapsed());
            }
        }
        Outcome::Done
    }

    /// A channel's shape: small ll rings (a quarter of them in device memory), some index rings, and
    /// three in eight large bulk rings (16 KiB to 512 KiB messages, up to 2 MiB of slots), so that
    /// the 4 MiB arena fills, fragments and empties as channels come and go.
    fn draw_channel(&mut self) -> Chan {
        let rng = &mut self.rng;
        let small = |rng: &mut Rng| (8u32 << rng.below(6), 1u32 << (1 + rng.below(6)));
        let (placement, protocol, parts, (msg_size, capacity)) = match rng.below(8) {
            0..=2 => {
                let parts = 1 << rng.below(2);
                (Placement::Host, Protocol::Bulk, parts, ((16 << 10) << rng.below(6), 2 << rng.below(2)))
            }
            3 => (Placement::Host, Protocol::Index, 1, small(rng)),
            4 => (Placement::Device, Protocol::Ll, 1, small(rng)),
            _ => (Placement::Host, Protocol::Ll, 1, small(rng)),
        };
        Chan { msg_size, capacity, placement, protocol, parts }
    }

    /// Creates channel `name`: it must be made if the mailbox has a descriptor and a free run it fits
    /// in, and refused naming the limit otherwise; a new channel is empty, whatever its ring's bytes
    /// held before. Returns whether it was made.
    fn create(&mut self, name: &str, shape: Chan) -> bool {
        let room = Room::read(&self.mb, &format!("before creating {name}"));
        let fits = room.fits(&[shape]);
        let r = self.d.ask(&channel_req(name, shape), &[]);
        if !fits {
            let err = refused(r, &format!("channel {name} ({shape:?}), which does not fit ({room:?}),"));
            assert!(names(&err, &["mailbox full", "fragmented"]), "a create that does not fit names the limit: {err}");
            self.refusal(match () {
                () if room.free_descriptors == 0 => "create: no descriptor left",
                () if err.contains("fragmented") => "create: arena fragmented",
                () => "create: arena full",
            });
            return false;
        }
        assert!(r.ok, "channel {name} ({shape:?}) fits ({room:?}) and was refused: {:?}", r.error);
        let info = self.mb.channel(name).unwrap_or_else(|e| panic!("channel {name} was made, yet: {e}"));
        assert_eq!((info.head, info.tail), (0, 0), "channel {name}, new, has no history");
        if shape.host_plain() {
            // Stale slots of a deleted ring read back as messages if the new ring was not zeroed.
            let mut rx = Consumer::claim(&self.mb, name).expect("the consumer end of a new channel");
            let mut buf = vec![0u8; shape.msg_size as usize];
            assert!(!rx.try_recv(&mut buf).unwrap(), "channel {name}, new, holds a message");
        }
        let again = self.d.ask(&channel_req(name, shape), &[]);
        assert!(!again.ok, "a second channel {name} is refused");
        self.m.channels.insert(name.to_string(), shape);
        true
    }

    /// Deletes a channel: refused, naming the holder, while a program binds it or this process holds
    /// its ends (a stream's), and while it holds messages unless discarded; else deleted, counting
    /// what it dropped, and now and then its name made again at once with another shape.
    fn channel_delete(&mut self) {
        let what = match self.rng.below(16) {
            0 => Some(self.m.fresh("gone")),
            1 => self.rng.pick(&self.m.services.iter().cloned().collect::<Vec<_>>()).cloned(),
            _ => None,
        };
        if let Some(name) = what {
            let err = refused(self.d.ask(&Request::ChannelDelete { name: name.clone(), discard: true }, &[]), &name);
            if self.m.services.contains(&name) {
                assert!(
                    err.contains("service"),
                    "deleting service {name}'s channel alone is refused, saying so: {err}"
                );
                self.refusal("channel delete: a service's channel");
            } else {
                assert!(err.contains(&name), "deleting {name}, which does not exist, is refused naming it: {err}");
                self.refusal("channel delete: no such channel");
            }
            return;
        }
        let Some(name) = self.rng.pick(&self.m.plain_channels()).cloned() else { return };
        let discard = self.rng.below(2) == 0;
        let (binders, queued) = (self.m.binders(&name), self.m.queued(&name));
        let r = self.d.ask(&Request::ChannelDelete { name: name.clone(), discard }, &[]);
        let slots = self.slots_of(&binders);
        let ours = format!("pid {}", std::process::id());
        if self.m.streams.contains(&name) || !binders.is_empty() {
            let err = refused(r, &format!("deleting {name}, bound by {binders:?} or held by this process,"));
            let held = self.m.streams.contains(&name) && err.contains(&ours);
            let bound = slots.iter().any(|s| err.contains(s.as_str())) || binders.iter().any(|p| err.contains(p));
            assert!(held || bound, "deleting {name} (bound by {binders:?} in {slots:?}) names the holder: {err}");
            self.refusal(if bound {
                "channel delete: a program binds it"
            } else {
                "channel delete: a host end holds it"
            });
            return;
        }
        if queued > 0 && !discard {
            let err = refused(r, &format!("deleting {name}, holding {queued} messages, without discard"));
            assert!(err.contains(&queued.to_string()), "the refusal counts the {queued} messages: {err}");
            self.refusal("channel delete: messages queued");
            return;
        }
        assert!(r.ok, "deleting {name} (unbound, {queued} queued, discard {discard}): {:?}", r.error);
        assert_eq!(r.discarded.unwrap_or(0), queued, "the messages deleting {name} discarded");
        self.m.drop_channel(&name);
        if self.rng.below(3) == 0 {
            // A deleted name can be made again at once, with any size.
            let shape = self.draw_channel();
            self.create(&name, shape);
        }
    }

    /// `slot N` of each of `programs`, as `ps` shows them.
    fn slots_of(&self, programs: &[String]) -> Vec<String> {
        let rows = self.d.ok(&Request::Ps, &[]).programs.unwrap_or_default();
        rows.iter().filter(|r| programs.contains(&r.name)).map(|r| format!("slot {}", r.slot)).collect()
    }

    /// Leaves messages on a channel nobody consumes (as many as it takes, up to its capacity): they
    /// must stay through every restart and crash, and a delete must count them.
    fn queue(&mut self) -> Outcome {
        let m = &self.m;
        let open: Vec<String> = m
            .channels
            .iter()
            .filter(|(n, c)| c.host_plain() && !m.streams.contains(*n) && m.queued(n) < u64::from(c.capacity))
            .map(|(n, _)| n.clone())
            .collect();
        let Some(name) = self.rng.pick(&open).cloned() else { return Outcome::Skipped };
        let shape = self.m.channels[&name];
        let mut tx = Producer::claim(&self.mb, &name).unwrap_or_else(|e| panic!("the producer end of {name}: {e}"));
        let mut msg = vec![0u8; shape.msg_size as usize];
        let want = 1 + self.rng.below(shape.capacity as usize) as u64;
        let mut sent = 0;
        while sent < want {
            fill(&mut msg, 1 << 15, self.m.queued(&name) + sent);
            if !tx.try_send(&msg).unwrap() {
                break;
            }
            sent += 1;
        }
        *self.m.queued.entry(name).or_default() += sent;
        Outcome::Done
    }

    /// Creates a service: made if the mailbox has two descriptors and room for its two rings, one
    /// after the other, and refused naming the limit otherwise.
    fn service_create(&mut self) {
        let name = self.m.fresh("v");
        let rng = &mut self.rng;
        let (clients, msg_size, capacity, reply_capacity) =
            (1 << rng.below(3), 8 << rng.below(4), 4 << rng.below(6), 2 << rng.below(4));
        let rings = service_rings(clients, msg_size, capacity, reply_capacity);
        let room = Room::read(&self.mb, &format!("before creating service {name}"));
        let fits = room.fits(&rings);
        let r = self.d.ask(&service_req(&name, clients, msg_size, capacity, reply_capacity), &[]);
        if !fits {
            let err = refused(r, &format!("service {name} ({rings:?}), which does not fit ({room:?}),"));
            assert!(names(&err, &["mailbox full", "fragmented"]), "a service that does not fit names the limit: {err}");
            self.refusal("service create: no room");
            return;
        }
        assert!(r.ok, "service {name} ({rings:?}) fits ({room:?}) and was refused: {:?}", r.error);
        self.m.channels.insert(name.clone(), rings[0]);
        self.m.channels.insert(format!("{name}.replies"), rings[1]);
        self.m.services.insert(name);
    }

    /// Deletes a service: refused, naming the client, while one is attached; deleted, both its
    /// channels, once it has left.
    fn service_delete(&mut self) -> Outcome {
        if self.rng.below(16) == 0 {
            let name = self.m.fresh("gone");
            let err = refused(self.d.ask(&Request::ServiceDelete { name: name.clone(), discard: false }, &[]), &name);
            assert!(err.contains(&name), "deleting service {name}, which does not exist, names it: {err}");
            self.refusal("service delete: no such service");
            return Outcome::Done;
        }
        let services: Vec<String> = self.m.services.iter().cloned().collect();
        let Some(name) = self.rng.pick(&services).cloned() else { return Outcome::Skipped };
        let discard = self.rng.below(2) == 0;
        if self.rng.below(2) == 0 {
            let client = ServiceClient::connect(&self.d.socket(), &name)
                .unwrap_or_else(|e| panic!("attaching to service {name}: {e:#}"));
            let r = self.d.ask(&Request::ServiceDelete { name: name.clone(), discard }, &[]);
            let err = refused(r, &format!("deleting service {name} with a client attached"));
            let ours = format!("pid {}", std::process::id());
            assert!(names(&err, &[&ours, "client"]), "deleting service {name} names its attached client: {err}");
            self.refusal("service delete: a client attached");
            client.detach().unwrap_or_else(|e| panic!("detaching from service {name}: {e:#}"));
        }
        let r = self.d.ask(&Request::ServiceDelete { name: name.clone(), discard }, &[]);
        assert!(r.ok, "deleting service {name}, no client attached: {:?}", r.error);
        assert_eq!(r.discarded.unwrap_or(0), 0, "service {name} held no request or reply");
        self.m.drop_channel(&name);
        self.m.drop_channel(&format!("{name}.replies"));
        self.m.services.remove(&name);
        Outcome::Done
    }
}
