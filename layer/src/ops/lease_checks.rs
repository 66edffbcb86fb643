//! Lease checks shared by the attempts one transaction starts (keyspace format 4, issue 34).
//!
//! An attempt's first lease check used to be a timer of its own: a set when the attempt
//! started and a clear when its result came, two point writes of nearly every lifecycle for a
//! check that almost never finds anything. Now the attempts a transaction starts in one shard
//! with one deadline share one LEASE_CHECKS timer, which lists them (namespace, id, fencing
//! token). The execution names it (`TimerRef.group`), so a result, a release or a cancel only
//! forgets it (no write: the key is shared). When it fires, each member whose execution still
//! names it with the same fencing token is checked as by a LEASE_CHECK timer — timed out,
//! released, or given a LEASE_CHECK timer of its own at its renewed deadline — and the shared
//! key is cleared. A member finished, restarted or deleted since is passed.

use std::collections::BTreeMap;

use kairos_proto::storage::v1::{Execution, LeaseCheckMember, TimerEntry, TimerKind, TimerRef};

use super::Scheduler;
use super::error::{Error, Result};
use super::records::{encode, load_state};
use crate::ids::bucket_of;
use crate::keys::TimerKey;
use crate::kv::Transaction;

/// The lease check groups one transaction is filling: one per (shard, bucket, deadline).
#[derive(Debug, Default, Clone)]
pub(crate) struct LeaseChecks {
    groups: BTreeMap<(u32, i64, i64), Group>,
}

#[derive(Debug, Clone)]
struct Group {
    id: String,
    members: Vec<LeaseCheckMember>,
}

impl Scheduler {
    /// Makes `e` (its attempt just started, its fencing token drawn) a member of the group of
    /// its shard due at `deadline`, creating the group if this transaction has none yet; sets
    /// the execution's timer to it. `wm` is the shard's watermark, read in this transaction.
    pub(crate) fn join_lease_checks(
        &self,
        checks: &mut LeaseChecks,
        e: &mut Execution,
        deadline: i64,
        wm: i64,
    ) {
        let bucket = bucket_of(deadline, self.config.bucket_width_ms).max(wm);
        assert!(bucket >= wm, "a timer below its shard's watermark would never fire");
        let group = checks.groups.entry((e.shard, bucket, deadline)).or_insert_with(|| Group {
            id: format!("lc-{:016x}", self.rng.next_u64()),
            members: Vec::new(),
        });
        group.members.push(LeaseCheckMember {
            namespace: e.namespace.clone(),
            execution_id: e.id.clone(),
            fencing_token: e.fencing_token,
        });
        e.timer = Some(TimerRef {
            fire_at_ms: deadline,
            bucket,
            kind: TimerKind::LeaseChecks as i32,
            group: group.id.clone(),
        });
    }

    /// Writes the groups' timers (one set each): called once per transaction, after its last
    /// start and before it commits.
    pub(crate) fn write_lease_checks(&self, tx: &Transaction, checks: LeaseChecks) -> Result<()> {
        for ((shard, bucket, deadline), g) in checks.groups {
            let key = TimerKey {
                bucket,
                shard,
                fire_at_ms: deadline,
                execution_id: g.id,
                kind: TimerKind::LeaseChecks as i32,
            };
            let namespace = g.members.first().map(|m| m.namespace.clone()).unwrap_or_default();
            let entry = TimerEntry {
                kind: TimerKind::LeaseChecks as i32,
                namespace,
                queue: String::new(),
                members: g.members,
            };
            tx.set(&self.ks.timer(&key), &encode(&entry))?;
        }
        Ok(())
    }

    /// The members of the LEASE_CHECKS timer `t` (its entry `entry`) still to check, each with
    /// the LEASE_CHECK key its `Fired` reports (its own id: the node follows a renewed lease
    /// as any other), their states read concurrently. A member whose execution is gone, names
    /// another timer, or runs another attempt is passed; so is one whose state does not decode
    /// (`kairos check` reports it), rather than holding up the others' checks.
    pub(crate) async fn lease_check_members(
        &self,
        tx: &Transaction,
        t: &TimerKey,
        entry: TimerEntry,
    ) -> Result<Vec<(Execution, TimerKey)>> {
        let loads = entry.members.into_iter().map(|m| async move {
            match load_state(tx, &self.ks, &m.namespace, &m.execution_id).await {
                Ok(Some(e)) if is_member(&e, t, &m) => Ok(Some(e)),
                Ok(_) => Ok(None),
                Err(Error::Kv(k)) => Err(Error::Kv(k)),
                Err(_) => Ok(None),
            }
        });
        let found = crate::ops::join::join_in_order(loads).await?;
        Ok(found
            .into_iter()
            .flatten()
            .map(|mut e| {
                let own = TimerKey {
                    execution_id: e.id.clone(),
                    kind: TimerKind::LeaseCheck as i32,
                    ..t.clone()
                };
                e.timer = None; // its key is cleared by the fire
                (e, own)
            })
            .collect())
    }
}

/// Whether `e` is still the member `m` of the LEASE_CHECKS timer `t`: its execution names that
/// group and the attempt is the one that joined it.
fn is_member(e: &Execution, t: &TimerKey, m: &LeaseCheckMember) -> bool {
    e.fencing_token == m.fencing_token
        && e.timer.as_ref().is_some_and(|r| {
            r.kind == TimerKind::LeaseChecks as i32
                && r.group == t.execution_id
                && r.fire_at_ms == t.fire_at_ms
                && r.bucket == t.bucket
        })
}
