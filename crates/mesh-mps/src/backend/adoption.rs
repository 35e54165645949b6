//! Programs adopted from a previous meshd: the orphans greeted when its daemon was adopted, checked against the mailbox, held until the relaunch claims each by name, and those left over stopped.
//!
//! The relaunch loads what the state directory records. A recorded program whose orphan was
//! adopted is not launched again: [`MpsBackend::adopt_program`] takes the running worker as the
//! program's, after checking that it runs what is recorded (its slot's name and bindings, its
//! launch shape, its SMs) and linking the recorded image, which a later recovery relaunches. An
//! orphan that fails a check, and one that no recorded program claims, has its kernel stopped in
//! order before anything else runs in its slot, so two generations of a program never run at once.

use super::*;
use crate::orphans::Greeted;
use mesh_mps_worker::{FileId, Loaded};

use super::Adoptee;

/// Why orphan `g` cannot be adopted into `mailbox`, or what it runs: its slot's name, slot,
/// generation and loaded module.
fn check(g: &Greeted, mailbox: &Mailbox) -> std::result::Result<(String, u32, u32, Loaded), String> {
    let o = &g.orphan;
    match FileId::of(mailbox.path()) {
        Ok(id) if id == o.mailbox => {}
        Ok(_) => return Err(format!("it maps another mailbox file than {}", mailbox.path().display())),
        Err(e) => return Err(format!("the mailbox {}: {e}", mailbox.path().display())),
    }
    let (Some(index), Some(generation)) = (o.slot, o.generation) else {
        return Err("it launched no program".into());
    };
    let slot = mailbox.slot(index).map_err(|e| e.to_string())?;
    if !slot.in_use() {
        return Err(format!("its slot {index} is free in the mailbox"));
    }
    if slot.generation() != generation {
        return Err(format!(
            "its slot {index} is at generation {}, and it runs generation {generation}",
            slot.generation()
        ));
    }
    let loaded = o.loaded.clone().ok_or("it has no module loaded")?;
    Ok((slot.name(), index, generation, loaded))
}

/// Checks each orphan greeted by `control` against `mailbox` and adopts those it confirms; retires
/// the others (their programs stopped in order). Then frees every slot of the mailbox that no
/// adopted program holds (a takeover under an orphan grace leaves them as they were). Returns the
/// adopted workers and lines for the log; each program not adopted is counted in `events`.
pub(super) fn adopt_greeted(
    control: &MpsControl,
    mailbox: &Mailbox,
    news: &NewsSender,
    rings: &mut Option<SharedRings>,
    events: &mut Vec<BackendEvent>,
) -> (Vec<Adoptee>, Vec<String>) {
    let mut log = Vec::new();
    let name_in = |slot: Option<u32>| slot.and_then(|i| mailbox.slot(i).ok()).map(|s| s.name()).unwrap_or_default();
    let mut adopted = Vec::new();
    let (binary, pipe_dirs, stop_deadline) = match control.orphans() {
        Some(o) => (o.control.clone(), crate::orphans::pipe_dirs(control.mps_dir()), o.stop_deadline),
        None => return (adopted, log),
    };
    for g in control.take_greeted() {
        let (name, slot, generation, loaded) = match check(&g, mailbox) {
            Ok(what) => what,
            Err(why) => {
                events.push(BackendEvent::Adoption { program: name_in(g.orphan.slot), adopted: false });
                log.push(g.retire(&binary, &pipe_dirs, stop_deadline, &why));
                continue;
            }
        };
        let (pid, server, orphaned_ms) = (g.held.id(), g.server, g.orphan.orphaned_ms);
        match Worker::adopt(g.stream, g.held, &g.orphan, server, news) {
            Ok(mut worker) => match hold_rings(&mut worker, &g.orphan.mapped, mailbox, rings) {
                Ok(()) => adopted.push(Adoptee { name, slot, generation, loaded, worker, orphaned_ms }),
                Err(why) => {
                    events.push(BackendEvent::Adoption { program: name, adopted: false });
                    log.push(format!(
                        "not adopted: the previous meshd's worker {pid} (slot {slot}): {why}; asked to retire, its \
                         program is relaunched with the rings renewed"
                    ));
                    worker.retire(stop_deadline + Duration::from_secs(5));
                }
            },
            Err(e) => {
                events.push(BackendEvent::Adoption { program: name, adopted: false });
                // What it does now is unknown: cut off its server before it is killed.
                let _ = control.terminate_client(server, pid, TERMINATE_WITHIN);
                std::thread::sleep(CUT_OFF);
                if let Ok(held) = crate::process::Held::adopt(pid) {
                    held.kill();
                }
                log.push(format!(
                    "not adopted: the previous meshd's worker {pid} (slot {slot}): {e}; cut off and killed"
                ));
            }
        }
    }
    for index in 0..mailbox.geometry().slot_count {
        let Ok(slot) = mailbox.slot(index) else { continue };
        if slot.in_use() && !adopted.iter().any(|a| a.slot == index) {
            slot.request_stop();
            slot.release();
        }
    }
    (adopted, log)
}

