//! Changes to stores written by earlier builds, made once at open and recorded in the cluster
//! config so they never run again (a clear is a write, on an LSM as much as a set).
//!
//! Keyspace formats are upgraded by [`STEPS`], an ordered list of steps, each from format N to
//! N+1: [`plan`] says which a store needs (or why it is refused: a store newer than this
//! binary — a downgrade — or older than the first step, each naming both formats), and
//! [`upgrade`] runs them in order, each recording its new format in the cluster config as it
//! ends, so a stopped upgrade resumes at the step it was in. The node runs them at open (the
//! `kairos` binary copies an embedded store aside first); `kairos migrate` runs them alone.
//! A later format change adds its step at the end of [`STEPS`] and raises [`FORMAT_VERSION`].
//!
//! Format 2 → 3 (issue 21, step 2): the spec of an execution is kept apart from its state.
//! Nothing is rewritten at open: a record of format 2 is read as it is and split at its next
//! write; only the config's format is raised ([`format`]).
//!
//! Format 3 → 4 (issue 34, the write-lean lifecycle): no index by definition. A submit no longer
//! writes a by-definition entry (tag 14) nor retention clears one; listing by definition filters
//! the time index by the specs its rows hold. The step clears tag 14 in transactions of at most
//! [`MIGRATION_CHUNK_ROWS`] entries, then raises the format, so a format 3 binary — which would
//! list by definition from an index no longer kept — refuses the store from then on.
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

/// The keyspace format this binary writes. Format 2 (partitioned leases, ready queues and
/// counts; attempts stored when they end) cannot read format 1. Format 3 keeps an execution's
/// spec apart from its state (`ExecutionSpec`, issue 21): it reads format 2 and a store of
/// format 2 becomes format 3 at its first open ([`STEPS`]), so that a binary of format 2,
/// which cannot read the split records, refuses it from then on. Format 4 keeps no index by
/// definition (issue 34).
pub const FORMAT_VERSION: u32 = 4;

/// One upgrade of the keyspace format, from `from` to `from + 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The format it reads.
    pub from: u32,
    /// The format it leaves (`from + 1`).
    pub to: u32,
    /// What it does, for `kairos migrate --dry-run` and the node's log.
    pub what: &'static str,
}

/// Every format upgrade this binary knows, in order: a store of format `STEPS[0].from` or later
/// can be brought to [`FORMAT_VERSION`]. Each step's code is in [`run_step`].
pub const STEPS: &[Step] = &[
    Step {
        from: 2,
        to: 3,
        what: "execution specs kept apart from their state (issue 21): no record is rewritten \
               at once, each is split at its next write; the format is raised so format 2 \
               binaries refuse the store",
    },
    Step {
        from: 3,
        to: 4,
        what: "no index by definition (issue 34): its entries are cleared, 10,000 per \
               transaction (listing by definition filters the time index); the format is raised \
               so format 3 binaries refuse the store",
    },
];

/// What a store needs before this binary can serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The keyspace format the store holds.
    pub format: u32,
    /// The format steps to run, in order (empty: the format is current).
    pub steps: Vec<Step>,
    /// The status index revision the store holds, when older than this binary's (its clearing
    /// of index entries runs after the format steps).
    pub status_index_from: Option<u32>,
}

impl Plan {
    /// Whether anything would change.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.status_index_from.is_none()
    }
}

/// The upgrade a store of this config needs; refused (naming both formats) when the store is
/// newer than this binary (a downgrade) or older than any step it knows.
pub fn plan(config: &ClusterConfig) -> Result<Plan> {
    let stored = config.format_version;
    if stored > FORMAT_VERSION {
        return Err(Error::FailedPrecondition(format!(
            "the store holds keyspace format {stored}, newer than this binary's format \
             {FORMAT_VERSION}: a downgrade is refused — run a binary of format {stored} or later \
             (or restore a backup taken before the upgrade)"
        )));
    }
    let first = STEPS.first().map_or(FORMAT_VERSION, |s| s.from);
    if stored < first {
        return Err(Error::FailedPrecondition(format!(
            "the store holds keyspace format {stored} and this binary reads format \
             {FORMAT_VERSION}, upgrading stores of format {first} or later only: use a binary of \
             format {stored}, or start from an empty data directory"
        )));
    }
    let steps = STEPS.iter().filter(|s| s.from >= stored).copied().collect();
    let status_index_from = (config.status_index < STATUS_INDEX).then_some(config.status_index);
    Ok(Plan { format: stored, steps, status_index_from })
}

/// The cluster config stored under `ks`, if the cluster exists.
pub async fn stored_config(db: &Database, ks: &Keyspace) -> Result<Option<ClusterConfig>> {
    db.run(|tx| async move {
        match tx.get(&ks.cluster()).await? {
            Some(v) => Ok(Some(decode::<ClusterConfig>("cluster config", &v)?)),
            None => Ok::<_, Error>(None),
        }
    })
    .await
}

/// What the cluster under `ks` needs (`None`: there is no cluster yet).
pub async fn pending(db: &Database, ks: &Keyspace) -> Result<Option<Plan>> {
    match stored_config(db, ks).await? {
        Some(config) => plan(&config).map(Some),
        None => Ok(None),
    }
}

/// Runs every step the store needs ([`plan`]), in order, then the status index's; returns the
/// config as stored afterwards. Refuses what [`plan`] refuses, before writing anything.
pub(crate) async fn upgrade(
    db: &Database,
    ks: &Keyspace,
    mut config: ClusterConfig,
) -> Result<ClusterConfig> {
    let plan = plan(&config)?;
    for step in &plan.steps {
        config = run_step(db, ks, config, step).await?;
        tracing::info!(from = step.from, to = step.to, "keyspace format upgraded");
    }
    status_index(db, ks, config, MIGRATION_CHUNK_ROWS).await
}

