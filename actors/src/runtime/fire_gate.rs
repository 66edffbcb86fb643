//! The first fire of a burst runs alone (issue 21: the first start within 5 ms of due).
//!
//! When many executions fall due at one instant, every shard owner decides its fire within a
//! millisecond or two, and sixteen or more fire transactions with room (and the owners with
//! none, holding) ran side by side on the node's cores and into one group commit: the first of
//! them committed ~10 ms after due. Now, after a quiet spell (no fire with room for
//! [`QUIET_MS`]), the first fire with room *leads*: the fires decided while it runs wait for
//! its commit — at most [`LEAD_WAIT_MS`] — and [`AFTER_LEAD_MS`] more for its deliveries,
//! before their own transactions begin. The lead fire's
//! executions reach their worker first; the rest follow a few milliseconds later, which a burst
//! of any size does not notice. Fires during a burst are never gated (it is not quiet).
//!
//! Executions a pre-fire started ahead are handed over at their due time: a fire decided
//! within [`LEAD_WAIT_MS`] before such a delivery, or [`AFTER_DELIVERY_MS`] after it, waits
//! until [`AFTER_DELIVERY_MS`] after it — the burst's fires would otherwise take the cores from
//! the hand-over, and from the worker starting what it got, at the very instant they are due.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use kairos_layer::env::SharedClock;
use tokio::sync::watch;

/// No fire with room for this long, and the next one leads.
pub const QUIET_MS: i64 = 50;
/// The longest a fire waits for the lead fire.
pub const LEAD_WAIT_MS: u64 = 5;
/// How long a fire still waits once the lead fire is done (its deliveries go first).
pub const AFTER_LEAD_MS: u64 = 2;
/// How long after a pre-fired hand-over a fire waits (S2 100,000 at once: first start 2.8–4.3 ms
/// in seven runs with 6, 2.2–9.2 ms in twelve with 2).
pub const AFTER_DELIVERY_MS: u64 = 6;

/// See the module docs.
#[derive(Debug)]
pub struct FireGate {
    /// When a fire with room last began (ms, the node's clock).
    last_room_fire_ms: AtomicI64,
    /// The lead fire in flight: told when it is done.
    lead: Mutex<Option<watch::Receiver<bool>>>,
    /// When pre-fired executions are handed over (ms, the node's clock), recent and coming.
    deliveries: Mutex<BTreeSet<i64>>,
}

impl Default for FireGate {
    fn default() -> Self {
        FireGate {
            last_room_fire_ms: AtomicI64::new(i64::MIN / 2),
            lead: Mutex::new(None),
            deliveries: Mutex::new(BTreeSet::new()),
        }
    }
}

/// What a fire does about the gate.
#[derive(Debug)]
pub enum Pass {
    /// It leads: tell the others when done ([`FireGate::led`]).
    Lead(watch::Sender<bool>),
    /// Wait for the lead fire (or [`LEAD_WAIT_MS`]) first.
    Follow(watch::Receiver<bool>),
    /// Go at once.
    Go,
}

impl FireGate {
    /// A fire is about to run at `now_ms`, with room (an offer) or not.
    pub fn enter(&self, now_ms: i64, has_room: bool) -> Pass {
        let mut lead = self.lead.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rx) = lead.as_ref() {
            return Pass::Follow(rx.clone());
        }
        if !has_room {
            return Pass::Go;
        }
        let last = self.last_room_fire_ms.swap(now_ms, Ordering::Relaxed);
        if now_ms.saturating_sub(last) < QUIET_MS {
            return Pass::Go;
        }
        let (tx, rx) = watch::channel(false);
        *lead = Some(rx);
        Pass::Lead(tx)
    }

    /// Pre-fired executions will be handed over at `at_ms`.
    pub fn delivering_at(&self, at_ms: i64) {
        self.deliveries.lock().unwrap_or_else(|e| e.into_inner()).insert(at_ms);
    }

    /// How long a fire decided at `now_ms` waits for pre-fired deliveries (see the module
    /// docs): until [`AFTER_DELIVERY_MS`] after the latest one due within [`LEAD_WAIT_MS`],
    /// unless that one is more than [`AFTER_DELIVERY_MS`] past.
    pub fn wait_for_deliveries(&self, now_ms: i64) -> Option<Duration> {
        let mut d = self.deliveries.lock().unwrap_or_else(|e| e.into_inner());
        let after = AFTER_DELIVERY_MS as i64;
        // Deliveries long past matter no more.
        while d.first().is_some_and(|t| *t < now_ms - after) {
            d.pop_first();
        }
        let last = d.range(..=now_ms + LEAD_WAIT_MS as i64).next_back()?;
        u64::try_from(last + after - now_ms).ok().filter(|w| *w > 0).map(Duration::from_millis)
    }

    /// The lead fire is done (committed or failed): the fires waiting for it go.
    pub fn led(&self, tx: watch::Sender<bool>) {
        self.lead.lock().unwrap_or_else(|e| e.into_inner()).take();
        let _ = tx.send(true);
    }
}

