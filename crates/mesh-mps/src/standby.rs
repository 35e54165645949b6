//! The standby MPS server (`meshd run --standby K`, by default as many as the pool): a second MPS daemon whose K idle workers take the programs over after a fault.
//!
//! A fault in one MPS server ends every client of it, and that server takes no new client until
//! every old one is gone (about 1.5 s on the H200); an idle client of a *second* daemon, made before
//! the fault, survived it and ran a kernel 157 ms after it. So meshd runs two
//! daemons by default: the active one (the programs and the pool) and this standby, whose
//! workers are made at start, before any program runs. A recovery whose culprit is named, once every
//! faulted worker has said its kernel failed (so no old kernel runs on), relaunches the others in
//! standby workers at once, leaves the faulted server's workers to be reaped here as they exit, and
//! swaps the roles; a new standby is then made on the faulted server, without blocking the backend
//! thread, once it takes clients again (each such worker counted like a pool growth). Anything
//! else recovers the usual way, and the log names the one reason. On the H200 8
//! programs recovered in 15.3 ms with the standby against 1.35-1.63 s without; see
//! docs/explanation/modes.md ("The standby server") for its cost to the running programs (an idle standby's server is a second
//! context, which time-slices only when both have work).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::control::MpsControl;
use crate::starting::Starting;
use crate::worker::{NewsSender, Worker};

pub use crate::starting::RETRY;

/// The standby server and its workers: ready, starting, and the faulted server's, being reaped.
#[derive(Debug)]
pub struct Standby {
    control: Arc<MpsControl>,
    ready: Vec<Worker>,
    starting: Starting,
    dying: Vec<Worker>,
    want: usize,
    /// When a standby made in the background (meshd started with adopted programs running) was
    /// begun, until it is first full.
    filling_since: Option<Instant>,
}

impl Standby {
    /// A standby of `want` workers on `control`'s server (none started yet).
    pub fn new(control: Arc<MpsControl>, want: usize) -> Self {
        Self { control, ready: Vec::new(), starting: Starting::new(), dying: Vec::new(), want, filling_since: None }
    }

    /// A standby of `want` workers on `control`'s server made by the ticks, while meshd serves:
    /// meshd started with adopted programs running, which its clients stall whenever they are made.
    pub fn in_background(control: Arc<MpsControl>, want: usize) -> Self {
        Self { filling_since: Some(Instant::now()), ..Self::new(control, want) }
    }

    /// Its server's control daemon.
    pub fn control(&self) -> &Arc<MpsControl> {
        &self.control
    }

    /// Workers ready to take a program.
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    /// Pids of every worker it holds (ready, starting, dying), for the log and tests.
    pub fn pids(&self) -> Vec<u32> {
        self.ready.iter().chain(&self.dying).map(Worker::pid).chain(self.starting.pids()).collect()
    }

    /// Takes `workers`, started (side by side) and checked to be clients of the standby server, at
    /// meshd's start before any program runs.
    pub fn adopt(&mut self, workers: Vec<Worker>) {
        self.ready.extend(workers);
    }

    /// How many ready workers it wants.
    pub fn wanted(&self) -> usize {
        self.want
    }

    /// One step, without blocking on a worker (each watchdog tick): reaps the dying that exited,
    /// drops ready workers that died, takes the starting ones that said `ready` (membership
    /// checked) and kills those refused (tried again after [`RETRY`]), and spawns more when fewer
    /// than wanted are ready or starting. Returns lines for the log and how many workers it spawned
    /// (each a new MPS client, created while programs may run).
    pub fn tick(&mut self, mailbox: &Path, sms: Option<u32>, news: &NewsSender) -> (Vec<String>, usize) {
        let mut log = Vec::new();
        self.dying.retain(|w| !w.exited());
        self.ready.retain_mut(|w| {
            w.refresh();
            let usable = w.alive() && w.broken().is_none();
            if !usable {
                log.push(format!("standby MPS worker {} discarded: {}", w.pid(), w.broken().unwrap_or("it exited")));
                w.kill();
            }
            usable
        });
        let was_short = self.ready.len() < self.want;
        let step = self.starting.step(&self.control, self.want.saturating_sub(self.ready.len()), mailbox, sms, news);
        self.ready.extend(step.ready);
        log.extend(step.log);
        if was_short && self.ready.len() >= self.want {
            log.push(match self.filling_since.take() {
                Some(since) => format!(
                    "MPS standby server ready with {} idle worker(s) in {:?}, made while meshd served: after a GPU \
                     fault they take the programs over",
                    self.ready.len(),
                    since.elapsed()
                ),
                None => format!("MPS standby ready again: {} idle worker(s) on the standby server", self.ready.len()),
            });
        }
        (log, step.spawned)
    }

    /// Breaks off every ready worker silent for more than `limit` at `now` (stopped or wedged: it
    /// would fail the recovery that takes it); the next [`Standby::tick`] discards and replaces it.
    pub fn check_silence(&mut self, now: Instant, limit: std::time::Duration) {
        for w in &mut self.ready {
            let _ = w.check_silence(now, limit);
        }
    }

    /// `n` ready workers, or `None` (and nothing taken) when fewer are ready.
    pub fn take(&mut self, n: usize) -> Option<Vec<Worker>> {
        if self.ready.len() < n {
            return None;
        }
        Some(self.ready.split_off(self.ready.len() - n))
    }

    /// A worker of the faulted server: SIGKILL now (its kernel has failed), reaped by a later
    /// [`Standby::tick`], so that no recovery waits for the driver to tear its context down.
    pub fn bury(&mut self, w: Worker) {
        w.signal_kill();
        self.dying.push(w);
    }

    /// After a recovery moved the programs to this server: it becomes the active one. Returns its
    /// control and its workers still idle (the active pool now); the standby is the faulted server
    /// (`faulted`) from here, its workers made by the next ticks.
    pub fn swap(&mut self, faulted: Arc<MpsControl>) -> (Arc<MpsControl>, Vec<Worker>) {
        let active = std::mem::replace(&mut self.control, faulted);
        let idle = std::mem::take(&mut self.ready);
        for w in self.starting.take_all() {
            self.bury(w);
        }
        self.filling_since = None;
        (active, idle)
    }

    /// Every worker killed and reaped; returns its daemon for the caller to quit (the standby's
    /// directory is nested in the active one's, or the other way round after a swap: the nested one
    /// is quit first).
    pub fn tear_down(&mut self) -> Arc<MpsControl> {
        for mut w in self.ready.drain(..).chain(self.starting.take_all()).chain(self.dying.drain(..)) {
            w.kill();
        }
        self.control.clone()
    }
}
