//! Reading and writing execution records and the bookkeeping that goes with them: the status
//! index and counts, timers (clamped to the shard watermark), ready entries, and the running
//! attempt (kept on the execution until it ends).

use kairos_proto::storage::v1::{
    Attempt, AttemptStatus, Execution, ExecutionSpec, ExecutionStatus, TimerEntry, TimerKind,
    TimerRef,
};
use prost::Message;

use super::Scheduler;
use super::error::{Error, Result};
use crate::ids::bucket_of;
use crate::keys::{Keyspace, ReadyKey, TimerKey};
use crate::kv::Transaction;

pub(crate) fn encode<M: Message>(m: &M) -> Vec<u8> {
    m.encode_to_vec()
}

pub(crate) fn decode<M: Message + Default>(what: &str, bytes: &[u8]) -> Result<M> {
    M::decode(bytes).map_err(|e| Error::Corrupt(format!("{what} record: {e}")))
}

/// How a record is read: conflicting with concurrent changes to it, or not (a snapshot read).
#[derive(Clone, Copy)]
enum Read {
    Conflicting,
    Snapshot,
}

/// Reads an execution record, with its spec when `spec` (the spec never changes, so it is always
/// read without a conflict).
async fn read_record(
    tx: &Transaction,
    ks: &Keyspace,
    (ns, id): (&str, &str),
    read: Read,
    spec: bool,
) -> Result<Option<Execution>> {
    let key = ks.execution(ns, id);
    let bytes = match read {
        Read::Conflicting => tx.get(&key).await?,
        Read::Snapshot => tx.snapshot_get(&key).await?,
    };
    let Some(bytes) = bytes else { return Ok(None) };
    let e = decode("execution", &bytes)?;
    Ok(Some(if spec { with_spec(tx, ks, e).await? } else { e }))
}

/// Reads an execution (non-snapshot: the transaction conflicts with concurrent changes to its
/// state; its spec never changes, so it is read without one).
pub(crate) async fn load_execution(
    tx: &Transaction,
    ks: &Keyspace,
    ns: &str,
    id: &str,
) -> Result<Option<Execution>> {
    read_record(tx, ks, (ns, id), Read::Conflicting, true).await
}

/// Reads an execution's state only (non-snapshot), for a change that needs nothing of its spec
/// (a heartbeat, a result): the spec fields are empty unless the record is of format 2 (whole).
/// [`Scheduler::save_execution`] writes such a record back as it should.
pub(crate) async fn load_state(
    tx: &Transaction,
    ks: &Keyspace,
    ns: &str,
    id: &str,
) -> Result<Option<Execution>> {
    read_record(tx, ks, (ns, id), Read::Conflicting, false).await
}

/// Reads an execution with a snapshot read (no conflict: listing and looking up).
pub(crate) async fn snapshot_execution(
    tx: &Transaction,
    ks: &Keyspace,
    ns: &str,
    id: &str,
) -> Result<Option<Execution>> {
    read_record(tx, ks, (ns, id), Read::Snapshot, true).await
}

/// Completes a decoded execution record with its spec when the spec is kept apart (format 3):
/// the value of its time index entry, read without a conflict (it never changes).
pub(crate) async fn with_spec(
    tx: &Transaction,
    ks: &Keyspace,
    mut e: Execution,
) -> Result<Execution> {
    if e.spec_apart {
        let key = ks.by_time(&e.namespace, e.execute_at_ms, &e.id);
        let v = tx.snapshot_get(&key).await?;
        merge_spec(&mut e, v.as_deref())?;
    }
    Ok(e)
}

/// Puts the spec `bytes` (a time index entry's value) into a record kept apart from it.
pub fn merge_spec(e: &mut Execution, bytes: Option<&[u8]>) -> Result<()> {
    let spec: ExecutionSpec = match bytes {
        Some(b) if !b.is_empty() => decode("execution spec", b)?,
        _ => {
            return Err(Error::Corrupt(format!(
                "execution {:?} in {:?} has no spec (its time index entry is missing or empty)",
                e.id, e.namespace
            )));
        }
    };
    let ExecutionSpec {
        definition_name,
        definition_version,
        input_json,
        idempotency_key,
        created_at_ms,
        request_fingerprint,
        cron_job_id,
        cron_occurrence_ms,
        traceparent,
    } = spec;
    e.definition_name = definition_name;
    e.definition_version = definition_version;
    e.input_json = input_json;
    e.idempotency_key = idempotency_key;
    e.created_at_ms = created_at_ms;
    e.request_fingerprint = request_fingerprint;
    e.cron_job_id = cron_job_id;
    e.cron_occurrence_ms = cron_occurrence_ms;
    e.traceparent = traceparent;
    Ok(())
}

