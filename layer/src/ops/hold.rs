//! Holding back due executions for a node's own busy workers (issue 21, step 3).
//!
//! In a burst, a fire runs far ahead of the workers: without holding, almost every execution is
//! written READY by its fire and then RUNNING by a claim — a record rewrite, a ready entry set
//! and cleared, and a claim transaction per batch, for work that waits in the store either way.
//! A fire given a [`Hold`] leaves the due executions of those queues beyond its offer as they
//! are (SCHEDULED or RETRY_WAIT, their timers in place, in due order) and starts them at a later
//! fire, when the queue's workers have room: fire and start in one write.
//!
//! Holding never hides work: a queue is held only while the node's own workers of it are
//! connected (the caller's choice), only when the fire's scan of the bucket saw every due row
//! (nothing waits unseen behind held rows), and never for an execution due more than
//! [`HOLD_MS_MAX`] ago (it goes READY, as without holding, where any node's worker or poll can
//! claim it). A held execution's timer stays durable: a crash loses nothing, the next owner
//! fires it.

use std::collections::{BTreeMap, BTreeSet};

use kairos_proto::storage::v1::{TimerEntry, TimerKind};

use super::claim::ClaimSlot;
use super::records::decode;
use crate::kv::KeyValue;
use crate::limits::HOLD_MS_MAX;

/// What a fire holds back: the due executions of `queues`, by `(namespace, queue)`, once its
/// offer for them is used up, instead of making them READY.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hold {
    /// The queues held.
    pub queues: BTreeSet<(String, String)>,
    /// A *narrow* fire, for room that appeared: it reads only as many due rows per bucket as
    /// its offer has room for (plus [`NARROW_EXTRA_ROWS`]) instead of the fair scan, and holds
    /// even though its read did not see the whole bucket. What it did not see waits for the
    /// next full fire (the owner's poll): a narrow fire costs reads in proportion to the work it
    /// starts, not to the backlog held.
    pub narrow: bool,
}

/// Rows a narrow fire reads per bucket beyond its offer's room.
pub const NARROW_EXTRA_ROWS: usize = 16;

impl Hold {
    /// Holds `queues`, with a full scan.
    pub fn queues(queues: impl IntoIterator<Item = (String, String)>) -> Hold {
        Hold { queues: queues.into_iter().collect(), narrow: false }
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }
}

/// What one fire may still start of each held queue: its offer's slots.
pub(crate) struct HoldRoom {
    room: BTreeMap<(String, String), usize>,
    /// A narrow fire's reads per bucket ([`Hold::narrow`]); `None` for a full scan.
    pub(crate) narrow_scan: Option<usize>,
    /// Rows due before this are never held.
    oldest_ms: i64,
    /// The queues it held rows of.
    pub(crate) held: BTreeSet<(String, String)>,
}

impl HoldRoom {
    /// The room of each queue of `hold` in `offer` (0 where it offers nothing); `None` when
    /// nothing is held.
    pub(crate) fn new(
        hold: &Hold,
        offer: &BTreeMap<(String, String), Vec<ClaimSlot>>,
        now_ms: i64,
    ) -> Option<HoldRoom> {
        if hold.is_empty() {
            return None;
        }
        let room: BTreeMap<_, usize> = hold
            .queues
            .iter()
            .map(|q| (q.clone(), offer.get(q).map_or(0, |s| s.iter().map(|s| s.max).sum())))
            .collect();
        let total: usize = room.values().sum();
        Some(HoldRoom {
            narrow_scan: hold.narrow.then_some(total + NARROW_EXTRA_ROWS),
            room,
            oldest_ms: now_ms.saturating_sub(HOLD_MS_MAX),
            held: BTreeSet::new(),
        })
    }

    /// Splits one bucket's scanned rows (in timer order) into those to process and the number
    /// held back: a DUE or RETRY row of a held queue beyond its room, due at or after the
    /// oldest time held (`fire_at` reads a row's due time from its key).
    pub(crate) fn filter(
        &mut self,
        rows: Vec<KeyValue>,
        fire_at: impl Fn(&[u8]) -> Option<i64>,
    ) -> (Vec<KeyValue>, usize) {
        let mut held = 0;
        let mut kept = Vec::with_capacity(rows.len());
        for kv in rows {
            match self.place(&kv, &fire_at) {
                Place::Keep => kept.push(kv),
                Place::Hold => held += 1,
            }
        }
        (kept, held)
    }

