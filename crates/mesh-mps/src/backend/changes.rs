//! A program's load, upgrade and unload: its image linked and probed in a worker, launched, stopped.

use super::device_rings::map_channels;
use super::*;

impl MpsBackend {
    /// [`Backend::load`]: linked and probed in an idle worker, then launched in a free slot.
    pub(super) fn load_program(&mut self, spec: ProgramSpec) -> Result<ProgramStatus> {
        self.ready()?;
        spec.validate()?;
        roster::refuse_duplicate(&self.lock().programs, &spec.name)?;
        if let Some(n) = spec.sms {
            self.device.sm_partitioning()?.check(n)?;
        }
        if let Some(status) = self.adopt_program(&spec) {
            return Ok(status);
        }
        let bindings = slots::channel_indices(&self.mailbox, &spec.bindings)?;
        let slot = self.free_slot()?;
        let cubin = self.link_checked(&spec.name, spec.image, spec.kind)?;
        slots::check_declared(&self.mailbox, &spec.name, &spec.bindings, &cubin)?;
        let mut worker = self.take_worker(spec.sms.or(self.config.sms), &spec.name, "load")?;
        let prepared = self.prepare(&mut worker, &spec.name, cubin, &spec.shape, None);
        let ((share, cubin), previous) =
            match prepared.and_then(|p| slots::prepare(&self.mailbox, slot, &spec.name, &bindings).map(|g| (p, g))) {
                Ok(p) => p,
                Err(e) => {
                    self.give_back(worker);
                    return Err(e);
                }
            };
        let mut core = ProgramCore::new(spec.name, slot, spec.kind, spec.shape, share);
        core.life = mesh_backend::life::Life::after(previous);
        let launched = core
            .life
            .launch()
            .map_err(|e| illegal(&core.name, e))
            .and_then(|generation| slots::arm(&self.mailbox, slot, generation))
            .and_then(|()| map_channels(&mut self.lock().rings, &self.mailbox, &mut worker, slot))
            .and_then(|()| worker.launch(slot));
        if let Err(e) = launched {
            let _ = slots::release(&self.mailbox, slot);
            self.give_back(worker);
            return Err(e);
        }
        let program = Program { core, worker, cubin, deaths: Vec::new() };
        let status = self.status_of(&program, KernelState::Busy);
        self.lock().programs.push(program);
        self.publish_pool();
        Ok(status)
    }

    /// [`Backend::upgrade`]: the new image probed in another worker while the old one runs; only this
    /// program blinks.
    pub(super) fn upgrade_program(&mut self, name: &str, image: Vec<u8>) -> Result<ProgramStatus> {
        self.ready()?;
        let i = roster::index_of(&self.lock().programs, name)?;
        let kind = ImageKind::detect_for(name, &image)?;
        let (shape, sms) = {
            let s = self.lock();
            let p = &s.programs[i];
            (p.core.shape, p.worker.asked_sms)
        };
        // The new image is linked first, then loaded and probed in another worker while the old one runs.
        let cubin = self.link_checked(name, image, kind)?;
        let slot = self.lock().programs[i].core.slot;
        slots::check_declared_in(&self.mailbox, name, slot, &cubin)?;
        let mut fresh = self.take_worker(sms, name, "upgrade")?;
        let (share, cubin) = match self.prepare(&mut fresh, name, cubin, &shape, Some(name)) {
            Ok(s) => s,
            Err(e) => {
                self.give_back(fresh);
                return Err(e);
            }
        };
        // Only this program blinks: stop the old kernel, relaunch in the same slot from the new worker.
        let mut old = self.lock().programs.remove(i);
        let slot = old.core.slot;
        old.core.life.request_stop();
        let kept = self.stop(name, slot, old.worker);
        old.core.life.returned();
        old.core.life.new_image();
        old.core.health.new_image(Instant::now());
        let launched = old
            .core
            .life
            .launch()
            .map_err(|e| illegal(name, e))
            .and_then(|generation| slots::arm(&self.mailbox, slot, generation))
            .and_then(|()| map_channels(&mut self.lock().rings, &self.mailbox, &mut fresh, slot))
            .and_then(|()| fresh.launch(slot));
        if let Some(w) = kept {
            self.give_back(w);
        }
        old.worker = fresh;
        old.core.kind = kind;
        old.core.share = share;
        old.cubin = cubin;
        if let Err(e) = &launched {
            old.core.life.fault(e.to_string());
        }
        let status = self.status_of(&old, if launched.is_ok() { KernelState::Busy } else { KernelState::Idle });
        self.lock().programs.insert(i, old);
        self.grow_back(name);
        launched?;
        Ok(status)
    }

