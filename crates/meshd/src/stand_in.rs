//! A backend without a GPU: programs kept in a list, each bound to a real mailbox slot, for testing the control plane and host clients anywhere.
//!
//! meshd's CPU tests and the Python package's Rust peer serve the real control socket and mailbox
//! over it: every request meshd answers (channels, load, upgrade, unload, `ps`, metrics) takes its
//! real path, and only the kernels are missing (a "running" program never moves a message).

use mesh_backend::{Backend, BackendError, IsolationMode, ProgramSpec, ProgramState, ProgramStatus};
use mesh_shm::Mailbox;

/// Programs in a list, each bound to a free mailbox slot as a real backend binds it (its channels
/// named in the slot, the slot armed at generation 1). Blink mode, no host atomics.
#[derive(Debug)]
pub struct StandInBackend {
    mailbox: Mailbox,
    programs: Vec<ProgramStatus>,
}

impl StandInBackend {
    /// A stand-in binding programs in `mailbox`.
    pub fn new(mailbox: &Mailbox) -> Self {
        Self { mailbox: mailbox.clone(), programs: Vec::new() }
    }

    /// The programs' statuses, to change as a backend's recovery would (tests of the watchdog).
    pub fn programs_mut(&mut self) -> &mut [ProgramStatus] {
        &mut self.programs
    }

    fn release(&self, slot: u32) {
        if let Ok(s) = self.mailbox.slot(slot) {
            s.release();
        }
    }
}

fn mailbox_err(e: impl std::fmt::Display) -> BackendError {
    BackendError::Mailbox(e.to_string())
}

impl Backend for StandInBackend {
    fn mode(&self) -> IsolationMode {
        IsolationMode::Blink
    }

    fn load(&mut self, spec: ProgramSpec) -> mesh_backend::Result<ProgramStatus> {
        spec.validate()?;
        if self.programs.iter().any(|p| p.name == spec.name) {
            return Err(BackendError::AlreadyLoaded(spec.name));
        }
        let taken: Vec<u32> = self.programs.iter().map(|p| p.slot).collect();
        let Some(slot) = (0..self.mailbox.geometry().slot_count).find(|s| !taken.contains(s)) else {
            return Err(BackendError::Mailbox("all program slots are in use".into()));
        };
        let bindings = spec
            .bindings
            .iter()
            .map(|c| self.mailbox.channel_for_program(c).map(|c| c.index).map_err(mailbox_err))
            .collect::<Result<Vec<_>, _>>()?;
        let s = self.mailbox.slot(slot).map_err(mailbox_err)?;
        s.bind(&spec.name, &bindings).map_err(mailbox_err)?;
        s.reset_status();
        s.arm(1);
        let status = ProgramStatus {
            name: spec.name,
            slot,
            state: ProgramState::Running,
            generation: 1,
            heartbeat: 0,
            worker_pid: None,
            sms: None,
            shape: spec.shape,
            kind: spec.kind,
            restarts: 0,
            last_fault: None,
            last_fault_unix_ms: None,
            stopped_why: None,
        };
        self.programs.push(status.clone());
        Ok(status)
    }

    fn upgrade(&mut self, name: &str, _image: Vec<u8>) -> mesh_backend::Result<ProgramStatus> {
        let p = self
            .programs
            .iter_mut()
            .find(|p| p.name == name)
            .ok_or_else(|| BackendError::NoSuchProgram(name.into()))?;
        p.generation += 1;
        Ok(p.clone())
    }

    fn unload(&mut self, name: &str) -> mesh_backend::Result<()> {
        let at = self
            .programs
            .iter()
            .position(|p| p.name == name)
            .ok_or_else(|| BackendError::NoSuchProgram(name.into()))?;
        let p = self.programs.remove(at);
        self.release(p.slot);
        Ok(())
    }

    fn status(&self) -> Vec<ProgramStatus> {
        self.programs.clone()
    }

    fn shutdown(&mut self) -> mesh_backend::Result<()> {
        for p in std::mem::take(&mut self.programs) {
            self.release(p.slot);
        }
        Ok(())
    }

    fn host_atomics(&self) -> bool {
        false
    }
}
