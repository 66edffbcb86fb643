//! The committer: one task per process that takes every commit waiting and writes those that
//! pass in one PostgreSQL transaction, holding the commit lock (the `meta` row) from the
//! conflict check to `COMMIT`, so commits are sequenced cluster-wide as FoundationDB's are.
//!
//! A batch, in one PostgreSQL transaction (READ COMMITTED: after taking the lock, each
//! statement sees every commit that finished before), sent as two pipelines of statements —
//! steps 1–2 (with the stored values the adds need), then step 4 with `COMMIT` — so it costs
//! two round trips:
//! 1. lock `meta`: the latest version `base` and `gc_version`;
//! 2. refuse transactions whose read version is below `gc_version` (too old), then those with a
//!    key in a read conflict range written after their read version (one query for the whole
//!    batch), then — with the shared resolver — those conflicting with an earlier transaction
//!    of the batch;
//! 3. fold the mutations of the rest, in order (`apply_batch`), reading the stored values the
//!    atomic adds need; transaction `i` gets version `base + i` and its own versionstamp;
//! 4. clear the cleared ranges, write the final values (replaced versions go to `history`),
//!    set `meta.version` and `NOTIFY` the changed keys; `COMMIT`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::{Client, Statement};

use super::cache::Changed;
use super::listener::payload;
use super::{COMMIT_BATCH_TRANSACTIONS_MAX, HISTORY_RETENTION_MS, PG_KEY_INDEX_BYTES_MAX, Shared};
use super::{classify, unavailable};
use crate::env::Timestamp;
use crate::kv::error::{Error, Result};
use crate::kv::limits::TRANSACTION_AGE_MAX_MS;
use crate::kv::local::mutation::{
    ApplyTarget, Change, Mutation, apply_batch, stamped_write_ranges,
};
use crate::kv::local::resolver::{KeyRange, Resolver};
use crate::kv::{CommitInfo, Versionstamp};

/// How often the committer forgets old versions.
const GC_INTERVAL: Duration = Duration::from_secs(1);
/// How often the committer notes the version it knows, for garbage collection.
const GC_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

pub(crate) struct Job {
    /// The read version (0 when the transaction read nothing: no conflict to check).
    pub read_version: u64,
    pub read_conflicts: Vec<KeyRange>,
    pub write_conflicts: Vec<KeyRange>,
    pub mutations: Vec<Mutation>,
    pub reply: oneshot::Sender<Result<CommitInfo>>,
}

/// Why a batch did not commit as a whole.
enum Failure {
    /// Nothing was applied; every transaction gets this error.
    NotApplied(Error),
    /// The connection failed while `COMMIT` was in flight: maybe applied.
    Unknown,
    /// PostgreSQL refused the data of one of the transactions (e.g. a key it cannot index):
    /// nothing was applied; run each transaction alone to find which.
    Split(Error),
}

/// (time, version) samples of committed versions, for garbage collection.
struct Gc {
    samples: std::collections::VecDeque<(Timestamp, u64)>,
    last_run: Option<Timestamp>,
}

/// The committer's connection and its prepared statements.
struct Conn {
    client: Client,
    lock: Statement,
    conflicts: Statement,
    current: Statement,
    clear_ranges: Statement,
    put: Statement,
    publish: Statement,
}

