//! Recovery from a GPU fault: every client ended (or abandoned to the standby), the culprit named or
//! searched by halves, the others relaunched in fresh workers.

use super::device_rings::map_channels;
use super::liveness::reap_later;
use super::takeover::take_over;
use super::workers::start_many;
use super::*;

/// The MPS backend as a recovery drives it, under its lock: a reset ends every client, a relaunch
/// starts fresh workers side by side.
struct Clients<'a> {
    backend: &'a MpsBackend,
    s: &'a mut Shared,
    control: &'a MpsControl,
    times: Breakdown,
    /// The programs move to the standby server: the faulted server's workers are abandoned (killed,
    /// reaped later), and the relaunch takes standby workers instead of starting clients.
    standby: bool,
}

/// Where a recovery's time went, for its log line (summed over a search by halves' rounds).
#[derive(Debug, Default, Clone, Copy)]
struct Breakdown {
    /// Ending every client.
    ending: Duration,
    /// Starting the new workers (MPS clients) side by side.
    new_clients: Duration,
    /// Loading each program into its new worker and launching it.
    relaunch: Duration,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn unix_ns_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl Recovery for Clients<'_> {
    type Error = std::convert::Infallible;

    fn reset(&mut self) -> std::result::Result<(), Self::Error> {
        let started = Instant::now();
        if self.standby {
            self.backend.abandon_all_clients(self.s);
        } else {
            self.backend.end_all_clients(self.s, self.control);
        }
        // No client maps a ring now: each is kept, messages and all, for the relaunched programs.
        if let Some(rings) = self.s.rings.as_mut() {
            let (kept, errors) = rings.keep_all(&self.backend.mailbox);
            for e in errors {
                tracing::error!("{e}");
            }
            for k in kept {
                tracing::info!(
                    channel = k.channel,
                    "channel {:?}: its device ring keeps its {} message(s) through the recovery (a consumer that \
                     had not published its position takes up to a ring of them again)",
                    k.channel,
                    k.held
                );
            }
        }
        self.times.ending += started.elapsed();
        Ok(())
    }

    fn relaunch(&mut self, which: &[usize]) {
        self.backend.relaunch(self.s, self.control, which, &mut self.times, self.standby);
    }

    fn faulted_within(&mut self, running: &[usize]) -> bool {
        faulted_within(self.s, running)
    }

    fn core(&mut self, i: usize) -> &mut ProgramCore {
        &mut self.s.programs[i].core
    }

    fn relaunchable(&self, i: usize) -> bool {
        relaunchable(&self.s.programs[i])
    }

    fn count(&self) -> usize {
        self.s.programs.len()
    }

    fn record(&mut self, event: BackendEvent) {
        self.s.events.push(event);
    }
}

