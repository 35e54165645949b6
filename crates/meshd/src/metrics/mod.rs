//! meshd's Prometheus exposition: what the backend thread records as it works (change, recovery and blink-pause durations), and the text a scrape renders from the same snapshot `ps` and `info` read.
//!
//! Names follow Prometheus's conventions (`meshd_` prefix, base units in the name, counters
//! ending in `_total`, `_info` for metadata) and every series carries DCGM exporter's `gpu` and
//! `UUID` labels (where known), so that `on(UUID)` joins meshd's per-program figures with DCGM's
//! per-GPU ones. The text is the Prometheus text format 0.0.4, encoded by `prometheus-client`: what
//! Prometheus scrapes and what node_exporter's textfile collector reads.
//!
//! The server hands the recorder ([`Metrics`]) facts at a few call sites and implements
//! [`Source`](crate::observe::Source) over its snapshot; everything else lives in `recorder` (the
//! recorder) and `render` (the text), beneath this module's re-exports. Imports go one way:
//! [`crate::observe`] (the types a scrape and a probe share) ← this module ← `crate::health` ←
//! `crate::monitor` ← the server and the HTTP listener.

mod recorder;
mod render;

use prometheus_client::encoding::prometheus_text;

pub use recorder::{Metrics, beats_of};
pub use render::render;

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;
