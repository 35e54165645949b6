//! What meshd calls: opening the backend ([`MpsBackend::open`]) and the [`Backend`] trait's methods, each of which hands its job to the job's own file.

use super::device_rings::open_rings;
use super::takeover::start_standby;
use super::workers::start_pool;
use super::*;

impl MpsBackend {
    /// Starts the private daemon, adopts what a previous meshd left running (under an orphan grace),
    /// and starts the pool and the standby (each worker checked to be our client): before any
    /// program runs, or, with adopted programs running, while meshd serves.
    pub fn open(mailbox: &Mailbox, config: MpsConfig) -> Result<Self> {
        let (client_limit, limit_source) = crate::pool::client_limit(mesh_cuda::driver::init().ok().map(|d| d.version));
        if config.pool > client_limit {
            return Err(BackendError::ClientLimit { asked: config.pool, limit: client_limit });
        }
        let standby = config.standby_size();
        if config.pool + standby > client_limit {
            return Err(BackendError::Invalid {
                what: format!("--pool {} with --standby {standby}", config.pool),
                reason: format!(
                    "the pool and the standby would be {} MPS clients, more than this device's {client_limit} \
                     ({limit_source}); lower --standby (it needs one worker per program that runs) or --pool",
                    config.pool + standby
                ),
            });
        }
        let growth = client_limit - config.pool - standby;
        tracing::info!(
            "MPS clients: the pool uses {} and the standby {standby} of this device's {client_limit} ({limit_source}); \
             up to {} program(s) run without creating a client, {}",
            config.pool,
            config.pool,
            if config.pool_grow {
                format!("and --pool-grow may create {growth} more (each stalls the running programs once)")
            } else {
                format!("{growth} more with --pool-grow")
            }
        );
        let check_us = u64::try_from(config.kernel_check.as_micros()).unwrap_or(u64::MAX);
        if !mesh_mps_worker::KERNEL_CHECK_RANGE_US.contains(&check_us) {
            return Err(BackendError::Invalid {
                what: format!("the MPS workers' kernel check period {check_us} µs"),
                reason: format!(
                    "must be {} to {} µs",
                    mesh_mps_worker::KERNEL_CHECK_RANGE_US.start(),
                    mesh_mps_worker::KERNEL_CHECK_RANGE_US.end()
                ),
            });
        }
        tracing::info!(
            "MPS workers check a running kernel's stream every {check_us} µs (how soon a fault is heard, against each \
             worker's CPU use); a worker silent for {} ms is replaced",
            SILENCE_LIMIT.as_millis()
        );
        let device = Device::get(0)?;
        // Every worker looks its GPU up by UUID (under MPS a client sees the server's devices renumbered).
        let uuid = match device.uuid() {
            Ok(uuid) => Some(uuid),
            Err(e) => {
                tracing::warn!("the GPU's UUID: {e}; workers open the server's device 0");
                None
            }
        };
        let pool = PoolFigures::default();
        pool.open(config.pool, config.pool_grow, client_limit, limit_source);
        if let Some(n) = config.sms {
            device.sm_partitioning()?.check(n)?;
        }
        // meshd's own plain context, beside the daemon's start or adoption (neither touches the GPU,
        // and a restart that adopts running programs answers sooner for it): it cannot become a
        // client of our daemon, whose pipe directory only the children's environment names (a
        // daemon that meshd's own environment leads to is refused by its check, with the reason).
        // MPS mode still starts without it: only device channels are then refused, saying why.
        let rings_device = device.clone();
        let own_context = std::thread::Builder::new()
            .name("mps-own-context".into())
            .spawn(move || open_rings(&rings_device))
            .map_err(|e| BackendError::MpsDaemon(format!("a thread for meshd's own context: {e}")))?;
        let (root, owned) = match &config.mps_dir {
            Some(dir) => (dir.clone(), false),
            None => (crate::mps_dir::default_root(mailbox.path()), true),
        };
        let orphans = orphan_policy(&root, &config)?;
        let control = Arc::new(
            MpsControl::start_in(root, owned, orphans)?.with_device(uuid).with_kernel_check(config.kernel_check),
        );
        // A panic there (none is expected) leaves device channels refused, as a failed context does.
        let rings = own_context.join().unwrap_or_default();
        let (news, news_rx) = NewsSender::channel();
        let shared = Arc::new(Mutex::new(Shared {
            control: Some(control.clone()),
            news: Some(news_rx),
            rings,
            ..Shared::default()
        }));
        let for_cleanup = shared.clone();
        let cleanup_id = cleanup::register("MPS workers and control daemon", move || tear_down(&for_cleanup));
        // Before the pool: a previous meshd's programs that run on are adopted, the rest of its
        // slots freed, before any new client of the server exists.
        let mut events = Vec::new();
        let (adopted, lines) = {
            let mut s = shared.lock();
            super::adoption::adopt_greeted(&control, mailbox, &news, &mut s.rings, &mut events)
        };
        for line in lines {
            tracing::warn!("{line}");
        }
        if !adopted.is_empty() {
            tracing::info!(
                "{} program(s) of the previous meshd run on, adopted; the relaunch claims them by name",
                adopted.len()
            );
        }
        let running = adopted.len();
        {
            let mut s = shared.lock();
            s.adopted = adopted;
            s.events = events;
        }
        *ACTIVE.lock() = Some(control.clone());
        let cubins = control.mps_dir().join("cubins");
        let built = std::fs::create_dir_all(&cubins)
            .map_err(|e| BackendError::MpsDaemon(format!("{}: {e}", cubins.display())))
            .and_then(|()| start_pool(&control, mailbox, &config, &shared, &news, running))
            .and_then(|()| start_standby(&control, mailbox, &config, &shared, &news, running > 0))
            .and_then(|()| start_keeper(&control, owned, &shared))
            .and_then(|()| Jit::start(&device.arch()));
        let jit = match built {
            Ok(j) => j,
            Err(e) => {
                cleanup::run_one(cleanup_id);
                pool.close();
                return Err(e);
            }
        };
        pool.publish(shared.lock().idle.len(), 0);
        Ok(Self {
            shared,
            mailbox: mailbox.clone(),
            jit,
            device,
            config,
            cleanup_id,
            cubins,
            next_cubin: AtomicU64::new(0),
            shut_down: false,
            client_limit,
            pool,
            news,
            silence: SilenceClock::new(),
            board: RecoveryBoard::new(),
            cutting: Arc::default(),
        })
    }
}

