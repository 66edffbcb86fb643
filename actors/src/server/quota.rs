//! Per-namespace quotas, checked before a submit reaches the store: a submission rate (a token
//! bucket per namespace on this node, holding one second's worth; a batch may borrow ahead and
//! the namespace then waits) and a cap on unfinished executions (cluster-wide counts, read at
//! most once a second, plus what this node admitted since). Over a quota: RESOURCE_EXHAUSTED /
//! HTTP 429 with a retry-after, and nothing stored.

use std::collections::BTreeMap;
use std::sync::Mutex;

use kairos_layer::ops::{self, Scheduler};
use kairos_proto::storage::v1::ExecutionStatus;

use kairos_layer::state::is_terminal;

use crate::server::config::{Quota, Quotas as QuotaConfig};

/// How long unfinished-execution counts are trusted before they are read again.
const PENDING_REFRESH_MS: i64 = 1_000;

#[derive(Debug, Default)]
struct Bucket {
    tokens: f64,
    last_ms: i64,
    started: bool,
    pending: u64,
    pending_read_ms: Option<i64>,
}

/// The quotas of every namespace, and their state on this node.
#[derive(Debug)]
pub struct Quotas {
    config: QuotaConfig,
    state: Mutex<BTreeMap<String, Bucket>>,
}

/// Which quota refused a submit (for the metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The submission rate.
    Rate,
    /// The unfinished executions.
    Pending,
}

impl Quotas {
    /// The configured quotas.
    pub fn new(config: QuotaConfig) -> Self {
        Quotas { config, state: Mutex::default() }
    }

    /// Admits `n` new executions of `ns` at `now_ms`, or says which quota they would break.
    pub async fn admit(
        &self,
        sched: &Scheduler,
        ns: &str,
        n: usize,
        now_ms: i64,
    ) -> Result<(), (Refused, ops::Error)> {
        let q = self.config.of(ns);
        if q.submit_per_s == 0 && q.pending_max == 0 {
            return Ok(());
        }
        if q.pending_max > 0 {
            self.refresh_pending(sched, ns, now_ms).await.map_err(|e| (Refused::Pending, e))?;
        }
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.entry(ns.to_string()).or_default().admit(ns, &q, n, now_ms)
    }

    /// Reads the namespace's unfinished executions again if the count is stale (outside the
    /// lock).
    async fn refresh_pending(&self, sched: &Scheduler, ns: &str, now_ms: i64) -> ops::Result<()> {
        let stale = {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state
                .get(ns)
                .and_then(|b| b.pending_read_ms)
                .is_none_or(|at| now_ms - at >= PENDING_REFRESH_MS)
        };
        if !stale {
            return Ok(());
        }
        let counts = sched.status_counts(ns).await?;
        let pending: i64 = counts
            .iter()
            .filter(|(s, _)| !is_terminal(*s) && *s != ExecutionStatus::Unspecified)
            .map(|(_, n)| *n)
            .sum();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let b = state.entry(ns.to_string()).or_default();
        b.pending = u64::try_from(pending).unwrap_or(0);
        b.pending_read_ms = Some(now_ms);
        Ok(())
    }
}

impl Bucket {
    /// Takes `n` new executions of `ns` under quota `q`: the unfinished cap, then the rate.
    fn admit(
        &mut self,
        ns: &str,
        q: &Quota,
        n: usize,
        now_ms: i64,
    ) -> Result<(), (Refused, ops::Error)> {
        let n_u = n as u64;
        if q.pending_max > 0 && self.pending + n_u > q.pending_max {
            let what = format!(
                "{} unfinished executions, at most {} (pending_max)",
                self.pending, q.pending_max
            );
            return Err((Refused::Pending, exceeded(ns, what, PENDING_REFRESH_MS as u64)));
        }
        if q.submit_per_s > 0 {
            let rate = f64::from(q.submit_per_s);
            if !self.started {
                (self.tokens, self.last_ms, self.started) = (rate, now_ms, true);
            }
            let elapsed = (now_ms - self.last_ms).max(0) as f64 / 1000.0;
            self.tokens = (self.tokens + elapsed * rate).min(rate);
            self.last_ms = now_ms;
            // A batch larger than the bucket may borrow ahead once the bucket is full.
            let need = (n as f64).min(rate);
            if self.tokens < need {
                let wait_ms = ((need - self.tokens) / rate * 1000.0).ceil() as u64;
                let what = format!("more than {} submissions per second", q.submit_per_s);
                return Err((Refused::Rate, exceeded(ns, what, wait_ms.max(1))));
            }
            self.tokens -= n as f64;
        }
        self.pending += n_u;
        Ok(())
    }
}

fn exceeded(ns: &str, what: String, retry_after_ms: u64) -> ops::Error {
    ops::Error::QuotaExceeded { namespace: ns.to_string(), what, retry_after_ms }
}