impl Adoptee {
    /// Ends its worker where the backend cannot stop it itself (its teardown, or an open that
    /// failed): the worker stops its kernel in order and leaves, or is killed past the bound.
    pub(super) fn end(self) {
        self.worker.retire(Duration::from_secs(10));
    }
}

/// Holds, as this meshd's, the device rings that adopted `worker` maps (`mapped`): each one's
/// descriptor taken from the worker and imported into meshd's own context, its messages kept. A
/// ring held already (another adopted worker maps it too) is the same memory and is kept.
fn hold_rings(
    worker: &mut Worker,
    mapped: &[u32],
    mailbox: &Mailbox,
    rings: &mut Option<SharedRings>,
) -> std::result::Result<(), String> {
    if mapped.is_empty() {
        return Ok(());
    }
    let rings = rings.as_mut().ok_or_else(|| {
        format!(
            "it maps device channel(s) {mapped:?}, and this meshd holds no device rings ({:?})",
            device_channels_refusal()
        )
    })?;
    let channels = mailbox.channels().map_err(|e| e.to_string())?;
    for &index in mapped {
        if rings.holds(index) {
            continue;
        }
        let info = channels
            .iter()
            .find(|c| c.index == index)
            .ok_or_else(|| format!("it maps channel #{index}, which the mailbox no longer has"))?;
        let bytes = mesh_cuda::device_ring::ring_bytes(info)
            .and_then(|b| mesh_cuda::exported::rounded(rings.device(), b))
            .map_err(|e| e.to_string())?;
        let fd = worker.export_ring(index, bytes).map_err(|e| e.to_string())?;
        rings.adopt(index, fd, bytes).map_err(|e| format!("holding channel {:?}'s ring: {e}", info.name))?;
        tracing::info!(channel = %info.name, "device ring held from the adopted worker {}, its messages kept", worker.pid());
    }
    Ok(())
}

/// Takes the adoptee running program `name`, if one does.
fn take(adoptees: &mut Vec<Adoptee>, name: &str) -> Option<Adoptee> {
    let i = adoptees.iter().position(|a| a.name == name)?;
    Some(adoptees.remove(i))
}

impl MpsBackend {
    /// The relaunch's load of `spec` when an adopted worker runs it: the worker taken as the
    /// program's, its kernel untouched. `None` when no adoptee runs `spec.name`; an adoptee that
    /// does not run what `spec` records has its kernel stopped, its slot freed, and `None` is
    /// returned too, for the load to go on as usual.
    pub(super) fn adopt_program(&mut self, spec: &ProgramSpec) -> Option<ProgramStatus> {
        let a = take(&mut self.lock().adopted, &spec.name)?;
        match self.adopted_program(spec, &a) {
            Ok((core, cubin)) => {
                tracing::info!(
                    program = %spec.name,
                    "adopted from the previous meshd: worker {}, slot {}, generation {}; its kernel ran on through \
                     {} ms without a meshd",
                    a.worker.pid(),
                    a.slot,
                    a.generation,
                    a.orphaned_ms
                );
                let program = Program { core, worker: a.worker, cubin, deaths: Vec::new() };
                let status = self.status_of(&program, KernelState::Busy);
                let mut s = self.lock();
                s.programs.push(program);
                s.events.push(BackendEvent::Adoption { program: spec.name.clone(), adopted: true });
                drop(s);
                self.publish_pool();
                Some(status)
            }
            Err(why) => {
                self.retire_adoptee(a, &why);
                None
            }
        }
    }

