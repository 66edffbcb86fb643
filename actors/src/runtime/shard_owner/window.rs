//! The pure core of a shard owner: its in-memory window of the shard's upcoming timers — of
//! every kind (DUE, RETRY, LEASE_CHECK) whose execution no execution timer follows — and when to
//! fire, load and wake. No I/O: the actor performs what this decides.

use std::collections::BTreeSet;

use kairos_layer::ops::retry::doubling_ms;

use crate::limits::RETRY_PAUSE_MAX_MS;

/// What the owner should do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerAction {
    /// Run `fire_due` for the shard at `now`, expecting to fire the `expected` timers the
    /// window holds due (it may find more: timers written elsewhere, or dropped over the cap).
    Fire {
        /// How many timers this fire may find.
        expected: usize,
    },
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

/// Upcoming timers of one shard, loaded up to `loaded_until`.
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
    /// Failed fires (loads) in a row, and the earliest time to try again: a failing store is
    /// retried with a doubling pause (the poll interval up to [`RETRY_PAUSE_MAX_MS`]), not spun on.
    fire_failures: u32,
    fire_not_before: i64,
    load_failures: u32,
    load_not_before: i64,
    /// Fire at the next decision even if nothing is known due (room appeared for executions a
    /// fire held back).
    poked: bool,
    /// The fire last decided is a poll: a full look at the shard (see [`Window::polling`]).
    polling: bool,
    /// When the last poll was decided.
    last_poll: i64,
    /// How far ahead of its timers a pre-fire may start executions (0: never).
    prefire_ms: i64,
    /// The end of the last pre-fire's look-ahead: timers up to it were offered to the waiting
    /// workers once, and are left to their fire.
    prefired_until: i64,
}

