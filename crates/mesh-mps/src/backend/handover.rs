//! Handing the programs to the new image of meshd that replaces this process (`meshd handoff`):
//! under an orphan grace each program's worker is let go with its kernel running, and waits at its
//! rendezvous for the new image, which adopts it as it adopts orphans after a crash; without a grace
//! every program is stopped in order and the new image relaunches it.

use std::time::{Duration, Instant};

use mesh_backend::{Backend, Handover, Result};
use mesh_mps_worker::KernelState;

use super::{MpsBackend, Program};

/// How long the workers let go get to reach their rendezvous: an orphan binds it as soon as it
/// reads the end of its input, well within this.
pub const RENDEZVOUS_WITHIN: Duration = Duration::from_secs(3);

impl MpsBackend {
    /// [`Backend::hand_over`].
    pub(super) fn hand_over_programs(&mut self) -> Result<Handover> {
        if self.config.orphan_grace.is_zero() {
            self.shutdown()?;
            return Ok(Handover::Stopped);
        }
        self.ready()?;
        // Adoptees no program claimed have nothing to hand over.
        self.retire_unclaimed();
        self.shut_down = true;
        let root = self.control()?.mps_dir().to_path_buf();
        let dir = crate::orphans::rendezvous_dir(&root);
        let (programs, idle) = {
            let mut s = self.lock();
            (s.programs.drain(..).collect::<Vec<Program>>(), s.idle.drain(..).collect::<Vec<_>>())
        };
        let count = programs.len();
        let mut waiting = Vec::new();
        for p in programs {
            if p.worker.kernel() == KernelState::Busy {
                waiting.push((p.core.name.clone(), p.worker.pid()));
            }
            // Its pipes close with it: the worker reads the end of its input, as after a crash of
            // meshd, and waits at its rendezvous with its kernel running. Nothing is stopped or
            // killed, and its slot stays in use for the new image to check.
            drop(p);
        }
        // Idle workers run nothing: the new image starts its own pool.
        for w in idle {
            w.exit();
        }
        let deadline = Instant::now() + RENDEZVOUS_WITHIN;
        let late = loop {
            let late: Vec<&(String, u32)> =
                waiting.iter().filter(|(_, pid)| !mesh_mps_worker::orphan::rendezvous(&dir, *pid).exists()).collect();
            if late.is_empty() || Instant::now() >= deadline {
                break late.into_iter().map(|(name, pid)| format!("{name} (worker {pid})")).collect::<Vec<_>>();
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        tracing::info!(
            "handing over: {count} program(s) run on in their workers, {} waiting at {}{}",
            waiting.len() - late.len(),
            dir.display(),
            if late.is_empty() { String::new() } else { format!("; not there within {RENDEZVOUS_WITHIN:?}: {late:?}") }
        );
        Ok(Handover::RunningOn { programs: count, late })
    }
}
