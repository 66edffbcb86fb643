//! Node metrics: counters, gauges and fixed-bucket histograms on atomics (recording never
//! blocks), exposed on scrape through `prometheus-client`'s OpenMetrics encoder (a registry
//! built from the values read at that moment).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use kairos_layer::kv::{Error as KvError, RunObserver};
use kairos_layer::ops::cron::round::RoundReport;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::{Registry, Unit};

pub use super::histogram::Histogram;

/// A help text as the registry takes it: without its final full stop, which the registry adds
/// (else every `# HELP` line would end in "..").
fn help_text(help: &str) -> &str {
    help.strip_suffix('.').unwrap_or(help)
}

/// Registers a counter's current value (the encoder adds `_total`).
pub(crate) fn counter(reg: &mut Registry, name: &str, help: &str, v: &AtomicU64) {
    reg.register(name, help_text(help), ConstCounter::new(v.load(Ordering::Relaxed)));
}

/// Registers a gauge's current value.
pub(crate) fn gauge(reg: &mut Registry, name: &str, help: &str, v: &AtomicI64) {
    reg.register(name, help_text(help), ConstGauge::new(v.load(Ordering::Relaxed)));
}

/// Registers a latency histogram in seconds (the encoder adds `_seconds`).
pub(crate) fn seconds(reg: &mut Registry, name: &str, help: &str, h: &Histogram) {
    reg.register_with_unit(name, help_text(help), Unit::Seconds, h.snapshot());
}

