//! A transaction of the postgres backend: the shared write buffer on the client; reads as of
//! the read version (point reads from the read cache, else gathered with the other misses
//! waiting into one statement by `reads`; range reads one statement each on a pooled
//! connection); the commit handed to the committer.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OnceCell, oneshot};

use super::committer::Job;
use super::{Shared, classify};
use crate::env::{BoxFuture, Timestamp};
use crate::kv::error::{Error, Result};
use crate::kv::limits::RANGE_PAGE_ROWS_HIDDEN_MIN;
use crate::kv::limits::{TRANSACTION_AGE_MAX_MS, check_key, check_range, key_after};
use crate::kv::local::buffer::{RangeMerge, WriteBuffer, unreadable_watch_value};
use crate::kv::local::watch::{WatchSender, watch_pair};
use crate::kv::{CommitInfo, KeyValue, KvTransaction, RangeOption, Watch};

#[derive(Debug, PartialEq, Eq)]
enum Status {
    Open,
    Done,
}

struct State {
    status: Status,
    buf: WriteBuffer,
}

pub(crate) struct PgTransaction {
    db: Arc<Shared>,
    started: Timestamp,
    /// What this process knew committed at `begin`: the read version is at least this.
    known_at_begin: u64,
    /// Commit batches this process had acknowledged at `begin`.
    acks_at_begin: u64,
    read_version: OnceCell<u64>,
    state: Mutex<State>,
}