/// The orphan policy of `--orphan-grace-ms` on MPS directory `root`, or `None` for a grace of 0;
/// refused when the rendezvous sockets would not fit a socket path.
fn orphan_policy(root: &Path, config: &MpsConfig) -> Result<Option<crate::orphans::OrphanPolicy>> {
    if config.orphan_grace.is_zero() {
        return Ok(None);
    }
    let rendezvous_dir = crate::orphans::rendezvous_dir(root);
    mesh_mps_worker::orphan::check_rendezvous_dir(&rendezvous_dir)
        .map_err(|reason| BackendError::Invalid { what: "--orphan-grace-ms".into(), reason })?;
    tracing::info!(
        "MPS workers outlive meshd: after a crash each program runs on for up to {} ms, waiting at {} for a meshd, \
         then stops in order",
        config.orphan_grace.as_millis(),
        rendezvous_dir.display()
    );
    Ok(Some(crate::orphans::OrphanPolicy {
        grace: config.orphan_grace,
        stop_deadline: config.stop_deadline,
        rendezvous_dir,
        control: crate::control::find_control()?,
    }))
}

/// Under an orphan grace, the keeper of the MPS directory (its daemons' pipe directories: the
/// active one and the standby's), which quits them once meshd has died and the last orphan is gone.
fn start_keeper(control: &MpsControl, owned: bool, shared: &Mutex<Shared>) -> Result<()> {
    let Some(policy) = control.orphans() else { return Ok(()) };
    let mut s = shared.lock();
    let mut pipe_dirs = vec![control.pipe_dir()];
    pipe_dirs.extend(s.standby.as_ref().map(|sb| sb.control().pipe_dir()));
    let keeper = crate::orphans::Keeper::start(control.mps_dir(), &pipe_dirs, policy, owned)?;
    tracing::info!("MPS keeper {} watches {}", keeper.pid(), control.mps_dir().display());
    s.keeper = Some(keeper);
    Ok(())
}

impl Backend for MpsBackend {
    fn mode(&self) -> IsolationMode {
        IsolationMode::Mps
    }

    fn pool(&self) -> Option<PoolFigures> {
        Some(self.pool.clone())
    }

    fn load(&mut self, spec: ProgramSpec) -> Result<ProgramStatus> {
        self.load_program(spec)
    }

    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> Result<ProgramStatus> {
        self.upgrade_program(name, image)
    }

    fn unload(&mut self, name: &str) -> Result<()> {
        self.unload_program(name)
    }

    fn status(&self) -> Vec<ProgramStatus> {
        let mut s = self.lock();
        absorb(&mut s);
        let states: Vec<KernelState> = s
            .programs
            .iter()
            // A program left stopped has no kernel to speak of.
            .map(|p| if on_watch(p) { p.worker.kernel() } else { KernelState::Idle })
            .collect();
        self.pool.publish(s.idle.len(), s.programs.len());
        s.programs.iter().zip(states).map(|(p, state)| self.status_of(p, state)).collect()
    }

    fn watch(&mut self) -> Vec<String> {
        self.watch_tick()
    }

    fn set_recovery_board(&mut self, board: RecoveryBoard) {
        self.news.set_on_failure(failure_hook(board.clone(), self.cutting.clone()));
        self.board = board;
    }

    fn set_waker(&mut self, wake: mesh_backend::Waker) {
        self.news.set_wake(wake);
    }

    fn take_events(&mut self) -> Vec<BackendEvent> {
        std::mem::take(&mut self.lock().events)
    }

    fn channel_deleted(&mut self, index: u32) {
        // meshd's own context runs no kernel, so releasing its allocation waits for nothing.
        if let Some(rings) = self.lock().rings.as_mut() {
            rings.release(index);
        }
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.shut_down {
            return Ok(());
        }
        self.retire_unclaimed();
        self.shut_down = true;
        let programs: Vec<Program> = self.lock().programs.drain(..).collect();
        for p in programs {
            // A program that will not stop is cut off inside `stop`: nothing runs on afterwards.
            if let Some(w) = self.stop(&p.core.name, p.core.slot, p.worker) {
                w.exit();
            }
            let _ = slots::release(&self.mailbox, p.core.slot);
        }
        let idle: Vec<Worker> = self.lock().idle.drain(..).collect();
        for w in idle {
            w.exit();
        }
        cleanup::run_one(self.cleanup_id);
        self.pool.close();
        Ok(())
    }

    fn hand_over(&mut self) -> Result<mesh_backend::Handover> {
        self.hand_over_programs()
    }

    fn host_atomics(&self) -> bool {
        self.device.host_atomics
    }
}

impl Drop for MpsBackend {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
