//! The retention sweeper: deletes terminal executions once they finished longer ago than
//! their namespace's retention (`retention_days`, `namespace_retention_days`), in short
//! transactions with a pause between them, so it never holds up firing or claiming. One node
//! sweeps: the owner of execution shard 0 (any node could; this one avoids duplicated work).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kairos_layer::limits::SWEEP_BATCH_MAX;
use kairos_layer::ops::retention::SweepCursor;

use crate::runtime::context::Ctx;

/// Pause between two sweep transactions.
const BETWEEN_BATCHES: Duration = Duration::from_millis(20);
const DAY_MS: i64 = 86_400_000;

/// Where each namespace's sweeps go on, kept from one round to the next so a round does not
/// read again the rows an earlier one had to keep (see `kairos_layer::ops::retention`). Lost
/// with the node or the sweeper: the next round then walks from the start.
pub type Cursors = BTreeMap<String, SweepCursor>;

/// One sweep of every namespace; returns what it deleted.
pub async fn sweep(ctx: &Ctx, cursors: &mut Cursors) -> u64 {
    if !ctx.routes.owned_shards().contains(&0) {
        return 0;
    }
    let namespaces = match ctx.sched.namespaces().await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "retention: listing namespaces failed");
            return 0;
        }
    };
    let now = ctx.clock.now().as_millis();
    // One batch per namespace in turn (fair: a namespace with much to delete does not hold
    // the others up), each going on from its cursor until the round is over for it.
    let mut work: Vec<(String, i64, SweepCursor)> = namespaces
        .into_iter()
        .filter_map(|ns| {
            let days = ctx.config.namespace_retention_days.get(&ns).copied();
            let days = days.unwrap_or(ctx.config.retention_days);
            // 0: kept forever.
            (days != 0).then(|| (ns, now.saturating_sub(i64::from(days) * DAY_MS)))
        })
        .map(|(ns, before)| {
            let cursor = cursors.get(&ns).cloned().unwrap_or_default();
            (ns, before, cursor)
        })
        .collect();
    let mut deleted = 0;
    while !work.is_empty() {
        let mut next = Vec::new();
        for (ns, before, cursor) in work {
            match ctx.sched.sweep_terminal_from(&ns, before, SWEEP_BATCH_MAX, &cursor).await {
                Ok(s) => {
                    deleted += s.deleted;
                    ctx.metrics.retention_deleted.fetch_add(s.deleted, Ordering::Relaxed);
                    if s.more {
                        next.push((ns, before, s.cursor));
                    } else {
                        cursors.insert(ns, s.cursor);
                    }
                }
                Err(e) => {
                    cursors.remove(&ns);
                    tracing::warn!(namespace = %ns, error = %e, "retention sweep failed; next round retries");
                }
            }
            ctx.clock.sleep(BETWEEN_BATCHES).await;
        }
        work = next;
    }
    if deleted > 0 {
        tracing::info!(deleted, "retention: terminal executions past their retention deleted");
    }
    if let Err(e) = ctx.sched.sweep_receipts(now).await {
        tracing::warn!(error = %e, "retention: clearing expired claim receipts failed; next round retries");
    }
    sweep_audit(ctx, now).await;
    deleted
}

/// Deletes audit records older than `audit_retention_days` (0 keeps them).
async fn sweep_audit(ctx: &Ctx, now: i64) -> u64 {
    let days = ctx.config.audit_retention_days;
    if days == 0 {
        return 0;
    }
    let before = now.saturating_sub(i64::from(days) * DAY_MS);
    let namespaces = match ctx.sched.audit_namespaces().await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "retention: listing audit namespaces failed");
            return 0;
        }
    };
    let mut deleted = 0;
    for ns in namespaces {
        loop {
            match ctx.sched.sweep_audit(&ns, before, SWEEP_BATCH_MAX).await {
                Ok(n) => {
                    deleted += n;
                    if n < SWEEP_BATCH_MAX as u64 {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(namespace = %ns, error = %e, "audit retention sweep failed; next round retries");
                    break;
                }
            }
            ctx.clock.sleep(BETWEEN_BATCHES).await;
        }
    }
    if deleted > 0 {
        tracing::info!(deleted, "retention: audit records past audit_retention_days deleted");
    }
    deleted
}
