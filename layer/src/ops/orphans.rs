//! `release_orphaned_claims`: a restarted node gives back the attempts its previous run
//! claimed and never handed over.
//!
//! A node claims ahead of its workers (its dispatch buffers) and starts attempts for waiting
//! workers in the claim or fire transaction itself; such an attempt is RUNNING but
//! *unconfirmed* until a worker's heartbeat or result names it. A node killed holding some
//! leaves them for their lease check, a whole lease later (30 s by default). The receipts of
//! its claims and matched fires name the node ([`Scheduler::with_holder`]), so the node, once
//! restarted and once its workers had time to reconnect and be heard from, reads its receipts
//! of the last [`RECEIPT_KEEP_MS`] and releases what is still unconfirmed under the token it
//! was claimed with: READY again at once, the attempt not counted, as the lease check would
//! have done. A worker that did get such an attempt and was not heard from by then finds its
//! token fenced (the attempt runs again: at least once); an attempt older than the receipts is
//! left to its lease check, as before.

use kairos_proto::storage::v1::{Execution, ExecutionStatus, NodeRecord};

use super::Scheduler;
use super::budget;
use super::claim::{RECEIPT_KEEP_MS, Receipt};
use super::error::{Error, Result};
use super::records::{decode, load_execution};
use super::worker::attempt_timeout_at_ms;
use crate::kv::RangeOption;
use crate::kv::limits::key_after;
use crate::limits::RELEASES_UNCOUNTED_MAX;

/// Receipts read per page (each lists up to a claim's 1,024 attempts).
const RECEIPTS_PER_PAGE: usize = 64;

/// Attempts looked at per release transaction (fewer when their records are large).
const ORPHANS_PER_TRANSACTION: usize = 256;

/// An attempt a receipt names: `(namespace, execution id, fencing token)`.
type Named = (String, String, u64);

impl Scheduler {
    /// Releases the attempts `holder` claimed (or started at fire for its waiting workers)
    /// before `before_ms`, in the last [`RECEIPT_KEEP_MS`], that are still RUNNING under that
    /// claim's token and were never confirmed by a worker. Returns the released executions
    /// (READY again, or CANCELLED if a cancel was asked). Call it only for a node that is not
    /// running: a restarted node for its previous run; for another node found silent, use
    /// [`Scheduler::release_dead_node_claims`], which checks that in each transaction.
    pub async fn release_orphaned_claims(
        &self,
        holder: &str,
        before_ms: i64,
    ) -> Result<Vec<Execution>> {
        self.release_claims(holder, before_ms, None).await
    }

    /// [`Scheduler::release_orphaned_claims`] of another node, `holder`, found without a
    /// heartbeat for more than `silent_ms`: each release transaction first reads its node record
    /// and releases nothing once a heartbeat newer than that shows it alive. A node's view of
    /// the others can be stale (a round whose reads stalled across a network cut, a paused
    /// process): the attempts of a live node may be on their way to its workers, and
    /// releasing them would start them twice.
    pub async fn release_dead_node_claims(
        &self,
        holder: &str,
        silent_ms: i64,
    ) -> Result<Vec<Execution>> {
        let now_ms = self.clock.now().as_millis();
        self.release_claims(holder, now_ms, Some(silent_ms)).await
    }

    async fn release_claims(
        &self,
        holder: &str,
        before_ms: i64,
        silent_ms: Option<i64>,
    ) -> Result<Vec<Execution>> {
        let named = self.receipts_of(holder, before_ms).await?;
        let mut released = Vec::new();
        let mut done = 0;
        while done < named.len() {
            let rest = &named[done..(done + ORPHANS_PER_TRANSACTION).min(named.len())];
            let now_ms = self.clock.now().as_millis();
            let outcome = self
                .db
                .run(|tx| async move {
                    if let Some(silent_ms) = silent_ms
                        && self.heard_from(&tx, holder, now_ms - silent_ms).await?
                    {
                        return Ok(None);
                    }
                    self.release_in(&tx, rest, now_ms).await.map(Some)
                })
                .await?;
            let Some((seen, part)) = outcome else {
                tracing::info!(node = holder, "a node taken for dead is alive: nothing released");
                break;
            };
            assert!(seen > 0, "a transaction looks at one attempt at least");
            done += seen;
            released.extend(part);
        }
        Ok(released)
    }

