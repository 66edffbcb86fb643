//! Admission: what a submit must pass on this node before the layer sees it — the batch
//! bound, each namespace's input size limit and its quotas (rate and pending). A batch is
//! screened in place: an item that fails becomes its error and the rest go on, so results
//! line up with requests without splitting the batch.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use kairos_layer::limits::SUBMIT_BATCH_MAX;
use kairos_layer::ops::fire::Offer;
use kairos_layer::ops::submit::{SubmitRequest, Submitted};
use kairos_layer::ops::validate::check_batch;
use kairos_layer::ops::{self, Error, error::invalid};

use super::Node;
use crate::runtime::effects;
use crate::runtime::matchmaker::Reserved;
use crate::runtime::messages::QueueKey;
use crate::server::quota::Refused;

impl Node {
    /// Submits an execution; its shard's local owner (if any) learns of the timer at once.
    pub async fn submit(&self, req: SubmitRequest) -> ops::Result<Submitted> {
        let mut out = self.submit_batch(vec![Ok(req)]).await?;
        out.pop().unwrap_or_else(|| Err(Error::Corrupt("submit result missing".into())))
    }

    /// Submits up to [`SUBMIT_BATCH_MAX`] items in one transaction; each gets its own result,
    /// in order. An item the caller refused already (`Err`) passes through; an item over its
    /// namespace's size limit or quota fails alone, nothing of its namespace stored.
    pub async fn submit_batch(
        &self,
        items: Vec<ops::Result<SubmitRequest>>,
    ) -> ops::Result<Vec<ops::Result<Submitted>>> {
        // Before any quota counts the batch.
        check_batch("requests", items.len(), SUBMIT_BATCH_MAX)?;
        let (n, items) = (items.len(), self.admit_batch(items).await);
        let offer = self.due_now_offer(&items);
        let slots: Offer = offer.iter().map(|(q, r)| (q.clone(), r.slots.clone())).collect();
        let out = self.ctx().sched.submit_batch_offered(items, &slots).await;
        effects::submit_matched(self.ctx(), out.as_ref().ok().map(|o| &o.1[..]), offer);
        let out = out?.0;
        assert_eq!(out.len(), n, "one result per item, in order");
        effects::submitted(self.ctx(), out.iter().flatten());
        Ok(out)
    }

    /// The waiting workers a submit may start its due-now items for (sync match at submit):
    /// per namespace of the batch, up to its due-now count of each hungry queue's free credits.
    /// Nothing while a shard owner here holds due executions back for busy workers: what was
    /// due before goes first.
    fn due_now_offer(&self, items: &[ops::Result<SubmitRequest>]) -> BTreeMap<QueueKey, Reserved> {
        let ctx = self.ctx();
        if ctx.held.any_waiting() {
            return BTreeMap::new();
        }
        let now = ctx.now_ms();
        let mut due: BTreeMap<String, usize> = BTreeMap::new();
        for r in items.iter().flatten() {
            let due_now = match r.delay_ms {
                Some(d) => d == 0,
                None => r.execute_at_ms <= now,
            };
            if due_now {
                *due.entry(r.namespace.clone()).or_default() += 1;
            }
        }
        if due.is_empty() {
            return BTreeMap::new();
        }
        ctx.matchmaker.offer_in(&due)
    }

    /// Screens a batch: sizes per item, then quotas per namespace (its admitted items at once).
    async fn admit_batch(
        &self,
        items: Vec<ops::Result<SubmitRequest>>,
    ) -> Vec<ops::Result<SubmitRequest>> {
        let items: Vec<ops::Result<SubmitRequest>> = items
            .into_iter()
            .map(|r| r.and_then(|r| self.check_inputs_size(&r).map(|()| r)))
            .collect();
        let mut per_ns: BTreeMap<String, usize> = BTreeMap::new();
        for r in items.iter().flatten() {
            *per_ns.entry(r.namespace.clone()).or_default() += 1;
        }
        let mut refused: BTreeMap<String, Error> = BTreeMap::new();
        for (ns, n) in per_ns {
            if let Err(e) = self.admit(&ns, n).await {
                refused.insert(ns, e);
            }
        }
        items
            .into_iter()
            .map(|r| {
                r.and_then(|r| match refused.get(&r.namespace) {
                    Some(e) => Err(quota_error(e)),
                    None => Ok(r),
                })
            })
            .collect()
    }

    /// Refuses inputs over their namespace's `inputs_bytes_max` (a size is no reason to retry:
    /// INVALID_ARGUMENT naming `inputs`, not RESOURCE_EXHAUSTED).
    fn check_inputs_size(&self, req: &SubmitRequest) -> ops::Result<()> {
        let max = self.ctx().config.quotas.of(&req.namespace).inputs_bytes_max as usize;
        if max == 0 {
            return Ok(());
        }
        let size = serde_json::to_vec(&req.inputs).map_or(0, |v| v.len());
        if size > max {
            return Err(invalid(
                "inputs",
                format!(
                    "{size} bytes of JSON, over the limit of {max} for namespace {}",
                    req.namespace
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a definition source over its namespace's `definition_bytes_max`.
    pub fn check_definition_size(&self, ns: &str, bytes: usize) -> ops::Result<()> {
        let max = self.ctx().config.quotas.of(ns).definition_bytes_max as usize;
        if max > 0 && bytes > max {
            return Err(invalid(
                "definition",
                format!("{bytes} bytes, over the limit of {max} for namespace {ns}"),
            ));
        }
        Ok(())
    }

    /// Checks `n` new executions of `ns` against the namespace's quotas.
    async fn admit(&self, ns: &str, n: usize) -> ops::Result<()> {
        let ctx = self.ctx();
        match self.inner.quotas.admit(&ctx.sched, ns, n, ctx.now_ms()).await {
            Ok(()) => Ok(()),
            Err((which, e)) => {
                let c = match which {
                    Refused::Rate => &ctx.metrics.quota_refused_rate,
                    Refused::Pending => &ctx.metrics.quota_refused_pending,
                };
                c.fetch_add(n as u64, Ordering::Relaxed);
                Err(e)
            }
        }
    }
}

/// A quota error for one batch item (the same for every item of its namespace).
fn quota_error(e: &Error) -> Error {
    match e {
        Error::QuotaExceeded { namespace, what, retry_after_ms } => Error::QuotaExceeded {
            namespace: namespace.clone(),
            what: what.clone(),
            retry_after_ms: *retry_after_ms,
        },
        other => Error::FailedPrecondition(other.to_string()),
    }
}
