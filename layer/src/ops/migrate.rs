//! Changes to stores written by earlier builds, made once at open and recorded in the cluster
//! config so they never run again (a clear is a write, on an LSM as much as a set).
//!
//! Format 2 → 3 (issue 21, step 2): the spec of an execution is kept apart from its state.
//! Nothing is rewritten at open: a record of format 2 is read as it is and split at its next
//! write; only the config's format is raised ([`format`]).
//!
//! Status index 0 → 1 (issue 21): SCHEDULED and RETRY_WAIT executions no longer have status
//! index entries (see [`super::records::is_indexed`]); the entries an earlier build wrote for
//! them are cleared, per namespace and status, in transactions of at most
//! [`MIGRATION_CHUNK_ROWS`] entries each (range clears: a few bytes of mutation, well within the
//! transaction budget, and a bounded amount of engine work per commit).
//!
//! Status index 1 → 2 (issue 21, step 5): SUCCEEDED executions no longer have entries either;
//! a store at 0 or 1 has them cleared the same way (and a store at 0 its SCHEDULED and
//! RETRY_WAIT ones too, in the same pass). Only the states a revision after the store's dropped
//! are read, and a range is cleared only where it holds entries: no blind clears.

use kairos_proto::storage::v1::{ClusterConfig, ExecutionStatus};

use super::error::{Error, Result};
use super::records::{decode, encode};
use crate::keys::{Keyspace, Tag};
use crate::kv::limits::key_after;
use crate::kv::{Database, RangeOption};

/// The status index revision this binary writes.
pub(crate) const STATUS_INDEX: u32 = 2;

/// Status index entries one migration transaction clears, at most.
pub(crate) const MIGRATION_CHUNK_ROWS: usize = 10_000;

/// States whose status index entries a revision dropped, with that revision.
const UNINDEXED: [(u32, ExecutionStatus); 3] = [
    (1, ExecutionStatus::Scheduled),
    (1, ExecutionStatus::RetryWait),
    (2, ExecutionStatus::Succeeded),
];

/// Brings the store's status index to [`STATUS_INDEX`] if it is older; returns the config as
/// stored afterwards. Safe to run on several nodes at once, and to stop at any point: every step
/// is idempotent and the config is updated last.
pub(crate) async fn status_index(
    db: &Database,
    ks: &Keyspace,
    config: ClusterConfig,
    chunk: usize,
) -> Result<ClusterConfig> {
    if config.status_index >= STATUS_INDEX {
        return Ok(config);
    }
    let mut begin = ks.subspace_range(Tag::ByStatus).begin;
    while let Some(ns) = next_namespace(db, ks, &begin).await? {
        let dropped = UNINDEXED.iter().filter(|(rev, _)| *rev > config.status_index);
        for (_, status) in dropped {
            clear_in_chunks(db, ks.by_status_range(&ns, *status as i32, i64::MIN, i64::MAX), chunk)
                .await?;
        }
        // Past every status of this namespace.
        begin = ks.by_status_range(&ns, i32::MAX, i64::MIN, i64::MAX).end;
    }
    db.run(|tx| async move {
        let v = tx.get(&ks.cluster()).await?.ok_or_else(|| Error::Corrupt("no cluster".into()))?;
        let mut config = decode::<ClusterConfig>("cluster config", &v)?;
        if config.status_index < STATUS_INDEX {
            config.status_index = STATUS_INDEX;
            tx.set(&ks.cluster(), &encode(&config))?;
        }
        Ok::<_, Error>(config)
    })
    .await
}

/// Brings a store of keyspace format `from` to `to` (a store of any other format is left as
/// it is, for the caller to refuse). Format 2 → 3 changes no stored record: records of format
/// 2 carry their spec and are read as they are, and split at their next write
/// ([`super::records`]); the version is raised so binaries of format 2 refuse the store.
pub(crate) async fn format(
    db: &Database,
    ks: &Keyspace,
    config: ClusterConfig,
    from: u32,
    to: u32,
) -> Result<ClusterConfig> {
    if config.format_version != from {
        return Ok(config);
    }
    db.run(|tx| async move {
        let v = tx.get(&ks.cluster()).await?.ok_or_else(|| Error::Corrupt("no cluster".into()))?;
        let mut config = decode::<ClusterConfig>("cluster config", &v)?;
        if config.format_version == from {
            config.format_version = to;
            tx.set(&ks.cluster(), &encode(&config))?;
        }
        Ok::<_, Error>(config)
    })
    .await
}