/// Registers counters by one label's values.
pub(crate) fn counters_by(
    reg: &mut Registry,
    name: &str,
    help: &str,
    label: &'static str,
    values: &[(&str, u64)],
) {
    let family = Family::<Vec<(&'static str, String)>, Counter>::default();
    for (l, v) in values {
        family.get_or_create(&vec![(label, l.to_string())]).inc_by(*v);
    }
    reg.register(name, help_text(help), family);
}

/// Connections the listeners refused over their limits ([`crate::server::conns`]): HTTP, gRPC.
/// Process-wide, like the listeners' sockets.
static CONNECTIONS_REFUSED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Counts a connection refused by listener `listener` (`http` or `grpc`).
pub fn connection_refused(listener: &str) {
    CONNECTIONS_REFUSED[usize::from(listener == "grpc")].fetch_add(1, Ordering::Relaxed);
}

/// Attempt outcomes counted by [`Metrics::attempts`].
pub const OUTCOMES: [&str; 6] =
    ["succeeded", "failed", "timed_out", "fenced_out", "released", "cancelled"];

/// The node's metrics. One per node, shared by its actors.
#[derive(Debug, Default)]
pub struct Metrics {
    /// The last hour minute by minute (completions, start lateness), for the console.
    pub last_hour: super::recent::LastHour,
    /// `execute_at` → READY.
    pub lateness_ready: Histogram,
    /// `execute_at` → attempt start (first attempts).
    pub lateness_start: Histogram,
    /// Store commit latency of each `run`.
    pub commit_latency: Histogram,
    /// The last commit's latency in microseconds (the node record carries it to `/healthz`).
    pub last_commit_us: AtomicU64,
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
    /// Of those, started ahead of their `execute_at` by a pre-fire (handed over at it).
    pub prefired: AtomicU64,
    /// Due-now executions started for a waiting worker by the transaction that submitted them.
    pub matched_at_submit: AtomicU64,
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
    /// Execution timers on this node (executions in flight past their first timer).
    pub execution_timers: AtomicI64,
    /// Actor restarts by the node supervisor.
    pub actor_restarts: AtomicU64,
    /// The embedded store's configured page cache, in bytes (0 for other backends).
    pub store_cache_bytes: AtomicI64,
    /// Whether the store accepts writes (1), refuses them for now (0, e.g. its disk is full),
    /// or has failed for good (-1).
    pub store_health: AtomicI64,
    /// Terminal executions deleted by the retention sweeper.
    pub retention_deleted: AtomicU64,
    /// Submissions refused by a namespace's rate quota.
    pub quota_refused_rate: AtomicU64,
    /// Submissions refused by a namespace's unfinished-executions quota.
    pub quota_refused_pending: AtomicU64,
    /// Requests per gRPC method and HTTP route.
    pub requests: super::requests::RequestMetrics,
}

/// Whether a store error is a conflict (for the conflicts counter).
fn is_conflict(e: &KvError) -> bool {
    matches!(e, KvError::NotCommitted)
}

impl RunObserver for Metrics {
    fn committed(&self, latency: Duration) {
        self.commit_latency.observe(latency);
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.last_commit_us.store(us.max(1), Ordering::Relaxed);
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

    /// Registers the node-local metrics plus `executions` (by state, cluster-wide).
    pub fn register(&self, reg: &mut Registry, executions: &[(String, i64)]) {
        self.register_latencies(reg);
        self.register_by_label(reg);
        self.register_counters(reg);
        self.register_gauges(reg);
        self.requests.register(reg);
        let by_state = Family::<Vec<(&'static str, String)>, Gauge>::default();
        for (state, n) in executions {
            by_state.get_or_create(&vec![("state", state.clone())]).set(*n);
        }
        reg.register(
            "kairos_executions",
            help_text("Executions by state (cluster-wide, all namespaces)."),
            by_state,
        );
    }

    fn register_latencies(&self, reg: &mut Registry) {
        let histograms = [
            (
                "kairos_lateness_ready",
                "Time from execute_at until the execution became READY.",
                &self.lateness_ready,
            ),
            (
                "kairos_lateness_start",
                "Time from execute_at until its first attempt started.",
                &self.lateness_start,
            ),
            (
                "kairos_store_commit",
                "Latency of store transactions, retries included.",
                &self.commit_latency,
            ),
        ];
        for (name, help, h) in histograms {
            seconds(reg, name, help, h);
        }
    }

    fn register_by_label(&self, reg: &mut Registry) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let retries = [
            ("conflict", load(&self.store_retries_conflict)),
            ("other", load(&self.store_retries_other)),
        ];
        counters_by(
            reg,
            "kairos_store_retries",
            "Store transactions retried, by reason.",
            "reason",
            &retries,
        );
        let outcomes: Vec<(&str, u64)> =
            OUTCOMES.iter().zip(&self.attempts).map(|(o, a)| (*o, load(a))).collect();
        counters_by(
            reg,
            "kairos_attempts",
            "Attempt outcomes reported to this node.",
            "outcome",
            &outcomes,
        );
        let refused = [
            ("rate", load(&self.quota_refused_rate)),
            ("pending", load(&self.quota_refused_pending)),
        ];
        let help = "Submissions refused by a namespace's quota, by quota.";
        counters_by(reg, "kairos_quota_refused", help, "quota", &refused);
        let conns =
            [("http", load(&CONNECTIONS_REFUSED[0])), ("grpc", load(&CONNECTIONS_REFUSED[1]))];
        let help = "Connections refused over a listener's limits, by listener.";
        counters_by(reg, "kairos_connections_refused", help, "listener", &conns);
    }

    fn register_counters(&self, reg: &mut Registry) {
        let counters = [
            ("kairos_retries", "Retries scheduled.", &self.retries),
            (
                "kairos_retention_deleted",
                "Terminal executions deleted after their namespace's retention.",
                &self.retention_deleted,
            ),
            ("kairos_lease_expiries", "Attempt leases that expired.", &self.lease_expiries),
            ("kairos_timers_fired", "Timers fired by this node.", &self.timers_fired),
            ("kairos_claimed", "Executions claimed through this node.", &self.claimed),
            (
                "kairos_matched_at_fire",
                "Executions started for a waiting worker by the transaction that fired them.",
                &self.matched_at_fire,
            ),
            (
                "kairos_matched_at_submit",
                "Due-now executions started for a waiting worker by the transaction that submitted them (no timer, no fire).",
                &self.matched_at_submit,
            ),
            (
                "kairos_prefired",
                "Executions started for a waiting worker ahead of their execute_at by a pre-fire, handed over at it (counted in kairos_matched_at_fire too).",
                &self.prefired,
            ),
            (
                "kairos_orphans_released",
                "Claimed executions released to READY undelivered: their worker vanished, they aged in a dispatch buffer, or this node's previous run held them.",
                &self.orphans_released,
            ),
            (
                "kairos_quarantined",
                "Timers put aside as unprocessable by this node.",
                &self.quarantined,
            ),
            (
                "kairos_clock_skew_suspected",
                "Other nodes' heartbeats seen further ahead than max_clock_skew_ms.",
                &self.clock_skew_suspected,
            ),
            ("kairos_submitted", "Executions submitted through this node.", &self.submitted),
            (
                "kairos_actor_restarts",
                "Actors restarted by the node supervisor.",
                &self.actor_restarts,
            ),
        ];
        for (name, help, c) in counters {
            counter(reg, name, help, c);
        }
    }

    fn register_gauges(&self, reg: &mut Registry) {
        let gauges = [
            (
                "kairos_store_cache_bytes",
                "The embedded store's page cache (store_cache_mib).",
                &self.store_cache_bytes,
            ),
            (
                "kairos_store_healthy",
                "1: the store takes writes; 0: it refuses them for now (disk full); -1: it failed; -2: it cannot be reached for now.",
                &self.store_health,
            ),
            ("kairos_shards_owned", "Shards this node owns.", &self.shards_owned),
            (
                "kairos_execution_timers",
                "Execution timers: executions in flight past their first timer, each followed in memory.",
                &self.execution_timers,
            ),
        ];
        for (name, help, g) in gauges {
            gauge(reg, name, help, g);
        }
    }
}

/// Encodes a registry in the OpenMetrics text format.
pub fn encode(reg: &Registry) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, reg);
    out
}