impl MpsBackend {
    /// After a GPU fault: NVIDIA documents (and the H200 showed) that a fatal fault in one client is
    /// reported to every client, and that the server takes no new client until all of them have exited.
    /// So every client is ended at once, and the culprit is named from the evidence (mesh-backend's
    /// `watch`: slots, a dead worker, the server's log, recency, heartbeats); the others are relaunched
    /// at once in fresh workers started side by side. When it cannot be named it is searched by halves
    /// (each half relaunched and watched for [`FAULT_WATCH`]). A server that went away names no one.
    /// Returns the log lines.
    pub(super) fn recover(&self, error: &str) -> Vec<String> {
        let started = Instant::now();
        let started_unix = unix_ns_now();
        let mut s = self.lock();
        let Some(control) = s.control.clone() else { return Vec::new() };
        // Every program on the GPU shows as recovering from now until it is relaunched (the reader
        // thread that heard the fault marked the recovery begun already, naming no program).
        self.board.begin(
            format!("GPU fault: {error}"),
            s.programs.iter().filter(|p| on_watch(p)).map(|p| p.core.name.clone()).collect::<Vec<_>>(),
        );
        // The first worker to see the fault, and when (its own clock reading, not meshd's).
        let first_seen = s.programs.iter().filter_map(|p| p.worker.failed_at().map(|t| (t, p.worker.pid()))).min();
        // Every worker says its kernel failed within some 40 ms of the first (H200); one that died
        // says nothing, and is seen dying. Waited for (at most FAULT_SPREAD) before the evidence is
        // read, so that a death is never mistaken for a fault to search by halves.
        news_until(&mut s, Instant::now() + FAULT_SPREAD, |s| {
            s.programs.iter().filter(|p| on_watch(p)).all(|p| p.worker.failed_or_dead())
        });
        let evidence = self.evidence(&mut s, &control, started);
        // Only a list that answers and lacks our server says it went away.
        let server_gone = control.servers().is_ok_and(|servers| {
            s.programs.iter().filter(|p| on_watch(p)).any(|p| !servers.contains(&p.worker.server))
        });
        let mut verdict = if server_gone { Verdict::NoCulprit } else { watch::name_culprit(&evidence, watch::TICK) };
        let mut log = vec![format!(
            "GPU fault reported to the MPS clients ({error}){}: ending every client; {verdict:?}",
            if server_gone { "; our MPS server went away" } else { "" }
        )];
        // A worker killed from outside (or crashed) while its kernel ran: its death failed every
        // client's kernel, so no program is to blame and all are relaunched, its own too; a program
        // whose workers keep dying ([`DEATH_LIMIT`] within [`DEATH_WINDOW`]) is left stopped.
        for (i, e) in evidence.iter().enumerate() {
            if !e.process_gone || server_gone {
                continue;
            }
            let p = &mut s.programs[i];
            p.deaths.retain(|t| started.saturating_duration_since(*t) < DEATH_WINDOW);
            p.deaths.push(started);
            let n = p.deaths.len();
            log.push(format!(
                "MPS worker {} of program {} died while its kernel ran, without its kernel reporting a fault of its \
                 own (killed from outside, e.g. the OOM killer or an operator, or crashed): its death failed every \
                 client's kernel; death {n} of {DEATH_LIMIT} allowed within {} s",
                p.worker.pid(),
                p.core.name,
                DEATH_WINDOW.as_secs()
            ));
            if n >= DEATH_LIMIT && !matches!(verdict, Verdict::Culprit { .. }) {
                verdict = Verdict::Culprit {
                    index: i,
                    why: format!(
                        "its MPS worker died {n} times within {} s while its kernel ran (each death fails every \
                         program's kernel); `meshd upgrade` or a new load runs it again",
                        DEATH_WINDOW.as_secs()
                    ),
                };
            }
        }
        // The standby takes the programs over unless one reason below holds; the log names it. A
        // named culprit is left stopped: it needs no standby worker.
        let culprit = match &verdict {
            Verdict::Culprit { index, .. } => Some(*index),
            _ => None,
        };
        let to_relaunch: Vec<usize> =
            (0..s.programs.len()).filter(|&i| relaunchable(&s.programs[i]) && Some(i) != culprit).collect();
        let refusal = self.standby_refusal(&mut s, &verdict, &to_relaunch);
        let standby = s.standby.is_some() && refusal.is_none();
        if let Some(why) = &refusal {
            log.push(format!("MPS standby not used for this recovery: {why}; the usual recovery"));
        }
        let named = started.elapsed();
        let mut clients = Clients { backend: self, s: &mut s, control: &control, times: Breakdown::default(), standby };
        let culprit = recover::recover(&mut clients, &verdict, error, &evidence, started, &mut log);
        let times = clients.times;
        let Ok(culprit) = culprit;
        self.board.end();
        if let Some((i, why)) = &culprit {
            tracing::error!(program = s.programs[*i].core.name, "caused the GPU fault ({why}): left stopped");
        }
        let name = culprit.as_ref().map_or_else(|| "none".to_string(), |(i, _)| s.programs[*i].core.name.clone());
        let running = s.programs.iter().filter(|p| p.core.life.phase() == &Phase::Running).count();
        let detection = first_seen.map_or_else(
            || "no worker said when it saw the fault".to_string(),
            |(at, pid)| {
                format!(
                    "worker {pid} saw the fault {:.1} ms before the recovery began",
                    started_unix.saturating_sub(at) as f64 / 1e6
                )
            },
        );
        log.push(format!(
            "watchdog mps: recovered in {:.1} ms; culprit {name}; {running} program(s) running; breakdown: {detection}; \
             evidence and culprit {:.1} ms; ending the clients {:.1} ms; new clients {:.1} ms; loads and launches {:.1} \
             ms; the rest is a search's watches",
            ms(started.elapsed()),
            ms(named),
            ms(times.ending),
            ms(times.new_clients),
            ms(times.relaunch),
        ));
        // A pool still being made (after an adoption) was being made on the faulted server: its
        // workers go (reaped by the standby's ticks, so as not to wait on the driver here), and the
        // pool is now the standby's idle workers or the refill's.
        if let Some(mut fill) = s.pool_fill.take() {
            for mut w in fill.starting.take_all() {
                match s.standby.as_mut() {
                    Some(sb) => sb.bury(w),
                    None => w.kill(),
                }
            }
        }
        if standby {
            // The standby server is the active one now; its idle workers are the pool (creating more
            // would stall the programs just relaunched there), and a new standby is made on the
            // faulted server by the watchdog's ticks, as it takes clients again.
            take_over(&mut s, &control, &mut log);
        } else {
            self.refill(&mut s, &control);
        }
        log
    }

