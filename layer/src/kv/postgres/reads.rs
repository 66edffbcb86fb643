//! Point reads the read cache cannot serve, gathered into one statement: every miss waiting
//! when a statement can be sent goes in it (at most [`PG_POINT_READ_BATCH_KEYS_MAX`] keys),
//! each at its own read version, and at most [`PG_POINT_READS_IN_FLIGHT_MAX`] such statements
//! run at once. A lone read is sent at once, as before; the reads that a burst issues
//! concurrently (a `SubmitBatch` of 1,000 reads 1,000 idempotency keys, none of them stored
//! yet) cost one round trip and one statement instead of one each.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{Shared, classify};
use crate::kv::error::{Error, Result};
use crate::kv::limits::{PG_POINT_READ_BATCH_KEYS_MAX, PG_POINT_READS_IN_FLIGHT_MAX};

/// A key's stored state as of a read version, with what the statement saw of `meta`.
pub(crate) struct Point {
    /// Versions below this are forgotten.
    pub gc: u64,
    /// The latest committed version the statement saw.
    pub latest: u64,
    /// The version of the key's `kv` row (`None`: no row).
    pub row_version: Option<u64>,
    /// The value as of the read version.
    pub value: Option<Vec<u8>>,
}

pub(crate) struct Read {
    key: Vec<u8>,
    rv: i64,
    reply: oneshot::Sender<Result<Point>>,
}

/// The sending side, held by the backend; the task ends when it is dropped.
pub(crate) type Reads = mpsc::UnboundedSender<Read>;

/// Queues a point read of `key` as of `rv`.
pub(crate) async fn read(reads: &Reads, key: &[u8], rv: u64) -> Result<Point> {
    let (reply, answer) = oneshot::channel();
    let rv = i64::try_from(rv).unwrap_or(i64::MAX);
    reads.send(Read { key: key.to_vec(), rv, reply }).map_err(|_| Error::DatabaseClosed)?;
    answer.await.unwrap_or(Err(Error::DatabaseClosed))
}

/// Gathers waiting reads into statements until every sender is gone.
pub(crate) async fn run(db: Arc<Shared>, mut queue: mpsc::UnboundedReceiver<Read>) {
    let permits = Arc::new(Semaphore::new(PG_POINT_READS_IN_FLIGHT_MAX));
    while let Some(first) = queue.recv().await {
        // Waiting for a permit is what lets the next batch grow while the database answers.
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let mut batch = vec![first];
        while batch.len() < PG_POINT_READ_BATCH_KEYS_MAX {
            match queue.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let db = db.clone();
        tokio::spawn(async move {
            let outcome = fetch(&db, &batch).await;
            drop(permit);
            match outcome {
                Ok(points) => {
                    for (r, p) in batch.into_iter().zip(points) {
                        let _ = r.reply.send(Ok(p));
                    }
                }
                Err(e) => {
                    for r in batch {
                        let _ = r.reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}

/// One statement for the whole batch; the points in the batch's order.
async fn fetch(db: &Shared, batch: &[Read]) -> Result<Vec<Point>> {
    db.stats.point_reads.fetch_add(batch.len() as u64, Ordering::Relaxed);
    db.stats.point_read_statements.fetch_add(1, Ordering::Relaxed);
    let conn = db.conn().await?;
    let stmt = conn.prepare_cached(&db.sql.get_many).await.map_err(|e| classify(&e))?;
    let keys: Vec<&[u8]> = batch.iter().map(|r| r.key.as_slice()).collect();
    let rvs: Vec<i64> = batch.iter().map(|r| r.rv).collect();
    let rows = conn.query(&stmt, &[&keys, &rvs]).await.map_err(|e| classify(&e))?;
    let mut points: Vec<Option<Point>> = (0..batch.len()).map(|_| None).collect();
    let to_u64 = |v: i64| u64::try_from(v).unwrap_or(0);
    for row in rows {
        let i = usize::try_from(row.get::<_, i64>(0) - 1).unwrap_or(usize::MAX);
        let Some(slot) = points.get_mut(i) else { continue };
        *slot = Some(Point {
            gc: to_u64(row.get(1)),
            latest: to_u64(row.get(2)),
            row_version: row.get::<_, Option<i64>>(3).map(to_u64),
            value: row.get(4),
        });
    }
    points
        .into_iter()
        .map(|p| p.ok_or_else(|| Error::Storage("a point read returned no row".into())))
        .collect()
}