/// The spec of an execution: the fields fixed at submit.
pub(crate) fn spec_of(e: &Execution) -> ExecutionSpec {
    ExecutionSpec {
        definition_name: e.definition_name.clone(),
        definition_version: e.definition_version,
        input_json: e.input_json.clone(),
        idempotency_key: e.idempotency_key.clone(),
        created_at_ms: e.created_at_ms,
        request_fingerprint: e.request_fingerprint.clone(),
        cron_job_id: e.cron_job_id.clone(),
        cron_occurrence_ms: e.cron_occurrence_ms,
        traceparent: e.traceparent.clone(),
    }
}

/// The state record of an execution: every field but its spec's (which are left empty), with
/// `spec_apart` set. Destructured field by field, so a field added to `Execution` does not
/// compile until it is placed on one side or the other.
pub(crate) fn state_of(e: &Execution) -> Execution {
    let Execution {
        id,
        namespace,
        definition_name: _,
        definition_version: _,
        input_json: _,
        execute_at_ms,
        idempotency_key: _,
        status,
        attempt_count,
        fencing_token,
        retry_policy,
        queue,
        output_json,
        output_reference,
        error,
        created_at_ms: _,
        updated_at_ms,
        ready_at_ms,
        started_at_ms,
        finished_at_ms,
        timer,
        lease_expires_at_ms,
        cancel_requested,
        attempt_timeout_ms,
        lease_ms,
        shard,
        attempt_base,
        request_fingerprint: _,
        worker_id,
        attempts_released,
        cron_job_id: _,
        cron_occurrence_ms: _,
        traceparent: _,
        worker_confirmed,
        spec_apart: _,
    } = e;
    Execution {
        id: id.clone(),
        namespace: namespace.clone(),
        execute_at_ms: *execute_at_ms,
        status: *status,
        attempt_count: *attempt_count,
        fencing_token: *fencing_token,
        retry_policy: *retry_policy,
        queue: queue.clone(),
        output_json: output_json.clone(),
        output_reference: output_reference.clone(),
        error: error.clone(),
        updated_at_ms: *updated_at_ms,
        ready_at_ms: *ready_at_ms,
        started_at_ms: *started_at_ms,
        finished_at_ms: *finished_at_ms,
        timer: timer.clone(),
        lease_expires_at_ms: *lease_expires_at_ms,
        cancel_requested: *cancel_requested,
        attempt_timeout_ms: *attempt_timeout_ms,
        lease_ms: *lease_ms,
        shard: *shard,
        attempt_base: *attempt_base,
        worker_id: worker_id.clone(),
        attempts_released: *attempts_released,
        worker_confirmed: *worker_confirmed,
        spec_apart: true,
        ..Execution::default()
    }
}

/// Reads an execution that must exist.
pub(crate) async fn require_execution(
    tx: &Transaction,
    ks: &Keyspace,
    ns: &str,
    id: &str,
) -> Result<Execution> {
    load_execution(tx, ks, ns, id)
        .await?
        .ok_or_else(|| Error::NotFound { what: "execution", id: id.to_string() })
}

/// A shard's watermark (read with a conflict: a timer written below a concurrently advanced
/// watermark would never fire, so the two transactions must not both commit).
pub(crate) async fn watermark(tx: &Transaction, ks: &Keyspace, shard: u32) -> Result<i64> {
    match tx.get(&ks.watermark(shard)).await? {
        Some(v) if v.len() == 8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&v);
            Ok(i64::from_be_bytes(b))
        }
        Some(_) => Err(Error::Corrupt(format!("watermark of shard {shard}"))),
        None => Err(Error::Corrupt(format!("shard {shard} has no watermark"))),
    }
}

pub(crate) fn timer_key(e: &Execution, t: &TimerRef) -> TimerKey {
    // A shared lease check's key names its group, not one execution (`ops::lease_checks`).
    let shared = t.kind == TimerKind::LeaseChecks as i32;
    TimerKey {
        bucket: t.bucket,
        shard: e.shard,
        fire_at_ms: t.fire_at_ms,
        execution_id: if shared { t.group.clone() } else { e.id.clone() },
        kind: t.kind,
    }
}

