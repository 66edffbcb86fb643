//! The pure core of a shard owner: its in-memory window of upcoming DUE timers, and when to
//! fire, load and wake. No I/O: the actor performs what this decides.

use std::collections::BTreeSet;

/// What the owner should do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerAction {
    /// Run `fire_due` for the shard at `now`.
    Fire,
    /// Load timers with `after < fire_at <= until` into the window.
    Load {
        /// Exclusive lower bound.
        after: i64,
        /// Inclusive upper bound.
        until: i64,
    },
    /// Wake up again at this time.
    WakeAt(i64),
}

/// Upcoming DUE timers of one shard, loaded up to `loaded_until`.
#[derive(Debug, Clone)]
pub struct Window {
    due: BTreeSet<(i64, String)>,
    loaded_until: i64,
    cap: usize,
    window_ms: i64,
    poll_ms: i64,
    last_fire: i64,
    firing: bool,
    loading: bool,
}

impl Window {
    /// A window that has loaded nothing after `now`, holding at most `cap` timers.
    pub fn new(now: i64, window_ms: i64, poll_ms: i64, cap: usize) -> Self {
        Window {
            due: BTreeSet::new(),
            loaded_until: now,
            cap,
            window_ms,
            poll_ms,
            last_fire: i64::MIN,
            firing: false,
            loading: false,
        }
    }

    /// Timers held.
    pub fn len(&self) -> usize {
        self.due.len()
    }

    /// Whether no timer is held.
    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    /// The earliest timer held.
    pub fn head(&self) -> Option<i64> {
        self.due.first().map(|(t, _)| *t)
    }

    /// A new DUE timer (from a local submit). Ignored beyond the loaded range: a later load
    /// brings it. Over the cap, the loaded range shrinks so the store supplies it later.
    pub fn hint(&mut self, fire_at: i64, id: String) {
        if fire_at > self.loaded_until {
            return;
        }
        self.insert(fire_at, id);
    }

    fn insert(&mut self, fire_at: i64, id: String) {
        self.due.insert((fire_at, id));
        while self.due.len() > self.cap {
            if let Some((t, _)) = self.due.pop_last() {
                // Everything from t on must come from the store again.
                self.loaded_until = self.loaded_until.min(t - 1);
            }
        }
    }

    /// The result of a load of `(after, until]`; `truncated` if the store had more.
    pub fn loaded(&mut self, timers: Vec<(i64, String)>, until: i64, truncated: bool) {
        self.loading = false;
        let last = timers.last().map(|(t, _)| *t);
        let reached = if truncated { last.unwrap_or(self.loaded_until) } else { until };
        self.loaded_until = self.loaded_until.max(reached);
        for (t, id) in timers {
            self.insert(t, id); // lowers loaded_until again if over the cap
        }
    }

    /// A load failed: allow another.
    pub fn load_failed(&mut self) {
        self.loading = false;
    }

    /// A `fire_due(now)` finished; `more` if timers due at `now` remain in the store.
    pub fn fired(&mut self, now: i64, more: bool) {
        self.firing = false;
        self.last_fire = now;
        if !more {
            while self.due.first().is_some_and(|(t, _)| *t <= now) {
                self.due.pop_first();
            }
        }
    }

    /// A fire failed: allow another after the poll interval.
    pub fn fire_failed(&mut self, now: i64) {
        self.firing = false;
        self.last_fire = now;
    }

    /// What to do at `now`; marks started fires and loads as in progress.
    pub fn decide(&mut self, now: i64) -> Vec<OwnerAction> {
        let mut out = Vec::new();
        let head_due = self.head().is_some_and(|t| t <= now);
        let poll_due = now >= self.last_fire.saturating_add(self.poll_ms);
        if !self.firing && (head_due || poll_due) {
            self.firing = true;
            out.push(OwnerAction::Fire);
        }
        if !self.loading
            && self.loaded_until < now + self.window_ms / 2
            && self.due.len() < self.cap
        {
            self.loading = true;
            out.push(OwnerAction::Load { after: self.loaded_until, until: now + self.window_ms });
        }
        let mut wake = self.last_fire.saturating_add(self.poll_ms).max(now + 1);
        // A head already due is being fired: its completion re-evaluates.
        if let Some(h) = self.head().filter(|h| *h > now) {
            wake = wake.min(h);
        }
        if !self.loading {
            wake = wake.min((self.loaded_until - self.window_ms / 2).max(now + 1));
        }
        out.push(OwnerAction::WakeAt(wake));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w() -> Window {
        Window::new(1_000, 30_000, 1_000, 3)
    }

    #[test]
    fn starts_by_firing_and_loading_the_window() {
        let mut w = w();
        let a = w.decide(1_000);
        assert_eq!(a[0], OwnerAction::Fire);
        assert_eq!(a[1], OwnerAction::Load { after: 1_000, until: 31_000 });
        // While both run, only a wake-up is planned.
        assert!(matches!(w.decide(1_001)[..], [OwnerAction::WakeAt(_)]));
    }

    #[test]
    fn wakes_exactly_at_the_next_timer_and_fires_it() {
        let mut w = w();
        w.decide(1_000);
        w.fired(1_000, false);
        w.loaded(vec![(1_500, "a".into()), (2_500, "b".into())], 31_000, false);
        assert_eq!(w.decide(1_001), vec![OwnerAction::WakeAt(1_500)]);
        assert_eq!(
            w.decide(1_500),
            vec![OwnerAction::Fire, OwnerAction::WakeAt(2_000)],
            "next poll"
        );
        w.fired(1_500, false);
        assert_eq!(w.head(), Some(2_500), "fired timers leave the window");
    }

    #[test]
    fn hints_inside_the_loaded_range_wake_earlier() {
        let mut w = w();
        w.decide(1_000);
        w.fired(1_000, false);
        w.loaded(vec![], 31_000, false);
        w.hint(1_200, "x".into());
        assert_eq!(w.decide(1_001), vec![OwnerAction::WakeAt(1_200)]);
        w.hint(40_000, "far".into());
        assert_eq!(w.len(), 1, "beyond the loaded range: left to a later load");
    }

    #[test]
    fn the_cap_bounds_memory_and_shrinks_the_loaded_range() {
        let mut w = w();
        w.decide(1_000);
        w.loaded((0..5).map(|i| (2_000 + i, format!("t{i}"))).collect(), 31_000, false);
        assert_eq!(w.len(), 3);
        assert!(w.loaded_until < 2_003, "timers that did not fit are reloaded later");
    }

    #[test]
    fn more_due_keeps_firing_and_polls_regularly() {
        let mut w = w();
        w.decide(1_000);
        w.loaded(vec![(900, "late".into())], 31_000, false);
        w.fired(1_000, true);
        assert_eq!(w.head(), Some(900), "kept while more is due");
        assert_eq!(w.decide(1_000)[0], OwnerAction::Fire);
        w.fired(1_000, false);
        assert!(w.is_empty());
        assert_eq!(w.decide(1_500), vec![OwnerAction::WakeAt(2_000)], "next poll");
        assert_eq!(w.decide(2_000)[0], OwnerAction::Fire, "poll fallback");
    }
}
