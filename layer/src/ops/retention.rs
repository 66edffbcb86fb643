//! Retention: terminal executions (SUCCEEDED, FAILED, CANCELLED) are deleted, with their
//! attempts, index entries, idempotency key and count, once they finished longer ago than
//! their namespace's retention. Sweeps run in short transactions of at most
//! [`SWEEP_BATCH_MAX`] executions, found through the status index (ordered by `execute_at`,
//! which is never after `finished_at`), so a sweep reads only what it may delete.

use kairos_proto::storage::v1::{Execution, IdempotencyRecord};

use super::Scheduler;
use super::error::{Error, Result};
use super::records::decode;
use crate::kv::RangeOption;
use crate::limits::SWEEP_BATCH_MAX;

/// What one sweep transaction did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Executions deleted.
    pub deleted: u64,
    /// Index entries looked at.
    pub scanned: u64,
    /// The batch was full: more may be due.
    pub more: bool,
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
    /// `ns` that finished before `before_ms`. A FAILED execution replayed meanwhile is not
    /// terminal any more and stays (the replay and the sweep conflict: one retries).
    pub async fn sweep_terminal(&self, ns: &str, before_ms: i64, max: usize) -> Result<Swept> {
        super::validate::check_name("namespace", ns)?;
        let max = max.clamp(1, SWEEP_BATCH_MAX);
        self.db
            .run(|tx| async move {
                let mut swept = Swept::default();
                for status in crate::state::TERMINAL {
                    let room = max - swept.deleted as usize;
                    if room == 0 {
                        swept.more = true;
                        break;
                    }
                    let range: RangeOption =
                        self.ks.by_status_range(ns, status as i32, i64::MIN, before_ms).limit(room);
                    let rows = tx.get_range(&range, true).await?;
                    swept.more |= rows.len() == room;
                    swept.scanned += rows.len() as u64;
                    let ids: Vec<String> = rows
                        .iter()
                        .filter_map(|kv| self.ks.parse_by_status(&kv.key).ok().map(|t| t.3))
                        .collect();
                    let tx = &tx;
                    let loads = ids.iter().map(|id| async move {
                        // Read with a conflict: a concurrent replay and this delete never both
                        // commit.
                        tx.get(&self.ks.execution(ns, id)).await
                    });
                    let found = futures_util::future::try_join_all(loads).await?;
                    for v in found.into_iter().flatten() {
                        let e: Execution = decode("execution", &v)?;
                        if e.status != status as i32
                            || e.finished_at_ms == 0
                            || e.finished_at_ms >= before_ms
                        {
                            continue;
                        }
                        self.delete_execution(tx, &e).await?;
                        swept.deleted += 1;
                    }
                }
                Ok::<_, Error>(swept)
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