/// Whether executions in `status` have entries in the status index: only FAILED and
/// CANCELLED, the ended states that are rare and looked for (issue 21). SUCCEEDED, the common
/// end, has none: its entry cost a set at completion and a clear at retention, and listing it
/// (the least selective filter: most rows match) scans the time index as well; retention finds
/// it through the time index ([`super::retention`]). The waiting and passing states —
/// SCHEDULED, RETRY_WAIT, READY, RUNNING — have none either: an entry written at submit and
/// cleared at fire cost two writes per execution, and listing them scans the time index
/// instead, where the rows due in the future are mostly SCHEDULED anyway (the counts are exact
/// for every state). Stores written before these rules lose those entries once, at open
/// ([`super::migrate`]).
pub fn is_indexed(status: i32) -> bool {
    status == ExecutionStatus::Failed as i32 || status == ExecutionStatus::Cancelled as i32
}

/// The attempt that made an execution SUCCEEDED, as the execution carries it (a successful
/// attempt's record is never stored: the execution holds all of it).
pub(crate) fn succeeded_attempt(e: &Execution) -> Attempt {
    debug_assert_eq!(e.status, ExecutionStatus::Succeeded as i32, "only a successful attempt");
    Attempt {
        execution_id: e.id.clone(),
        number: e.attempt_count,
        worker_id: e.worker_id.clone(),
        lease_owner: e.worker_id.clone(),
        lease_expires_at_ms: 0,
        fencing_token: e.fencing_token,
        started_at_ms: e.started_at_ms,
        ended_at_ms: e.finished_at_ms,
        status: AttemptStatus::Succeeded as i32,
        error: None,
    }
}

/// The running attempt of a RUNNING execution, as the execution carries it (the attempt record
/// is only written when the attempt ends).
pub(crate) fn running_attempt(e: &Execution) -> Attempt {
    debug_assert_eq!(e.status, ExecutionStatus::Running as i32, "only a running attempt");
    Attempt {
        execution_id: e.id.clone(),
        number: e.attempt_count,
        worker_id: e.worker_id.clone(),
        lease_owner: e.worker_id.clone(),
        lease_expires_at_ms: e.lease_expires_at_ms,
        fencing_token: e.fencing_token,
        started_at_ms: e.started_at_ms,
        ended_at_ms: 0,
        status: AttemptStatus::Running as i32,
        error: None,
    }
}

impl Scheduler {
    /// The ready / count partition of an execution.
    pub(crate) fn partition_of(&self, e: &Execution) -> u32 {
        e.shard % self.config.ready_partitions.max(1)
    }

    /// Writes an execution's state, moving its status index entry (for [indexed](is_indexed)
    /// states) and count if the status changed; and its spec, the first time (`spec_apart`
    /// unset: a new execution, or one stored by an earlier format).
    pub(crate) fn save_execution(
        &self,
        tx: &Transaction,
        before_status: Option<i32>,
        e: &Execution,
    ) -> Result<()> {
        check_shape(e);
        let ks = &self.ks;
        if before_status != Some(e.status) {
            let part = self.partition_of(e);
            if let Some(old) = before_status {
                if is_indexed(old) {
                    tx.clear(&ks.by_status(&e.namespace, old, e.execute_at_ms, &e.id))?;
                }
                tx.add_i64(&ks.status_count(&e.namespace, old, part), -1)?;
            }
            if is_indexed(e.status) {
                tx.set(&ks.by_status(&e.namespace, e.status, e.execute_at_ms, &e.id), b"")?;
            }
            // Atomic adds: counting adds no conflict between concurrent transitions, and the
            // partition keeps any one counter from being written by every node.
            tx.add_i64(&ks.status_count(&e.namespace, e.status, part), 1)?;
        }
        // The spec is written once: at submit, or when a record of an earlier format (which
        // carries it) is first rewritten. After that only the state is.
        if !e.spec_apart {
            tx.set(&ks.by_time(&e.namespace, e.execute_at_ms, &e.id), &encode(&spec_of(e)))?;
        }
        tx.set(&ks.execution(&e.namespace, &e.id), &encode(&state_of(e)))?;
        Ok(())
    }

