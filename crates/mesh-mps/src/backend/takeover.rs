//! The standby server's part in the backend: started at open, whether it can take a recovery (the one
//! reason it cannot), and its takeover.

use super::workers::start_all;
use super::*;

/// The standby daemon (`<mps dir>/standby`, or `<mps dir>` itself when the active daemon was
/// adopted in `standby/` after a GPU fault) and its workers (`--standby`, by default as many as
/// the pool), started now side by side, before any program runs, into `shared` (so that the cleanup
/// tears them down on failure); or, `in_background` (adopted programs run already), made by the
/// watchdog's ticks while meshd serves. `--standby 0`: none.
pub(super) fn start_standby(
    control: &MpsControl,
    mailbox: &Mailbox,
    config: &MpsConfig,
    shared: &Mutex<Shared>,
    news: &NewsSender,
    in_background: bool,
) -> Result<()> {
    let k = config.standby_size();
    if k == 0 {
        tracing::warn!(
            "--standby 0: no standby MPS server; a GPU fault stalls every program until the faulted server has \
             torn its clients down (1.3-1.6 s on the H200, against 15 ms with a standby)"
        );
        return Ok(());
    }
    let started = Instant::now();
    let sb_control = Arc::new(control.start_standby()?);
    if in_background {
        shared.lock().standby = Some(Standby::in_background(sb_control.clone(), k as usize));
        tracing::info!(
            "MPS standby server {} started; its {k} worker(s) are made while meshd serves (clients created while \
             programs run, counted as the pool's growth)",
            sb_control.root().display()
        );
        return Ok(());
    }
    shared.lock().standby = Some(Standby::new(sb_control.clone(), k as usize));
    let workers = start_all(&sb_control, mailbox.path(), config.sms, news, k as usize, "standby")?;
    if let Some(sb) = shared.lock().standby.as_mut() {
        sb.adopt(workers);
    }
    tracing::info!(
        "MPS standby server ready with {k} idle worker(s) in {:?}: after a GPU fault they take the programs over",
        started.elapsed()
    );
    Ok(())
}

/// Waits up to [`FAULT_SPREAD`] until every watched program's worker has said its kernel failed:
/// then no kernel of the faulted server runs on, and the programs may move to the standby at once.
fn every_kernel_failed(s: &mut Shared) -> bool {
    news_until(s, Instant::now() + FAULT_SPREAD, |s| {
        s.programs.iter().filter(|p| on_watch(p)).all(|p| p.worker.failed_or_dead())
    })
}

impl MpsBackend {
    /// Why the standby cannot take this recovery (the one reason that applies, for the log), else `None`:
    /// it takes the programs `to_relaunch` over unless one reason holds.
    pub(super) fn standby_refusal(&self, s: &mut Shared, verdict: &Verdict, to_relaunch: &[usize]) -> Option<String> {
        match s.standby.as_ref() {
            None => None,
            Some(_) if matches!(verdict, Verdict::Search { .. }) => Some(
                "the culprit is not named and is searched by halves (a half relaunched on the standby that faulted \
                 would leave no standby)"
                    .to_string(),
            ),
            Some(sb) if sb.ready() < to_relaunch.len() => Some(format!(
                "it has {} ready worker(s) for {} program(s) to relaunch (--standby {}; it refills after each use)",
                sb.ready(),
                to_relaunch.len(),
                sb.wanted()
            )),
            Some(_) => match to_relaunch.iter().find(|&&i| s.programs[i].worker.asked_sms != self.config.sms) {
                Some(&i) => Some(format!(
                    "program {} runs with its own --sms ({}), and the standby's workers have the pool's",
                    s.programs[i].core.name,
                    s.programs[i].worker.asked_sms.map_or_else(|| "the whole GPU".into(), |n| n.to_string())
                )),
                None if !every_kernel_failed(s) => {
                    let quiet: Vec<String> = s
                        .programs
                        .iter()
                        .filter(|p| on_watch(p) && failed(&p.worker).is_none())
                        .map(|p| format!("{} (worker {})", p.core.name, p.worker.pid()))
                        .collect();
                    Some(format!(
                        "{} did not say within {} ms that its kernel failed, so it may still run on the faulted server",
                        quiet.join(", "),
                        FAULT_SPREAD.as_millis()
                    ))
                }
                None => None,
            },
        }
    }
}

/// The standby takes the programs over: its server becomes the active one, its idle workers the
/// pool; the faulted server (`control`) becomes the standby's, to be made anew as it takes clients again.
pub(super) fn take_over(s: &mut Shared, control: &Arc<MpsControl>, log: &mut Vec<String>) {
    if let Some(sb) = s.standby.as_mut() {
        let (active, idle) = sb.swap(control.clone());
        log.push(format!(
            "MPS standby took the programs over: its server is the active one now, with {} idle worker(s); a \
             new standby is made on the faulted server as it takes clients again",
            idle.len()
        ));
        s.idle.extend(idle);
        *ACTIVE.lock() = Some(active.clone());
        s.control = Some(active);
    }
}
