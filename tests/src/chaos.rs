//! The chaos test's pieces (tests/tests/chaos.rs): its seed and schedule generator, meshd started by
//! the systemd unit's command and killed with -9, the host ends of its sequence-checked streams, the
//! channels and services it makes and deletes under traffic, and the process, descriptor and
//! GPU-memory accounting it ends with.

mod accounting;
pub use accounting::*;

mod churn;
pub use churn::*;

mod deletes;

mod failure;
pub use failure::*;

mod schedule;
pub use schedule::*;

mod scrape;
pub use scrape::*;

mod streams;
pub use streams::*;

mod unit;
pub use unit::*;

#[cfg(test)]
mod tests;
