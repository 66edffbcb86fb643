//! Long polls in the dispatcher's core: a poll is a waiting worker with `max` credits that is
//! answered once — when it has `max` executions, when its wait runs out, or [`POLL_LINGER`]
//! after its first delivery (so the fires of several shards that reserved its credits fill
//! one answer).

use std::time::Duration;

use kairos_layer::ops::claim::Claimed;

use super::state::{Action, Apply, POLL_LINGER, Poll, Timer, Waiting};

impl Apply<'_> {
    pub(super) fn poll(&mut self, w: Waiting, wait_ms: u64) {
        if self.core.draining {
            self.out.push(Action::Answer(w.id, Vec::new()));
            return;
        }
        debug_assert!(!self.core.polls.contains_key(&w.id), "a poll's id is new");
        let wait = wait_ms.min(self.core.poll_wait_max_ms);
        self.ledger.add(&w.queue, w.id, &w.worker_id, w.lease_ms, w.credits);
        self.ledger.mark_poll(&w.queue, w.id);
        let poll =
            Poll { queue: w.queue.clone(), max: w.credits, got: Vec::new(), lingering: false };
        self.core.polls.insert(w.id, poll);
        self.later(Duration::from_millis(wait), Timer::Expire(w.id));
        self.demand(&w.queue);
    }

    /// A lingering poll answers — unless work reserved for it by a transaction still running
    /// comes soon: it lingers on for it rather than leave it without a taker.
    pub(super) fn flush(&mut self, id: u64) {
        let pending = self.core.polls.get(&id).map_or(0, |p| self.ledger.pending(&p.queue, id));
        if pending > 0 {
            self.later(POLL_LINGER, Timer::Flush(id));
        } else {
            self.answer(id);
        }
    }

    /// Answers a poll with what it got (a poll is answered once: its remaining credits go).
    pub(super) fn answer(&mut self, id: u64) {
        let Some(p) = self.core.polls.remove(&id) else { return };
        self.ledger.remove(&p.queue, id);
        assert!(p.got.len() <= p.max, "a poll gets at most its max");
        self.out.push(Action::Answer(id, p.got));
    }

    /// Adds executions to a poll: answered once full, else it lingers for more.
    pub(super) fn deliver_to_poll(&mut self, id: u64, claimed: Vec<Claimed>) -> Vec<Claimed> {
        let Some(p) = self.core.polls.get_mut(&id) else { return claimed };
        p.got.extend(claimed);
        if p.got.len() >= p.max {
            self.answer(id);
        } else if !p.lingering {
            p.lingering = true;
            self.later(POLL_LINGER, Timer::Flush(id));
        }
        Vec::new()
    }
}
