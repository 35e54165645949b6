//! Worker liveness: the watchdog's tick, silent workers broken off and replaced alone, kernels given
//! their stop deadline, clients cut off before their kill, killed workers reaped later.

use super::workers::{start_many, take_idle};
use super::*;

impl MpsBackend {
    /// The watchdog's tick ([`Backend::watch`]): what the workers said taken in, silent workers
    /// replaced, programs that ended by themselves reported, the standby ticked, dead idle workers
    /// discarded, then a recovery if a kernel failed.
    pub(super) fn watch_tick(&mut self) -> Vec<String> {
        if self.shut_down {
            return Vec::new();
        }
        // The relaunch is over by the first tick: an adopted program it did not claim stops now.
        self.retire_unclaimed();
        let now = Instant::now();
        let mut standby_spawned = 0;
        // Not while meshd itself may have been stopped or starved, with the readers that note the
        // workers' lines (see SilenceClock).
        let judge_silence = self.silence.tick(now, SILENCE_LIMIT);
        let mut log = Vec::new();
        let failure = {
            let mut s = self.lock();
            absorb(&mut s);
            if judge_silence {
                log.extend(self.replace_silent(&mut s, now));
            }
            let mut failure = None;
            for p in &mut s.programs {
                let Ok(slot) = self.mailbox.slot(p.core.slot) else { continue };
                let status = slot.status();
                p.core.health.observe_beat(status.heartbeat, now);
                if !on_watch(p) {
                    continue;
                }
                match p.worker.kernel() {
                    KernelState::Failed { reason } => {
                        failure.get_or_insert(reason);
                    }
                    KernelState::Idle if status.state == STATE_EXITED => {
                        // Ended by itself: reported once, never relaunched (until a new image).
                        p.core.health.exited = Some(status.exit_code);
                        p.core.life.returned();
                        log.push(format!(
                            "program {} ended by itself (mesh_exit({})): reported, not relaunched",
                            p.core.name, status.exit_code
                        ));
                    }
                    _ => {}
                }
            }
            if let Some(sb) = s.standby.as_mut() {
                let (lines, spawned) = sb.tick(self.mailbox.path(), self.config.sms, &self.news);
                log.extend(lines);
                standby_spawned = spawned;
            }
            let (lines, pool_spawned) = self.fill_pool(&mut s);
            log.extend(lines);
            // Each standby or pool worker created while programs run is a new MPS client, counted
            // as the pool's growth is (whether it stalls programs of the other server is the GPU's to say).
            let running = s.programs.iter().filter(|p| on_watch(p)).count();
            let stalled = u32::try_from(running).unwrap_or(u32::MAX);
            for (spawned, what, op) in
                [(standby_spawned, "standby", "refill the standby"), (pool_spawned, "pool", "fill the pool")]
            {
                if spawned == 0 || running == 0 {
                    continue;
                }
                for _ in 0..spawned {
                    self.pool.record_growth(what, op, stalled);
                }
                log.push(format!(
                    "MPS {what}: {spawned} worker(s) being created while {running} program(s) run (counted as pool \
                     growth)"
                ));
            }
            // An idle worker that died (nothing ran in it) is replaced at the next refill.
            s.idle.retain_mut(|w| {
                let usable = w.alive() && w.broken().is_none();
                if !usable {
                    tracing::warn!("idle MPS worker {} discarded: {}", w.pid(), w.broken().unwrap_or("it exited"));
                    w.kill();
                }
                usable
            });
            failure
        };
        match failure {
            Some(error) => log.extend(self.recover(&error)),
            // A failure a reader heard that no recovery followed (a load's probe, a worker meshd
            // itself cut off): nothing to show any more.
            None => self.board.end_if_begun_before(now),
        }
        log
    }

