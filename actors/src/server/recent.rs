//! The last hour, minute by minute: how many executions this node saw finish and how late
//! their first attempts started (`execute_at` → start), for the console's charts. A ring of
//! [`RECENT_MINUTES`] buckets under one lock, each a count and a fixed-bound histogram, so its
//! memory is bounded whatever the load (about 10 KiB); a bucket is reused once its minute is
//! an hour old. In memory: a restart starts it empty, and each node counts only its own.

use std::sync::Mutex;

use crate::limits::RECENT_MINUTES;

/// Bounds of the lateness buckets, in milliseconds (the metrics' latency buckets).
pub const LATENESS_BOUNDS_MS: [u64; 19] = [
    0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 120_000,
    300_000, 600_000,
];

#[derive(Debug, Clone, Copy, Default)]
struct Minute {
    /// Minutes since the epoch this bucket counts (0: unused).
    minute: i64,
    completions: u64,
    /// Per bound of [`LATENESS_BOUNDS_MS`], plus one past the last.
    lateness: [u64; LATENESS_BOUNDS_MS.len() + 1],
}

/// One minute as [`LastHour::minutes`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MinuteView {
    /// Its start (ms since the epoch).
    pub start_ms: i64,
    /// Executions that reached a final status through this node.
    pub completions: u64,
    /// First attempts started.
    pub started: u64,
    /// Start lateness p50 and p99 (ms; the upper bound of the bucket, `None` past 10 min).
    pub p50_ms: Option<Option<u64>>,
    /// See `p50_ms`.
    pub p99_ms: Option<Option<u64>>,
}

/// The ring. See the module docs.
#[derive(Debug)]
pub struct LastHour {
    ring: Mutex<[Minute; RECENT_MINUTES]>,
}

impl Default for LastHour {
    fn default() -> Self {
        LastHour { ring: Mutex::new([Minute::default(); RECENT_MINUTES]) }
    }
}

fn slot(ring: &mut [Minute; RECENT_MINUTES], now_ms: i64) -> &mut Minute {
    let minute = now_ms.div_euclid(60_000);
    let m = &mut ring[minute.rem_euclid(RECENT_MINUTES as i64) as usize];
    if m.minute != minute {
        *m = Minute { minute, ..Minute::default() };
    }
    m
}

fn quantile(h: &[u64; LATENESS_BOUNDS_MS.len() + 1], q: f64) -> Option<Option<u64>> {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return None;
    }
    let want = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in h.iter().enumerate() {
        seen += n;
        if seen >= want {
            return Some(LATENESS_BOUNDS_MS.get(i).copied());
        }
    }
    Some(None)
}

impl LastHour {
    fn lock(&self) -> std::sync::MutexGuard<'_, [Minute; RECENT_MINUTES]> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `n` executions finished at `now_ms`.
    pub fn completed(&self, now_ms: i64, n: u64) {
        if n > 0 {
            slot(&mut self.lock(), now_ms).completions += n;
        }
    }

    /// A first attempt started `late_ms` after its `execute_at`, at `now_ms`.
    pub fn started(&self, now_ms: i64, late_ms: u64) {
        let i = LATENESS_BOUNDS_MS.iter().position(|b| late_ms <= *b);
        slot(&mut self.lock(), now_ms).lateness[i.unwrap_or(LATENESS_BOUNDS_MS.len())] += 1;
    }

    /// The last [`RECENT_MINUTES`] minutes up to `now_ms`'s, oldest first (empty minutes too).
    pub fn minutes(&self, now_ms: i64) -> Vec<MinuteView> {
        let ring = *self.lock();
        let this = now_ms.div_euclid(60_000);
        (0..RECENT_MINUTES as i64)
            .rev()
            .map(|ago| {
                let minute = this - ago;
                let m = ring[minute.rem_euclid(RECENT_MINUTES as i64) as usize];
                let m = if m.minute == minute { m } else { Minute::default() };
                MinuteView {
                    start_ms: minute * 60_000,
                    completions: m.completions,
                    started: m.lateness.iter().sum(),
                    p50_ms: quantile(&m.lateness, 0.5),
                    p99_ms: quantile(&m.lateness, 0.99),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_are_counted_apart_and_forgotten_after_an_hour() {
        let h = LastHour::default();
        let t0 = 1_800_000_000_000;
        h.completed(t0, 3);
        h.started(t0, 4);
        h.started(t0, 4);
        h.started(t0, 900);
        h.completed(t0 + 60_000, 1);
        let m = h.minutes(t0 + 60_000);
        assert_eq!(m.len(), RECENT_MINUTES);
        let (prev, last) = (&m[RECENT_MINUTES - 2], &m[RECENT_MINUTES - 1]);
        assert_eq!((prev.completions, prev.started), (3, 3));
        assert_eq!(prev.p50_ms, Some(Some(5)));
        assert_eq!(prev.p99_ms, Some(Some(1_000)));
        assert_eq!((last.completions, last.started, last.p50_ms), (1, 0, None));
        // An hour on, t0's bucket is reused, not added to: its 3 are gone, t0 + 1 min's 1
        // is still in the window.
        h.completed(t0 + 3_600_000, 2);
        let m = h.minutes(t0 + 3_600_000);
        assert_eq!(m.iter().map(|x| x.completions).sum::<u64>(), 3);
        assert_eq!(m[RECENT_MINUTES - 1].completions, 2);
        h.started(t0, 700_000);
        assert_eq!(h.minutes(t0)[RECENT_MINUTES - 1].p99_ms, Some(None));
    }
}
