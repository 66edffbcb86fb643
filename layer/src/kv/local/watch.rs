//! Watches of the local backends: registered after the watching transaction commits, fired
//! by the first later commit that changes the key's value.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::mutation::Change;
use crate::kv::Watch;
use crate::kv::error::{Error, Result};

pub(crate) type WatchSender = oneshot::Sender<Result<()>>;

/// A watch future and the sender that resolves it.
pub(crate) fn watch_pair() -> (WatchSender, Watch) {
    let (tx, rx) = oneshot::channel();
    let fut = Box::pin(async move { rx.await.unwrap_or(Err(Error::DatabaseClosed)) });
    (tx, Watch::new(fut))
}

struct Watcher {
    expected: Option<Bytes>,
    tx: WatchSender,
}

#[derive(Default)]
pub(crate) struct Watches {
    map: Mutex<BTreeMap<Vec<u8>, Vec<Watcher>>>,
    any: AtomicBool,
    closed: AtomicBool,
}

impl Watches {
    /// Whether any watch is registered (commits skip change collection when not).
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Registers a watch expecting `expected`; fires at once if `current` already differs.
    pub(crate) fn register(
        &self,
        key: Vec<u8>,
        expected: Option<Bytes>,
        current: Option<Bytes>,
        tx: WatchSender,
    ) {
        if self.closed.load(Ordering::Acquire) {
            let _ = tx.send(Err(Error::DatabaseClosed));
            return;
        }
        if expected != current {
            let _ = tx.send(Ok(()));
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(key).or_default().push(Watcher { expected, tx });
        self.any.store(true, Ordering::Release);
    }

    /// Fires the watches whose key a commit changed to a different value.
    pub(crate) fn notify(&self, changes: &[Change]) {
        if !self.any() {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for change in changes {
            match change {
                Change::Key(k, v) => {
                    if let Some(ws) = map.get_mut(k) {
                        fire_differing(ws, v.as_ref());
                        if ws.is_empty() {
                            map.remove(k);
                        }
                    }
                }
                Change::Range(b, e) => {
                    let keys: Vec<Vec<u8>> = map
                        .range::<[u8], _>((
                            Bound::Included(b.as_slice()),
                            Bound::Excluded(e.as_slice()),
                        ))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in keys {
                        if let Some(ws) = map.get_mut(&k) {
                            fire_differing(ws, None);
                            if ws.is_empty() {
                                map.remove(&k);
                            }
                        }
                    }
                }
            }
        }
        // Dropped receivers need no firing.
        map.retain(|_, ws| {
            ws.retain(|w| !w.tx.is_closed());
            !ws.is_empty()
        });
        self.any.store(!map.is_empty(), Ordering::Release);
    }

    /// Fails every watch with `DatabaseClosed`; later registrations fail at once.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for (_, ws) in std::mem::take(&mut *map) {
            for w in ws {
                let _ = w.tx.send(Err(Error::DatabaseClosed));
            }
        }
        self.any.store(false, Ordering::Release);
    }
}

fn fire_differing(ws: &mut Vec<Watcher>, new: Option<&Bytes>) {
    let mut i = 0;
    while i < ws.len() {
        if ws[i].expected.as_ref() != new {
            let w = ws.swap_remove(i);
            let _ = w.tx.send(Ok(()));
        } else {
            i += 1;
        }
    }
}
