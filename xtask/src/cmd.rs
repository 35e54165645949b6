//! Running a command as xtask does: echoed first, and an error naming it when it fails.

use std::process::Command;

use anyhow::{Context, Result, bail};

/// Runs `cmd`, echoed first: an error names it when it cannot start or exits unsuccessfully.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("$ {cmd:?}");
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Cargo as it started xtask (`CARGO`), else the one on `PATH`.
pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}