    /// Checks that adoptee `a` runs what `spec` records, and makes its program: the core, running
    /// at the adoptee's generation, and the recorded image linked (for a later relaunch).
    fn adopted_program(
        &self,
        spec: &ProgramSpec,
        a: &Adoptee,
    ) -> std::result::Result<(ProgramCore, Arc<Vec<u8>>), String> {
        let bindings = slots::channel_indices(&self.mailbox, &spec.bindings).map_err(|e| e.to_string())?;
        let bound = self.mailbox.slot(a.slot).map_err(|e| e.to_string())?.bindings();
        if bindings != bound {
            return Err(format!("its slot binds channels {bound:?}, and the record {bindings:?}"));
        }
        let asked = spec.sms.or(self.config.sms);
        if a.worker.asked_sms != asked {
            return Err(format!("it runs on {:?} SMs, and the record asks {asked:?}", a.worker.asked_sms));
        }
        let shape = (a.loaded.grid, a.loaded.block, a.loaded.shared_mem);
        if shape != (spec.shape.grid, spec.shape.block, spec.shape.shared_mem) {
            return Err(format!("it runs the launch shape {shape:?}, and the record asks {:?}", spec.shape));
        }
        let cubin = self.link_checked(&spec.name, spec.image.clone(), spec.kind).map_err(|e| e.to_string())?;
        let held = roster::held_share(&self.lock().programs, None);
        let sms = SmBudget::own_context(a.loaded.probe.sms, self.device.sm_count);
        let share =
            check_resident(&spec.name, &spec.shape, &a.loaded.probe.figures(), sms, held).map_err(|e| e.to_string())?;
        let mut core = ProgramCore::new(spec.name.clone(), a.slot, spec.kind, spec.shape, share);
        core.life = mesh_backend::life::Life::adopted(a.generation);
        Ok((core, cubin))
    }

    /// Stops adoptee `a`'s kernel in order (cut off past the stop deadline), frees its slot and
    /// lets its worker go, logging why it was not adopted.
    fn retire_adoptee(&self, a: Adoptee, why: &str) {
        tracing::warn!(
            program = %a.name,
            "not adopted from the previous meshd's worker {} (slot {}): {why}; its kernel is stopped",
            a.worker.pid(),
            a.slot
        );
        if let Some(w) = self.stop(&a.name, a.slot, a.worker) {
            w.exit();
        }
        let _ = slots::release(&self.mailbox, a.slot);
        self.lock().events.push(BackendEvent::Adoption { program: a.name, adopted: false });
    }

    /// A slot for a new program: one no program holds and no adoptee's kernel runs in (the
    /// relaunch may load another program before it claims an adoptee).
    pub(super) fn free_slot(&self) -> Result<u32> {
        let s = self.lock();
        let count = self.mailbox.geometry().slot_count;
        (0..count)
            .find(|i| s.programs.iter().all(|p| p.core.slot != *i) && s.adopted.iter().all(|a| a.slot != *i))
            .ok_or_else(|| {
                BackendError::Mailbox(format!(
                    "all {count} program slots are in use (create the mailbox with more slots)"
                ))
            })
    }

    /// Stops every adoptee that no recorded program claimed (after the relaunch).
    pub(super) fn retire_unclaimed(&mut self) {
        let left: Vec<Adoptee> = std::mem::take(&mut self.lock().adopted);
        for a in left {
            self.retire_adoptee(a, "the state directory records no program of that name");
        }
    }
}