    fn place(&mut self, kv: &KeyValue, fire_at: &impl Fn(&[u8]) -> Option<i64>) -> Place {
        // Undecodable rows are kept: their step quarantines them.
        let Ok(entry) = decode::<TimerEntry>("timer", &kv.value) else { return Place::Keep };
        let startable =
            entry.kind == TimerKind::Due as i32 || entry.kind == TimerKind::Retry as i32;
        if !startable || entry.queue.is_empty() {
            return Place::Keep;
        }
        let queue = (entry.namespace, entry.queue);
        let Some(room) = self.room.get_mut(&queue) else { return Place::Keep };
        if *room > 0 {
            *room -= 1;
            return Place::Keep;
        }
        match fire_at(&kv.key) {
            Some(at) if at >= self.oldest_ms => {
                self.held.insert(queue);
                Place::Hold
            }
            _ => Place::Keep,
        }
    }
}

enum Place {
    Keep,
    Hold,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::fire::Offer;
    use crate::ops::records::encode;

    fn row(i: u8, kind: TimerKind, queue: &str) -> KeyValue {
        let entry = TimerEntry {
            kind: kind as i32,
            namespace: "ns".into(),
            queue: queue.to_string(),
            members: vec![],
        };
        KeyValue { key: vec![i].into(), value: encode(&entry).into() }
    }

    fn offer(q: &str, n: usize) -> Offer {
        let slot = ClaimSlot { worker_id: "w".into(), max: n, lease_ms: None };
        [(("ns".to_string(), q.to_string()), vec![slot])].into_iter().collect()
    }

    #[test]
    fn a_held_queue_keeps_its_room_and_holds_the_rest_other_rows_pass() {
        let hold = Hold::queues([("ns".to_string(), "a".to_string())]);
        let mut room = HoldRoom::new(&hold, &offer("a", 2), 1_000_000).unwrap();
        assert_eq!(room.narrow_scan, None, "a full scan");
        let rows = vec![
            row(1, TimerKind::Due, "a"),
            row(2, TimerKind::LeaseCheck, "a"),
            row(3, TimerKind::Retry, "a"),
            row(4, TimerKind::Due, "a"),
            row(5, TimerKind::Due, "b"),
            row(6, TimerKind::Due, ""),
            row(7, TimerKind::Due, "a"),
        ];
        let (kept, held) = room.filter(rows, |_| Some(1_000_000));
        let kept: Vec<u8> = kept.iter().map(|kv| kv.key[0]).collect();
        assert_eq!(kept, vec![1, 2, 3, 5, 6], "room for two of queue a; lease checks pass");
        assert_eq!(held, 2);
        assert_eq!(room.held.len(), 1, "held rows of one queue");
        // The room is used up for the whole fire.
        let (kept, held) = room.filter(vec![row(8, TimerKind::Due, "a")], |_| Some(1_000_000));
        assert!(kept.is_empty());
        assert_eq!(held, 1);
    }

    #[test]
    fn nothing_is_held_too_long_and_an_empty_hold_holds_nothing() {
        let mut hold = Hold::queues([("ns".to_string(), "a".to_string())]);
        hold.narrow = true;
        let now = 1_000_000;
        let mut room = HoldRoom::new(&hold, &Offer::new(), now).unwrap();
        assert_eq!(room.narrow_scan, Some(NARROW_EXTRA_ROWS), "no room: reads only the extra");
        let old = now - HOLD_MS_MAX - 1;
        let (kept, held) = room.filter(vec![row(1, TimerKind::Due, "a")], |_| Some(old));
        assert_eq!((kept.len(), held), (1, 0), "due too long ago: made READY");
        assert!(HoldRoom::new(&Hold::default(), &offer("a", 1), now).is_none());
    }
}
