//! What the monitoring endpoint (`--metrics-addr`), the control socket's `metrics` and the health probes read: [`Monitor`], over the recorder and the snapshot's [`Source`].
//!
//! It sits above [`crate::metrics`] and [`crate::health`], which it joins (a scrape's text says
//! whether `/readyz` would answer 200), so that neither of them imports the other's caller.

use std::sync::Arc;

use crate::health;
use crate::metrics::{Metrics, render};
use crate::observe::{Scrape, Source};

/// The recorder and the snapshot's source. Cheap to clone.
#[derive(Clone)]
pub struct Monitor {
    metrics: Arc<Metrics>,
    source: Arc<dyn Source>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").field("metrics", &self.metrics).finish_non_exhaustive()
    }
}

impl Monitor {
    /// A monitor over `source`, recording into `metrics`.
    pub fn new(metrics: Arc<Metrics>, source: Arc<dyn Source>) -> Self {
        Self { metrics, source }
    }

    /// The recorder.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// A snapshot, its heartbeats noted (so that their ages are as fresh as the scrape).
    pub fn scrape(&self) -> Scrape {
        scrape(&self.metrics, &*self.source)
    }

    /// The exposition, in the Prometheus text format.
    pub fn render(&self) -> String {
        exposition(&self.metrics, &*self.source)
    }

    /// `/livez`: `Ok` with what was checked, or `Err` with why not.
    pub fn live(&self) -> Result<String, String> {
        health::live(&self.metrics)
    }

    /// `/readyz`: `Ok` with what was checked, or `Err` with the first reasons it is not ready. A
    /// recovery under way answers from the board alone, before any snapshot or mailbox is read.
    pub fn ready(&self) -> Result<String, String> {
        if self.metrics.since_backend_pass().is_some()
            && let Some(why) = health::recovering(&self.source.recovery())
        {
            return Err(why);
        }
        health::ready(&self.metrics, &self.scrape())
    }
}

/// A snapshot from `source`, its heartbeats noted in `metrics` (so that their ages are as fresh as the scrape).
pub fn scrape(metrics: &Metrics, source: &dyn Source) -> Scrape {
    let scrape = source.scrape();
    metrics.observe_heartbeats(scrape.programs.iter().map(|p| (p.name.as_str(), p.generation, p.heartbeat)));
    scrape
}

/// The exposition of `source` and `metrics` now, in the Prometheus text format.
pub fn exposition(metrics: &Metrics, source: &dyn Source) -> String {
    let scrape = scrape(metrics, source);
    let ready = health::ready(metrics, &scrape).is_ok();
    render(metrics, &scrape, ready)
}
