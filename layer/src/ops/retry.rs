//! Back-off, in one place: capped doubling ([`doubling_ms`]) — the pause of every retry loop of
//! a node (a failing fire, load or claim, a restarted actor) — and, for attempts, capped
//! exponential with **full jitter**: `delay = random(0, min(max_delay, base_delay *
//! 2^(attempt-1)))`, randomness injected.

use kairos_proto::storage::v1::RetryPolicy;

use crate::env::Rng;

/// `first_ms` doubled `doublings` times, at most `max_ms` (saturating, never overflowing).
pub fn doubling_ms(first_ms: u64, doublings: u32, max_ms: u64) -> u64 {
    let factor = 1u64.checked_shl(doublings.min(63)).unwrap_or(u64::MAX);
    first_ms.saturating_mul(factor).min(max_ms)
}

/// The cap of the back-off before attempt `attempt + 1` (`attempt` ≥ 1 attempts failed).
pub fn backoff_cap_ms(policy: &RetryPolicy, attempt: u32) -> u64 {
    doubling_ms(policy.base_delay_ms, attempt.saturating_sub(1), policy.max_delay_ms)
}

/// A full-jitter delay before the next attempt, after `attempt` failed attempts.
pub fn retry_delay_ms(policy: &RetryPolicy, attempt: u32, rng: &Rng) -> u64 {
    rng.between(0, backoff_cap_ms(policy, attempt))
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: RetryPolicy =
        RetryPolicy { max_attempts: 10, base_delay_ms: 100, max_delay_ms: 5_000 };

    #[test]
    fn doubling_is_capped_and_never_overflows() {
        assert_eq!(
            (0..4).map(|n| doubling_ms(100, n, 500)).collect::<Vec<_>>(),
            [100, 200, 400, 500]
        );
        assert_eq!(doubling_ms(100, 200, u64::MAX), u64::MAX);
        assert_eq!(doubling_ms(0, 5, 10), 0);
    }

    #[test]
    fn caps_grow_exponentially_then_saturate() {
        let caps: Vec<u64> = (1..=8).map(|a| backoff_cap_ms(&POLICY, a)).collect();
        assert_eq!(caps, [100, 200, 400, 800, 1_600, 3_200, 5_000, 5_000]);
        assert_eq!(backoff_cap_ms(&POLICY, 1_000), 5_000, "no overflow for huge attempts");
        let huge =
            RetryPolicy { max_attempts: 3, base_delay_ms: u64::MAX / 2, max_delay_ms: u64::MAX };
        assert_eq!(backoff_cap_ms(&huge, 3), u64::MAX, "saturates");
    }

    #[test]
    fn delays_are_within_full_jitter_bounds_and_spread() {
        let rng = Rng::seeded(17);
        for attempt in 1..=8 {
            let cap = backoff_cap_ms(&POLICY, attempt);
            let samples: Vec<u64> =
                (0..2_000).map(|_| retry_delay_ms(&POLICY, attempt, &rng)).collect();
            assert!(samples.iter().all(|d| *d <= cap), "attempt {attempt}: over the cap {cap}");
            // Full jitter: spread over [0, cap], not clustered near the cap or at zero.
            let mean = samples.iter().sum::<u64>() as f64 / samples.len() as f64;
            assert!(
                (mean - cap as f64 / 2.0).abs() < cap as f64 * 0.06,
                "attempt {attempt}: mean {mean}"
            );
            let low = samples.iter().filter(|d| **d < cap / 4).count();
            let high = samples.iter().filter(|d| **d > cap * 3 / 4).count();
            assert!(low > 350 && high > 350, "attempt {attempt}: quartiles {low} / {high}");
        }
    }
}
