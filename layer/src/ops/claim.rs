//! `claim`: a worker takes up to n READY executions of a queue. No hot key: the head of the
//! queue is read as a snapshot, entries are picked at random among it, and only the picked
//! keys get an explicit read conflict (the couch_jobs / QuiCK pattern), so concurrent
//! claimers rarely collide and a collision only retries one of them.

use kairos_proto::storage::v1::{Attempt, AttemptStatus, Execution, ExecutionStatus, TimerKind};

use super::Scheduler;
use super::error::{Error, Result, invalid};
use super::limits::{CLAIM_BATCH_MAX, CLAIM_SCAN_MAX, LEASE_MS_MAX, LEASE_MS_MIN};
use super::records::{load_execution, save_execution, set_timer};
use super::submit::check_name;
use super::worker::{attempt_deadline_ms, load_attempt, save_attempt};
use crate::kv::Transaction;
use crate::state::{ExecutionEvent, execution_transition};

/// An execution handed to a worker: the attempt carries the fencing token its results must
/// present.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The execution, now RUNNING.
    pub execution: Execution,
    /// The new attempt.
    pub attempt: Attempt,
}

/// One worker's share of a `claim_many`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSlot {
    /// The worker.
    pub worker_id: String,
    /// Most executions for it.
    pub max: usize,
}

/// Most executions one `claim_many` takes over all its slots.
pub const CLAIM_MANY_MAX: usize = CLAIM_SCAN_MAX;