pub(crate) async fn run(db: Arc<Shared>, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let mut client: Option<Conn> = None;
    let mut gc = Gc { samples: Default::default(), last_run: None };
    while let Some(first) = jobs.recv().await {
        let mut batch = vec![first];
        while batch.len() < COMMIT_BATCH_TRANSACTIONS_MAX {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        commit_batch(&db, &mut client, batch).await;
        maybe_gc(&db, &mut client, &mut gc).await;
    }
}

/// The committer's connection, (re)connecting if needed.
async fn connected<'a>(db: &Shared, conn: &'a mut Option<Conn>) -> Result<&'a mut Conn> {
    if conn.as_ref().is_none_or(|c| c.client.is_closed()) {
        *conn = None;
        let (client, connection) =
            db.config.connect(tokio_postgres::NoTls).await.map_err(|e| unavailable(&e))?;
        tokio::spawn(async move {
            let _ = connection.await; // ends when the client is dropped or the connection fails
        });
        // Every statement of the committer probes `kv` by key or key range. Its prepared
        // statements get generic plans made while the tables may still be empty (no
        // statistics until autovacuum's first ANALYZE, up to a minute later): such a plan
        // scans all of `kv` in a hash join, and each batch's write then took ~50 ms instead
        // of ~4 ms once the table held 100,000 keys. Index probes are never the wrong plan
        // here, so the committer's connection plans only those.
        client
            .batch_execute(
                "SET enable_seqscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off",
            )
            .await
            .map_err(|e| classify(&e))?;
        let sql = &db.sql;
        let prepare = |q: &str| {
            let q = q.to_string();
            let client = &client;
            async move { client.prepare(&q).await.map_err(|e| classify(&e)) }
        };
        let (lock, conflicts, current, clear_ranges, put, publish) = tokio::try_join!(
            prepare(&sql.lock),
            prepare(&sql.conflicts),
            prepare(&sql.current),
            prepare(&sql.clear_ranges),
            prepare(&sql.put),
            prepare(&sql.publish),
        )?;
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .map_err(|e| classify(&e))?
            .get(0);
        db.committer_pid.store(pid, Ordering::Release);
        *conn = Some(Conn { client, lock, conflicts, current, clear_ranges, put, publish });
    }
    conn.as_mut().ok_or_else(|| Error::Storage("no committer connection".into()))
}

async fn commit_batch(db: &Shared, client: &mut Option<Conn>, batch: Vec<Job>) {
    let outcome = match connected(db, client).await {
        Ok(c) => try_batch(db, c, &batch).await,
        Err(e) => Err(Failure::NotApplied(e)),
    };
    db.reached(match &outcome {
        Ok(_) => Ok(()),
        Err(Failure::NotApplied(e) | Failure::Split(e)) => Err(e),
        Err(Failure::Unknown) => Err(&Error::CommitUnknownResult),
    });
    match outcome {
        Ok(replies) => {
            for (job, r) in batch.into_iter().zip(replies) {
                let _ = job.reply.send(r);
            }
        }
        Err(Failure::NotApplied(e)) => {
            rollback(client).await;
            for job in batch {
                let _ = job.reply.send(Err(e.clone()));
            }
        }
        Err(Failure::Unknown) => {
            // Maybe committed, unknown at which version: the read cache loses the order.
            db.cache.suspend();
            *client = None;
            for job in batch {
                let _ = job.reply.send(Err(Error::CommitUnknownResult));
            }
        }
        Err(Failure::Split(e)) => {
            rollback(client).await;
            if batch.len() == 1 {
                for job in batch {
                    let _ = job.reply.send(Err(e.clone()));
                }
                return;
            }
            for job in batch {
                Box::pin(commit_batch(db, client, vec![job])).await;
            }
        }
    }
}

/// Ends a failed PostgreSQL transaction (or drops a broken connection).
async fn rollback(client: &mut Option<Conn>) {
    if let Some(c) = client.as_ref()
        && c.client.batch_execute("ROLLBACK").await.is_err()
    {
        *client = None;
    }
}

/// Maps an error of a statement before `COMMIT`.
fn before_commit(batch: &[Job]) -> impl Fn(tokio_postgres::Error) -> Failure + '_ {
    move |e| match e.code().map(|c| c.code()) {
        // program_limit_exceeded: an index entry too large (a long incompressible key).
        Some("54000") => Failure::Split(Error::KeyTooLarge {
            size: batch.iter().flat_map(|j| j.mutations.iter()).map(key_len).max().unwrap_or(0),
            limit: PG_KEY_INDEX_BYTES_MAX,
        }),
        // Data PostgreSQL refuses for one transaction: find it.
        Some(c) if c.starts_with("22") || c.starts_with("23") => Failure::Split(classify(&e)),
        _ => Failure::NotApplied(classify(&e)),
    }
}

