//! Watches of the postgres backend, over `LISTEN`/`NOTIFY`.
//!
//! Every commit batch notifies, on the schema's channel and inside its PostgreSQL transaction
//! (so the notification is delivered once the batch committed, in commit order), its version
//! and what it changed: a 64-bit hash of each key set or cleared and each cleared range (or
//! `*` when that does not fit in a notification). Each process keeps one connection
//! listening. On a notification it learns the version, picks the watched keys the batch may
//! have changed, reads their current values and fires the watches whose value differs.
//!
//! No lost wake-up: a watch is put in the registry **before** its key's current value is read
//! (and compared with what its transaction saw). A commit that lands before that read is seen
//! by the read; one that lands after it notifies the listener, which finds the watch
//! registered. While the listening connection is down, notifications are lost: on every
//! (re)connection every watched key is checked again.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;

use super::cache::Changed;
use super::sql::fnv1a;
use super::{Shared, classify, unavailable};
use crate::kv::error::Result;
use crate::kv::limits::{PAYLOAD_BYTES_MAX, RECONNECT_DELAY_MAX};
use crate::kv::local::mutation::Change;
use crate::kv::local::watch::WatchSender;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// The notification of the batch `(base, version]` with `changes`.
pub(crate) fn payload(base: i64, version: i64, changes: &[Change]) -> String {
    let mut p = format!("v{version} b{base}");
    for c in changes {
        match c {
            Change::Key(k, _) => p.push_str(&format!(" k{:016x}", fnv1a(k))),
            Change::Range(b, e) => p.push_str(&format!(" r{}-{}", hex(b), hex(e))),
        }
        if p.len() > PAYLOAD_BYTES_MAX {
            return format!("v{version} b{base} *");
        }
    }
    p
}

/// What a notification says a batch may have changed.
#[derive(Debug, PartialEq)]
enum Touched {
    All,
    Some { keys: HashSet<u64>, ranges: Vec<(Vec<u8>, Vec<u8>)> },
}

impl Touched {
    fn covers(&self, key: &[u8]) -> bool {
        match self {
            Touched::All => true,
            Touched::Some { keys, ranges } => {
                keys.contains(&fnv1a(key))
                    || ranges.iter().any(|(b, e)| b.as_slice() <= key && key < e.as_slice())
            }
        }
    }
}

/// A parsed notification: the batch `(base, version]` (no base from a node before ADR 0015)
/// and what it may have changed.
#[derive(Debug, PartialEq)]
struct Notified {
    version: u64,
    base: Option<u64>,
    touched: Touched,
}

/// Parses a notification; `None` if it is not one of ours (then everything is re-checked).
fn parse(payload: &str) -> Option<Notified> {
    let mut parts = payload.split(' ').peekable();
    let version = parts.next()?.strip_prefix('v')?.parse().ok()?;
    let base = match parts.peek().and_then(|p| p.strip_prefix('b')) {
        Some(b) => {
            let b = b.parse().ok()?;
            parts.next();
            Some(b)
        }
        None => None,
    };
    let (mut keys, mut ranges) = (HashSet::new(), Vec::new());
    for part in parts {
        if part == "*" {
            return Some(Notified { version, base, touched: Touched::All });
        } else if let Some(h) = part.strip_prefix('k') {
            keys.insert(u64::from_str_radix(h, 16).ok()?);
        } else if let Some(r) = part.strip_prefix('r') {
            let (b, e) = r.split_once('-')?;
            ranges.push((unhex(b)?, unhex(e)?));
        } else {
            return None;
        }
    }
    Some(Notified { version, base, touched: Touched::Some { keys, ranges } })
}

impl Notified {
    /// What the read cache learns from it (`None`: anything may have changed).
    fn changed(&self) -> Option<Changed> {
        match &self.touched {
            Touched::All => None,
            Touched::Some { keys, ranges } => Some(Changed::Touched {
                hashes: keys.iter().copied().collect(),
                ranges: ranges.clone(),
            }),
        }
    }
}

/// A listening connection: its client (kept alive) and the payloads it receives. The
/// receiver ends when the connection does.
struct Listening {
    _client: tokio_postgres::Client,
    /// (backend pid of the notifying connection, payload).
    payloads: mpsc::UnboundedReceiver<(i32, String)>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

async fn listen(db: &Shared) -> Result<Listening> {
    let (client, mut connection) =
        db.config.connect(tokio_postgres::NoTls).await.map_err(|e| unavailable(&e))?;
    let (tx, payloads) = mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.send((n.process_id(), n.payload().to_string())).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
    });
    client.batch_execute(&format!("LISTEN {}", db.sql.channel)).await.map_err(|e| classify(&e))?;
    Ok(Listening { _client: client, payloads, driver })
}