    /// Breaks off every worker of `s` silent for more than [`SILENCE_LIMIT`] at `now`, and replaces
    /// each such program's worker alone: no GPU fault happened, so the other programs run on. Its
    /// kernel is asked to stop and gets the stop deadline to leave in order (read from its slot);
    /// then the server cuts the silent client off (a kernel still running ends), it is killed (a
    /// stopped process too), and the program is relaunched in an idle worker of its size, else in a new client
    /// (which stalls the running programs once, counted as the pool's growth). Idle and standby
    /// workers found silent are only broken off: the watchdog and the standby's tick discard them.
    /// Returns the log lines.
    pub(super) fn replace_silent(&self, s: &mut Shared, now: Instant) -> Vec<String> {
        let silent = silent_programs(s, now, SILENCE_LIMIT);
        let Some(control) = s.control.clone().filter(|_| !silent.is_empty()) else { return Vec::new() };
        self.board.begin(
            format!("MPS worker(s) silent for more than {} ms", SILENCE_LIMIT.as_millis()),
            silent.iter().map(|&(i, _)| s.programs[i].core.name.clone()).collect::<Vec<_>>(),
        );
        for &(i, _) in &silent {
            let p = &mut s.programs[i];
            slots::request_stop(&self.mailbox, p.core.slot);
            p.core.life.request_stop();
        }
        // A silent worker's kernel still runs and reads its stop word: given the stop deadline to
        // leave in order (mesh_end after closing its channels publishes their exact positions, so
        // its relaunch repeats nothing), read from its slot, before the server cuts it off.
        let slots: Vec<u32> = silent.iter().map(|&(i, _)| s.programs[i].core.slot).collect();
        let state_of = |slot: u32| self.mailbox.slot(slot).map_or(STATE_EXITED, |s| s.status().state);
        let in_order = await_stops(&slots, Instant::now() + self.config.stop_deadline, state_of);
        // Side by side and bounded: a stopped client may never let the command finish (test-mps's
        // SIGSTOPped worker was replaced 13.28 s after its stop, against a 3 s bound).
        let cut: Vec<(u32, u32)> =
            silent.iter().map(|&(i, _)| (s.programs[i].worker.server, s.programs[i].worker.pid())).collect();
        for (pid, e) in control.terminate_clients(&cut, TERMINATE_WITHIN) {
            tracing::error!("terminate_client of silent MPS worker {pid}: {e}; it is killed all the same");
        }
        // All cut off first, then one wait for the server, then the signals.
        std::thread::sleep(CUT_OFF);
        // A GPU fault reported meanwhile (during the stop wait) poisons every client of the server,
        // the idle ones too: a relaunch now would fail and leave the program faulted, which the
        // recovery that follows in this tick would not relaunch. Left stopped instead, for it.
        let fault_meanwhile = fault_pending(s);
        let mut log = Vec::new();
        for ((i, silent), in_order) in silent.into_iter().zip(in_order) {
            let p = &mut s.programs[i];
            p.worker.signal_kill();
            p.core.life.returned();
            let (old, name, ask) = (p.worker.pid(), p.core.name.clone(), p.worker.asked_sms);
            if fault_meanwhile {
                log.push(format!(
                    "MPS worker {old} of program {name} was silent for {} ms: cut off its MPS server and killed; \
                     {name} is relaunched by the recovery from the GPU fault reported meanwhile",
                    silent.as_millis()
                ));
                continue;
            }
            let (workers, from) = match take_idle(&mut s.idle, ask) {
                Some(w) => (vec![w], "an idle worker of the pool"),
                None => {
                    let running = s.programs.iter().filter(|p| on_watch(p)).count();
                    if running > 0 {
                        let stalled = u32::try_from(running).unwrap_or(u32::MAX);
                        self.pool.record_growth(&name, "replace a silent worker", stalled);
                    }
                    // Started with what the old worker was started with (the program's own --sms).
                    let fresh = start_many(&control, self.mailbox.path(), ask, &self.news, 1);
                    (fresh, "a new MPS client: the running programs stalled once")
                }
            };
            self.launch_in(s, &[i], workers, false, "its worker went silent");
            let p = &s.programs[i];
            let outcome = match p.core.life.faulted() {
                None if in_order => format!(
                    "{name} stopped in order first (exactly once on its channels) and relaunched in worker {} ({from})",
                    p.worker.pid()
                ),
                // Cut off, not stopped in order: a GPU consumer publishes its position in batches.
                None => format!(
                    "{name} did not stop in order within {} ms and was cut off, then relaunched in worker {} ({from}); \
                     its channels are at-least-once across this: messages its kernel had taken since it last \
                     published its position come again",
                    self.config.stop_deadline.as_millis(),
                    p.worker.pid()
                ),
                Some(why) => format!("{name} left stopped: {why}"),
            };
            log.push(format!(
                "MPS worker {old} of program {name} was silent for {} ms (it says alive every {} ms; the bound is {} \
                 ms): stopped or wedged; cut off its MPS server and killed; {outcome}",
                silent.as_millis(),
                mesh_mps_worker::ALIVE_EVERY.as_millis(),
                SILENCE_LIMIT.as_millis()
            ));
        }
        self.publish_pool_locked(s);
        self.board.end();
        log
    }
}