impl Scheduler {
    /// Claims up to `max` READY executions of `queue` for `worker_id`, each with a lease of
    /// `lease_ms` (the definition's lease when `None`).
    pub async fn claim(
        &self,
        ns: &str,
        queue: &str,
        worker_id: &str,
        max: usize,
        lease_ms: Option<u64>,
    ) -> Result<Vec<Claimed>> {
        if max == 0 || max > CLAIM_BATCH_MAX {
            return Err(invalid(
                "maxExecutions",
                format!("must be between 1 and {CLAIM_BATCH_MAX}"),
            ));
        }
        let slots = [ClaimSlot { worker_id: worker_id.to_string(), max }];
        let mut out = self.claim_many(ns, queue, &slots, lease_ms).await?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Claims for several waiting workers of one queue in one transaction (a node's
    /// dispatcher batches its long polls this way): slot `i` gets up to `slots[i].max`
    /// executions, earlier slots first.
    pub async fn claim_many(
        &self,
        ns: &str,
        queue: &str,
        slots: &[ClaimSlot],
        lease_ms: Option<u64>,
    ) -> Result<Vec<Vec<Claimed>>> {
        check_name("namespace", ns)?;
        check_name("queue", queue)?;
        for s in slots {
            check_name("workerId", &s.worker_id)?;
            if s.max == 0 || s.max > CLAIM_BATCH_MAX {
                return Err(invalid(
                    "maxExecutions",
                    format!("must be between 1 and {CLAIM_BATCH_MAX}"),
                ));
            }
        }
        let total: usize = slots.iter().map(|s| s.max).sum();
        if slots.is_empty() || total > CLAIM_MANY_MAX {
            return Err(invalid("slots", format!("1 to {CLAIM_MANY_MAX} executions per claim")));
        }
        if let Some(l) = lease_ms
            && !(LEASE_MS_MIN..=LEASE_MS_MAX).contains(&l)
        {
            return Err(invalid(
                "leaseMs",
                format!("must be between {LEASE_MS_MIN} and {LEASE_MS_MAX}"),
            ));
        }
        let now_ms = self.clock.now().as_millis();
        // Chosen outside the retry loop: a retry after an unknown commit result finds the
        // receipt of the claim that did commit and returns what it took.
        let owner = slots[0].worker_id.as_str();
        let receipt = &self.ks.claim_receipt(ns, owner, now_ms, self.rng.next_u64());
        self.db
            .run(|tx| async move {
                // Read here, not before the loop: a retried claim starts attempts now, never
                // before the executions it takes became READY.
                let now_ms = self.clock.now().as_millis().max(now_ms);
                if let Some(v) = tx.get(receipt).await? {
                    return self.claimed_by_receipt(&tx, ns, &v, slots.len()).await;
                }
                let expired = self.ks.claim_receipts_before(ns, owner, now_ms - RECEIPT_KEEP_MS);
                tx.clear_range(&expired.begin, &expired.end)?;
                let scan = (total * 4).clamp(32, CLAIM_SCAN_MAX);
                let head = tx.get_range(&self.ks.ready_queue(ns, queue).limit(scan), true).await?;
                // A random subset of the head, in random order (partial Fisher-Yates).
                let mut order: Vec<usize> = (0..head.len()).collect();
                let picks = total.min(order.len());
                for i in 0..picks {
                    let j = i + self.rng.below((order.len() - i) as u64) as usize;
                    order.swap(i, j);
                }
                let mut out: Vec<Vec<Claimed>> = vec![Vec::new(); slots.len()];
                let mut slot = 0;
                let mut taken: Vec<(String, u64, u32)> = Vec::new();
                for &i in &order[..picks] {
                    while slot < slots.len() && out[slot].len() >= slots[slot].max {
                        slot += 1;
                    }
                    if slot == slots.len() {
                        break;
                    }
                    let key = &head[i].key;
                    tx.add_read_conflict_key(key)?;
                    tx.clear(key)?;
                    let entry = self.ks.parse_ready(key)?;
                    let Some(e) = load_execution(&tx, &self.ks, ns, &entry.execution_id).await?
                    else {
                        continue; // a stale entry: cleared above
                    };
                    if e.status != ExecutionStatus::Ready as i32 {
                        continue;
                    }
                    let c = self
                        .start_attempt(&tx, e, &slots[slot].worker_id, lease_ms, now_ms)
                        .await?;
                    taken.push((c.execution.id.clone(), c.attempt.fencing_token, slot as u32));
                    out[slot].push(c);
                }
                tx.set(receipt, &crate::tuple::pack(&taken))?;
                Ok(out)
            })
            .await
    }

    /// READY → RUNNING: a new attempt with the next fencing token, a lease and its check.
    async fn start_attempt(
        &self,
        tx: &Transaction,
        mut e: Execution,
        worker_id: &str,
        lease_ms: Option<u64>,
        now_ms: i64,
    ) -> Result<Claimed> {
        let before = e.status;
        e.status = execution_transition(e.status(), ExecutionEvent::Claim)? as i32;
        e.attempt_count += 1;
        e.fencing_token += 1;
        e.started_at_ms = now_ms;
        e.updated_at_ms = now_ms;
        e.cancel_requested = false;
        let lease = lease_ms.unwrap_or(e.lease_ms).clamp(LEASE_MS_MIN, LEASE_MS_MAX);
        e.lease_ms = lease;
        e.lease_expires_at_ms = now_ms.saturating_add(lease as i64);
        e.lease_expires_at_ms = attempt_deadline_ms(&e);
        let attempt = Attempt {
            execution_id: e.id.clone(),
            number: e.attempt_count,
            worker_id: worker_id.to_string(),
            lease_owner: worker_id.to_string(),
            lease_expires_at_ms: e.lease_expires_at_ms,
            fencing_token: e.fencing_token,
            started_at_ms: now_ms,
            ended_at_ms: 0,
            status: AttemptStatus::Running as i32,
            error: None,
        };
        save_attempt(tx, self, &attempt, &e.namespace)?;
        let deadline = e.lease_expires_at_ms;
        set_timer(
            tx,
            &self.ks,
            self.config.bucket_width_ms,
            &mut e,
            TimerKind::LeaseCheck,
            deadline,
        )
        .await?;
        save_execution(tx, &self.ks, Some(before), &e)?;
        Ok(Claimed { execution: e, attempt })
    }

    async fn claimed_by_receipt(
        &self,
        tx: &Transaction,
        ns: &str,
        receipt: &[u8],
        slots: usize,
    ) -> Result<Vec<Vec<Claimed>>> {
        let taken: Vec<(String, u64, u32)> = crate::tuple::unpack(receipt)
            .map_err(|e| Error::Corrupt(format!("claim receipt: {e}")))?;
        let mut out: Vec<Vec<Claimed>> = vec![Vec::new(); slots];
        for (id, token, slot) in taken {
            let Some(e) = load_execution(tx, &self.ks, ns, &id).await? else { continue };
            // Only what this claim still holds: the attempt may have ended meanwhile.
            if e.fencing_token != token || e.status != ExecutionStatus::Running as i32 {
                continue;
            }
            let attempt = load_attempt(tx, self, &e).await?;
            if let Some(v) = out.get_mut(slot as usize) {
                v.push(Claimed { execution: e, attempt });
            }
        }
        Ok(out)
    }
}

/// How long claim receipts are kept (a retried claim comes back within seconds).
const RECEIPT_KEEP_MS: i64 = 60_000;