/// Waits, for a [`Pass::Follow`], until the lead fire is done or [`LEAD_WAIT_MS`] passed,
/// then [`AFTER_LEAD_MS`] more: the lead's executions, handed to the dispatcher, still have to
/// be written to their worker's stream — by the same runtime threads the followers' fire
/// transactions would take.
pub async fn follow(clock: &SharedClock, mut rx: watch::Receiver<bool>) {
    tokio::select! {
        _ = rx.wait_for(|done| *done) => {}
        _ = clock.sleep(Duration::from_millis(LEAD_WAIT_MS)) => {}
    }
    clock.sleep(Duration::from_millis(AFTER_LEAD_MS)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_a_quiet_spell_the_first_fire_with_room_leads_and_the_others_follow() {
        let g = FireGate::default();
        assert!(matches!(g.enter(1_000, false), Pass::Go), "no room: nothing to lead");
        let Pass::Lead(tx) = g.enter(1_000, true) else { panic!("the first with room leads") };
        let Pass::Follow(rx) = g.enter(1_001, true) else { panic!("others follow") };
        assert!(matches!(g.enter(1_001, false), Pass::Follow(_)), "holding fires follow too");
        assert!(!*rx.borrow());
        g.led(tx);
        assert!(*rx.borrow(), "the followers are told");
        assert!(matches!(g.enter(1_002, true), Pass::Go), "within a burst nobody leads");
        assert!(matches!(g.enter(1_002 + QUIET_MS, true), Pass::Lead(_)), "quiet again: lead");
    }

    #[test]
    fn fires_next_to_a_prefired_delivery_wait_until_just_after_it() {
        let g = FireGate::default();
        assert_eq!(g.wait_for_deliveries(1_000), None, "nothing to deliver");
        g.delivering_at(1_000);
        g.delivering_at(1_100);
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(AFTER_DELIVERY_MS, 6);
        assert_eq!(g.wait_for_deliveries(996), ms(10), "due within the bound: until after it");
        assert_eq!(g.wait_for_deliveries(1_002), ms(4), "just past: the rest of the pause");
        assert_eq!(g.wait_for_deliveries(1_006), None, "past the pause");
        assert_eq!(g.wait_for_deliveries(1_050), None, "the next one is too far ahead");
        assert_eq!(g.wait_for_deliveries(1_099), ms(7));
        assert_eq!(g.wait_for_deliveries(1_200), None);
        assert!(g.deliveries.lock().unwrap().is_empty(), "forgotten once past");
    }

    #[tokio::test]
    async fn a_follower_waits_for_the_lead_and_no_longer_than_the_bound() {
        let clock: SharedClock = std::sync::Arc::new(kairos_layer::env::SystemClock::default());
        let g = std::sync::Arc::new(FireGate::default());
        let Pass::Lead(tx) = g.enter(0, true) else { panic!() };
        let Pass::Follow(rx) = g.enter(0, true) else { panic!() };
        let waiting = tokio::spawn({
            let clock = clock.clone();
            async move { follow(&clock, rx).await }
        });
        g.led(tx);
        waiting.await.unwrap();
        // A lead that never reports: the follower goes after the bound.
        let Pass::Lead(_tx) = g.enter(1_000_000, true) else { panic!() };
        let Pass::Follow(rx) = g.enter(1_000_000, true) else { panic!() };
        tokio::time::timeout(Duration::from_secs(5), follow(&clock, rx)).await.unwrap();
    }
}