/// The watched programs whose worker said nothing for more than `limit` before `now`, each broken
/// off, with how long it was silent; idle and standby workers silent that long are broken off too
/// (discarded later in the tick). None while a watched kernel has failed or a worker is gone: the
/// recovery that follows in the same tick ends every client anyway, and a replacement now would
/// land in a client of the faulted server (whose load fails, leaving an innocent program stopped
/// for good) or wait for that server to take clients again; a worker can also be legitimately
/// silent then, its driver call held while the server tears the faulted clients down.
fn silent_programs(s: &mut Shared, now: Instant, limit: Duration) -> Vec<(usize, Duration)> {
    for w in &mut s.idle {
        let _ = w.check_silence(now, limit);
    }
    if let Some(sb) = s.standby.as_mut() {
        sb.check_silence(now, limit);
    }
    if fault_pending(s) {
        return Vec::new();
    }
    s.programs
        .iter_mut()
        .enumerate()
        .filter(|(_, p)| on_watch(p))
        .filter_map(|(i, p)| p.worker.check_silence(now, limit).map(|d| (i, d)))
        .collect()
}

/// Waits until the kernel of every slot of `slots` has left (its state, read with `state_of`, says
/// stopped at the request or exited) or `deadline` passes. Returns, slot by slot, whether it stopped
/// in order (`mesh_end`: its channels' positions published).
fn await_stops(slots: &[u32], deadline: Instant, state_of: impl Fn(u32) -> u32) -> Vec<bool> {
    loop {
        let states: Vec<u32> = slots.iter().map(|&slot| state_of(slot)).collect();
        if states.iter().all(|&st| st == STATE_STOPPED || st == STATE_EXITED) || Instant::now() >= deadline {
            return states.into_iter().map(|st| st == STATE_STOPPED).collect();
        }
        // A kernel reads its stop word every 100 µs (MESH_STOP_PERIOD_NS) and sees it within two.
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// SIGKILLs `w` and reaps it on a thread of its own: the driver can take up to 2 s to tear a
/// killed client's context down, which no recovery should wait for.
pub(super) fn reap_later(w: Worker) {
    w.signal_kill();
    let spawned = std::thread::Builder::new().name(format!("reap-{}", w.pid())).spawn(move || {
        let mut w = w;
        w.kill();
    });
    if let Err(e) = spawned {
        tracing::warn!("reaping a killed MPS worker on its own thread: {e}; it is reaped at meshd's exit");
    }
}

#[cfg(test)]
mod tests {
    //! The watchdog's choices about silent workers, against stand-in workers: the MPS backend itself
    //! needs a GPU.

    use super::super::stand_in::{Bench, kill_all};
    use super::*;

    #[test]
    fn a_silent_worker_is_replaced_but_not_while_a_fault_is_pending() {
        let bench = Bench::new();
        let mut s = Shared::default();
        s.programs.push(bench.program(0, bench.worker(&[])));
        s.programs.push(bench.program(1, bench.worker(&[])));
        let later = Instant::now() + Duration::from_secs(4);
        let silent = silent_programs(&mut s, later, SILENCE_LIMIT);
        assert_eq!(silent.iter().map(|&(i, _)| i).collect::<Vec<_>>(), [0, 1], "both said nothing past the bound");
        assert!(silent.iter().all(|&(_, d)| d > SILENCE_LIMIT));
        kill_all(&mut s);

        // Program 0's worker is gone (a failure the same tick recovers from, ending every client):
        // program 1's silent worker is left to that recovery, not replaced into the faulted server.
        let mut s = Shared::default();
        s.programs.push(bench.program(0, bench.worker(&[("MODE", "gone")])));
        s.programs.push(bench.program(1, bench.worker(&[])));
        let deadline = Instant::now() + Duration::from_secs(10);
        while failed(&s.programs[0].worker).is_none() {
            assert!(Instant::now() < deadline, "the stand-in's exit was never noticed");
            std::thread::sleep(Duration::from_millis(5));
            s.programs[0].worker.refresh();
        }
        let later = Instant::now() + Duration::from_secs(4);
        assert_eq!(silent_programs(&mut s, later, SILENCE_LIMIT), []);
        assert_eq!(s.programs[1].worker.broken(), None, "left as it was for the recovery");
        // What replace_silent asks again before relaunching: a recovery is due while a watched
        // program's worker failed, not once that program is off watch.
        assert!(fault_pending(&mut s));
        s.programs[0].core.life.request_stop();
        s.programs[0].core.life.returned();
        assert!(!fault_pending(&mut s), "program 1's mute worker alone is no fault");
        kill_all(&mut s);
    }

    #[test]
    fn a_worker_spoken_to_no_more_still_gets_the_servers_time_to_be_cut_off_before_its_kill() {
        let bench = Bench::new();
        let mut w = bench.worker(&[]);
        assert!(w.check_silence(Instant::now() + Duration::from_secs(4), SILENCE_LIMIT).is_some());
        let started = Instant::now();
        await_cut_off(&mut w);
        // A lower bound only: the wait is a sleep, not a race.
        assert!(started.elapsed() >= CUT_OFF, "killed {:?} after terminate_client", started.elapsed());
        w.kill();
    }

    #[test]
    fn a_silent_workers_kernel_gets_its_stop_deadline_to_leave_in_order_before_the_cut_off() {
        use std::cell::Cell;
        // Slot 4's kernel sees its stop on the third look; slot 7's has exited by itself.
        let looks = Cell::new(0);
        let state_of = |slot: u32| match slot {
            4 => {
                looks.set(looks.get() + 1);
                if looks.get() >= 3 { STATE_STOPPED } else { STATE_RUNNING }
            }
            _ => STATE_EXITED,
        };
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(
            await_stops(&[4, 7], far, state_of),
            [true, false],
            "4 stopped in order; 7 left, not at the request"
        );
        assert!(looks.get() >= 3);
        // One that never stops is given up at the deadline (already passed here: one look).
        let stuck = |_slot: u32| STATE_RUNNING;
        assert_eq!(await_stops(&[1, 2], Instant::now(), stuck), [false, false]);
    }

    #[test]
    fn silence_is_judged_only_after_meshd_ran_a_whole_bound_since_its_last_stall() {
        let limit = Duration::from_secs(3);
        let tick = Duration::from_millis(25);
        let mut clock = SilenceClock::new();
        let t0 = Instant::now();
        let mut t = t0;
        let mut first_judged = None;
        while t < t0 + Duration::from_secs(5) {
            if clock.tick(t, limit) && first_judged.is_none() {
                first_judged = Some(t - t0);
            }
            t += tick;
        }
        let first = first_judged.expect("judged once meshd ran past the bound");
        assert!(first > limit && first <= limit + tick, "{first:?}");
        // meshd stopped for 5 s: neither the tick after it nor the ones its news brings at once
        // (before every reader has read what its worker said meanwhile) judge anyone.
        t += Duration::from_secs(5);
        assert!(!clock.tick(t, limit), "the tick after the stall");
        assert!(!clock.tick(t + Duration::from_millis(1), limit), "a tick a wake-up brought right after it");
        let resumed = t;
        while t < resumed + limit {
            assert!(!clock.tick(t, limit), "{:?} after the stall", t - resumed);
            t += tick;
        }
        t += tick;
        assert!(clock.tick(t, limit), "a whole bound after the stall");
        // A gap under half the bound (a long job of the backend thread) is no stall.
        t += limit / 2 - Duration::from_millis(1);
        assert!(clock.tick(t, limit));
    }
}