    /// What each program's slot, worker and heartbeat said when the fault was noticed, with the
    /// server's log searched for a line about the fault that names a worker.
    fn evidence(&self, s: &mut Shared, control: &MpsControl, now: Instant) -> Vec<Evidence> {
        let log = std::fs::read_to_string(control.log_dir().join("server.log")).unwrap_or_default();
        let fault_lines: Vec<&str> = log
            .lines()
            .filter(|l| {
                let l = l.to_ascii_lowercase();
                l.contains("fatal") || l.contains("exception") || l.contains("fault") || l.contains("illegal")
            })
            .collect();
        s.programs
            .iter_mut()
            .map(|p| {
                let state = self.mailbox.slot(p.core.slot).map(|s| s.status().state).unwrap_or(STATE_IDLE);
                let pid = p.worker.pid().to_string();
                Evidence {
                    on_gpu: on_watch(p) && matches!(state, STATE_IDLE | STATE_RUNNING),
                    named_by_server: fault_lines
                        .iter()
                        .any(|l| l.split(|c: char| !c.is_ascii_digit()).any(|w| w == pid)),
                    process_gone: p.worker.died_unreported(),
                    image_age: p.core.health.image_age(now),
                    beat_stale: p.core.health.beat_stale(now),
                }
            })
            .collect()
    }

    /// Relaunches programs `which` (stopped, their clients ended) in fresh workers started side by
    /// side; a program whose relaunch fails is left stopped with the error.
    fn relaunch(&self, s: &mut Shared, control: &MpsControl, which: &[usize], times: &mut Breakdown, standby: bool) {
        let spawned = Instant::now();
        let taken = if standby { s.standby.as_mut().and_then(|sb| sb.take(which.len())) } else { None };
        let workers = match taken {
            Some(w) => w,
            None => {
                // Each program in a worker of its own size (its `--sms`, else the global one):
                // the sizes one after the other, each size's workers side by side.
                let mut asks: BTreeMap<Option<u32>, usize> = BTreeMap::new();
                for &i in which {
                    *asks.entry(s.programs[i].worker.asked_sms).or_default() += 1;
                }
                asks.into_iter()
                    .flat_map(|(ask, n)| start_many(control, self.mailbox.path(), ask, &self.news, n))
                    .collect()
            }
        };
        times.new_clients += spawned.elapsed();
        let launched_at = Instant::now();
        self.launch_in(s, which, workers, standby, "a GPU fault");
        times.relaunch += launched_at.elapsed();
    }

    /// Relaunches programs `which` (stopped) in `workers`, one each, the old worker of each killed (or
    /// handed to the standby to reap); a program left without a worker, or whose launch fails, is
    /// left stopped with the error, naming `after` (what the relaunch follows). Workers left over go
    /// to the pool (standby) or are killed.
    pub(super) fn launch_in(
        &self,
        s: &mut Shared,
        which: &[usize],
        mut workers: Vec<Worker>,
        standby: bool,
        after: &str,
    ) {
        for &i in which {
            let ask = s.programs[i].worker.asked_sms;
            let Some(mut worker) = workers.iter().position(|w| w.asked_sms == ask).map(|at| workers.swap_remove(at))
            else {
                s.programs[i].core.life.fault(format!("relaunch after {after} failed: no MPS client could be started"));
                continue;
            };
            let Shared { programs, rings, standby: sb, .. } = &mut *s;
            let p = &mut programs[i];
            let launched = self.load_into(&mut worker, &p.core.name, &p.cubin, &p.core.shape).and_then(|_| {
                map_channels(rings, &self.mailbox, &mut worker, p.core.slot)?;
                let generation = p.core.life.launch().map_err(|e| illegal(&p.core.name, e))?;
                slots::arm(&self.mailbox, p.core.slot, generation)?;
                p.core.health.launched(slots::reading(&self.mailbox, p.core.slot).heartbeat);
                worker.launch(p.core.slot)
            });
            let old = std::mem::replace(&mut p.worker, worker);
            match sb.as_mut().filter(|_| standby) {
                Some(sb) => sb.bury(old),
                None => reap_later(old),
            }
            match launched {
                Ok(()) => {
                    p.core.health.restarts += 1;
                    self.board.relaunched(&p.core.name);
                }
                Err(e) => {
                    tracing::error!(program = p.core.name, "relaunch after {after} failed: {e}");
                    p.core.life.returned();
                    p.core.life.fault(format!("relaunch after {after} failed: {e}"));
                }
            }
        }
        for mut w in workers {
            if standby {
                s.idle.push(w);
            } else {
                w.kill();
            }
        }
    }

