//! Retention: terminal executions (SUCCEEDED, FAILED, CANCELLED) are deleted, with their
//! attempts, index entries, idempotency key and count, once they finished longer ago than
//! their namespace's retention. Sweeps run in short transactions of at most
//! [`SWEEP_BATCH_MAX`] executions, found through the status index (ordered by `execute_at`,
//! which is never after `finished_at`), so a sweep reads only what it may delete.

use kairos_proto::storage::v1::{Execution, ExecutionStatus, IdempotencyRecord};

use super::Scheduler;
use super::error::{Error, Result};
use super::records::decode;
use crate::kv::RangeOption;
use crate::limits::SWEEP_BATCH_MAX;

/// What one sweep transaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// Executions deleted.
    pub deleted: u64,
    /// Index entries looked at.
    pub scanned: u64,
    /// The batch was full: more may be due (from `cursor` on).
    pub more: bool,
    /// Where the next sweep of the namespace goes on.
    pub cursor: SweepCursor,
}

/// Where a sweep of a namespace's status index goes on: the terminal status (its place in
/// [`crate::state::TERMINAL`]) and the last row read (`None`: that status's start).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepCursor {
    status: usize,
    after: Option<Vec<u8>>,
}

impl Scheduler {
    /// Namespaces that hold executions (those with status counters), in order.
    pub async fn namespaces(&self) -> Result<Vec<String>> {
        let range = self.ks.subspace_range(crate::keys::Tag::StatusCount);
        let range = &range;
        let rows = self.db.run(|tx| async move { tx.get_range(range, true).await }).await?;
        let mut out: Vec<String> = Vec::new();
        for kv in rows {
            let (ns, _, _) = self.ks.parse_status_count(&kv.key)?;
            if out.last() != Some(&ns) {
                out.push(ns);
            }
        }
        Ok(out)
    }

    /// Deletes, in one transaction, up to `max` (≤ [`SWEEP_BATCH_MAX`]) terminal executions of
    /// `ns` that finished before `before_ms`, from the start of the index; see
    /// [`Self::sweep_terminal_from`].
    pub async fn sweep_terminal(&self, ns: &str, before_ms: i64, max: usize) -> Result<Swept> {
        self.sweep_terminal_from(ns, before_ms, max, &SweepCursor::default()).await
    }

    /// Deletes, in one transaction, up to `max` (≤ [`SWEEP_BATCH_MAX`]) terminal executions of
    /// `ns` that finished before `before_ms`, reading the status index from `from` on; the
    /// outcome's cursor says where the next call goes on (back at the start once it reached the
    /// end), so a sweep passes rows it may not delete yet (finished recently) instead of reading
    /// them again. SUCCEEDED and FAILED executions are found by `execute_at` (never after
    /// their end); CANCELLED ones over the whole index, since one cancelled before its time
    /// ends before its `execute_at`: each is kept from its end. A FAILED execution replayed
    /// meanwhile is not terminal any more and stays (the replay and the sweep conflict: one
    /// retries).
    pub async fn sweep_terminal_from(
        &self,
        ns: &str,
        before_ms: i64,
        max: usize,
        from: &SweepCursor,
    ) -> Result<Swept> {
        super::validate::check_name("namespace", ns)?;
        let max = max.clamp(1, SWEEP_BATCH_MAX);
        self.db
            .run(|tx| async move {
                let mut swept = Swept::default();
                for (i, status) in crate::state::TERMINAL.iter().enumerate().skip(from.status) {
                    let room = max - swept.scanned as usize;
                    if room == 0 {
                        swept.cursor = SweepCursor { status: i, after: None };
                        swept.more = true;
                        break;
                    }
                    let after = from.after.as_deref().filter(|_| i == from.status);
                    let rows = self.sweep_rows(&tx, ns, *status, before_ms, after, room).await?;
                    swept.scanned += rows.len() as u64;
                    if rows.len() == room {
                        let last = rows.last().map(|kv| kv.key.to_vec());
                        swept.cursor = SweepCursor { status: i, after: last };
                        swept.more = true;
                    }
                    swept.deleted += self.sweep_some(&tx, ns, *status, before_ms, &rows).await?;
                    if swept.more {
                        break;
                    }
                }
                Ok::<_, Error>(swept)
            })
            .await
    }

