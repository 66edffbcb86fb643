//! Retention: terminal executions (SUCCEEDED, FAILED, CANCELLED) are deleted, with their
//! attempts, index entries, idempotency key and count, once they finished longer ago than
//! their namespace's retention. Sweeps run in short transactions that read at most
//! [`SWEEP_BATCH_MAX`] index rows each.
//!
//! SUCCEEDED executions have no status index entry (issue 21), so a sweep walks the **time
//! index** (ordered by `execute_at`, which is never after an execution's end) up to the
//! horizon: only a row due before it can have finished before it. The walk deletes every
//! terminal execution past its time and keeps the rest. CANCELLED executions are also looked
//! up in their status index beyond the horizon (one cancelled before its time ends before its
//! `execute_at`). The walk's cursor outlives a round ([`SweepCursor`]): a later round goes on
//! where it stopped instead of reading again the rows it had to keep (unfinished, or finished
//! too recently), and starts over only once the horizon passes the earliest time one of them
//! could be deleted (its end, or for an unfinished one the time it was read). New executions
//! never land behind the cursor: an `execute_at` is at most [`EXECUTE_AT_PAST_MAX_MS`] in the
//! past at submit, and the cursor is kept across rounds only when the horizon is older than
//! that (with [`SETTLE_MARGIN_MS`] for clocks); otherwise each round walks from the start.

use kairos_proto::storage::v1::{Execution, ExecutionStatus, IdempotencyRecord};

use super::Scheduler;
use super::error::{Error, Result};
use super::records::{decode, is_indexed, merge_spec, snapshot_execution};
use crate::kv::{KeyValue, RangeOption, Transaction};
use crate::limits::{EXECUTE_AT_PAST_MAX_MS, SWEEP_BATCH_MAX};

/// How far behind another node's clock may be, for the walk's cursor: a round keeps it only
/// when its horizon is this much older than the oldest `execute_at` a submit accepts.
pub const SETTLE_MARGIN_MS: i64 = 3_600_000;

/// What one sweep transaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Swept {
    /// Executions deleted.
    pub deleted: u64,
    /// Index entries looked at.
    pub scanned: u64,
    /// The batch was full: more may be due (from `cursor` on).
    pub more: bool,
    /// Where the next sweep of the namespace goes on: within this round while `more`, and
    /// the next round once it is false (keep it for the namespace; the default walks from the
    /// start, which is always right).
    pub cursor: SweepCursor,
}

/// Where the sweeps of a namespace go on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepCursor {
    /// The last time index row the walk read (`None`: its start).
    walked: Option<Vec<u8>>,
    /// The earliest horizon past which a row the walk read and kept may be deleted: a sweep
    /// with a later horizon walks from the start again (`None`: the walk kept none).
    revisit: Option<i64>,
    /// The round's walk is done and its CANCELLED lookup goes on after this row (`Some(None)`:
    /// from its start).
    cancelled: Option<Option<Vec<u8>>>,
}

impl SweepCursor {
    /// Whether the walk goes on from where an earlier round left it (not its start).
    pub fn resumes_walk(&self) -> bool {
        self.walked.is_some()
    }
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
    /// `ns` that finished before `before_ms`, walking from the start; see
    /// [`Self::sweep_terminal_from`].
    pub async fn sweep_terminal(&self, ns: &str, before_ms: i64, max: usize) -> Result<Swept> {
        self.sweep_terminal_from(ns, before_ms, max, &SweepCursor::default()).await
    }

    /// Deletes, in one transaction that reads at most `max` (≤ [`SWEEP_BATCH_MAX`]) index
    /// rows, terminal executions of `ns` that finished before `before_ms`, going on from
    /// `from`: the time index up to `before_ms`, then the CANCELLED executions due later (see
    /// the module). The outcome's cursor says where the next call goes on: while `more`, in
    /// this round; then in the next round. A FAILED execution replayed meanwhile is not
    /// terminal any more and stays (the replay and the sweep conflict: one retries).
    pub async fn sweep_terminal_from(
        &self,
        ns: &str,
        before_ms: i64,
        max: usize,
        from: &SweepCursor,
    ) -> Result<Swept> {
        super::validate::check_name("namespace", ns)?;
        let max = max.clamp(1, SWEEP_BATCH_MAX);
        let now = self.clock.now().as_millis();
        let mut start = from.clone();
        if start.cancelled.is_none() && start.revisit.is_some_and(|r| before_ms > r) {
            // A row the walk kept may be deletable now: walk from the start.
            (start.walked, start.revisit) = (None, None);
        }
        let start = &start;
        let mut swept = self
            .db
            .run(|tx| async move {
                let mut swept = Swept { cursor: start.clone(), ..Swept::default() };
                if start.cancelled.is_none() {
                    self.sweep_walk(&tx, ns, before_ms, now, max, &mut swept).await?;
                    if swept.more {
                        return Ok(swept);
                    }
                    swept.cursor.cancelled = Some(None);
                }
                self.sweep_cancelled(&tx, ns, before_ms, max, &mut swept).await?;
                Ok::<_, Error>(swept)
            })
            .await?;
        if !swept.more {
            // The round is over. Its walk is kept only where no new execution can land behind
            // it.
            swept.cursor.cancelled = None;
            if before_ms > now - EXECUTE_AT_PAST_MAX_MS - SETTLE_MARGIN_MS {
                swept.cursor = SweepCursor::default();
            }
        }
        Ok(swept)
    }

