//! The pool's workers: started at open, taken for a load or upgrade (or grown), given back, refilled
//! after a recovery.

use super::*;
use crate::starting::Filling;

/// Starts the pool's workers into `shared`'s idle list, each checked to be our client: `--pool`
/// less the `adopted` programs' workers, which are the pool's in use. With none adopted they are
/// made now, before any program runs ([`start_all`]). With programs adopted they run already, and
/// their clients stall them whenever they are made: the watchdog's ticks spawn and take them in
/// ([`Filling`]) while meshd serves, rather than keeping it silent for seconds.
pub(super) fn start_pool(
    control: &MpsControl,
    mailbox: &Mailbox,
    config: &MpsConfig,
    shared: &Mutex<Shared>,
    news: &NewsSender,
    adopted: usize,
) -> Result<()> {
    let started = Instant::now();
    let n = (config.pool as usize).saturating_sub(adopted);
    if adopted > 0 {
        tracing::info!(
            "MPS pool of {}: the {adopted} adopted program(s) hold workers of it, and {n} idle worker(s) are made while \
             meshd serves (each a client created while programs run, counted as the pool's growth)",
            config.pool
        );
        shared.lock().pool_fill = Some(Filling::new(started));
        return Ok(());
    }
    let workers = start_all(control, mailbox.path(), config.sms, news, n, "pool")?;
    if let Some(first) = workers.first() {
        tracing::info!(
            worker = first.pid(),
            server = first.server,
            context_ms = first.ready.context_ms,
            kernel_check_us = first.ready.kernel_check_us,
            "MPS pool of {} worker(s) ready in {:?} (the MPS server started with the first)",
            config.pool,
            started.elapsed()
        );
    }
    shared.lock().idle.extend(workers);
    Ok(())
}

/// Exactly `n` workers for `what` (at meshd's start), or an error naming why one failed: the first
/// alone (its context creation starts the MPS server, and its error is the clearest), the rest side
/// by side (each client takes 0.1-0.4 s to create; one after the other, a pool of 14 and a standby
/// of 14 took seconds at every start). On an error every worker started is killed.
pub(super) fn start_all(
    control: &MpsControl,
    mailbox: &Path,
    sms: Option<u32>,
    news: &NewsSender,
    n: usize,
    what: &str,
) -> Result<Vec<Worker>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let first = Worker::start(control, mailbox, sms, news, WORKER_LOAD)?;
    let (rest, last) = start_many_or_why(control, mailbox, sms, news, n - 1);
    let mut ready = vec![first];
    ready.extend(rest);
    if ready.len() < n {
        let got = ready.len();
        for mut w in ready {
            w.kill();
        }
        return Err(BackendError::MpsDaemon(format!(
            "started {got} of the {n} MPS workers of the {what}: {}",
            last.map_or_else(|| "no reason given".to_string(), |e| e.to_string())
        )));
    }
    Ok(ready)
}

/// Starts `n` workers side by side (spawned together, then each awaited), retrying those the server
/// refuses for up to 10 s: after a fault it takes no client until every old one has exited (the
/// H200 took a new client 0.3 s later). Returns those that started.
pub(super) fn start_many(
    control: &MpsControl,
    mailbox: &Path,
    sms: Option<u32>,
    news: &NewsSender,
    n: usize,
) -> Vec<Worker> {
    start_many_or_why(control, mailbox, sms, news, n).0
}

