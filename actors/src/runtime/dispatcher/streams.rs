//! Worker streams in the dispatcher's core: a stream is a waiting worker whose credits come
//! back with its results; its queue is served through a dispatch buffer ([`super::buffer`])
//! unless the queue has a concurrency limit.

use super::state::{Action, Apply, Stream, Waiting};

impl Apply<'_> {
    pub(super) fn open(&mut self, w: Waiting) {
        if self.core.draining {
            self.out.push(Action::EndStream(w.id));
            return;
        }
        self.ledger.add(&w.queue, w.id, &w.worker_id, w.lease_ms, w.credits);
        self.core.streams.insert(w.id, Stream { queue: w.queue.clone(), capacity: w.credits });
        self.demand(&w.queue);
    }

    pub(super) fn credits(&mut self, id: u64, n: usize) {
        let Some(s) = self.core.streams.get_mut(&id) else { return };
        let q = s.queue.clone();
        self.ledger.credit(&q, id, n);
        // The buffer's target covers every credit its streams hold.
        s.capacity = s.capacity.max(self.ledger.credits(&q, id));
        self.demand(&q);
    }

    pub(super) fn close(&mut self, id: u64) {
        let Some(s) = self.core.streams.remove(&id) else { return };
        self.ledger.remove(&s.queue, id);
        self.out.push(Action::EndStream(id));
        if !self.is_buffered(&s.queue) {
            // No stream left on this node: let other nodes' workers have them.
            self.drop_buffer(&s.queue);
        }
    }
}
