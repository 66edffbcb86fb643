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
        self.any.load(Ordering::SeqCst)
    }

    /// The keys watched now.
    pub(crate) fn keys(&self) -> Vec<Vec<u8>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect()
    }

    /// Registers a watch expecting `expected`; fires at once if the current value, read by
    /// `current` **under the watch lock**, already differs. Holding the lock across the read
    /// and the insert closes the window where a commit published after the read notifies
    /// before the watcher is in the map (a missed wake-up).
    pub(crate) fn register(
        &self,
        key: Vec<u8>,
        expected: Option<Bytes>,
        current: impl FnOnce(&[u8]) -> Result<Option<Bytes>>,
        tx: WatchSender,
    ) {
        if self.closed.load(Ordering::Acquire) {
            let _ = tx.send(Err(Error::DatabaseClosed));
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // Set before reading: a commit publishing after the read then collects its changes.
        self.any.store(true, Ordering::SeqCst);
        match current(&key) {
            Err(e) => {
                let _ = tx.send(Err(e));
            }
            Ok(current) if current != expected => {
                let _ = tx.send(Ok(()));
            }
            Ok(_) => map.entry(key).or_default().push(Watcher { expected, tx }),
        }
        self.any.store(!map.is_empty(), Ordering::SeqCst);
    }

    /// Re-checks every watch against the current values (after a commit that did not collect
    /// its changes because no watch existed when it began).
    pub(crate) fn revalidate(&self, current: impl Fn(&[u8]) -> Option<Bytes>) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        for (key, ws) in map.iter_mut() {
            let now = current(key);
            fire_differing(ws, now.as_ref());
        }
        map.retain(|_, ws| !ws.is_empty());
        self.any.store(!map.is_empty(), Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn val(v: u8) -> Option<Bytes> {
        Some(Bytes::from(vec![v]))
    }

    /// The interleaving the backends guard against: a commit that began with no watch (so it
    /// does not collect its changes) publishes a new value after a watch registered against the
    /// old one. Its empty notify cannot fire the watch; the re-check after it must.
    #[test]
    fn a_commit_that_collected_nothing_is_caught_by_the_recheck() {
        let w = Watches::default();
        let collected = w.any();
        assert!(!collected, "no watch yet: the commit will not collect its changes");
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        w.register(b"k".to_vec(), val(1), |_| Ok(val(1)), tx);
        assert!(w.any());
        // The commit publishes k = 2 and notifies what it collected: nothing.
        w.notify(&[]);
        assert!(rx.try_recv().is_err(), "an empty notify fires nothing");
        // ... so it re-checks the watches against the committed values.
        w.revalidate(|_| val(2));
        assert!(matches!(rx.try_recv(), Ok(Ok(()))), "the re-check fires it");
        assert!(!w.any());
    }

    #[test]
    fn a_value_already_changed_at_registration_fires_at_once() {
        let w = Watches::default();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        w.register(b"k".to_vec(), val(1), |_| Ok(val(2)), tx);
        assert!(matches!(rx.try_recv(), Ok(Ok(()))));
        assert!(!w.any());
    }
}