/// The pause after `failures` failures in a row: the poll interval, doubling, at most
/// [`RETRY_PAUSE_MAX_MS`] (and never less than 100 ms).
fn retry_pause(poll_ms: i64, failures: u32) -> i64 {
    let max = RETRY_PAUSE_MAX_MS as u64;
    let first = (poll_ms.max(0) as u64).clamp(100, max);
    doubling_ms(first, failures.saturating_sub(1), max) as i64
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
            fire_failures: 0,
            fire_not_before: i64::MIN,
            load_failures: 0,
            load_not_before: i64::MIN,
            poked: false,
            polling: false,
            last_poll: i64::MIN,
            prefire_ms: 0,
            prefired_until: i64::MIN,
        }
    }

    /// Pre-fires up to `ms` ahead of the timers ([`Window::prefire`]); 0: never.
    pub fn with_prefire(mut self, ms: i64) -> Self {
        self.prefire_ms = ms.max(0);
        self
    }

    /// Whether to pre-fire now (when no fire runs and nothing is due yet, the next timer falls
    /// within `prefire_ms` and was not offered before): the end of the look-ahead, the pre-fire
    /// marked as in progress. Asked whether or not workers wait: a timer is looked at once.
    pub fn prefire(&mut self, now: i64) -> Option<i64> {
        let head = self.head()?;
        let ahead = now.saturating_add(self.prefire_ms);
        let wanted = self.prefire_ms > 0 && head > now && head <= ahead;
        if !wanted || head <= self.prefired_until || self.firing || now < self.fire_not_before {
            return None;
        }
        self.firing = true;
        self.prefired_until = ahead;
        Some(ahead)
    }

    /// A pre-fire ended (or was not needed): the timers it started leave the window.
    pub fn prefired(&mut self, started: &[(i64, String)]) {
        self.firing = false;
        for t in started {
            self.due.remove(t);
        }
    }

    /// Failed fires and loads in a row (0 once one succeeds).
    pub fn failures(&self) -> (u32, u32) {
        (self.fire_failures, self.load_failures)
    }

    /// Timers held.
    pub fn len(&self) -> usize {
        self.due.len()
    }

    /// Whether no timer is held.
    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    /// Timers held due at or before `t`.
    pub fn due_by(&self, t: i64) -> usize {
        self.due.range(..(t.saturating_add(1), String::new())).count()
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
        assert!(self.due.len() <= self.cap, "the window holds at most its cap");
    }

    /// The result of a load of `(after, until]`; `truncated` if the store had more.
    pub fn loaded(&mut self, timers: Vec<(i64, String)>, until: i64, truncated: bool) {
        self.loading = false;
        self.load_failures = 0;
        let last = timers.last().map(|(t, _)| *t);
        let reached = if truncated { last.unwrap_or(self.loaded_until) } else { until };
        self.loaded_until = self.loaded_until.max(reached);
        for (t, id) in timers {
            self.insert(t, id); // lowers loaded_until again if over the cap
        }
    }

    /// A load at `now` failed: allow another after a pause that grows while loads keep failing.
    pub fn load_failed(&mut self, now: i64) {
        self.loading = false;
        self.load_failures = self.load_failures.saturating_add(1);
        self.load_not_before = now.saturating_add(retry_pause(self.poll_ms, self.load_failures));
    }

    /// A `fire_due(now)` finished; `more` if timers due at `now` remain in the store.
    pub fn fired(&mut self, now: i64, more: bool) {
        self.firing = false;
        self.last_fire = now;
        self.fire_failures = 0;
        if !more {
            while self.due.first().is_some_and(|(t, _)| *t <= now) {
                self.due.pop_first();
            }
        }
    }

    /// A fire failed: allow another after a pause (the poll interval, doubling while fires
    /// keep failing, up to [`RETRY_PAUSE_MAX_MS`]), even if timers are due.
    pub fn fire_failed(&mut self, now: i64) {
        self.firing = false;
        self.last_fire = now;
        self.fire_failures = self.fire_failures.saturating_add(1);
        self.fire_not_before = now.saturating_add(retry_pause(self.poll_ms, self.fire_failures));
    }

    /// Fire at the next decision (once no fire is in progress and failures allow), whatever
    /// the window knows is due.
    pub fn poke(&mut self) {
        self.poked = true;
    }

    /// Whether the fire last decided is a poll — nothing known due and no poke, or no poll for
    /// a poll interval (other fires keeping the shard busy): the owner's periodic full look at
    /// its shard.
    pub fn polling(&self) -> bool {
        self.polling
    }

    /// What to do at `now`; marks started fires and loads as in progress.
    pub fn decide(&mut self, now: i64) -> Vec<OwnerAction> {
        let mut out = Vec::new();
        let head_due = self.head().is_some_and(|t| t <= now);
        let poll_due = now >= self.last_fire.saturating_add(self.poll_ms);
        let fire_allowed = now >= self.fire_not_before;
        if !self.firing && fire_allowed && (head_due || poll_due || self.poked) {
            self.firing = true;
            // A poll at least every poll interval, even while other fires keep the shard busy.
            let poll_owed = now >= self.last_poll.saturating_add(self.poll_ms);
            self.polling = poll_owed || (!head_due && !self.poked);
            if self.polling {
                self.last_poll = now;
            }
            self.poked = false;
            // What the window knows is due: a fire reserves waiting workers for that many (what
            // a poll's fire finds written elsewhere becomes READY, for a claim).
            let expected = self.due.range(..(now + 1, String::new())).count();
            out.push(OwnerAction::Fire { expected });
        }
        let load_allowed = now >= self.load_not_before;
        if !self.loading
            && load_allowed
            && self.loaded_until < now + self.window_ms / 2
            && self.due.len() < self.cap
        {
            self.loading = true;
            out.push(OwnerAction::Load { after: self.loaded_until, until: now + self.window_ms });
        }
        let mut wake =
            self.last_fire.saturating_add(self.poll_ms).max(self.fire_not_before).max(now + 1);
        // A head already due is being fired: its completion re-evaluates.
        if let Some(h) = self.head().filter(|h| *h > now) {
            wake = wake.min(h.max(self.fire_not_before));
            if self.prefire_ms > 0 && h > self.prefired_until && !self.firing {
                wake = wake.min((h - self.prefire_ms).max(self.fire_not_before).max(now + 1));
            }
        }
        if !self.loading {
            wake = wake.min(
                (self.loaded_until - self.window_ms / 2).max(self.load_not_before).max(now + 1),
            );
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
    fn a_poke_fires_once_nothing_is_firing() {
        let mut w = w();
        w.decide(1_000);
        w.fired(1_000, false);
        w.loaded(vec![], 31_000, false);
        w.poke();
        assert_eq!(w.decide(1_001)[0], OwnerAction::Fire { expected: 0 }, "fires at once");
        assert!(!w.polling(), "a poked fire is not a poll");
        w.poke();
        assert!(
            !matches!(w.decide(1_002)[0], OwnerAction::Fire { .. }),
            "not while a fire is in progress"
        );
        w.fired(1_003, false);
        assert_eq!(w.decide(1_003)[0], OwnerAction::Fire { expected: 0 }, "the poke waited");
        w.fired(1_004, false);
        assert!(!matches!(w.decide(1_005)[0], OwnerAction::Fire { .. }), "once");
        // Poked fires in a row (each before the poll interval since the last fire) still make
        // one of them a poll once a poll interval.
        for t in [1_500, 1_900] {
            w.poke();
            assert_eq!(w.decide(t)[0], OwnerAction::Fire { expected: 0 });
            assert!(!w.polling());
            w.fired(t, false);
        }
        w.poke();
        assert_eq!(w.decide(2_000)[0], OwnerAction::Fire { expected: 0 });
        assert!(w.polling(), "a poll interval since the last poll");
    }

    #[test]
    fn prefires_each_timer_once_ahead_of_it_and_wakes_for_it() {
        let mut w = w().with_prefire(20);
        w.decide(1_000);
        w.fired(1_000, false);
        w.loaded(
            vec![(1_500, "a".into()), (1_510, "b".into()), (1_700, "c".into())],
            31_000,
            false,
        );
        assert_eq!(w.decide(1_001), vec![OwnerAction::WakeAt(1_480)], "a look-ahead before it");
        assert_eq!(w.prefire(1_479), None, "too early");
        assert_eq!(w.prefire(1_480), Some(1_500));
        assert_eq!(w.prefire(1_481), None, "one at a time");
        assert!(!matches!(w.decide(1_481)[0], OwnerAction::Fire { .. }), "nor with a fire");
        w.prefired(&[(1_500, "a".into())]);
        assert_eq!(w.head(), Some(1_510), "what it started leaves the window");
        // "b" is inside the look-ahead already offered: left to its fire, woken for at its time.
        assert_eq!(w.prefire(1_490), Some(1_510), "beyond the last look-ahead: once more");
        w.prefired(&[]);
        assert_eq!(w.prefire(1_495), None, "offered once");
        assert_eq!(w.decide(1_495), vec![OwnerAction::WakeAt(1_510)]);
        assert_eq!(w.decide(1_510)[0], OwnerAction::Fire { expected: 1 }, "its fire takes it");
        w.fired(1_510, false);
        assert_eq!(w.prefire(1_510), None, "c is not within 20 ms");
        assert!(w.decide(1_511).contains(&OwnerAction::WakeAt(1_680)));
        assert_eq!(Window::new(0, 30_000, 1_000, 3).prefire(0), None, "off by default");
    }

    #[test]
    fn starts_by_firing_and_loading_the_window() {
        let mut w = w();
        let a = w.decide(1_000);
        assert_eq!(
            a[0],
            OwnerAction::Fire { expected: 0 },
            "a first fire polls, knowing of nothing"
        );
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
            vec![OwnerAction::Fire { expected: 1 }, OwnerAction::WakeAt(2_000)],
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
        assert_eq!(w.decide(1_000)[0], OwnerAction::Fire { expected: 1 });
        w.fired(1_000, false);
        assert!(w.is_empty());
        assert_eq!(w.decide(1_500), vec![OwnerAction::WakeAt(2_000)], "next poll");
        assert_eq!(w.decide(2_000)[0], OwnerAction::Fire { expected: 0 }, "poll fallback");
        assert!(w.polling());
    }

    #[test]
    fn a_failing_store_is_retried_with_a_growing_pause_not_spun_on() {
        let mut w = Window::new(1_000, 30_000, 1_000, 100);
        w.decide(1_000);
        w.fired(1_000, false);
        w.loaded(vec![(1_200, "a".into())], 31_000, false);
        assert_eq!(w.decide(1_200)[0], OwnerAction::Fire { expected: 1 });
        w.fire_failed(1_200);
        // The head is still due, but the next fire waits for the pause.
        let a = w.decide(1_201);
        assert_eq!(a, vec![OwnerAction::WakeAt(2_200)], "{a:?}");
        assert_eq!(w.decide(2_200)[0], OwnerAction::Fire { expected: 1 }, "the failed one");
        w.fire_failed(2_200);
        assert_eq!(w.decide(2_201), vec![OwnerAction::WakeAt(4_200)], "doubled");
        for _ in 0..10 {
            w.fire_failed(4_200);
        }
        assert_eq!(
            w.decide(4_201),
            vec![OwnerAction::WakeAt(4_200 + RETRY_PAUSE_MAX_MS)],
            "capped"
        );
        w.fired(20_000, false);
        assert_eq!(w.failures().0, 0, "a success resets the pause");

        // Loads back off the same way.
        let mut w = Window::new(1_000, 30_000, 1_000, 100);
        w.decide(1_000);
        w.fired(1_000, false);
        w.load_failed(1_000);
        assert!(!w.decide(1_001).iter().any(|a| matches!(a, OwnerAction::Load { .. })));
        assert!(w.decide(2_000).iter().any(|a| matches!(a, OwnerAction::Load { .. })));
        w.load_failed(2_000);
        assert!(!w.decide(3_500).iter().any(|a| matches!(a, OwnerAction::Load { .. })));
        assert!(w.decide(4_000).iter().any(|a| matches!(a, OwnerAction::Load { .. })));
    }
}
