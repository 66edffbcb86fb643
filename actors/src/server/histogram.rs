//! Fixed-bucket latency histograms on atomics (recording never blocks), encoded at scrape
//! time by `prometheus-client`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// Bucket bounds of latency histograms, in seconds: half a millisecond to ten minutes, about
/// three per decade (lateness is milliseconds when all is well, minutes after an outage).
const LATENCY_BUCKETS_S: [f64; 19] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

/// A histogram of durations with [`LATENCY_BUCKETS_S`] bounds.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_S.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS_S.iter().position(|b| s <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The values now, for the encoder.
    pub(crate) fn snapshot(&self) -> HistogramSnapshot {
        let mut buckets: Vec<(f64, u64)> = LATENCY_BUCKETS_S
            .iter()
            .zip(&self.buckets)
            .map(|(b, n)| (*b, n.load(Ordering::Relaxed)))
            .collect();
        let count = self.count();
        let within: u64 = buckets.iter().map(|(_, n)| n).sum();
        buckets.push((f64::MAX, count.saturating_sub(within)));
        HistogramSnapshot {
            sum: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            count,
            buckets,
        }
    }
}

/// A histogram's values at scrape time (per-bucket counts; the encoder accumulates them).
#[derive(Debug)]
pub(crate) struct HistogramSnapshot {
    sum: f64,
    count: u64,
    buckets: Vec<(f64, u64)>,
}

impl EncodeMetric for HistogramSnapshot {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_histogram::<NoLabelSet>(self.sum, self.count, &self.buckets, None)
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}
