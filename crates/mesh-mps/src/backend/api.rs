//! What meshd calls: opening the backend ([`MpsBackend::open`]) and the [`Backend`] trait's methods, each of which hands its job to the job's own file.

use super::device_rings::open_rings;
use super::takeover::start_standby;
use super::workers::start_pool;
use super::*;

impl MpsBackend {
    /// Starts the private daemon and the pool (each worker checked to be our client) before any program runs.
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
        // Before the MPS daemon exists, so that it cannot become its client.
        // MPS mode still starts without it: only device channels are then refused, saying why.
        let rings = open_rings(&device);
        let control = Arc::new(
            MpsControl::start(config.mps_dir.as_deref())?.with_device(uuid).with_kernel_check(config.kernel_check),
        );
        let (news, news_rx) = NewsSender::channel();
        let shared = Arc::new(Mutex::new(Shared {
            control: Some(control.clone()),
            news: Some(news_rx),
            rings,
            ..Shared::default()
        }));
        let for_cleanup = shared.clone();
        let cleanup_id = cleanup::register("MPS workers and control daemon", move || tear_down(&for_cleanup));
        *ACTIVE.lock() = Some(control.clone());
        let cubins = control.root().join("cubins");
        let built = std::fs::create_dir_all(&cubins)
            .map_err(|e| BackendError::MpsDaemon(format!("{}: {e}", cubins.display())))
            .and_then(|()| start_pool(&control, mailbox, &config, &shared, &news))
            .and_then(|()| start_standby(&control, mailbox, &config, &shared, &news))
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

    fn shutdown(&mut self) -> Result<()> {
        if self.shut_down {
            return Ok(());
        }
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

    fn host_atomics(&self) -> bool {
        self.device.host_atomics
    }
}

impl Drop for MpsBackend {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
