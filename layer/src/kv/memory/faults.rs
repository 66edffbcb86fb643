//! Seeded fault injection for the memory backend (BUGGIFY-style): each fault site is enabled
//! or not per seed, then fires with a probability on every pass.

use std::time::Duration;

use crate::env::Rng;

/// Which faults fire, and how often. `None` = site disabled.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// A commit fails with `not_committed` although it did not conflict (not applied).
    pub spurious_conflict: Option<f64>,
    /// A commit is applied but reports `commit_unknown_result`.
    pub unknown_result_applied: Option<f64>,
    /// A commit is not applied and reports `commit_unknown_result`.
    pub unknown_result_not_applied: Option<f64>,
    /// A read fails with `transaction_too_old`.
    pub too_old: Option<f64>,
    /// Reads and commits are delayed by up to `latency_max` (of the injected clock).
    pub latency: Option<f64>,
    /// The largest injected delay.
    pub latency_max: Duration,
    /// Every read waits exactly this long (of the injected clock), as a read from a
    /// FoundationDB cluster waits for its storage server: reads issued one after another add
    /// up, concurrent ones overlap. Zero = none.
    pub read_round_trip: Duration,
}

impl FaultConfig {
    /// No faults.
    pub fn none() -> Self {
        FaultConfig::default()
    }

    /// Every site enabled with probability `p` (latency up to 2 ms).
    pub fn all(p: f64) -> Self {
        FaultConfig {
            spurious_conflict: Some(p),
            unknown_result_applied: Some(p),
            unknown_result_not_applied: Some(p),
            too_old: Some(p),
            latency: Some(p),
            latency_max: Duration::from_millis(2),
            read_round_trip: Duration::ZERO,
        }
    }

    /// A configuration drawn from `seed`: each site enabled with probability 1/2, then firing
    /// with a probability between 0.1 % and 5 %.
    pub fn from_seed(seed: u64) -> Self {
        let rng = Rng::seeded(seed);
        let site = || rng.chance(0.5).then(|| 0.001 + rng.unit() * 0.049);
        FaultConfig {
            spurious_conflict: site(),
            unknown_result_applied: site(),
            unknown_result_not_applied: site(),
            too_old: site(),
            latency: site(),
            latency_max: Duration::from_micros(rng.between(100, 5_000)),
            read_round_trip: Duration::ZERO,
        }
    }

    /// Whether any site is enabled.
    pub fn any(&self) -> bool {
        self.spurious_conflict.is_some()
            || self.unknown_result_applied.is_some()
            || self.unknown_result_not_applied.is_some()
            || self.too_old.is_some()
            || self.latency.is_some()
            || !self.read_round_trip.is_zero()
    }
}

/// A fault site's draw.
pub(crate) fn fires(rng: &Rng, site: Option<f64>) -> bool {
    site.is_some_and(|p| rng.chance(p))
}
