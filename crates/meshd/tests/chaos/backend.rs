//! The chaos test's stand-in backend: meshd's stand-in with a sticky fault on demand, adopting a killed meshd's programs when asked.

use std::sync::Arc;
use std::time::Instant;

use mesh_backend::watch::{Replacement, Verdict};
use mesh_backend::{Backend, IsolationMode, ProgramSpec, ProgramStatus};

use crate::common::{ListBackend, PTX};

/// The image a `fault…` load carries: the stand-in backend faults (stickily) on it once loaded.
pub const FAULT_PTX: &[u8] = b".version 8.0\n.target sm_90\n// fault\n";

/// The stand-in backend: [`ListBackend`], plus a sticky fault (a replacement of the process, as the
/// blink backend asks for one) on the next watch after a load of [`FAULT_PTX`], naming that program.
pub struct Chaotic {
    inner: ListBackend,
    faulting: Option<String>,
    replacement: Option<Replacement>,
}

impl Chaotic {
    pub fn new(mailbox: &mesh_shm::Mailbox) -> Self {
        Self { inner: ListBackend::new(mailbox), faulting: None, replacement: None }
    }

    /// Adopting the programs a killed meshd left running ([`meshd::stand_in::StandInBackend::adopting`]).
    pub fn adopting(mailbox: &mesh_shm::Mailbox) -> Self {
        Self { inner: ListBackend::adopting(mailbox), faulting: None, replacement: None }
    }
}

impl Backend for Chaotic {
    fn mode(&self) -> IsolationMode {
        IsolationMode::Blink
    }
    fn load(&mut self, spec: ProgramSpec) -> mesh_backend::Result<ProgramStatus> {
        let faults = spec.image == FAULT_PTX;
        let name = spec.name.clone();
        let status = self.inner.load(spec)?;
        if faults {
            self.faulting = Some(name);
        }
        Ok(status)
    }
    fn upgrade(&mut self, name: &str, image: Vec<u8>) -> mesh_backend::Result<ProgramStatus> {
        self.inner.upgrade(name, image)
    }
    fn unload(&mut self, name: &str) -> mesh_backend::Result<()> {
        self.inner.unload(name)
    }
    fn status(&self) -> Vec<ProgramStatus> {
        self.inner.status()
    }
    fn watch(&mut self) -> Vec<String> {
        let mut log = self.inner.watch();
        let Some(culprit) = self.faulting.take() else { return log };
        let programs: Vec<String> = self.inner.status().into_iter().map(|p| p.name).collect();
        let Some(index) = programs.iter().position(|p| *p == culprit) else { return log };
        let linked = programs.iter().map(|p| (p.clone(), Arc::new(PTX.to_vec()))).collect();
        self.replacement = Some(Replacement {
            error: "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered".into(),
            programs,
            verdict: Verdict::Culprit { index, why: "its image was loaded just before the fault".into() },
            noticed: Instant::now(),
            linked,
            arch: "sm_90".into(),
        });
        log.push(format!("sticky fault by {culprit}"));
        log
    }
    fn take_replacement(&mut self) -> Option<Replacement> {
        self.replacement.take()
    }
    fn shutdown(&mut self) -> mesh_backend::Result<()> {
        self.inner.shutdown()
    }
    fn take_events(&mut self) -> Vec<mesh_backend::BackendEvent> {
        self.inner.take_events()
    }
    fn host_atomics(&self) -> bool {
        false
    }
}