/// The namespace of the first status index entry at or after `begin`, if any.
async fn next_namespace(db: &Database, ks: &Keyspace, begin: &[u8]) -> Result<Option<String>> {
    let end = ks.subspace_range(Tag::ByStatus).end;
    let mut begin = begin.to_vec();
    loop {
        let range = RangeOption::new(begin.clone(), end.clone()).limit(1);
        let range = &range;
        let rows = db.run(|tx| async move { tx.get_range(range, true).await }).await?;
        let Some(kv) = rows.first() else { return Ok(None) };
        match ks.parse_by_status(&kv.key) {
            Ok((ns, ..)) => return Ok(Some(ns)),
            // A key that names no namespace (damage `kairos check` reports): step past it.
            Err(_) => begin = key_after(&kv.key),
        }
    }
}

/// Clears `range`, at most `chunk` keys per transaction; how many keys it cleared.
async fn clear_in_chunks(db: &Database, range: RangeOption, chunk: usize) -> Result<u64> {
    let mut cleared = 0;
    loop {
        let r = &range;
        let n = db
            .run(|tx| async move {
                let rows = tx.get_range(&r.clone().limit(chunk), true).await?;
                if let Some(last) = rows.last() {
                    tx.clear_range(&r.begin, &key_after(&last.key))?;
                }
                Ok::<_, Error>(rows.len())
            })
            .await?;
        cleared += n as u64;
        if n < chunk {
            return Ok(cleared);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::env::{ManualClock, Rng, SharedClock, Timestamp};
    use crate::kv::memory::MemoryDatabase;

    /// Entries of several namespaces and states, cleared in chunks smaller than a status's
    /// entries: only the states the store's revision still indexes lose none, and the config
    /// records the new revision.
    async fn migrate_from(level: u32) -> Vec<(String, i32)> {
        let clock: SharedClock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000)));
        let db = MemoryDatabase::open(clock, Rng::seeded(5), Default::default());
        let ks = Keyspace::new("t");
        let (ks, db) = (&ks, &db);
        let old = ClusterConfig { status_index: level, ..ClusterConfig::default() };
        let stored = old.clone();
        db.run(|tx| {
            let stored = stored.clone();
            async move {
                tx.set(&ks.cluster(), &encode(&stored))?;
                for ns in ["a", "b", "c"] {
                    for status in 1..=7 {
                        for i in 0..9 {
                            tx.set(&ks.by_status(ns, status, i, &format!("E{i}")), b"")?;
                        }
                    }
                }
                Ok::<_, Error>(())
            }
        })
        .await
        .unwrap();
        let config = status_index(db, ks, old, 4).await.unwrap();
        assert_eq!(config.status_index, STATUS_INDEX);
        let all = &ks.subspace_range(Tag::ByStatus);
        let rows = db.run(|tx| async move { tx.get_range(all, true).await }).await.unwrap();
        let mut left: Vec<(String, i32)> = rows
            .iter()
            .map(|kv| ks.parse_by_status(&kv.key).unwrap())
            .map(|t| (t.0, t.1))
            .collect();
        assert_eq!(rows.len() % 9, 0);
        left.dedup();
        left
    }

    fn in_each(states: &[i32]) -> Vec<(String, i32)> {
        ["a", "b", "c"].iter().flat_map(|ns| states.iter().map(|s| (ns.to_string(), *s))).collect()
    }

    #[tokio::test]
    async fn old_entries_go_in_chunks_and_failed_and_cancelled_ones_stay() {
        // From 0: SCHEDULED (1), RETRY_WAIT (4) and SUCCEEDED (5) go.
        let left = migrate_from(0).await;
        assert_eq!(left, in_each(&[2, 3, 6, 7]), "READY/RUNNING entries are not its to clear");
        // From 1 (migrated by the step before): only SUCCEEDED is read and cleared.
        assert_eq!(migrate_from(1).await, in_each(&[1, 2, 3, 4, 6, 7]));
    }
}