/// The content type of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_openmetrics_text() {
        let m = Metrics::default();
        m.lateness_ready.observe(Duration::from_millis(3));
        m.lateness_ready.observe(Duration::from_secs(1000));
        m.attempt("succeeded");
        m.retrying(&KvError::NotCommitted);
        m.shards_owned.store(5, Ordering::Relaxed);
        let mut reg = Registry::default();
        m.register(&mut reg, &[("SCHEDULED".into(), 4)]);
        let text = encode(&reg);
        assert!(text.contains("# TYPE kairos_lateness_ready_seconds histogram"), "{text}");
        assert!(text.contains("kairos_lateness_ready_seconds_bucket{le=\"0.005\"} 1"), "{text}");
        assert!(text.contains("kairos_lateness_ready_seconds_bucket{le=\"600.0\"} 1"), "{text}");
        assert!(text.contains("kairos_lateness_ready_seconds_bucket{le=\"+Inf\"} 2"), "{text}");
        assert!(text.contains("kairos_lateness_ready_seconds_count 2"), "{text}");
        assert!(text.contains("kairos_attempts_total{outcome=\"succeeded\"} 1"), "{text}");
        assert!(text.contains("kairos_store_retries_total{reason=\"conflict\"} 1"), "{text}");
        assert!(text.contains("kairos_executions{state=\"SCHEDULED\"} 4"), "{text}");
        assert!(text.contains("kairos_shards_owned 5"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert_eq!(line.split(' ').count(), 2, "sample lines are `name value`: {line}");
        }
        CronMetrics::default().register(&mut reg);
        let text = encode(&reg);
        let helps: Vec<&str> = text.lines().filter(|l| l.starts_with("# HELP")).collect();
        assert!(helps.len() > 20, "{text}");
        for h in helps {
            assert!(h.ends_with('.') && !h.ends_with(".."), "one full stop: {h}");
        }
    }
}