/// Starts listening (the first connection before returning, so a watch registered right
/// after `connect` is covered) and returns the listener task.
pub(crate) async fn start(db: Arc<Shared>) -> Result<tokio::task::JoinHandle<()>> {
    let first = listen(&db).await?;
    Ok(tokio::spawn(run(db, first)))
}

async fn run(db: Arc<Shared>, mut current: Listening) {
    loop {
        check(&db, &Touched::All).await;
        while let Some((pid, p)) = current.payloads.recv().await {
            let own = pid == db.committer_pid.load(Ordering::Acquire);
            match parse(&p) {
                Some(n) => {
                    db.learn(n.version);
                    db.cache.notified(own, n.base, n.version, n.changed());
                    check(&db, &n.touched).await;
                }
                None => {
                    db.cache.suspend();
                    check(&db, &Touched::All).await;
                }
            }
        }
        // Notifications are lost until the next connection listens: the cache stops serving.
        db.cache.suspend();
        let mut delay = Duration::from_millis(10);
        current = loop {
            if db.closed.load(Ordering::Acquire) {
                return;
            }
            match listen(&db).await {
                Ok(l) => break l,
                Err(e) => {
                    db.reached(Err(&e));
                    db.clock.sleep(delay).await;
                    delay = (delay * 2).min(RECONNECT_DELAY_MAX);
                }
            }
        };
    }
}

/// The current values of `keys` (absent ones missing).
async fn current(db: &Shared, keys: &[Vec<u8>]) -> Result<BTreeMap<Vec<u8>, Bytes>> {
    let conn = db.conn().await?;
    let stmt = conn.prepare_cached(&db.sql.current).await.map_err(|e| classify(&e))?;
    let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let rows = conn.query(&stmt, &[&keys]).await.map_err(|e| classify(&e))?;
    Ok(rows.iter().map(|r| (r.get::<_, Vec<u8>>(0), Bytes::from(r.get::<_, Vec<u8>>(1)))).collect())
}

/// Fires the watches on keys `touched` whose value now differs from what they expect. A
/// failed read leaves them registered: the next notification or reconnection checks again.
async fn check(db: &Shared, touched: &Touched) {
    if !db.watches.any() {
        return;
    }
    let keys: Vec<Vec<u8>> = db.watches.keys().into_iter().filter(|k| touched.covers(k)).collect();
    if keys.is_empty() {
        return;
    }
    if let Ok(values) = current(db, &keys).await {
        let changes: Vec<Change> =
            keys.into_iter().map(|k| Change::Key(k.clone(), values.get(&k).cloned())).collect();
        db.watches.notify(&changes);
    }
}

/// Registers the watches of a committed transaction, each with the value it saw, then checks
/// them against their keys' current values (one query).
pub(crate) async fn register(db: &Shared, watches: Vec<(Vec<u8>, Option<Bytes>, WatchSender)>) {
    if watches.is_empty() {
        return;
    }
    let mut keys = Vec::with_capacity(watches.len());
    for (key, expected, tx) in watches {
        let seen = expected.clone();
        db.watches.register(key.clone(), expected, |_| Ok(seen), tx);
        keys.push(key);
    }
    if let Ok(values) = current(db, &keys).await {
        let changes: Vec<Change> =
            keys.into_iter().map(|k| Change::Key(k.clone(), values.get(&k).cloned())).collect();
        db.watches.notify(&changes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_overflow_to_everything() {
        let changes = vec![
            Change::Key(b"a".to_vec(), None),
            Change::Range(b"b\x00".to_vec(), b"c\xff".to_vec()),
        ];
        let Notified { version: v, base, touched: t } = parse(&payload(40, 42, &changes)).unwrap();
        assert_eq!((v, base), (42, Some(40)));
        assert!(t.covers(b"a") && t.covers(b"b\x00") && t.covers(b"c") && !t.covers(b"c\xff"));
        assert!(!t.covers(b"z"));
        let many: Vec<Change> =
            (0..1_000u32).map(|i| Change::Key(i.to_be_bytes().to_vec(), None)).collect();
        let p = payload(6, 7, &many);
        assert!(p.len() <= PAYLOAD_BYTES_MAX);
        assert_eq!(parse(&p), Some(Notified { version: 7, base: Some(6), touched: Touched::All }));
        // A node before ADR 0015 sends no base.
        assert_eq!(parse("v9 *"), Some(Notified { version: 9, base: None, touched: Touched::All }));
        assert_eq!(parse("not ours"), None);
    }
}
