//! Rate limits for warnings a failing store would otherwise repeat from every actor (each
//! execution supervisor, each cron round): one line per interval per call site, carrying the
//! count of lines suppressed since the last one.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// One call site's limit. `static LIMIT: LogLimit = LogLimit::new(1_000);`
pub struct LogLimit {
    interval_ms: i64,
    last_ms: AtomicI64,
    suppressed: AtomicU64,
}

impl LogLimit {
    /// At most one line per `interval_ms`.
    pub const fn new(interval_ms: i64) -> Self {
        LogLimit { interval_ms, last_ms: AtomicI64::new(i64::MIN), suppressed: AtomicU64::new(0) }
    }

    /// Whether to log now (time from the injected clock, in ms); if so, how many lines were
    /// suppressed since the last one.
    pub fn allow(&self, now_ms: i64) -> Option<u64> {
        let last = self.last_ms.load(Ordering::Relaxed);
        if now_ms < last.saturating_add(self.interval_ms)
            || self
                .last_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_suppressed() {
        let l = LogLimit::new(1_000);
        assert_eq!(l.allow(0), Some(0));
        assert_eq!(l.allow(1), None);
        assert_eq!(l.allow(999), None);
        assert_eq!(l.allow(1_000), Some(2));
        assert_eq!(l.allow(1_500), None);
        assert_eq!(l.allow(5_000), Some(1));
    }
}