    /// The walk: time index rows due before `before_ms` after the cursor's; deletes those
    /// finished before it and notes when the ones kept may be deleted.
    async fn sweep_walk(
        &self,
        tx: &Transaction,
        ns: &str,
        before_ms: i64,
        now: i64,
        max: usize,
        swept: &mut Swept,
    ) -> Result<()> {
        let range = self.ks.by_time_range(ns, i64::MIN, before_ms);
        let rows = rows_after(tx, range, swept.cursor.walked.as_deref(), max).await?;
        swept.scanned += rows.len() as u64;
        swept.more = rows.len() == max;
        if let Some(last) = rows.last() {
            swept.cursor.walked = Some(last.key.to_vec());
        }
        for e in self.walk_load(tx, ns, &rows).await? {
            if expired(&e, before_ms) {
                self.delete_execution(tx, &e).await?;
                swept.deleted += 1;
                continue;
            }
            // Kept: deletable once the horizon passes its end (for an unfinished one, no
            // earlier than now), and never within this round's horizon.
            let at = if ended(&e) { e.finished_at_ms } else { now }.max(before_ms);
            swept.cursor.revisit = Some(swept.cursor.revisit.map_or(at, |r| r.min(at)));
        }
        Ok(())
    }

    /// CANCELLED executions due at or after `before_ms` (the walk saw those due before),
    /// with what room the walk left in the batch.
    async fn sweep_cancelled(
        &self,
        tx: &Transaction,
        ns: &str,
        before_ms: i64,
        max: usize,
        swept: &mut Swept,
    ) -> Result<()> {
        let room = max - swept.scanned as usize;
        if room == 0 {
            swept.more = true;
            return Ok(());
        }
        let cancelled = ExecutionStatus::Cancelled as i32;
        let range = self.ks.by_status_range(ns, cancelled, before_ms, i64::MAX);
        let after = swept.cursor.cancelled.clone().flatten();
        let rows = rows_after(tx, range, after.as_deref(), room).await?;
        swept.scanned += rows.len() as u64;
        if rows.len() == room {
            swept.more = true;
            swept.cursor.cancelled = Some(rows.last().map(|kv| kv.key.to_vec()));
        }
        let ids = rows.iter().filter_map(|kv| self.ks.parse_by_status(&kv.key).ok().map(|t| t.3));
        for e in self.sweep_load(tx, ns, ids).await? {
            if e.status == cancelled && expired(&e, before_ms) {
                self.delete_execution(tx, &e).await?;
                swept.deleted += 1;
            }
        }
        Ok(())
    }

    /// The executions of `ids` that exist. Snapshot reads: the walk reads rows it keeps
    /// (running ones among them), and a report or a replay of those must not fail the sweep;
    /// the delete adds the conflict ([`Self::delete_execution`]).
    async fn sweep_load(
        &self,
        tx: &Transaction,
        ns: &str,
        ids: impl Iterator<Item = String>,
    ) -> Result<Vec<Execution>> {
        let ids: Vec<String> = ids.collect();
        let loads = ids.iter().map(|id| snapshot_execution(tx, &self.ks, ns, id));
        let found = crate::ops::join::join_in_order(loads).await?;
        Ok(found.into_iter().flatten().collect())
    }

    /// The executions the time index `rows` name that exist, like [`Self::sweep_load`]; the
    /// rows carry the specs, so only the states are read.
    async fn walk_load(
        &self,
        tx: &Transaction,
        ns: &str,
        rows: &[KeyValue],
    ) -> Result<Vec<Execution>> {
        let loads = rows.iter().filter_map(|kv| {
            let id = self.ks.parse_by_time(&kv.key).ok()?.2;
            Some(async move {
                let Some(v) = tx.snapshot_get(&self.ks.execution(ns, &id)).await? else {
                    return Ok::<_, Error>(None);
                };
                let mut e: Execution = decode("execution", &v)?;
                if e.spec_apart {
                    merge_spec(&mut e, Some(&kv.value))?;
                }
                Ok(Some(e))
            })
        });
        let found = crate::ops::join::join_in_order(loads).await?;
        Ok(found.into_iter().flatten().collect())
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

    /// Removes an execution, as read, and everything kept for it. The record's read conflicts:
    /// a concurrent replay and this delete never both commit.
    async fn delete_execution(&self, tx: &Transaction, e: &Execution) -> Result<()> {
        let (ks, ns, id) = (&self.ks, e.namespace.as_str(), e.id.as_str());
        tx.add_read_conflict_key(&ks.execution(ns, id))?;
        tx.clear(&ks.execution(ns, id))?;
        let attempts = ks.attempts(ns, id);
        tx.clear_range(&attempts.begin, &attempts.end)?;
        if is_indexed(e.status) {
            tx.clear(&ks.by_status(ns, e.status, e.execute_at_ms, id))?;
        }
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

/// Whether `e` ended (a terminal state, with its end recorded).
fn ended(e: &Execution) -> bool {
    e.finished_at_ms != 0
        && ExecutionStatus::try_from(e.status).is_ok_and(crate::state::is_terminal)
}

/// Whether `e` ended before `before_ms`.
fn expired(e: &Execution, before_ms: i64) -> bool {
    ended(e) && e.finished_at_ms < before_ms
}

/// Up to `limit` rows of `range` after the key `after`.
async fn rows_after(
    tx: &Transaction,
    mut range: RangeOption,
    after: Option<&[u8]>,
    limit: usize,
) -> Result<Vec<KeyValue>> {
    if let Some(after) = after {
        let mut begin = after.to_vec();
        begin.push(0);
        range = RangeOption::new(begin.max(range.begin.clone()), range.end.clone());
    }
    Ok(tx.get_range(&range.limit(limit), true).await?)
}
