//! Workers being started without blocking the backend thread: spawned together, each taken in once
//! its `ready` has come and it proved to be a client of the server, a refused one tried again later.
//!
//! The standby server's workers are made this way after each fault, and so is the pool when meshd
//! starts with adopted programs already running: their clients would stall those programs whether
//! made before meshd answers or after, and made one by one they took seconds (a pool and a standby
//! of 14 workers each, 8.3 s on an H100), during which meshd answered nothing.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::control::MpsControl;
use crate::worker::{NewsSender, Worker};
use mesh_backend::BackendError;

/// How long after a refused start a new worker is tried again (a faulted server refuses clients
/// until its old ones are gone).
pub const RETRY: Duration = Duration::from_millis(250);

/// Workers spawned and not yet ready, and when a refused start may be tried again.
#[derive(Debug)]
pub struct Starting {
    pending: Vec<Worker>,
    next_try: Instant,
}

/// What one [`Starting::step`] did.
#[derive(Debug, Default)]
pub struct Step {
    /// Workers that said `ready` and are clients of the server.
    pub ready: Vec<Worker>,
    /// How many processes it spawned (each a new MPS client, made while programs may run).
    pub spawned: usize,
    /// Lines for the log.
    pub log: Vec<String>,
}

/// Workers being made until a set is full (the pool after a start that adopted running programs):
/// each watchdog tick takes in those ready and spawns what the set lacks, until it lacks none.
#[derive(Debug)]
pub struct Filling {
    /// The workers starting.
    pub starting: Starting,
    /// When the filling began.
    pub since: Instant,
}

impl Filling {
    /// Nothing starting yet, begun at `since`.
    pub fn new(since: Instant) -> Self {
        Self { starting: Starting::new(), since }
    }
}

impl Default for Starting {
    fn default() -> Self {
        Self::new()
    }
}

impl Starting {
    /// Nothing starting.
    pub fn new() -> Self {
        Self { pending: Vec::new(), next_try: Instant::now() }
    }

    /// How many workers are starting.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether no worker is starting.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Pids of the workers starting, for the log and tests.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.pending.iter().map(Worker::pid)
    }

    /// One step, without blocking: the starting workers whose `ready` came are checked to be clients
    /// of `control`'s server and returned; those refused are killed (tried again after [`RETRY`]);
    /// then, when the retry time has come, more are spawned until `wanted` workers are ready or
    /// starting. `wanted` counts the workers still lacking before this step.
    pub fn step(
        &mut self,
        control: &MpsControl,
        wanted: usize,
        mailbox: &Path,
        sms: Option<u32>,
        news: &NewsSender,
    ) -> Step {
        let mut step = Step::default();
        let mut still = Vec::new();
        for mut w in std::mem::take(&mut self.pending) {
            match w.try_handshake() {
                None => still.push(w),
                Some(Ok(())) => match control.check_client(w.pid()) {
                    Ok(server) => {
                        w.server = server;
                        step.ready.push(w);
                    }
                    Err(e) => self.refused(w, &e),
                },
                // The faulted server refuses clients until its old ones are gone: expected for a while.
                Some(Err(e)) => self.refused(w, &e),
            }
        }
        self.pending = still;
        let missing = wanted.saturating_sub(step.ready.len() + self.pending.len());
        if missing > 0 && Instant::now() >= self.next_try {
            for _ in 0..missing {
                match Worker::spawn(control, mailbox, sms, news) {
                    Ok(w) => {
                        step.spawned += 1;
                        self.pending.push(w);
                    }
                    Err(e) => {
                        step.log.push(format!("starting an MPS worker: {e}"));
                        self.next_try = Instant::now() + RETRY;
                        break;
                    }
                }
            }
        }
        step
    }

    /// One starting worker that was started with `sms`, taken out (for the caller to await with
    /// [`Worker::await_ready`]), or `None` when none such is starting.
    pub fn take_one(&mut self, sms: Option<u32>) -> Option<Worker> {
        let pos = self.pending.iter().position(|w| w.asked_sms == sms)?;
        Some(self.pending.swap_remove(pos))
    }

    /// Every starting worker, taken out (to be killed, or buried after a fault).
    pub fn take_all(&mut self) -> Vec<Worker> {
        self.next_try = Instant::now();
        std::mem::take(&mut self.pending)
    }

    fn refused(&mut self, mut w: Worker, e: &BackendError) {
        tracing::debug!("MPS worker {}: {e}", w.pid());
        w.kill();
        self.next_try = Instant::now() + RETRY;
    }
}