/// [`start_many`], with the last error when fewer than `n` started.
fn start_many_or_why(
    control: &MpsControl,
    mailbox: &Path,
    sms: Option<u32>,
    news: &NewsSender,
    n: usize,
) -> (Vec<Worker>, Option<BackendError>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ready = Vec::with_capacity(n);
    let mut last = None;
    while ready.len() < n {
        let spawned: Vec<Result<Worker>> =
            (ready.len()..n).map(|_| Worker::spawn(control, mailbox, sms, news)).collect();
        for w in spawned {
            match w.and_then(|w| w.await_ready(control, WORKER_LOAD)) {
                Ok(w) => ready.push(w),
                Err(e) => last = Some(e),
            }
        }
        if ready.len() < n {
            if Instant::now() >= deadline {
                tracing::error!(
                    "started {} of {n} MPS workers: {}",
                    ready.len(),
                    last.as_ref().map_or(String::new(), |e| e.to_string())
                );
                break;
            }
            tracing::debug!("the MPS server takes no client yet: {last:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    (ready, last)
}

/// An idle worker that can take a program whose worker was started with `ask` (its `--sms`): one
/// started with the same, alive and not broken (one found silent at this very tick, or gone, would
/// only fail the relaunch).
pub(super) fn take_idle(idle: &mut Vec<Worker>, ask: Option<u32>) -> Option<Worker> {
    let pos = idle.iter().position(|w| w.asked_sms == ask && w.alive() && w.broken().is_none())?;
    Some(idle.swap_remove(pos))
}

impl MpsBackend {
    /// An idle worker started with `sms` (the program's own `--sms`, else the global one; None: the
    /// whole GPU) for `op` (`load`, `upgrade`) of `program`. None idle: refused with
    /// the reason, unless growth is allowed (`--pool-grow`); then a new MPS client, which stalls the
    /// running programs once: counted, logged, and shown by `info` and the request's reply.
    pub(super) fn take_worker(&mut self, sms: Option<u32>, program: &str, op: &'static str) -> Result<Worker> {
        let (found, idle_asks, in_use) = {
            let mut s = self.lock();
            // Exactly what was asked: a worker given back by an unloaded `--sms 16` program must not
            // hand a later whole-GPU program 16 SMs.
            let pos = s.idle.iter().position(|w| w.asked_sms == sms);
            let found = pos.map(|p| s.idle.swap_remove(p));
            (found, s.idle.iter().map(|w| w.asked_sms).collect::<Vec<Option<u32>>>(), s.programs.len())
        };
        if let Some(w) = found {
            self.publish_pool();
            return Ok(w);
        }
        if let Some(w) = self.await_pool_fill(sms) {
            return Ok(w);
        }
        if !self.config.pool_grow {
            let why = crate::pool::refusal(op, program, sms, &idle_asks, in_use, self.config.pool);
            tracing::warn!("{why}");
            return Err(BackendError::Invalid { what: "MPS pool".into(), reason: why });
        }
        self.grow(sms, program, op)
    }

    /// A worker of the pool still being made ([`Filling`]) that was started with `sms`, waited for
    /// (a load, or the relaunch of a program not adopted, before the pool was full); one started now
    /// when none such is starting yet and the pool lacks one of the pool's size. `None` when no pool
    /// is being made, or the worker failed.
    fn await_pool_fill(&self, sms: Option<u32>) -> Option<Worker> {
        let control = self.control().ok()?;
        let starting = {
            let mut s = self.lock();
            let lacking = self.pool_lacking(&s);
            let fill = s.pool_fill.as_mut()?;
            match fill.starting.take_one(sms) {
                Some(w) => w,
                None if lacking > 0 && sms == self.config.sms => {
                    match Worker::spawn(&control, self.mailbox.path(), sms, &self.news) {
                        Ok(w) => w,
                        Err(e) => {
                            tracing::warn!("a worker of the pool being made: {e}");
                            return None;
                        }
                    }
                }
                None => return None,
            }
        };
        // Awaited without the lock: the workers' readers take it to file their news.
        match starting.await_ready(&control, WORKER_LOAD) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!("a worker of the pool being made failed: {e}");
                None
            }
        }
    }

    /// How many workers the pool lacks: `--pool` less those idle and those of programs.
    fn pool_lacking(&self, s: &Shared) -> usize {
        (self.config.pool as usize).saturating_sub(s.idle.len() + s.programs.len())
    }

    /// The watchdog's step of a pool being made ([`Filling`]): those ready join the idle list,
    /// what is lacking is spawned. Returns the log lines and how many clients it spawned.
    pub(super) fn fill_pool(&self, s: &mut Shared) -> (Vec<String>, usize) {
        let lacking = self.pool_lacking(s);
        let (Some(fill), Some(control)) = (s.pool_fill.as_mut(), s.control.clone()) else { return (Vec::new(), 0) };
        let step = fill.starting.step(&control, lacking, self.mailbox.path(), self.config.sms, &self.news);
        let mut log = step.log;
        let done = step.ready.len() >= lacking && fill.starting.is_empty();
        let since = fill.since;
        s.idle.extend(step.ready);
        if done {
            s.pool_fill = None;
            log.push(format!(
                "MPS pool of {} worker(s) ready in {:?}, made while meshd served: {} idle",
                self.config.pool,
                since.elapsed(),
                s.idle.len()
            ));
            self.publish_pool_locked(s);
        }
        (log, step.spawned)
    }

    /// A new worker (a new MPS client) for `op` of `program`, growth being allowed: every running
    /// program stalls once, which is counted and logged.
    fn grow(&self, sms: Option<u32>, program: &str, op: &'static str) -> Result<Worker> {
        let (clients, running) = {
            let s = self.lock();
            let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            let standby = s.standby.as_ref().map_or(0, |sb| sb.pids().len());
            let filling = s.pool_fill.as_ref().map_or(0, |f| f.starting.len());
            (
                count(s.idle.len() + s.programs.len() + standby + filling),
                count(s.programs.iter().filter(|p| on_watch(p)).count()),
            )
        };
        if clients + 1 > self.client_limit {
            return Err(BackendError::ClientLimit { asked: clients + 1, limit: self.client_limit });
        }
        let control = self.control()?;
        let started = Instant::now();
        let w = Worker::start(&control, self.mailbox.path(), sms, &self.news, WORKER_LOAD)?;
        if running > 0 {
            let n = self.pool.record_growth(program, op, running);
            tracing::warn!(
                program,
                "MPS pool grown for {op} of {program:?} (--pool-grow): worker {} created in {:?}; its client creation \
                 stalled {running} running program(s) (stall #{n} since start)",
                w.pid(),
                started.elapsed()
            );
        } else {
            tracing::info!(
                program,
                "MPS pool grown for {op} of {program:?}: worker {} (no program was running)",
                w.pid()
            );
        }
        Ok(w)
    }

    /// After an unload or upgrade of `program`: workers discarded (a program cut off, a failed
    /// kernel) so that fewer than `--pool` exist are replaced only when growth is allowed (each
    /// replacement stalls the running programs once, counted). Workers that return from programs
    /// refill the pool by themselves.
    pub(super) fn grow_back(&self, program: &str) {
        let missing = self.pool_lacking(&self.lock());
        if missing > 0 && !self.config.pool_grow {
            tracing::info!(
                "MPS pool: {missing} worker(s) discarded below --pool {} not replaced (creating a client stalls the \
                 running programs; --pool-grow allows it)",
                self.config.pool
            );
        }
        if self.config.pool_grow {
            for _ in 0..missing {
                match self.grow(self.config.sms, program, "refill") {
                    Ok(w) => self.lock().idle.push(w),
                    Err(e) => {
                        tracing::warn!("growing the MPS pool back: {e}");
                        break;
                    }
                }
            }
        }
        self.publish_pool();
    }

    /// The pool's counts for `info`.
    pub(super) fn publish_pool(&self) {
        self.publish_pool_locked(&self.lock());
    }

    /// [`MpsBackend::publish_pool`] under a lock already held.
    pub(super) fn publish_pool_locked(&self, s: &Shared) {
        self.pool.publish(s.idle.len(), s.programs.len());
    }

    /// Returns a worker to the pool after unloading its module; a worker that will not is discarded.
    pub(super) fn give_back(&self, mut w: Worker) {
        match w.unload() {
            Ok(()) => self.lock().idle.push(w),
            Err(e) => {
                tracing::warn!("worker {} discarded: {e}", w.pid());
                // A worker that did not answer may still run a kernel: cut it off through the
                // server first (a SIGKILL of a busy client fails the server's other clients).
                w.refresh();
                if may_run_a_kernel(&w) {
                    let control = self.lock().control.clone();
                    self.cut_off_and_kill(control, &mut w, "discarded MPS worker");
                } else {
                    w.kill();
                }
            }
        }
    }

    /// Refills the pool, now that the server takes clients again (workers started side by side).
    pub(super) fn refill(&self, s: &mut Shared, control: &MpsControl) {
        let missing = (self.config.pool as usize).saturating_sub(s.idle.len());
        s.idle.extend(start_many(control, self.mailbox.path(), self.config.sms, &self.news, missing));
    }
}

#[cfg(test)]
mod tests {
    //! Which idle worker a replacement takes, against stand-in workers: the MPS backend itself needs a GPU.

    use super::super::stand_in::Bench;
    use super::*;

    #[test]
    fn a_replacement_takes_only_a_usable_idle_worker_of_the_same_size() {
        let bench = Bench::new();
        let sixteen = |env: &[(&str, &str)]| {
            let mut w = bench.worker(env);
            w.asked_sms = Some(16);
            w
        };
        let mut idle = vec![sixteen(&[("SMS", "16")])];
        assert!(
            take_idle(&mut idle, None).is_none(),
            "a worker started with --sms 16 is no home for a whole-GPU program"
        );
        assert!(take_idle(&mut idle, Some(15)).is_none(), "matched by what was asked, not by the rounded SMs");
        assert_eq!(idle.len(), 1);
        // Found silent at this tick: broken, never handed a program.
        assert!(idle[0].check_silence(Instant::now() + Duration::from_secs(4), SILENCE_LIMIT).is_some());
        assert!(take_idle(&mut idle, Some(16)).is_none(), "a broken idle worker is not taken");
        idle.push(sixteen(&[("SMS", "16")]));
        let mut w = take_idle(&mut idle, Some(16)).expect("the usable one");
        assert!(w.broken().is_none());
        w.kill();
        for mut w in idle {
            w.kill();
        }
    }
}