/// Whether an error of `COMMIT` says for sure that nothing was committed: a plain ERROR of a
/// serialization failure or an integrity check. Anything else — no answer, or a FATAL error (the
/// backend terminated, e.g. while waiting for a synchronous standby after committing locally)
/// — leaves the outcome unknown.
fn refused_commit(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        let code = db.code().code();
        db.parsed_severity() == Some(tokio_postgres::error::Severity::Error)
            && (code.starts_with("40") || code.starts_with("23"))
    })
}

fn key_len(m: &Mutation) -> usize {
    match m {
        Mutation::Set(k, _) | Mutation::Clear(k) | Mutation::Add(k, _) => k.len(),
        Mutation::ClearRange(b, e) => b.len().max(e.len()),
        Mutation::VersionstampedKey { key, .. } | Mutation::VersionstampedValue { key, .. } => {
            key.len()
        }
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Commits what it can of `batch`; the reply of each transaction, in order.
///
/// Two round trips, each a pipeline of statements PostgreSQL runs in order: `BEGIN`, the lock,
/// the conflict check and the stored values the adds need (each statement after the lock sees
/// every commit that finished before it); then the cleared ranges, the puts, the publication
/// and `COMMIT`.
async fn try_batch(
    db: &Shared,
    c: &mut Conn,
    batch: &[Job],
) -> std::result::Result<Vec<Result<CommitInfo>>, Failure> {
    let err = before_commit(batch);
    let (begun, locked, stale, stored) = futures_util::future::join4(
        c.client.batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED"),
        c.client.query_one(&c.lock, &[]),
        stale(c, batch),
        stored_for_adds(c, batch),
    )
    .await;
    begun.map_err(&err)?;
    let row = locked.map_err(&err)?;
    let (stale, stored) = (stale.map_err(&err)?, stored.map_err(&err)?);
    let (base, gc): (i64, i64) = (row.get(1), row.get(2));
    let (base, gc) = (u64::try_from(base).unwrap_or(0), u64::try_from(gc).unwrap_or(0));
    db.learn(base);
    let mut verdicts: Vec<Option<Error>> = batch
        .iter()
        .map(|j| {
            let read = !j.read_conflicts.is_empty();
            (read && j.read_version < gc)
                .then_some(Error::TransactionTooOld { window_ms: TRANSACTION_AGE_MAX_MS })
        })
        .collect();
    for i in stale {
        verdicts[i].get_or_insert(Error::NotCommitted);
    }
    // Conflicts inside the batch: each transaction against the writes of those before it.
    let mut resolver = Resolver::new(0);
    let batch_version = resolver.next_version();
    let now = db.clock.now();
    let mut accepted: Vec<(&[Mutation], Versionstamp)> = Vec::new();
    let mut replies = Vec::with_capacity(batch.len());
    for (job, verdict) in batch.iter().zip(verdicts) {
        let verdict = verdict.map_or_else(|| resolver.check(0, &job.read_conflicts), Err);
        if let Err(e) = verdict {
            db.stats.transactions_rejected.fetch_add(1, Ordering::Relaxed);
            replies.push(Err(e));
            continue;
        }
        let version = base + accepted.len() as u64 + 1;
        let stamp = Versionstamp::new(version, 0);
        let mut writes = job.write_conflicts.clone();
        writes.extend(stamped_write_ranges(&job.mutations, &stamp));
        resolver.record(batch_version, writes, now, 0);
        accepted.push((job.mutations.as_slice(), stamp));
        replies.push(Ok(CommitInfo { version: Some(version), versionstamp: Some(stamp) }));
    }
    if accepted.is_empty() {
        c.client.batch_execute("ROLLBACK").await.map_err(&err)?;
        return Ok(replies);
    }
    let top = base + accepted.len() as u64;
    let mut target = Target { stored, ..Target::default() };
    let changes = apply_batch(&mut target, &accepted, true)
        .map_err(|e| Failure::NotApplied(Error::Storage(format!("folding a batch: {e}"))))?;
    write_and_commit(db, c, base, &target, top, &changes, &err).await?;
    // Before any caller hears of it: a transaction begun after reads it from the cache.
    db.cache.batch(base, top, target.into_changed());
    // Acknowledged in order: the log first, so a transaction begun after this batch's callers
    // hear of it reads at least this far, and one begun before reads below it.
    db.acks.push(base);
    db.learn(top);
    db.stats.transactions_committed.fetch_add(accepted.len() as u64, Ordering::Relaxed);
    db.stats.batches_committed.fetch_add(1, Ordering::Relaxed);
    Ok(replies)
}

/// Indexes of the transactions with a key in a read conflict range written after their read
/// version (those the lock's `gc_version` refuses are asked too: the answer does not matter).
async fn stale(c: &Conn, batch: &[Job]) -> std::result::Result<Vec<usize>, tokio_postgres::Error> {
    let (mut idx, mut begins, mut ends, mut rvs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, job) in batch.iter().enumerate() {
        for (b, e) in &job.read_conflicts {
            idx.push(i as i32);
            begins.push(b.as_slice());
            ends.push(e.as_slice());
            rvs.push(to_i64(job.read_version));
        }
    }
    if idx.is_empty() {
        return Ok(Vec::new());
    }
    let rows = c.client.query(&c.conflicts, &[&idx, &begins, &ends, &rvs]).await?;
    Ok(rows.iter().map(|r| r.get::<_, i32>(0) as usize).collect())
}

/// The stored values of the keys the batch's transactions add to (those refused included).
async fn stored_for_adds(
    c: &Conn,
    batch: &[Job],
) -> std::result::Result<BTreeMap<Vec<u8>, Bytes>, tokio_postgres::Error> {
    let keys: BTreeSet<&[u8]> = batch
        .iter()
        .flat_map(|j| j.mutations.iter())
        .filter_map(|m| match m {
            Mutation::Add(k, _) => Some(k.as_slice()),
            _ => None,
        })
        .collect();
    if keys.is_empty() {
        return Ok(BTreeMap::new());
    }
    let keys: Vec<&[u8]> = keys.into_iter().collect();
    let rows = c.client.query(&c.current, &[&keys]).await?;
    Ok(rows.iter().map(|r| (r.get::<_, Vec<u8>>(0), Bytes::from(r.get::<_, Vec<u8>>(1)))).collect())
}

/// What a folded batch leaves: ranges to clear, then final values.
#[derive(Default)]
struct Target {
    stored: BTreeMap<Vec<u8>, Bytes>,
    cleared: Vec<KeyRange>,
    puts: BTreeMap<Vec<u8>, Option<Bytes>>,
}

impl Target {
    /// What the batch changed, exactly, for the read cache.
    fn into_changed(self) -> Changed {
        Changed::Exact { cleared: self.cleared, puts: self.puts.into_iter().collect() }
    }
}

impl ApplyTarget for Target {
    fn get(&mut self, key: &[u8]) -> Result<Option<Bytes>> {
        // Only asked for keys the batch adds to without clearing them first: read before.
        Ok(self.stored.get(key).cloned())
    }
    fn put(&mut self, key: &[u8], value: Option<Bytes>) -> Result<()> {
        self.puts.insert(key.to_vec(), value);
        Ok(())
    }
    fn clear_range(&mut self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.cleared.push((begin.to_vec(), end.to_vec()));
        Ok(())
    }
}

/// Writes the folded batch `(base, top]`, publishes it and commits, in one pipeline.
///
/// A statement PostgreSQL refused aborts the transaction, and the `COMMIT` sent after it then
/// rolls back: nothing was applied. A statement without an answer (the connection failed) may
/// have been followed by a `COMMIT` that PostgreSQL ran: the outcome is unknown.
async fn write_and_commit(
    db: &Shared,
    c: &Conn,
    base: u64,
    t: &Target,
    top: u64,
    changes: &[Change],
    err: &impl Fn(tokio_postgres::Error) -> Failure,
) -> std::result::Result<(), Failure> {
    let top = to_i64(top);
    let put_keys: Vec<&[u8]> = t.puts.keys().map(Vec::as_slice).collect();
    let begins: Vec<&[u8]> = t.cleared.iter().map(|(b, _)| b.as_slice()).collect();
    let ends: Vec<&[u8]> = t.cleared.iter().map(|(_, e)| e.as_slice()).collect();
    // Only the written keys inside a cleared range are spared (usually none): the statement
    // compares each cleared row with each of them.
    let inside: Vec<&[u8]> = put_keys
        .iter()
        .copied()
        .filter(|k| t.cleared.iter().any(|(b, e)| b.as_slice() <= *k && *k < e.as_slice()))
        .collect();
    let values: Vec<Option<&[u8]>> = t.puts.values().map(|v| v.as_deref()).collect();
    let payload = payload(to_i64(base), top, changes);
    let (cleared, put, published, committed) = futures_util::future::join4(
        async {
            match t.cleared.is_empty() {
                true => Ok(0),
                false => c.client.execute(&c.clear_ranges, &[&begins, &ends, &inside, &top]).await,
            }
        },
        async {
            match put_keys.is_empty() {
                true => Ok(0),
                false => c.client.execute(&c.put, &[&put_keys, &values, &top]).await,
            }
        },
        c.client.query(&c.publish, &[&top, &db.sql.channel, &payload]),
        c.client.batch_execute("COMMIT"),
    )
    .await;
    for outcome in [cleared.map(drop), put.map(drop), published.map(drop)] {
        match outcome {
            Ok(()) => {}
            Err(e) if e.as_db_error().is_some() => return Err(err(e)),
            Err(_) => return Err(Failure::Unknown),
        }
    }
    committed.map_err(|e| match refused_commit(&e) {
        true => Failure::NotApplied(classify(&e)),
        false => Failure::Unknown,
    })
}

/// Forgets versions older than [`HISTORY_RETENTION_MS`], at most every [`GC_INTERVAL`]: raises
/// `gc_version` (reads and commits below it are too old), then deletes the replaced versions
/// and the cleared rows below it, a bounded number per run.
async fn maybe_gc(db: &Shared, conn: &mut Option<Conn>, gc: &mut Gc) {
    let now = db.clock.now();
    let retention = Duration::from_millis(HISTORY_RETENTION_MS);
    if gc.samples.back().is_none_or(|(t, _)| now.since(*t) >= GC_SAMPLE_INTERVAL) {
        gc.samples.push_back((now, db.known.load(Ordering::Acquire)));
    }
    // The newest sample older than the retention is the horizon; older ones are not needed.
    while gc.samples.len() >= 2 && now.since(gc.samples[1].0) >= retention {
        gc.samples.pop_front();
    }
    let horizon = gc.samples.front().filter(|(t, _)| now.since(*t) >= retention).map(|s| s.1);
    let due = gc.last_run.is_none_or(|t| now.since(t) >= GC_INTERVAL);
    let (Some(h), true) = (horizon, due) else { return };
    gc.last_run = Some(now);
    let Ok(c) = connected(db, conn).await else { return };
    let h = to_i64(h);
    for sql in [&db.sql.gc_mark, &db.sql.gc_history, &db.sql.gc_cleared] {
        // A failure leaves the rest to the next run.
        if c.client.execute(sql.as_str(), &[&h]).await.is_err() {
            return;
        }
    }
}