    /// [`Backend::unload`]: stopped, its slot released, its worker given back.
    pub(super) fn unload_program(&mut self, name: &str) -> Result<()> {
        self.ready()?;
        let i = roster::index_of(&self.lock().programs, name)?;
        let p = self.lock().programs.remove(i);
        self.board.forget(name);
        let slot = p.core.slot;
        let kept = self.stop(name, slot, p.worker);
        slots::release(&self.mailbox, slot)?;
        if let Some(w) = kept {
            self.give_back(w);
        }
        self.grow_back(name);
        Ok(())
    }

    /// Has `worker` load `cubin` and probe its `mesh_main` for `shape`.
    pub(super) fn load_into(
        &self,
        worker: &mut Worker,
        name: &str,
        cubin: &[u8],
        shape: &LaunchShape,
    ) -> Result<Probe> {
        let n = self.next_cubin.fetch_add(1, Ordering::Relaxed);
        let path = self.cubins.join(format!("{n}-{name}.cubin"));
        std::fs::write(&path, cubin)
            .map_err(|e| BackendError::Worker { pid: worker.pid(), detail: format!("{}: {e}", path.display()) })?;
        let probe = worker.load(&path, shape, name);
        let _ = std::fs::remove_file(&path);
        probe
    }

    /// Links `image` and reads its entry point, before any worker is taken: an image refused for
    /// its format, architecture, link or entry is refused for that reason in both modes, never for
    /// an empty pool (and no idle worker is spent on it).
    pub(super) fn link_checked(&self, name: &str, image: Vec<u8>, kind: ImageKind) -> Result<Arc<Vec<u8>>> {
        let linked = self.jit.link(name, image, kind)?;
        if mesh_cuda::entry::function(&linked.cubin, "mesh_main") == mesh_cuda::entry::Entry::Missing {
            return Err(BackendError::NoEntry {
                program: name.to_string(),
                detail: "the linked cubin's symbol table defines no function mesh_main".into(),
            });
        }
        Ok(linked.cubin)
    }

    /// Has `worker` load and probe the linked `cubin`, and checks that it can be resident beside the
    /// others: every block within the worker's own context, its share counted of the device's SMs,
    /// which every worker shares. Returns the launch's share and the cubin.
    pub(super) fn prepare(
        &mut self,
        worker: &mut Worker,
        name: &str,
        cubin: Arc<Vec<u8>>,
        shape: &LaunchShape,
        replacing: Option<&str>,
    ) -> Result<(f64, Arc<Vec<u8>>)> {
        let probe = self.load_into(worker, name, &cubin, shape)?;
        let held = roster::held_share(&self.lock().programs, replacing);
        let sms = SmBudget::own_context(probe.sms, self.device.sm_count);
        let share = check_resident(name, shape, &probe.figures(), sms, held)?;
        Ok((share, cubin))
    }

    /// Stops the kernel in `worker`: the stop request through the mailbox; past the deadline,
    /// `terminate_client` on our server; only then SIGKILL. Returns the worker if it is reusable.
    /// Never fails: whatever happens, the kernel is stopped or its worker is gone afterwards.
    pub(super) fn stop(&self, name: &str, slot: u32, mut worker: Worker) -> Option<Worker> {
        slots::request_stop(&self.mailbox, slot);
        let deadline = self.config.stop_deadline;
        match worker.wait(deadline, WORKER_LAUNCH) {
            Ok(KernelState::Idle) => Some(worker),
            Ok(KernelState::Failed { reason }) => {
                tracing::warn!(program = name, "its kernel had failed ({reason}); worker {} discarded", worker.pid());
                worker.kill();
                None
            }
            other => {
                tracing::warn!(
                    program = name,
                    "did not stop within {} ms ({other:?}): cutting worker {} off its MPS server",
                    deadline.as_millis(),
                    worker.pid()
                );
                self.cut_off_and_kill(self.control().ok(), &mut worker, "MPS worker");
                None
            }
        }
    }
}
