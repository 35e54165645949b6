//! `meshd handoff`'s checks of the new binary: the versions a build of meshd says in `--version`
//! (its state directory's format, the mailbox layout, the MPS worker protocol), read from the new
//! binary and compared with this build's before anything is handed over, and the file this process
//! was started from (what a package upgrade replaces).

use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// The versions one build of meshd reads and speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    /// `state.json`'s format ([`crate::state::STATE_VERSION`]).
    pub state: u32,
    /// The mailbox layout ([`mesh_shm::layout::LAYOUT_VERSION`]).
    pub layout: u32,
    /// The MPS worker protocol ([`mesh_mps::WORKER_PROTOCOL`]).
    pub worker: u32,
}

/// This build's versions.
pub const THIS_BUILD: Versions = Versions {
    state: crate::state::STATE_VERSION,
    layout: mesh_shm::layout::LAYOUT_VERSION,
    worker: mesh_mps::WORKER_PROTOCOL,
};

/// What `meshd --version` prints after "meshd ": the crate's version (with `+TAG` when built with
/// `MESHD_BUILD_TAG=TAG`, which tells two builds of one source apart) and [`THIS_BUILD`].
pub fn version_line() -> &'static str {
    static LINE: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{}{} (state {}, mailbox layout {}, worker protocol {})",
            env!("CARGO_PKG_VERSION"),
            option_env!("MESHD_BUILD_TAG").map(|t| format!("+{t}")).unwrap_or_default(),
            THIS_BUILD.state,
            THIS_BUILD.layout,
            THIS_BUILD.worker
        )
    });
    &LINE
}

/// The versions a `--version` line names, if it names all three.
pub fn parse_versions(line: &str) -> Option<Versions> {
    let inside = line.split_once('(')?.1.split_once(')')?.0;
    let mut v = Versions { state: u32::MAX, layout: u32::MAX, worker: u32::MAX };
    for part in inside.split(',') {
        let (name, value) = part.trim().rsplit_once(' ')?;
        let value: u32 = value.parse().ok()?;
        match name {
            "state" => v.state = value,
            "mailbox layout" => v.layout = value,
            "worker protocol" => v.worker = value,
            _ => {}
        }
    }
    (v.state != u32::MAX && v.layout != u32::MAX && v.worker != u32::MAX).then_some(v)
}

/// How long the new binary's `--version` may take.
pub const VERSION_WITHIN: Duration = Duration::from_secs(10);

/// The new binary, checked: its path and its `--version` line.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The file to execute.
    pub binary: PathBuf,
    /// What its `--version` printed.
    pub version: String,
}

/// Runs `binary --version` and checks that the new build reads this state directory and mailbox
/// and, where `workers_run_on` (MPS programs left running for it to adopt), speaks the workers'
/// protocol. The refusal names the file and the reason.
pub fn check_binary(binary: &Path, workers_run_on: bool) -> Result<Checked, String> {
    let shown = binary.display();
    let meta = std::fs::metadata(binary).map_err(|e| format!("{shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{shown} is not a file"));
    }
    let mut child = std::process::Command::new(binary)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("{shown} does not run: {e}"))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < VERSION_WITHIN => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{shown} --version did not answer within {VERSION_WITHIN:?}"));
            }
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
    }
    let line = out.lines().next().unwrap_or_default().trim().to_string();
    if !status.success() || !line.starts_with("meshd ") {
        return Err(format!("{shown} --version: {status}, {line:?}: not a build of meshd"));
    }
    let Some(new) = parse_versions(&line) else {
        return Err(format!(
            "{shown} says {line:?}, which names no state, mailbox layout and worker protocol versions: a build \
             from before handoff; stop meshd and start the new build instead"
        ));
    };
    let ours = THIS_BUILD;
    if new.state != ours.state {
        return Err(format!(
            "{shown} reads state directory format {}, this one is format {}: it would refuse to start",
            new.state, ours.state
        ));
    }
    if new.layout != ours.layout {
        return Err(format!(
            "{shown} reads mailbox layout {}, this mailbox is layout {}: it would refuse to start (a new layout \
             needs `meshd run --fresh`, which starts empty)",
            new.layout, ours.layout
        ));
    }
    if workers_run_on && new.worker != ours.worker {
        return Err(format!(
            "{shown} speaks MPS worker protocol {}, the running programs' workers speak {}: it could not adopt \
             them (restart meshd to move them to the new workers: each program stops once)",
            new.worker, ours.worker
        ));
    }
    Ok(Checked { binary: binary.to_path_buf(), version: line })
}

static STARTED_FROM: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();

/// Records the file this process image was started from (`main` calls it first, before any
/// upgrade could replace the file): the kernel's name for it, " (deleted)" dropped when the file
/// was replaced before this image started (a new image executed after a fault).
pub fn mark_started_from() {
    STARTED_FROM.get_or_init(|| {
        let exe = std::fs::read_link("/proc/self/exe").ok()?;
        let text = exe.to_str()?;
        Some(PathBuf::from(text.strip_suffix(" (deleted)").unwrap_or(text)))
    });
}

/// The file this process image was started from, where [`mark_started_from`] found it.
pub fn started_from() -> Option<PathBuf> {
    STARTED_FROM.get().cloned().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_names_the_three_versions_and_reads_back() {
        let line = format!("meshd {}", version_line());
        assert_eq!(parse_versions(&line), Some(THIS_BUILD), "{line}");
        assert_eq!(parse_versions("meshd 0.1.0"), None, "an older build names none");
        assert_eq!(parse_versions("meshd 0.1.0 (state 1, mailbox layout 4)"), None, "one missing");
        assert_eq!(
            parse_versions("meshd 9.9.9 (state 2, mailbox layout 5, worker protocol 6)"),
            Some(Versions { state: 2, layout: 5, worker: 6 })
        );
    }
}
