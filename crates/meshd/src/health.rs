//! Health, in two kinds: live (the backend thread passes between jobs within a deadline) and ready (every program that should run beats), and systemd's readiness and watchdog notifications driven by them.
//!
//! * **Live** (`/livez`): the process answers (it is this code running) and the backend thread
//!   passed between jobs within [`HealthConfig::live_deadline`]. A recovery is one job, bounded by
//!   the stop deadline and the culprit search's watch windows, far below the default of 30 s: a
//!   recovery in progress is live; a backend thread wedged in a driver call is not.
//! * **Ready** (`/readyz`): the backend is open (the recorded programs relaunched), meshd is not
//!   shutting down, and every program that should run (not loaded with `--no-readiness`, not
//!   ended by itself) runs with a heartbeat that moved within
//!   [`HealthConfig::max_heartbeat_age`]. A launch counts as a beat, so a program just loaded or
//!   relaunched has that long to beat first. A faulted or stopped program is not ready: it is named.
//!   While a recovery in place is under way (the backend marked the recovery board) meshd is not
//!   ready either, from the moment it was marked: [`recovering`] reads the board alone, never the
//!   snapshot, which the backend thread publishes only once its recovery call returns.

use mesh_backend::BoardView;

use crate::metrics::Metrics;
pub use crate::observe::HealthConfig;
use crate::observe::{Scrape, state_name};

/// Reasons listed in a 503's body at most (the count of the rest follows).
const MAX_REASONS: usize = 8;

/// `/livez`: `Ok` with what was seen, `Err` with why not.
pub fn live(metrics: &Metrics) -> Result<String, String> {
    let deadline = metrics.health().live_deadline;
    match metrics.since_backend_pass() {
        None => Ok("live: the backend is opening (or relaunching the recorded programs)".into()),
        Some(age) if age <= deadline => {
            Ok(format!("live: the backend thread passed between jobs {:.3} s ago", age.as_secs_f64()))
        }
        Some(age) => Err(format!(
            "not live: the backend thread has not passed between jobs for {:.1} s (--health-live-deadline {} s)",
            age.as_secs_f64(),
            deadline.as_secs_f64()
        )),
    }
}

/// `/readyz`: `Ok` with what was checked, `Err` with why not (the first few reasons, one a line).
pub fn ready(metrics: &Metrics, scrape: &Scrape) -> Result<String, String> {
    if metrics.since_backend_pass().is_none() {
        return Err("not ready: the backend is opening (or relaunching the recorded programs)".into());
    }
    if scrape.stopping {
        return Err("not ready: meshd is shutting down".into());
    }
    if let Some(why) = recovering(&scrape.recovery) {
        return Err(why);
    }
    let max = metrics.health().max_heartbeat_age;
    let (mut beating, mut exempt, mut reasons) = (0, 0, Vec::new());
    for p in &scrape.programs {
        if metrics.is_exempt(&p.name) {
            exempt += 1;
            continue;
        }
        match state_name(&p.state) {
            "running" => match metrics.heartbeat_age(&p.name) {
                Some(age) if age > max => reasons.push(format!(
                    "program {}: heartbeat {} unchanged for {:.1} s (--health-max-heartbeat-age {} s)",
                    p.name,
                    p.heartbeat,
                    age.as_secs_f64(),
                    max.as_secs_f64()
                )),
                _ => beating += 1,
            },
            // Ended by itself (mesh_exit): its own decision, reported in ps, not a failure of meshd.
            "exited" => {}
            _ => reasons.push(format!(
                "program {}: {}{}",
                p.name,
                p.state,
                p.stopped_why.as_deref().map(|w| format!(" ({w})")).unwrap_or_default()
            )),
        }
    }
    if reasons.is_empty() {
        return Ok(format!("ready: {beating} program(s) beating, {exempt} exempt (--no-readiness)"));
    }
    let more = reasons.len().saturating_sub(MAX_REASONS);
    reasons.truncate(MAX_REASONS);
    let mut body = format!("not ready:\n{}", reasons.join("\n"));
    if more > 0 {
        body.push_str(&format!("\n… and {more} more"));
    }
    Err(body)
}

/// `/readyz`'s answer while a recovery in place is under way (`None`: none is): its reason, how long
/// so far, and the programs it still holds.
pub fn recovering(view: &BoardView) -> Option<String> {
    let current = view.current.as_ref()?;
    Some(format!(
        "not ready: recovering from {} for {} ms: programs {}",
        current.reason,
        current.elapsed().as_millis(),
        if current.programs.is_empty() { "(none left to relaunch)".to_string() } else { current.programs.join(", ") }
    ))
}

/// systemd (`Type=notify`): tells it meshd is ready. Nothing happens outside systemd.
pub fn notify_ready() {
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        tracing::warn!("telling systemd meshd is ready: {e}");
    }
}

/// systemd: tells it meshd is stopping.
pub fn notify_stopping() {
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
}

/// Under systemd's watchdog (`WatchdogSec=`, which sets `WATCHDOG_USEC`): a thread that pings it
/// every half period while `live` says the backend thread is live, and stops pinging (so that
/// systemd kills and restarts meshd) once it is not. Returns whether the watchdog is on.
pub fn spawn_systemd_watchdog(live: impl Fn() -> Result<String, String> + Send + 'static) -> std::io::Result<bool> {
    let Some(period) = sd_notify::watchdog_enabled() else { return Ok(false) };
    let every = period / 2;
    std::thread::Builder::new().name("meshd-watchdog".into()).spawn(move || {
        let mut failing = false;
        loop {
            match live() {
                Ok(_) => {
                    failing = false;
                    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]) {
                        tracing::warn!("pinging systemd's watchdog: {e}");
                    }
                }
                Err(why) if !failing => {
                    failing = true;
                    tracing::error!("{why}: no longer pinging systemd's watchdog (it will restart meshd)");
                }
                Err(_) => {}
            }
            std::thread::sleep(every);
        }
    })?;
    tracing::info!("systemd watchdog: pinging every {:.1} s while the backend thread is live", every.as_secs_f64());
    Ok(true)
}
