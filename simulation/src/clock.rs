//! The injected clock of every simulated node, worker and store: turmoil's simulated time,
//! offset per node by its clock skew.
#![allow(clippy::disallowed_methods)] // tokio's timer is turmoil's simulated clock here

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use kairos_layer::env::{BoxFuture, Clock, Timestamp};

/// The simulated wall clock starts here (2026-09-21T…Z; any fixed instant would do).
pub const EPOCH_MS: i64 = 1_790_000_000_000;

/// Turmoil's simulated time since the start of the run, as seen by the host running now.
/// `None` outside a host (e.g. between steps).
pub fn sim_elapsed() -> Option<Duration> {
    turmoil::sim_elapsed()
}

/// The true simulated time in milliseconds since the epoch (the checkers' reference).
pub fn true_now_ms() -> i64 {
    EPOCH_MS + sim_elapsed().map_or(0, |d| d.as_millis() as i64)
}

/// A [`Clock`] reading turmoil's simulated time plus a fixed skew. Monotonic: hosts are
/// stepped one after another, so two hosts may disagree by up to one tick; a clock shared by
/// several hosts (the store's) never goes back.
#[derive(Debug)]
pub struct SimClock {
    skew_ms: i64,
    last: AtomicI64,
}

impl SimClock {
    /// A clock `skew_ms` ahead of true time (negative: behind).
    pub fn new(skew_ms: i64) -> Self {
        SimClock { skew_ms, last: AtomicI64::new(0) }
    }
}

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        let t = match sim_elapsed() {
            Some(e) => {
                Timestamp::from_millis(EPOCH_MS + self.skew_ms).as_nanos() + e.as_nanos() as i64
            }
            None => self.last.load(Ordering::SeqCst),
        };
        let prev = self.last.fetch_max(t, Ordering::SeqCst);
        Timestamp::from_nanos(prev.max(t))
    }

    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(d))
    }
}