    /// Sets the execution's timer (replacing any previous one). Its bucket is clamped up to the
    /// shard's watermark `wm` (read with a conflict in this transaction) so it is always
    /// scanned.
    pub(crate) fn set_timer_with(
        &self,
        tx: &Transaction,
        e: &mut Execution,
        kind: TimerKind,
        fire_at_ms: i64,
        wm: i64,
    ) -> Result<()> {
        self.clear_timer(tx, e)?;
        let bucket = bucket_of(fire_at_ms, self.config.bucket_width_ms).max(wm);
        assert!(bucket >= wm, "a timer below its shard's watermark would never fire");
        let t = TimerRef { fire_at_ms, bucket, kind: kind as i32, group: String::new() };
        // The queue lets a fire hold back a due execution without reading it (`ops::hold`);
        // a lease check is never held.
        let startable = matches!(kind, TimerKind::Due | TimerKind::Retry);
        let queue = if startable { e.queue.clone() } else { String::new() };
        let entry = TimerEntry {
            kind: kind as i32,
            namespace: e.namespace.clone(),
            queue,
            members: vec![],
        };
        tx.set(&self.ks.timer(&timer_key(e, &t)), &encode(&entry))?;
        e.timer = Some(t);
        Ok(())
    }

    /// Removes the execution's timer, if any. A shared lease check (`ops::lease_checks`) is
    /// only forgotten: its key is its group's, cleared when it fires.
    pub(crate) fn clear_timer(&self, tx: &Transaction, e: &mut Execution) -> Result<()> {
        if let Some(t) = e.timer.take()
            && t.kind != TimerKind::LeaseChecks as i32
        {
            tx.clear(&self.ks.timer(&timer_key(e, &t)))?;
        }
        Ok(())
    }

    fn ready_key(&self, e: &Execution) -> ReadyKey {
        ReadyKey {
            namespace: e.namespace.clone(),
            queue: e.queue.clone(),
            partition: self.partition_of(e),
            ready_at_ms: e.ready_at_ms,
            execution_id: e.id.clone(),
        }
    }

    /// Puts the execution on its ready queue and bumps the partition's ready signal.
    pub(crate) fn enqueue_ready(
        &self,
        tx: &Transaction,
        e: &mut Execution,
        now_ms: i64,
    ) -> Result<()> {
        e.ready_at_ms = now_ms;
        tx.set(&self.ks.ready(&self.ready_key(e)), b"")?;
        tx.add_i64(&self.ks.ready_signal(&e.namespace, &e.queue, self.partition_of(e)), 1)?;
        Ok(())
    }

    /// Takes the execution off its ready queue.
    pub(crate) fn dequeue_ready(&self, tx: &Transaction, e: &Execution) -> Result<()> {
        tx.clear(&self.ks.ready(&self.ready_key(e)))?;
        Ok(())
    }

    /// Writes the attempt record of an attempt that ended.
    pub(crate) fn save_attempt(&self, tx: &Transaction, ns: &str, a: &Attempt) -> Result<()> {
        debug_assert_ne!(a.status, AttemptStatus::Running as i32, "only ended attempts are stored");
        tx.set(&self.ks.attempt(ns, &a.execution_id, a.number), &encode(a))?;
        Ok(())
    }
}

/// What every stored execution is: a known status, the timer that status waits on (and no other),
/// a lease only while RUNNING. Checked before every write: a record that breaks it would never be
/// picked up again, or be picked up twice.
fn check_shape(e: &Execution) {
    let status = ExecutionStatus::try_from(e.status).unwrap_or(ExecutionStatus::Unspecified);
    assert_ne!(status, ExecutionStatus::Unspecified, "execution {} has no status", e.id);
    let want = match status {
        ExecutionStatus::Scheduled => Some(TimerKind::Due),
        ExecutionStatus::RetryWait => Some(TimerKind::Retry),
        ExecutionStatus::Running => Some(TimerKind::LeaseCheck),
        _ => None,
    };
    // A RUNNING execution's first lease check may be shared (`ops::lease_checks`).
    let kind = e.timer.as_ref().map(|t| match t.kind() {
        TimerKind::LeaseChecks => TimerKind::LeaseCheck,
        k => k,
    });
    debug_assert_eq!(
        kind,
        want,
        "execution {} in {} has the wrong timer",
        e.id,
        crate::state::status_name(e.status)
    );
    debug_assert!(
        status == ExecutionStatus::Running || e.lease_expires_at_ms == 0,
        "execution {} holds a lease while {}",
        e.id,
        crate::state::status_name(e.status)
    );
}