    /// Up to `room` status index rows of `ns` that may be due for deletion, after `after`.
    async fn sweep_rows(
        &self,
        tx: &crate::kv::Transaction,
        ns: &str,
        status: ExecutionStatus,
        before_ms: i64,
        after: Option<&[u8]>,
        room: usize,
    ) -> Result<Vec<crate::kv::KeyValue>> {
        let to = if status == ExecutionStatus::Cancelled { i64::MAX } else { before_ms };
        let mut range: RangeOption = self.ks.by_status_range(ns, status as i32, i64::MIN, to);
        if let Some(after) = after {
            let mut begin = after.to_vec();
            begin.push(0);
            range = RangeOption::new(begin.max(range.begin.clone()), range.end.clone());
        }
        Ok(tx.get_range(&range.limit(room), true).await?)
    }

    /// Deletes those of `rows`' executions still in `status` that finished before `before_ms`;
    /// how many.
    async fn sweep_some(
        &self,
        tx: &crate::kv::Transaction,
        ns: &str,
        status: ExecutionStatus,
        before_ms: i64,
        rows: &[crate::kv::KeyValue],
    ) -> Result<u64> {
        let ids: Vec<String> = rows
            .iter()
            .filter_map(|kv| self.ks.parse_by_status(&kv.key).ok().map(|t| t.3))
            .collect();
        // Read with a conflict: a concurrent replay and this delete never both commit.
        let loads = ids.iter().map(|id| async move { tx.get(&self.ks.execution(ns, id)).await });
        let found = futures_util::future::try_join_all(loads).await?;
        let mut deleted = 0;
        for v in found.into_iter().flatten() {
            let e: Execution = decode("execution", &v)?;
            if e.status != status as i32 || e.finished_at_ms == 0 || e.finished_at_ms >= before_ms {
                continue;
            }
            self.delete_execution(tx, &e).await?;
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Clears the claim receipts older than their keeping time (claims and fires clear them
    /// too; this covers a cluster that does neither for a while).
    pub async fn sweep_receipts(&self, now_ms: i64) -> Result<()> {
        let expired = self.ks.claim_receipts_before(now_ms - super::claim::RECEIPT_KEEP_MS);
        let expired = &expired;
        self.db
            .run(|tx| async move {
                tx.clear_range(&expired.begin, &expired.end)?;
                Ok::<_, Error>(())
            })
            .await
    }

    /// Removes an execution and everything kept for it.
    async fn delete_execution(&self, tx: &crate::kv::Transaction, e: &Execution) -> Result<()> {
        let (ks, ns, id) = (&self.ks, e.namespace.as_str(), e.id.as_str());
        tx.clear(&ks.execution(ns, id))?;
        let attempts = ks.attempts(ns, id);
        tx.clear_range(&attempts.begin, &attempts.end)?;
        tx.clear(&ks.by_status(ns, e.status, e.execute_at_ms, id))?;
        tx.clear(&ks.by_definition(ns, &e.definition_name, e.execute_at_ms, id))?;
        tx.clear(&ks.by_time(ns, e.execute_at_ms, id))?;
        let part = self.partition_of(e);
        tx.add_i64(&ks.status_count(ns, e.status, part), -1)?;
        let mut e = e.clone();
        self.clear_timer(tx, &mut e)?;
        if !e.idempotency_key.is_empty() {
            // The key goes with its execution (never before it), and only if it is still this
            // execution's.
            let key = ks.idempotency(ns, &e.idempotency_key);
            if let Some(v) = tx.get(&key).await? {
                let rec: IdempotencyRecord = decode("idempotency", &v)?;
                if rec.execution_id == e.id {
                    tx.clear(&key)?;
                }
            }
        }
        Ok(())
    }
}