/// Metrics of the cron service on this node.
#[derive(Debug, Default)]
pub struct CronMetrics {
    /// Executions created for occurrences.
    pub materialized: AtomicU64,
    /// Occurrences found materialized already (a repeated round).
    pub existing: AtomicU64,
    /// Occurrences that could not be materialized (refused by the API).
    pub failed: AtomicU64,
    /// Missed occurrences made up.
    pub missed_caught_up: AtomicU64,
    /// Missed occurrences not made up (policy).
    pub missed_skipped: AtomicU64,
    /// Missed occurrences older than the catch-up window.
    pub missed_expired: AtomicU64,
    /// Occurrences skipped because the previous execution had not finished.
    pub skipped_overlap: AtomicU64,
    /// Executions cancelled for a newer occurrence (`cancel-previous`).
    pub cancelled_previous: AtomicU64,
    /// Jobs paused because an execution failed.
    pub paused_on_failure: AtomicU64,
    /// Rounds run.
    pub rounds: AtomicU64,
    /// How late occurrences were materialized relative to `due - lookahead`.
    pub lateness: Histogram,
    /// Cron shards this node owns.
    pub shards_owned: AtomicI64,
}

impl CronMetrics {
    /// Records what a round did.
    pub fn record(&self, r: &RoundReport) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        self.materialized.fetch_add(r.created, Ordering::Relaxed);
        self.existing.fetch_add(r.existing, Ordering::Relaxed);
        self.failed.fetch_add(r.failed, Ordering::Relaxed);
        self.skipped_overlap.fetch_add(r.skipped_overlap, Ordering::Relaxed);
        self.cancelled_previous.fetch_add(r.cancelled, Ordering::Relaxed);
        for (outcome, n) in &r.missed {
            let c = match *outcome {
                "caught_up" => &self.missed_caught_up,
                "skipped" => &self.missed_skipped,
                _ => &self.missed_expired,
            };
            c.fetch_add(*n, Ordering::Relaxed);
        }
        if r.paused {
            self.paused_on_failure.fetch_add(1, Ordering::Relaxed);
        }
        for ms in &r.lateness_ms {
            self.lateness.observe(Duration::from_millis(u64::try_from(*ms).unwrap_or(0)));
        }
    }

    /// Registers the cron metrics.
    pub fn register(&self, reg: &mut prometheus_client::registry::Registry) {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        counter(
            reg,
            "kairos_cron_materialized",
            "Executions created for cron occurrences.",
            &self.materialized,
        );
        counter(
            reg,
            "kairos_cron_materialize_failed",
            "Cron occurrences the API refused.",
            &self.failed,
        );
        counters_by(
            reg,
            "kairos_cron_missed",
            "Missed cron occurrences, by policy outcome.",
            "outcome",
            &[
                ("caught_up", load(&self.missed_caught_up)),
                ("skipped", load(&self.missed_skipped)),
                ("expired", load(&self.missed_expired)),
            ],
        );
        counter(
            reg,
            "kairos_cron_skipped_overlap",
            "Cron occurrences skipped: the previous execution had not finished.",
            &self.skipped_overlap,
        );
        counter(
            reg,
            "kairos_cron_cancelled_previous",
            "Executions cancelled for a newer occurrence (cancel-previous).",
            &self.cancelled_previous,
        );
        counter(
            reg,
            "kairos_cron_paused_on_failure",
            "Cron jobs paused because an execution failed.",
            &self.paused_on_failure,
        );
        counter(reg, "kairos_cron_rounds", "Cron rounds run.", &self.rounds);
        seconds(
            reg,
            "kairos_cron_materialize_lateness",
            "How late cron occurrences were materialized, after due minus the lookahead (backfilled, triggered and caught-up ones left out).",
            &self.lateness,
        );
        gauge(reg, "kairos_cron_shards_owned", "Cron shards this node owns.", &self.shards_owned);
    }
}
