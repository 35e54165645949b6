//! `meshd handoff`: asks meshd to replace its process with a new build, then waits until the new
//! image answers and says what it runs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use meshd::protocol::{Info, Request};

use super::wire::call;
use crate::exit::Exit;

/// The `info` of the image that answers, or why none did.
fn info(socket: &Path) -> Result<Info, Exit> {
    call(socket, &Request::Info, &[])?.info.ok_or_else(|| Exit(3, anyhow!("meshd answered `info` without it")))
}

/// `meshd handoff [--binary PATH] [--timeout-ms MS]`.
pub(super) fn handoff(socket: &Path, binary: Option<PathBuf>, timeout_ms: u64) -> Result<(), Exit> {
    let before = info(socket)?;
    let binary = binary.map(|b| std::path::absolute(&b).unwrap_or(b)).map(|b| b.display().to_string());
    let resp = call(socket, &Request::Handoff { binary }, &[])?;
    let Some(h) = resp.handoff else {
        return Err(Exit(1, anyhow!("meshd answered the handoff without saying what it hands over")));
    };
    println!(
        "meshd (pid {}) hands over to {} ({}): {}",
        before.extra.pid.unwrap_or_default(),
        h.binary,
        h.version,
        match (h.running_on, h.stopped) {
            (0, 0) => "no program runs".to_string(),
            (n, 0) => format!("{n} program(s) run on for it to adopt"),
            (0, n) => format!("{n} program(s) stopped in order for it to relaunch"),
            (n, s) => format!("{n} program(s) run on, {s} stopped"),
        }
    );
    for late in &h.late {
        println!("  {late}: its worker was not seen waiting in time; the new image stops and relaunches it");
    }
    // The new image answers once it has taken the mailbox over and adopted or relaunched the
    // programs; until then the old one may still answer, or nobody.
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    loop {
        if let Ok(now) = info(socket)
            && now.extra.started_unix_ms != before.extra.started_unix_ms
        {
            let ps = call(socket, &Request::Ps, &[])?.programs.unwrap_or_default();
            let running = ps.iter().filter(|p| p.state == "running").count();
            println!(
                "meshd {} answers (pid {}): {running} of {} program(s) running",
                now.extra.version.as_deref().unwrap_or("(version unknown)"),
                now.extra.pid.unwrap_or_default(),
                ps.len()
            );
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Exit(
                4,
                anyhow!(
                    "the new image of meshd did not answer within {timeout_ms} ms: see meshd's log (journalctl -u \
                     meshd@…)"
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
