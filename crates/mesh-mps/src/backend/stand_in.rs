//! Stand-in workers for the backend's unit tests (shell scripts that say `ready` and then nothing,
//! or exit): the MPS backend itself needs a GPU.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use super::*;

/// Says `ready` in this protocol's version (with `SMS` SMs), then answers `done` to every command
/// (`MODE=gone`: exits at once).
fn stand_in() -> String {
    let protocol = mesh_mps_worker::PROTOCOL;
    format!(
        r#"printf '{{"reply":"ready","protocol":{protocol},"pid":%s,"device":"stand-in","mps_enabled":true,"sms":%s,"context_ms":0}}\n' $$ "${{SMS:-132}}"
[ "$MODE" = gone ] && exit 0
while read -r line; do
  case "$line" in *'"op":"exit"'*) exit 0 ;; *) echo '{{"reply":"done"}}' ;; esac
done
"#
    )
}

pub(super) struct Bench {
    _dir: tempfile::TempDir,
    script: PathBuf,
    news: NewsSender,
}

impl Bench {
    pub(super) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("stand-in-worker");
        std::fs::write(&script, stand_in()).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        Self { _dir: dir, script, news: NewsSender::channel().0 }
    }

    pub(super) fn worker(&self, env: &[(&str, &str)]) -> Worker {
        // By its path: control.rs's test points PATH elsewhere while the tests run side by side.
        let mut cmd = Command::new("/bin/sh");
        cmd.arg(&self.script);
        cmd.envs(env.iter().copied());
        Worker::spawn_command(&mut cmd, &self.news).unwrap().handshake(Duration::from_secs(10)).unwrap()
    }

    /// A running program in slot `slot` of `worker`.
    pub(super) fn program(&self, slot: u32, worker: Worker) -> Program {
        let mut core = ProgramCore::new(format!("p{slot}"), slot, ImageKind::Ptx, LaunchShape::default(), 0.0);
        core.life.launch().unwrap();
        Program { core, worker, cubin: Arc::new(Vec::new()), deaths: Vec::new() }
    }
}

pub(super) fn kill_all(s: &mut Shared) {
    for p in &mut s.programs {
        p.worker.kill();
    }
    for w in &mut s.idle {
        w.kill();
    }
}
