//! Shard owners holding back due executions for this node's busy workers (issue 21, step 3;
//! the layer's `ops::hold`), and the room that wakes them.
//!
//! A node alone in its cluster (no other live node) holds the queues its own workers serve: a
//! fire starts what their credits and dispatch buffers have room for and leaves the rest due,
//! in the store's timer order, instead of writing them READY for a later claim. A shard owner
//! whose fire held executions waits here, in order; each time room appears (a worker returns
//! credits, a dispatch buffer drains) the first waiting owner is told, and fires with an offer.
//! Its poll (`poll_interval_ms`) fires it anyway, so a lost wake-up costs latency, never work.
//! With other nodes alive nothing is held: their workers claim READY work.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use kairos_layer::ops::hold::Hold;

use super::matchmaker::Matchmaker;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Held {
    /// No other live node (as of the lease manager's last round); false until it is known.
    alone: AtomicBool,
    /// Shards whose last fire held executions, first come first woken.
    waiting: Mutex<VecDeque<u32>>,
}

impl Held {
    /// Whether other nodes are alive: only a node alone holds.
    pub fn set_alone(&self, alone: bool) {
        self.alone.store(alone, Ordering::Relaxed);
    }

    /// What a fire holds now: the queue this node's workers serve, when it is alone and they
    /// serve one queue; `narrow` for a fire that is not the owner's poll (see `Hold::narrow`).
    /// With workers of several queues nothing is held: a held backlog of one queue comes first
    /// in the timer order and would keep another queue's due work (another tenant's) unseen by
    /// narrow fires — the READY path's per-queue claims keep queues apart (bench s6).
    pub fn hold(&self, matchmaker: &Matchmaker, narrow: bool) -> Hold {
        if !self.alone.load(Ordering::Relaxed) {
            return Hold::default();
        }
        let queues = matchmaker.local_queues();
        if queues.len() != 1 {
            return Hold::default();
        }
        Hold { queues, narrow }
    }

    /// `shard`'s owner holds executions: wake it when there is room (once, however often it
    /// asks before then).
    pub fn wait(&self, shard: u32) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if !w.contains(&shard) {
            w.push_back(shard);
        }
    }

    /// Whether an owner waits for room (due executions held back on this node): a submit then
    /// starts nothing itself, so what is due now never goes ahead of what was due before.
    pub fn any_waiting(&self) -> bool {
        !self.waiting.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// The owner to wake next, if any waits.
    pub fn next(&self) -> Option<u32> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_wait_once_each_in_order_and_only_a_node_alone_holds() {
        let h = Held::default();
        h.wait(3);
        h.wait(1);
        h.wait(3);
        assert_eq!((h.next(), h.next(), h.next()), (Some(3), Some(1), None));
        let m = Matchmaker::default();
        m.add(&("ns".into(), "q".into()), 1, "w", None, 0);
        assert!(h.hold(&m, false).is_empty(), "not known to be alone: nothing held");
        h.set_alone(true);
        let held = h.hold(&m, true);
        assert_eq!(held.queues.into_iter().collect::<Vec<_>>(), vec![("ns".into(), "q".into())]);
        assert!(held.narrow);
        m.add(&("other".into(), "q".into()), 2, "w2", None, 0);
        assert!(h.hold(&m, true).is_empty(), "workers of two queues: nothing held");
    }
}