fn too_old() -> Error {
    Error::TransactionTooOld { window_ms: TRANSACTION_AGE_MAX_MS }
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl PgTransaction {
    pub(crate) fn begin(db: Arc<Shared>) -> Self {
        let acks_at_begin = db.acks.seq.load(Ordering::Acquire);
        let known_at_begin = db.known.load(Ordering::Acquire);
        PgTransaction {
            started: db.clock.now(),
            known_at_begin,
            acks_at_begin,
            read_version: OnceCell::new(),
            state: Mutex::new(State { status: Status::Open, buf: WriteBuffer::default() }),
            db,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check_age(&self) -> Result<()> {
        let age = self.db.clock.now().since(self.started);
        if age > Duration::from_millis(TRANSACTION_AGE_MAX_MS) {
            return Err(too_old());
        }
        Ok(())
    }

    /// The open state, or an error if the transaction is finished or too old.
    fn open(&self) -> Result<MutexGuard<'_, State>> {
        let st = self.lock();
        if st.status != Status::Open {
            return Err(Error::TransactionCancelled("transaction used after commit"));
        }
        self.check_age()?;
        Ok(st)
    }

    /// The read version, requested from the database the first time (see the module doc of
    /// `postgres`).
    async fn rv(&self) -> Result<u64> {
        self.read_version
            .get_or_try_init(|| async {
                let conn = self.db.conn().await?;
                let stmt = conn
                    .prepare_cached(&self.db.sql.read_version)
                    .await
                    .map_err(|e| classify(&e))?;
                let row = conn.query_one(&stmt, &[]).await.map_err(|e| classify(&e))?;
                let latest = to_u64(row.get(0));
                self.db.learn(latest);
                let rv = match self.db.acks.cap(self.acks_at_begin) {
                    None => latest,
                    Some(cap) => latest.min(cap),
                };
                Ok(rv.max(self.known_at_begin))
            })
            .await
            .copied()
    }

    /// The stored value of `key` as of the read version.
    async fn stored(&self, key: &[u8]) -> Result<Option<Bytes>> {
        let rv = self.rv().await?;
        if let Some(value) = self.db.cache.get(key, rv) {
            return Ok(value);
        }
        let point = super::reads::read(&self.db.reads, key, rv).await?;
        let (gc, latest) = (point.gc, point.latest);
        self.db.learn(latest);
        if gc > rv {
            return Err(too_old());
        }
        let value = point.value.map(Bytes::from);
        // The key's latest version, if it is not newer than `rv`: its value since then. No row:
        // absent since at least the collected versions.
        let written = match point.row_version {
            Some(w) if w <= rv => Some(w),
            Some(_) => None,
            None => Some(gc),
        };
        if let Some(written) = written {
            self.db.cache.fill(key, value.clone(), written, latest);
        }
        Ok(value)
    }

    /// Stored pairs of `[begin, end)` as of the read version, in scan order, at most `limit`.
    async fn stored_range(
        &self,
        begin: &[u8],
        end: &[u8],
        reverse: bool,
        limit: Option<usize>,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let rv = self.rv().await?;
        let conn = self.db.conn().await?;
        let sql = if reverse { &self.db.sql.range_desc } else { &self.db.sql.range_asc };
        let stmt = conn.prepare_cached(sql).await.map_err(|e| classify(&e))?;
        let limit = limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
        let rows = conn
            .query(&stmt, &[&begin, &end, &to_i64(rv), &limit])
            .await
            .map_err(|e| classify(&e))?;
        let mut out = Vec::with_capacity(rows.len());
        let mut meta = None;
        for row in rows {
            match row.get::<_, Option<Vec<u8>>>(0) {
                Some(k) => out.push((k, row.get::<_, Vec<u8>>(1))),
                None => meta = Some((row.get::<_, i64>(2), row.get::<_, i64>(3))),
            }
        }
        let (latest, gc) = meta.ok_or_else(|| Error::Storage("meta row missing".into()))?;
        self.db.learn(to_u64(latest));
        if to_u64(gc) > rv {
            return Err(too_old());
        }
        out.sort_unstable_by(|a, b| if reverse { b.0.cmp(&a.0) } else { a.0.cmp(&b.0) });
        Ok(out)
    }

    /// Read-your-writes value of `key` (adding a read conflict unless `snapshot`).
    async fn read(&self, key: &[u8], snapshot: bool) -> Result<Option<Bytes>> {
        if let Some(answer) = self.lock().buf.local_get(key) {
            return answer;
        }
        let stored = self.stored(key).await?;
        self.lock().buf.finish_get(key, stored, !snapshot)
    }

    async fn read_range(&self, r: &RangeOption, snapshot: bool) -> Result<Vec<KeyValue>> {
        let mut merge = RangeMerge::new(&self.open()?.buf, r)?;
        let (mut begin, mut end) = (r.begin.clone(), r.end.clone());
        loop {
            // Enough stored rows for the limit, plus one per buffered write of the range (it
            // may replace a stored row), more when cleared ranges may hide rows; page after
            // page until the limit or the range's end. No limit: everything at once.
            let page = (r.limit != 0).then(|| {
                let want = r.limit + merge.pending();
                if merge.hides_rows() { want.max(RANGE_PAGE_ROWS_HIDDEN_MIN) } else { want }
            });
            let rows = self.stored_range(&begin, &end, r.reverse, page).await?;
            let exhausted = page.is_none_or(|p| rows.len() < p);
            let mut more = true;
            for (k, v) in &rows {
                more = merge.stored(k, v);
                if !more {
                    break;
                }
            }
            match rows.last() {
                Some((last, _)) if more && !exhausted => {
                    if r.reverse {
                        end = last.clone();
                    } else {
                        begin = key_after(last);
                    }
                }
                _ => break,
            }
        }
        let out = merge.finish();
        if !snapshot {
            self.open()?.buf.add_range_conflict(r, &out)?;
        }
        Ok(out)
    }

    /// The value each watch expects: what this transaction leaves behind.
    async fn watch_expectations(
        &self,
        watches: Vec<(Vec<u8>, WatchSender)>,
    ) -> Vec<(Vec<u8>, Option<Bytes>, WatchSender)> {
        let reads = watches.iter().map(|(key, _)| self.read(key, true));
        let values = futures_util::future::join_all(reads).await;
        watches
            .into_iter()
            .zip(values)
            // Unreadable (a versionstamped value) or unknown (a failed read): any later value
            // differs, so the watch fires at its first check.
            .map(|((key, tx), v)| (key, v.unwrap_or_else(|_| unreadable_watch_value()), tx))
            .collect()
    }

    async fn commit_inner(&self) -> Result<CommitInfo> {
        let watches = {
            let mut st = self.open()?;
            st.status = Status::Done;
            st.buf.take_watches()
        };
        let watches = self.watch_expectations(watches).await;
        let buffered = self.lock().buf.take();
        let result = if buffered.mutations.is_empty() {
            Ok(CommitInfo::default())
        } else {
            self.send(buffered).await
        };
        match &result {
            Ok(_) => super::listener::register(&self.db, watches).await,
            Err(e) => {
                for (_, _, tx) in watches {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        }
        result
    }

    async fn send(&self, b: crate::kv::local::buffer::Buffered) -> Result<CommitInfo> {
        self.check_age()?;
        // Only a transaction that read needs its read version checked at commit.
        let read_version = if b.read_conflicts.is_empty() { 0 } else { self.rv().await? };
        let (reply, rx) = oneshot::channel();
        let job = Job {
            read_version,
            read_conflicts: b.read_conflicts,
            write_conflicts: b.write_conflicts,
            mutations: b.mutations,
            reply,
        };
        let sent = match self.db.jobs.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(jobs) => jobs.send(job).is_ok(),
            None => false,
        };
        if !sent {
            return Err(Error::DatabaseClosed);
        }
        // A dropped reply means the committer stopped mid-batch: the outcome is unknown.
        rx.await.unwrap_or(Err(Error::CommitUnknownResult))
    }
}

impl KvTransaction for PgTransaction {
    fn read_version(&self) -> BoxFuture<'_, Result<u64>> {
        Box::pin(async move {
            drop(self.open()?);
            self.rv().await
        })
    }

    fn get<'a>(&'a self, key: &'a [u8], snapshot: bool) -> BoxFuture<'a, Result<Option<Bytes>>> {
        Box::pin(async move {
            check_key(key)?;
            drop(self.open()?);
            let v = self.read(key, snapshot).await?;
            self.check_age()?;
            Ok(v)
        })
    }

    fn get_range<'a>(
        &'a self,
        range: &'a RangeOption,
        snapshot: bool,
    ) -> BoxFuture<'a, Result<Vec<KeyValue>>> {
        Box::pin(async move {
            check_range(&range.begin, &range.end)?;
            drop(self.open()?);
            if range.begin == range.end {
                return Ok(Vec::new());
            }
            self.read_range(range, snapshot).await
        })
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.open()?.buf.set(key, value)
    }

    fn clear(&self, key: &[u8]) -> Result<()> {
        self.open()?.buf.clear(key)
    }

    fn clear_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.open()?.buf.clear_range(begin, end)
    }

    fn atomic_add(&self, key: &[u8], param: &[u8]) -> Result<()> {
        self.open()?.buf.atomic_add(key, param)
    }

    fn set_versionstamped_key(&self, key: &[u8], offset: usize, value: &[u8]) -> Result<()> {
        self.open()?.buf.set_versionstamped_key(key, offset, value)
    }

    fn set_versionstamped_value(&self, key: &[u8], value: &[u8], offset: usize) -> Result<()> {
        self.open()?.buf.set_versionstamped_value(key, value, offset)
    }

    fn add_read_conflict_range(&self, begin: &[u8], end: &[u8]) -> Result<()> {
        self.open()?.buf.add_read_conflict_range(begin, end)
    }

    fn watch(&self, key: &[u8]) -> Result<Watch> {
        let mut st = self.open()?;
        let (tx, watch) = watch_pair();
        st.buf.watch(key, tx)?;
        Ok(watch)
    }

    fn approximate_size(&self) -> usize {
        self.lock().buf.size_bytes()
    }

    fn commit(&self) -> BoxFuture<'_, Result<CommitInfo>> {
        Box::pin(self.commit_inner())
    }
}
