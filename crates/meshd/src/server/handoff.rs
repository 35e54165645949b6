//! `meshd handoff` on the backend thread: the new binary checked (nothing changes when it is
//! refused), the programs handed over (left running for the new image to adopt, or stopped in order
//! for it to relaunch), the answer sent, then the process executes the new binary, its pid kept.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mesh_backend::Handover;

use super::worker::BackendWorker;
use crate::handoff::check_binary;
use crate::protocol::{HandoffRow, Response};

/// How long the answer gets to reach its client before the process is replaced.
const ANSWER_WITHIN: Duration = Duration::from_millis(500);

impl BackendWorker<'_> {
    /// Hands the programs over to `binary` (default: the file meshd was started from) and executes
    /// it; returns only when that was refused (nothing changed) or could not be done (every change
    /// refused from then on).
    pub(super) fn handoff(&mut self, binary: Option<String>, reply: &mpsc::SyncSender<Response>) {
        match self.prepare_handoff(binary) {
            Err(why) => {
                tracing::warn!("handoff refused, nothing changed: {why}");
                let _ = reply.send(Response::error(format!("handoff refused, nothing changed: {why}")));
            }
            Ok(row) => {
                let binary = PathBuf::from(&row.binary);
                let connections = self.shared.connections.load(Ordering::Acquire);
                let _ = reply.send(Response { ok: true, handoff: Some(row), ..Response::ok() });
                // The client closes its connection once it has read the answer.
                let deadline = Instant::now() + ANSWER_WITHIN;
                while self.shared.connections.load(Ordering::Acquire) >= connections && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(2));
                }
                let e = (self.replacer)(Some(&binary));
                tracing::error!(
                    "executing {}: {e}; executing this image again instead, which takes the programs back",
                    binary.display()
                );
                let e = (self.replacer)(None);
                let why = format!(
                    "meshd handed its programs over to {} and could not execute it ({e}): programs left running \
                     wait for a meshd; kill this one (`systemctl kill --kill-who=main -s KILL meshd@N`) and its \
                     restart adopts or relaunches them",
                    binary.display()
                );
                tracing::error!("{why}");
                self.handed_over = Some(why);
            }
        }
    }

    /// The checks, then the programs handed over; the answer's row.
    fn prepare_handoff(&mut self, binary: Option<String>) -> Result<HandoffRow, String> {
        if let Some(why) = &self.handed_over {
            return Err(why.clone());
        }
        if self.state.is_none() {
            return Err("meshd runs without a state directory: the new image would have nothing to adopt or \
                        relaunch the programs from"
                .into());
        }
        if let Some((s, _)) = &self.search {
            return Err(format!(
                "meshd is searching the culprit of a GPU fault by halves (question {}); try again in a moment",
                s.answers.len() + 1
            ));
        }
        let binary = match binary.map(PathBuf::from).or_else(crate::handoff::started_from) {
            Some(b) if b.is_absolute() => b,
            Some(b) => return Err(format!("{}: give the new binary's absolute path", b.display())),
            None => return Err("the file meshd was started from is unknown: give --binary".into()),
        };
        let workers_run_on =
            self.backend.mode() == mesh_backend::IsolationMode::Mps && self.shared.limits.natives_outlive_meshd;
        let checked = check_binary(&binary, workers_run_on)?;
        let programs = self.backend.status().len();
        tracing::info!(
            "handing over to {} ({}), pid {}: {programs} program(s)",
            checked.binary.display(),
            checked.version,
            std::process::id()
        );
        // Native workers outlive meshd where they are detached (an orphan grace); else they end here.
        if !self.shared.limits.natives_outlive_meshd {
            self.shared.natives.stop_all();
        }
        let handed = match self.backend.hand_over() {
            Ok(h) => h,
            Err(e) => {
                // The programs are stopped or cut off whatever went wrong: the new image relaunches them.
                tracing::error!("handing the programs over: {e}; the new image relaunches them");
                Handover::Stopped
            }
        };
        let (running_on, stopped, late) = match handed {
            Handover::Stopped => (0, programs, Vec::new()),
            Handover::RunningOn { programs, late } => (programs, 0, late),
        };
        self.shared.publish(Vec::new());
        Ok(HandoffRow {
            binary: checked.binary.display().to_string(),
            version: checked.version,
            running_on,
            stopped,
            late,
        })
    }
}