    /// Whether `node`'s record shows a heartbeat after `since_ms` (read in `tx`, so a release
    /// conflicts with a heartbeat committed meanwhile).
    async fn heard_from(
        &self,
        tx: &crate::kv::Transaction,
        node: &str,
        since_ms: i64,
    ) -> Result<bool> {
        match tx.get(&self.ks.node(node)).await? {
            Some(v) => Ok(decode::<NodeRecord>("node", &v)?.heartbeat_at_ms > since_ms),
            None => Ok(false),
        }
    }

    /// What `holder`'s receipts written in the [`RECEIPT_KEEP_MS`] before `before_ms` name,
    /// each attempt once.
    async fn receipts_of(&self, holder: &str, before_ms: i64) -> Result<Vec<Named>> {
        let range = self.ks.claim_receipts_between(before_ms - RECEIPT_KEEP_MS, before_ms);
        let mut begin = range.begin.clone();
        let mut named = Vec::new();
        loop {
            let page = RangeOption::new(begin.clone(), range.end.clone()).limit(RECEIPTS_PER_PAGE);
            let tx = self.db.begin()?;
            let rows = tx.get_range(&page, true).await?;
            for kv in &rows {
                let Ok((_, by)) = self.ks.parse_claim_receipt(&kv.key) else { continue };
                if by != holder {
                    continue;
                }
                let taken: Receipt = crate::tuple::unpack(&kv.value)
                    .map_err(|e| Error::Corrupt(format!("claim receipt: {e}")))?;
                named.extend(taken.into_iter().map(|(ns, id, token, _)| (ns, id, token)));
            }
            match rows.last() {
                Some(last) if rows.len() == RECEIPTS_PER_PAGE => begin = key_after(&last.key),
                _ => break,
            }
        }
        named.sort();
        named.dedup();
        Ok(named)
    }

    /// Releases the first of `named` that fit one transaction; returns how many it looked at
    /// and what it released.
    async fn release_in(
        &self,
        tx: &crate::kv::Transaction,
        named: &[Named],
        now_ms: i64,
    ) -> Result<(usize, Vec<Execution>)> {
        let loads = named.iter().map(|(ns, id, _)| load_execution(tx, &self.ks, ns, id));
        let found = crate::ops::join::join_in_order(loads).await?;
        let mut released = Vec::new();
        let mut seen = 0;
        for ((_, _, token), e) in named.iter().zip(found) {
            let Some(mut e) = e.filter(|e| is_orphan(e, *token, now_ms)) else {
                seen += 1;
                continue;
            };
            if !budget::has_room(tx, released.len(), budget::execution_bytes(&e)) {
                break; // the rest in the next transaction
            }
            seen += 1;
            let before = e.status;
            self.release_attempt(tx, &mut e, now_ms)?;
            e.updated_at_ms = now_ms;
            self.save_execution(tx, Some(before), &e)?;
            released.push(e);
        }
        Ok((seen, released))
    }
}

/// Whether `e` is still the attempt a receipt named with `token`, no worker was heard from for
/// it (no heartbeat or result), and the lease check would release it uncounted (not past its
/// own timeout, releases left).
fn is_orphan(e: &Execution, token: u64, now_ms: i64) -> bool {
    e.status == ExecutionStatus::Running as i32
        && e.fencing_token == token
        && !e.worker_confirmed
        && e.attempts_released < RELEASES_UNCOUNTED_MAX
        && attempt_timeout_at_ms(e).is_none_or(|t| now_ms < t)
}
