//! Node metrics in the Prometheus text format: counters, gauges and fixed-bucket histograms
//! on atomics (recording never blocks), rendered on scrape.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use kairos_layer::kv::{Error as KvError, RunObserver};

/// Bucket bounds of latency histograms, in seconds.
const LATENCY_BUCKETS_S: [f64; 16] = [
    0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
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

    pub(crate) fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, b) in LATENCY_BUCKETS_S.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// Attempt outcomes counted by [`Metrics::attempts`].
pub const OUTCOMES: [&str; 6] =
    ["succeeded", "failed", "timed_out", "fenced_out", "released", "cancelled"];

/// The node's metrics. One per node, shared by its actors.
#[derive(Debug, Default)]
pub struct Metrics {
    /// `execute_at` → READY.
    pub lateness_ready: Histogram,
    /// `execute_at` → attempt start (first attempts).
    pub lateness_start: Histogram,
    /// Store commit latency of each `run`.
    pub commit_latency: Histogram,
    /// Retryable store errors (conflicts, unknown results, too old) by code.
    pub store_retries_conflict: AtomicU64,
    /// Other retryable store errors.
    pub store_retries_other: AtomicU64,
    /// Attempt outcomes (index into [`OUTCOMES`]).
    pub attempts: [AtomicU64; OUTCOMES.len()],
    /// Retries scheduled (RETRY_WAIT entered).
    pub retries: AtomicU64,
    /// Attempt leases that expired.
    pub lease_expiries: AtomicU64,
    /// Timers fired by this node.
    pub timers_fired: AtomicU64,
    /// Executions handed to workers through this node.
    pub claimed: AtomicU64,
    /// Executions started for a waiting worker by the transaction that fired them.
    pub matched_at_fire: AtomicU64,
    /// Claimed executions whose worker vanished, released back to READY.
    pub orphans_released: AtomicU64,
    /// Timers put aside as unprocessable (see the admin API's `Quarantined`).
    pub quarantined: AtomicU64,
    /// Times another node's heartbeat appeared further in this node's future than
    /// `max_clock_skew_ms` allows.
    pub clock_skew_suspected: AtomicU64,
    /// Executions submitted through this node.
    pub submitted: AtomicU64,
    /// Shards this node owns.
    pub shards_owned: AtomicI64,
    /// In-flight execution supervisors on this node.
    pub supervisors: AtomicI64,
    /// Actor restarts by the node supervisor.
    pub actor_restarts: AtomicU64,
    /// The embedded store's configured page cache, in bytes (0 for other backends).
    pub store_cache_bytes: AtomicI64,
    /// Whether the store accepts writes (1), refuses them for now (0, e.g. its disk is full),
    /// or has failed for good (-1).
    pub store_health: AtomicI64,
}

/// Whether a store error is a conflict (for the conflicts counter).
fn is_conflict(e: &KvError) -> bool {
    matches!(e, KvError::NotCommitted)
}

