//! Reading and writing records, and the bookkeeping that goes with them: the status index,
//! timers (clamped to the shard watermark) and ready entries.

use kairos_proto::storage::v1::{Execution, TimerEntry, TimerKind, TimerRef};
use prost::Message;

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

/// Reads an execution (non-snapshot: the transaction conflicts with concurrent changes).
pub(crate) async fn load_execution(
    tx: &Transaction,
    ks: &Keyspace,
    ns: &str,
    id: &str,
) -> Result<Option<Execution>> {
    match tx.get(&ks.execution(ns, id)).await? {
        Some(v) => Ok(Some(decode("execution", &v)?)),
        None => Ok(None),
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

/// Writes an execution, moving its status index entry if the status changed.
pub(crate) fn save_execution(
    tx: &Transaction,
    ks: &Keyspace,
    before_status: Option<i32>,
    e: &Execution,
) -> Result<()> {
    if before_status != Some(e.status) {
        if let Some(old) = before_status {
            tx.clear(&ks.by_status(&e.namespace, old, e.execute_at_ms, &e.id))?;
            tx.add_i64(&ks.status_count(&e.namespace, old), -1)?;
        }
        tx.set(&ks.by_status(&e.namespace, e.status, e.execute_at_ms, &e.id), b"")?;
        // Atomic adds: counting adds no conflict between concurrent transitions.
        tx.add_i64(&ks.status_count(&e.namespace, e.status), 1)?;
    }
    tx.set(&ks.execution(&e.namespace, &e.id), &encode(e))?;
    Ok(())
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
    TimerKey {
        bucket: t.bucket,
        shard: e.shard,
        fire_at_ms: t.fire_at_ms,
        execution_id: e.id.clone(),
        kind: t.kind,
    }
}

/// Sets the execution's timer (replacing any previous one). Its bucket is clamped up to the
/// shard's watermark so it is always scanned.
pub(crate) async fn set_timer(
    tx: &Transaction,
    ks: &Keyspace,
    bucket_width_ms: i64,
    e: &mut Execution,
    kind: TimerKind,
    fire_at_ms: i64,
) -> Result<()> {
    clear_timer(tx, ks, e)?;
    let wm = watermark(tx, ks, e.shard).await?;
    let bucket = bucket_of(fire_at_ms, bucket_width_ms).max(wm);
    let t = TimerRef { fire_at_ms, bucket, kind: kind as i32 };
    let entry = TimerEntry {
        kind: kind as i32,
        namespace: e.namespace.clone(),
        attempt: e.attempt_count,
        fencing_token: e.fencing_token,
    };
    tx.set(&ks.timer(&timer_key(e, &t)), &encode(&entry))?;
    e.timer = Some(t);
    Ok(())
}

/// Removes the execution's timer, if any.
pub(crate) fn clear_timer(tx: &Transaction, ks: &Keyspace, e: &mut Execution) -> Result<()> {
    if let Some(t) = e.timer.take() {
        tx.clear(&ks.timer(&timer_key(e, &t)))?;
    }
    Ok(())
}

fn ready_key(e: &Execution) -> ReadyKey {
    ReadyKey {
        namespace: e.namespace.clone(),
        queue: e.queue.clone(),
        ready_at_ms: e.ready_at_ms,
        execution_id: e.id.clone(),
    }
}

/// Puts the execution on its ready queue and bumps the queue's ready signal.
pub(crate) fn enqueue_ready(
    tx: &Transaction,
    ks: &Keyspace,
    e: &mut Execution,
    now_ms: i64,
) -> Result<()> {
    e.ready_at_ms = now_ms;
    tx.set(&ks.ready(&ready_key(e)), b"")?;
    tx.add_i64(&ks.ready_signal(&e.namespace, &e.queue), 1)?;
    Ok(())
}

/// Takes the execution off its ready queue.
pub(crate) fn dequeue_ready(tx: &Transaction, ks: &Keyspace, e: &Execution) -> Result<()> {
    tx.clear(&ks.ready(&ready_key(e)))?;
    Ok(())
}