/// The code of one step of [`STEPS`].
async fn run_step(
    db: &Database,
    ks: &Keyspace,
    config: ClusterConfig,
    step: &Step,
) -> Result<ClusterConfig> {
    match (step.from, step.to) {
        (2, 3) => format(db, ks, config, 2, 3).await,
        (3, 4) => {
            if config.format_version == 3 {
                let n =
                    clear_in_chunks(db, ks.subspace_range(Tag::ByDefinition), MIGRATION_CHUNK_ROWS)
                        .await?;
                tracing::info!(entries = n, "by-definition index cleared");
            }
            format(db, ks, config, 3, 4).await
        }
        (from, to) => Err(Error::Corrupt(format!("no code for the format step {from} → {to}"))),
    }
}

/// The status index revision this binary writes.
pub const STATUS_INDEX: u32 = 2;

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

/// Raises a store of keyspace format `from` to `to` (a store of any other format is left as it
/// is), once the step's changes are made. Format 2 → 3 changes no stored record: records of
/// format 2 carry their spec and are read as they are, and split at their next write
/// ([`super::records`]); the version is raised so binaries of format 2 refuse the store.
async fn format(
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

    fn at(format_version: u32, status_index: u32) -> ClusterConfig {
        ClusterConfig { format_version, status_index, ..ClusterConfig::default() }
    }

    #[test]
    fn the_steps_are_ordered_and_end_at_this_binary_s_format() {
        for pair in STEPS.windows(2) {
            assert_eq!(pair[0].to, pair[1].from, "{pair:?}");
        }
        assert!(STEPS.iter().all(|s| s.to == s.from + 1), "{STEPS:?}");
        assert_eq!(STEPS.last().map(|s| s.to), Some(FORMAT_VERSION));
    }

    #[test]
    fn a_plan_lists_the_steps_a_store_needs_and_refuses_a_downgrade_naming_both_formats() {
        let current = plan(&at(FORMAT_VERSION, STATUS_INDEX)).unwrap();
        assert!(current.is_empty(), "{current:?}");
        let old = plan(&at(2, 1)).unwrap();
        assert_eq!(old.steps.iter().map(|s| (s.from, s.to)).collect::<Vec<_>>(), [(2, 3), (3, 4)]);
        assert_eq!(old.status_index_from, Some(1));
        let newer = plan(&at(FORMAT_VERSION + 1, STATUS_INDEX)).unwrap_err().to_string();
        assert!(newer.contains("format 5, newer than this binary's format 4"), "{newer}");
        assert!(newer.contains("downgrade is refused"), "{newer}");
        let ancient = plan(&at(1, 0)).unwrap_err().to_string();
        assert!(ancient.contains("format 1 and this binary reads format 4"), "{ancient}");
        assert!(ancient.contains("format 2 or later only"), "{ancient}");
    }

    #[tokio::test]
    async fn old_entries_go_in_chunks_and_failed_and_cancelled_ones_stay() {
        // From 0: SCHEDULED (1), RETRY_WAIT (4) and SUCCEEDED (5) go.
        let left = migrate_from(0).await;
        assert_eq!(left, in_each(&[2, 3, 6, 7]), "READY/RUNNING entries are not its to clear");
        // From 1 (migrated by the step before): only SUCCEEDED is read and cleared.
        assert_eq!(migrate_from(1).await, in_each(&[1, 2, 3, 4, 6, 7]));
    }

    /// Format 3 → 4: every by-definition entry goes (more than one transaction's worth), the
    /// time index stays, the format is raised; run again, it changes nothing.
    #[tokio::test]
    async fn the_by_definition_index_is_cleared_and_the_format_raised() {
        let clock: SharedClock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000)));
        let db = MemoryDatabase::open(clock, Rng::seeded(5), Default::default());
        let ks = Keyspace::new("t");
        let (ks, db) = (&ks, &db);
        let old = at(3, STATUS_INDEX);
        let n = MIGRATION_CHUNK_ROWS + 7;
        for part in 0..2 {
            let stored = old.clone();
            db.run(|tx| {
                let stored = stored.clone();
                async move {
                    tx.set(&ks.cluster(), &encode(&stored))?;
                    for i in (part * n / 2)..[n / 2, n][part] {
                        let (ns, id) = (["a", "b"][i % 2], format!("E{i:06}"));
                        tx.set(&ks.by_definition(ns, "d", i as i64, &id), b"")?;
                        tx.set(&ks.by_time(ns, i as i64, &id), b"spec")?;
                    }
                    Ok::<_, Error>(())
                }
            })
            .await
            .unwrap();
        }
        let count = |tag: Tag| async move {
            let all = &ks.subspace_range(tag);
            db.run(|tx| async move { tx.get_range(all, true).await }).await.unwrap().len()
        };
        assert_eq!(count(Tag::ByDefinition).await, n);
        let config = upgrade(db, ks, old).await.unwrap();
        assert_eq!(config.format_version, 4);
        assert_eq!(stored_config(db, ks).await.unwrap().unwrap().format_version, 4);
        assert_eq!(count(Tag::ByDefinition).await, 0);
        assert_eq!(count(Tag::ByTime).await, n, "the time index is kept whole");
        assert!(plan(&config).unwrap().is_empty());
        assert_eq!(upgrade(db, ks, config.clone()).await.unwrap(), config);
    }
}