impl RunObserver for Metrics {
    fn committed(&self, latency: Duration) {
        self.commit_latency.observe(latency);
    }
    fn retrying(&self, error: &KvError) {
        if is_conflict(error) {
            self.store_retries_conflict.fetch_add(1, Ordering::Relaxed);
        } else {
            self.store_retries_other.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Metrics {
    /// Counts an attempt outcome.
    pub fn attempt(&self, outcome: &str) {
        if let Some(i) = OUTCOMES.iter().position(|o| *o == outcome) {
            self.attempts[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Renders the node-local metrics plus `executions` (by state, cluster-wide) in the
    /// Prometheus text format.
    pub fn render(&self, executions: &[(String, i64)]) -> String {
        let mut out = String::new();
        self.lateness_ready.render(
            &mut out,
            "kairos_lateness_ready_seconds",
            "Time from execute_at until the execution became READY.",
        );
        self.lateness_start.render(
            &mut out,
            "kairos_lateness_start_seconds",
            "Time from execute_at until its first attempt started.",
        );
        self.commit_latency.render(
            &mut out,
            "kairos_store_commit_seconds",
            "Latency of store transactions, retries included.",
        );
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP kairos_store_retries_total Store transactions retried, by reason.\n# TYPE kairos_store_retries_total counter"
        );
        let _ = writeln!(
            out,
            "kairos_store_retries_total{{reason=\"conflict\"}} {}",
            load(&self.store_retries_conflict)
        );
        let _ = writeln!(
            out,
            "kairos_store_retries_total{{reason=\"other\"}} {}",
            load(&self.store_retries_other)
        );
        let _ = writeln!(
            out,
            "# HELP kairos_attempts_total Attempt outcomes reported to this node.\n# TYPE kairos_attempts_total counter"
        );
        for (i, o) in OUTCOMES.iter().enumerate() {
            let _ = writeln!(
                out,
                "kairos_attempts_total{{outcome=\"{o}\"}} {}",
                load(&self.attempts[i])
            );
        }
        counter(&mut out, "kairos_retries_total", "Retries scheduled.", load(&self.retries));
        counter(
            &mut out,
            "kairos_lease_expiries_total",
            "Attempt leases that expired.",
            load(&self.lease_expiries),
        );
        counter(
            &mut out,
            "kairos_timers_fired_total",
            "Timers fired by this node.",
            load(&self.timers_fired),
        );
        counter(
            &mut out,
            "kairos_claimed_total",
            "Executions claimed through this node.",
            load(&self.claimed),
        );
        counter(
            &mut out,
            "kairos_matched_at_fire_total",
            "Executions started for a waiting worker by the transaction that fired them.",
            load(&self.matched_at_fire),
        );
        counter(
            &mut out,
            "kairos_orphans_released_total",
            "Claimed executions whose worker vanished before delivery, released to READY.",
            load(&self.orphans_released),
        );
        counter(
            &mut out,
            "kairos_quarantined_total",
            "Timers put aside as unprocessable by this node.",
            load(&self.quarantined),
        );
        counter(
            &mut out,
            "kairos_clock_skew_suspected_total",
            "Other nodes' heartbeats seen further ahead than max_clock_skew_ms.",
            load(&self.clock_skew_suspected),
        );
        counter(
            &mut out,
            "kairos_submitted_total",
            "Executions submitted through this node.",
            load(&self.submitted),
        );
        counter(
            &mut out,
            "kairos_actor_restarts_total",
            "Actors restarted by the node supervisor.",
            load(&self.actor_restarts),
        );
        let gauge = |out: &mut String, name: &str, help: &str, v: i64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            &mut out,
            "kairos_store_cache_bytes",
            "The embedded store's page cache (store_cache_mib).",
            self.store_cache_bytes.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "kairos_store_healthy",
            "1: the store takes writes; 0: it refuses them for now (disk full); -1: it failed.",
            self.store_health.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "kairos_shards_owned",
            "Shards this node owns.",
            self.shards_owned.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "kairos_execution_supervisors",
            "In-flight execution supervisors.",
            self.supervisors.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP kairos_executions Executions by state (cluster-wide, all namespaces).\n# TYPE kairos_executions gauge"
        );
        for (state, n) in executions {
            let _ = writeln!(out, "kairos_executions{{state=\"{state}\"}} {n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.lateness_ready.observe(Duration::from_millis(3));
        m.lateness_ready.observe(Duration::from_secs(1000));
        m.attempt("succeeded");
        m.retrying(&KvError::NotCommitted);
        let text = m.render(&[("SCHEDULED".into(), 4)]);
        assert!(text.contains("kairos_lateness_ready_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("kairos_lateness_ready_seconds_bucket{le=\"+Inf\"} 2"));
        assert!(text.contains("kairos_lateness_ready_seconds_count 2"));
        assert!(text.contains("kairos_attempts_total{outcome=\"succeeded\"} 1"));
        assert!(text.contains("kairos_store_retries_total{reason=\"conflict\"} 1"));
        assert!(text.contains("kairos_executions{state=\"SCHEDULED\"} 4"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert_eq!(line.split(' ').count(), 2, "sample lines are `name value`: {line}");
        }
    }
}