    /// Abandons every client of the faulted server (the standby takes the programs over): a stop
    /// request to every program, every worker signalled (each kernel has failed, so a SIGKILL harms
    /// no other), the idle ones handed to the standby to reap; none is waited for.
    fn abandon_all_clients(&self, s: &mut Shared) {
        for p in &mut s.programs {
            slots::request_stop(&self.mailbox, p.core.slot);
            p.core.life.request_stop();
            p.worker.signal_kill();
        }
        let idle = std::mem::take(&mut s.idle);
        match s.standby.as_mut() {
            Some(sb) => idle.into_iter().for_each(|w| sb.bury(w)),
            None => idle.into_iter().for_each(|mut w| w.kill()),
        }
        for p in &mut s.programs {
            p.core.life.returned();
        }
    }

    /// Ends every client, bounded (at most about [`FAULT_SPREAD`] + [`TERMINATE_WITHIN`] +
    /// [`CUT_OFF`], however many): a stop request to every program; a wait of up to
    /// [`FAULT_SPREAD`] for every worker to say its kernel failed (after a fault they all do, within
    /// some 40 ms of each other on the H200); a worker whose kernel may still run is then cut off
    /// through the server, all side by side, each bounded (a server busy with the fault held a
    /// `terminate_client` for the daemon's 10 s timeout: "ending the clients 10267.3 ms"); then
    /// every worker is signalled. None is reaped here: a SIGKILLed client stays in D state while the
    /// driver tears its context down (up to 2 s), and the server takes new clients only once it is
    /// gone, which the relaunch waits for anyway.
    fn end_all_clients(&self, s: &mut Shared, control: &MpsControl) {
        for p in &mut s.programs {
            slots::request_stop(&self.mailbox, p.core.slot);
            p.core.life.request_stop();
        }
        let every_worker = |s: &Shared| -> Vec<(u32, u32)> {
            s.idle
                .iter()
                .chain(s.programs.iter().map(|p| &p.worker))
                .filter(|w| may_run_a_kernel(w))
                .map(|w| (w.server, w.pid()))
                .collect()
        };
        news_until(s, Instant::now() + FAULT_SPREAD, |s| every_worker(s).is_empty());
        let busy = every_worker(s);
        if !busy.is_empty() {
            let pids: Vec<u32> = busy.iter().map(|b| b.1).collect();
            tracing::warn!(
                "MPS workers {pids:?} did not say their kernel failed within {} ms: cut off through the server first \
                 (at most {} ms)",
                FAULT_SPREAD.as_millis(),
                TERMINATE_WITHIN.as_millis()
            );
            for (pid, e) in control.terminate_clients(&busy, TERMINATE_WITHIN) {
                tracing::error!("cutting MPS worker {pid} off its server: {e}; it is killed all the same");
            }
            std::thread::sleep(CUT_OFF);
        }
        for w in s.idle.iter().chain(s.programs.iter().map(|p| &p.worker)) {
            w.signal_kill();
        }
        for w in s.idle.drain(..) {
            reap_later(w);
        }
        for p in &mut s.programs {
            p.core.life.returned();
        }
    }
}

/// Watches programs `running` for [`FAULT_WATCH`]: whether the fault came back. Waits on the
/// workers' news (no worker is asked), so a failure is seen as soon as its worker says it.
fn faulted_within(s: &mut Shared, running: &[usize]) -> bool {
    // A fault reaches the clients some 150 ms after the faulting launch: watch long enough.
    news_until(s, Instant::now() + FAULT_WATCH, |s| {
        running.iter().any(|&i| on_watch(&s.programs[i]) && failed(&s.programs[i].worker).is_some())
    })
}
