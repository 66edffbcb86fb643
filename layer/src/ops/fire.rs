//! `fire_due`: a shard owner turns its due timers into effects, fenced by its lease epoch —
//! DUE and RETRY timers make executions READY, or, when a worker of the queue is waiting on
//! this node, RUNNING for that worker in the same transaction (a *sync match*: no ready entry,
//! no claim transaction, no extra round trip); LEASE_CHECK timers time out an attempt whose
//! lease expired (then the retry policy) or move to the renewed expiry. A timer that cannot be
//! processed (undecodable, an invalid transition) is quarantined — recorded for operators —
//! and the rest of the batch goes on. Advances the shard's watermark past drained buckets.

use std::collections::BTreeMap;

use kairos_proto::storage::v1::{
    Execution, ExecutionError, ExecutionStatus, QuarantineRecord, TimerEntry, TimerKind,
};

use bytes::Bytes;

use super::Scheduler;
use super::budget;
use super::claim::{ClaimSlot, Claimed, RECEIPT_KEEP_MS, Receipt, SlotFiller, load_receipt};
use super::error::{Error, Result};
use super::hold::{Hold, HoldRoom};
use super::lease_checks::LeaseChecks;
use super::leases::check_epoch;
use super::records::{decode, encode, load_execution, load_state, watermark};
use super::worker::{attempt_deadline_ms, attempt_timeout_at_ms};
use crate::ids::bucket_of;
use crate::keys::{Space, TimerKey};
use crate::kv::{KeyValue, Transaction};
use crate::limits::RELEASES_UNCOUNTED_MAX;
use crate::limits::{FIRE_BATCH_MAX, FIRE_BUCKET_READS_CONCURRENT_MAX, FIRE_BUCKETS_PER_CALL_MAX};
use crate::state::{AttemptEvent, ExecutionEvent, execution_transition};

/// Waiting workers a fire may start executions for, per `(namespace, queue)`: a plain value
/// the caller (a node's runtime) reserves before the transaction. A queue's slots are filled
/// in order, as a claim's are; what a fire does not use the caller gives back.
pub type Offer = BTreeMap<(String, String), Vec<ClaimSlot>>;

/// An execution a fire started for a slot of its offer (a *sync match*).
#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    /// The claim, for the worker of the slot.
    pub claim: Claimed,
    /// The slot's index among its queue's slots in the offer.
    pub slot: usize,
}

/// One timer processed by `fire_due`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fired {
    /// Namespace of the execution.
    pub namespace: String,
    /// The execution.
    pub execution_id: String,
    /// What kind of timer it was.
    pub kind: TimerKind,
    /// When the timer was due.
    pub fire_at_ms: i64,
    /// The execution's `execute_at`.
    pub execute_at_ms: i64,
    /// The execution's status afterwards.
    pub status: ExecutionStatus,
    /// The queue it is ready (or running) on.
    pub queue: String,
    /// The execution's next timer, if processing set one (retry back-off, renewed lease, the
    /// lease check of a matched attempt).
    pub next_timer: Option<TimerKey>,
    /// The attempt timed out because of `attempt_timeout_ms` (not a lost lease).
    pub timed_out: bool,
}

/// The result of one `fire_due` call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FireOutcome {
    /// Timers processed (stale ones are removed and not listed).
    pub fired: Vec<Fired>,
    /// Timers quarantined as unprocessable.
    pub quarantined: usize,
    /// Executions started for the offer's slots (also after an unknown commit result: the
    /// retry reads them back from the receipt).
    pub matched: Vec<Match>,
    /// The shard's watermark afterwards.
    pub watermark: i64,
    /// More timers may be due than the limit allowed: call again.
    pub more: bool,
    /// Due executions of held queues left as they were, for a later fire with room
    /// ([`Scheduler::fire_due_holding`]).
    pub held: usize,
    /// The queues of the executions held.
    pub held_queues: Vec<(String, String)>,
}

/// What one due timer turned into, before matching.
pub(super) enum Step {
    /// Stale: its execution is gone or has another timer.
    Stale,
    /// Becomes READY (DUE or RETRY), unless matched.
    Ready(Execution, TimerKey),
    /// A lease check, processed in place.
    LeaseCheck(Execution, TimerKey),
    /// A shared lease check: its members still to check, each as a lease check.
    LeaseChecks(Vec<(Execution, TimerKey)>),
    /// Unprocessable: put aside.
    Quarantine(Unprocessable),
}

/// Executions a fire makes ready, by (namespace, queue), with the timer that fired each.
type ReadyByQueue = BTreeMap<(String, String), Vec<(Execution, TimerKey)>>;

/// A timer that cannot be processed, and why.
pub(super) struct Unprocessable {
    key: Vec<u8>,
    value: Vec<u8>,
    reason: String,
    ns: String,
    id: String,
}

impl Scheduler {
    /// Processes up to `limit` timers of `shard` due at `now_ms`, fenced by `epoch`: a stale
    /// owner gets `OwnershipLost` and changes nothing. Executions made ready on a queue with
    /// slots in `offer` start at once (RUNNING, no ready entry) for those slots, in order.
    pub async fn fire_due(
        &self,
        shard: u32,
        epoch: u64,
        now_ms: i64,
        limit: usize,
        offer: &Offer,
    ) -> Result<FireOutcome> {
        self.fire_due_holding(shard, epoch, now_ms, limit, offer, &Hold::default()).await
    }

    /// [`Self::fire_due`], holding back the due executions of the queues in `hold` beyond what
    /// `offer` starts for them (see [`super::hold`]): they stay due, counted in
    /// [`FireOutcome::held`], and the watermark stays at their bucket.
    pub async fn fire_due_holding(
        &self,
        shard: u32,
        epoch: u64,
        now_ms: i64,
        limit: usize,
        offer: &Offer,
        hold: &Hold,
    ) -> Result<FireOutcome> {
        let limit = limit.clamp(1, FIRE_BATCH_MAX);
        // A receipt for the matched attempts, chosen outside the retry loop: a retry after an
        // unknown commit result hands out what the committed try matched, to the same slots.
        let receipt = &self.ks.claim_receipt(now_ms, self.rng.next_u64(), &self.holder);
        self.db
            .run(|tx| async move {
                if let Some(v) = tx.get(receipt).await? {
                    return replayed(&tx, self, &v, true).await;
                }
                let (owner, wm) = futures_util::future::try_join(
                    check_epoch(&tx, self, Space::Executions, shard, epoch),
                    watermark(&tx, &self.ks, shard),
                )
                .await?;
                let () = owner;
                let mut room = HoldRoom::new(hold, offer, now_ms);
                let (rows, mut out) =
                    self.due_rows(&tx, (shard, wm, now_ms, limit), &mut room).await?;
                out.held_queues = room.map(|r| r.held.into_iter().collect()).unwrap_or_default();
                let keys: Vec<(i64, Bytes)> =
                    rows.iter().map(|(b, kv)| (*b, kv.key.clone())).collect();
                let steps = self.steps(&tx, rows.into_iter().map(|(_, kv)| kv).collect()).await?;
                let steps = within_budget(&tx, &keys, steps, &mut out)?;
                let ready = self.fire_steps(&tx, shard, steps, now_ms, wm, &mut out)?;
                let mut taken = Receipt::new();
                let mut checks = LeaseChecks::default();
                for ((ns, queue), items) in ready {
                    let slots = offer.get(&(ns, queue)).map_or(&[][..], Vec::as_slice);
                    let started = (&mut taken, &mut checks);
                    self.fire_ready(&tx, items, slots, now_ms, wm, &mut out, started)?;
                }
                self.write_lease_checks(&tx, checks)?;
                if !taken.is_empty() {
                    tx.set(receipt, &crate::tuple::pack(&taken))?;
                    // A fire that leaves a receipt clears the expired ones, as a claim does: a
                    // node whose fires meet waiting workers may never claim.
                    let expired = self.ks.claim_receipts_before(now_ms - RECEIPT_KEEP_MS);
                    tx.clear_range(&expired.begin, &expired.end)?;
                }
                if out.watermark != wm {
                    assert!(out.watermark > wm, "a watermark only rises");
                    tx.set(&self.ks.watermark(shard), &out.watermark.to_be_bytes())?;
                }
                Ok(out)
            })
            .await
    }

    /// Processes lease checks and quarantines in place; returns the timers that make their
    /// executions ready, by queue.
    fn fire_steps(
        &self,
        tx: &Transaction,
        shard: u32,
        steps: Vec<Step>,
        now_ms: i64,
        wm: i64,
        out: &mut FireOutcome,
    ) -> Result<ReadyByQueue> {
        let mut ready = ReadyByQueue::new();
        for step in steps {
            match step {
                Step::Stale => {}
                Step::Ready(e, t) => {
                    ready.entry((e.namespace.clone(), e.queue.clone())).or_default().push((e, t))
                }
                Step::LeaseCheck(e, t) => out.fired.push(self.lease_check(tx, e, &t, now_ms, wm)?),
                Step::LeaseChecks(members) => {
                    for (e, t) in members {
                        out.fired.push(self.lease_check(tx, e, &t, now_ms, wm)?);
                    }
                }
                Step::Quarantine(q) => {
                    self.quarantine(tx, shard, now_ms, q)?;
                    out.quarantined += 1;
                }
            }
        }
        Ok(ready)
    }

    /// Makes a queue's due executions READY, or RUNNING for the slots offered, in order.
    #[allow(clippy::too_many_arguments)]
    fn fire_ready(
        &self,
        tx: &Transaction,
        items: Vec<(Execution, TimerKey)>,
        slots: &[ClaimSlot],
        now_ms: i64,
        wm: i64,
        out: &mut FireOutcome,
        (taken, checks): (&mut Receipt, &mut LeaseChecks),
    ) -> Result<()> {
        let mut filler = SlotFiller::new(slots);
        for (mut e, t) in items {
            let before = e.status;
            e.status = execution_transition(e.status(), fire_event(&t))? as i32;
            e.updated_at_ms = now_ms;
            match filler.take() {
                Some((i, slot)) => {
                    // Straight to RUNNING: the status index moves from the stored state, and
                    // no ready entry is written.
                    self.start_attempt(tx, &mut e, Some(before), (slot, checks), now_ms, wm)?;
                    taken.push((e.namespace.clone(), e.id.clone(), e.fencing_token, i as u32));
                    out.fired.push(fired(&e, &t, false));
                    out.matched.push(Match { claim: Claimed::of(e), slot: i });
                }
                None => {
                    self.enqueue_ready(tx, &mut e, now_ms)?;
                    self.save_execution(tx, Some(before), &e)?;
                    assert_eq!(e.status, ExecutionStatus::Ready as i32, "fired: READY");
                    out.fired.push(fired(&e, &t, false));
                }
            }
        }
        Ok(())
    }

    /// The due timer rows of `shard` from its watermark's bucket on, at most `limit`, with the
    /// bucket of each; the outcome starts with the watermark the drained buckets allow. The
    /// buckets are read concurrently, in waves growing from one to
    /// [`FIRE_BUCKET_READS_CONCURRENT_MAX`] (a full first bucket reads nothing more).
    /// Rows `room` holds back are not returned; the watermark stays at the first bucket that
    /// holds any.
    async fn due_rows(
        &self,
        tx: &Transaction,
        (shard, wm, now_ms, limit): (u32, i64, i64, usize),
        room: &mut Option<HoldRoom>,
    ) -> Result<(Vec<(i64, KeyValue)>, FireOutcome)> {
        let now_bucket = bucket_of(now_ms, self.config.bucket_width_ms);
        let last = now_bucket.min(wm.saturating_add(FIRE_BUCKETS_PER_CALL_MAX - 1));
        let mut out = FireOutcome { watermark: wm, ..FireOutcome::default() };
        let mut rows = Vec::new();
        let (mut next, mut wave) = (wm, 1);
        while next <= last {
            let upto = last.min(next + wave - 1);
            let narrow = room.as_ref().and_then(|r| r.narrow_scan);
            let scan = narrow.unwrap_or(self.fair_scan_rows.max(limit - rows.len()));
            let reads = (next..=upto).map(|bucket| {
                let range = self.ks.timers_due(bucket, shard, now_ms).limit(scan + 1);
                async move { Ok::<_, Error>((bucket, tx.get_range(&range, true).await?, range)) }
            });
            for (bucket, got, range) in crate::ops::join::join_in_order(reads).await? {
                let (done, held) =
                    self.take_bucket(tx, got, (scan, limit), &mut rows, bucket, room)?;
                out.held += held;
                if !done {
                    // A narrow fire that held rows stops here and waits for room: what it did
                    // not read is the held queues' backlog, or waits for the next full fire.
                    out.more = narrow.is_none() || out.held == 0 || rows.len() >= limit;
                    return Ok((rows, out));
                }
                // Every timer of a past bucket is due (later ones land in later buckets), so a
                // past bucket is now empty and the watermark may pass it: the whole bucket is a
                // read conflict then (a timer written there meanwhile keeps it from passing).
                // Not past a bucket with held rows, nor any after it.
                if bucket < now_bucket && out.held == 0 {
                    tx.add_read_conflict_range(&range.begin, &range.end)?;
                    out.watermark = bucket + 1;
                }
            }
            next = upto + 1;
            wave = (wave * 2).min(FIRE_BUCKET_READS_CONCURRENT_MAX);
        }
        out.more = last < now_bucket;
        Ok((rows, out))
    }

    /// Takes what is left of `limit` from one bucket's snapshot read of up to `scan` due timers
    /// (shared between namespaces), each taken with a read conflict; `false` if the bucket holds
    /// more than was taken and held back. Rows are held back (counted) only when the read saw
    /// the whole bucket.
    fn take_bucket(
        &self,
        tx: &Transaction,
        mut got: Vec<KeyValue>,
        (scan, limit): (usize, usize),
        rows: &mut Vec<(i64, KeyValue)>,
        bucket: i64,
        room: &mut Option<HoldRoom>,
    ) -> Result<(bool, usize)> {
        let cut = got.len() > scan;
        got.truncate(scan);
        let mut held = 0;
        if let Some(room) = room.as_mut().filter(|r| !cut || r.narrow_scan.is_some()) {
            let fire_at = |key: &[u8]| self.ks.parse_timer(key).ok().map(|t| t.fire_at_ms);
            (got, held) = room.filter(got, fire_at);
        }
        let (picked, skipped) = fair_pick(got, limit - rows.len(), &self.fire_weights);
        for kv in picked {
            tx.add_read_conflict_key(&kv.key)?;
            rows.push((bucket, kv));
        }
        Ok((!cut && !skipped, held))
    }

    /// Decodes due timer rows and loads their executions (concurrently); the caller clears the
    /// timers it processes.
    pub(super) async fn steps(&self, tx: &Transaction, rows: Vec<KeyValue>) -> Result<Vec<Step>> {
        let loads = rows.into_iter().map(|kv| async move {
            let quarantine = |reason: String, ns: String, id: String| {
                Step::Quarantine(Unprocessable {
                    key: kv.key.to_vec(),
                    value: kv.value.to_vec(),
                    reason,
                    ns,
                    id,
                })
            };
            let timer = match self.ks.parse_timer(&kv.key) {
                Ok(t) => t,
                Err(e) => return Ok(quarantine(e.to_string(), String::new(), String::new())),
            };
            let entry: TimerEntry = match decode("timer", &kv.value) {
                Ok(e) => e,
                Err(e) => return Ok(quarantine(e.to_string(), String::new(), timer.execution_id)),
            };
            if timer.kind == TimerKind::LeaseChecks as i32 {
                return Ok(Step::LeaseChecks(self.lease_check_members(tx, &timer, entry).await?));
            }
            let (ns, id) = (entry.namespace.clone(), timer.execution_id.clone());
            // A lease check needs the state only; a due execution may start, and its task
            // carries its spec (input, definition).
            let load = if timer.kind == TimerKind::LeaseCheck as i32 {
                load_state(tx, &self.ks, &ns, &id).await
            } else {
                load_execution(tx, &self.ks, &ns, &id).await
            };
            let e = match load {
                Ok(Some(e)) => e,
                Ok(None) => return Ok(Step::Stale), // execution gone: a stale timer
                Err(Error::Kv(k)) => return Err(Error::Kv(k)),
                Err(e) => return Ok(quarantine(e.to_string(), ns, id)),
            };
            if !names(&e, &timer) {
                return Ok(Step::Stale); // replaced or cleared: the key was stale
            }
            Ok(match TimerKind::try_from(timer.kind) {
                Ok(TimerKind::Due) if e.status == ExecutionStatus::Scheduled as i32 => {
                    Step::Ready(e, timer)
                }
                Ok(TimerKind::Retry) if e.status == ExecutionStatus::RetryWait as i32 => {
                    Step::Ready(e, timer)
                }
                Ok(TimerKind::LeaseCheck) => Step::LeaseCheck(e, timer),
                Ok(kind) => quarantine(
                    format!(
                        "a {} timer of an execution in state {}",
                        kind.as_str_name(),
                        crate::state::status_name(e.status)
                    ),
                    ns,
                    id,
                ),
                Err(_) => quarantine(format!("unknown timer kind {}", timer.kind), ns, id),
            })
        });
        let mut steps = crate::ops::join::join_in_order(loads).await?;
        // The timer of a quarantined step is cleared; its execution keeps pointing at it: drop
        // that reference so nothing waits on a timer that no longer exists.
        for s in &mut steps {
            if let Step::Ready(e, _) | Step::LeaseCheck(e, _) = s {
                e.timer = None;
            }
        }
        Ok(steps)
    }

    /// Puts an unprocessable timer aside: recorded under the quarantine subspace with why.
    fn quarantine(
        &self,
        tx: &Transaction,
        shard: u32,
        now_ms: i64,
        u: Unprocessable,
    ) -> Result<()> {
        let qkey = self.ks.quarantine(Space::Executions, shard, now_ms, &u.key);
        let rec = QuarantineRecord {
            key: u.key,
            value: u.value,
            reason: u.reason,
            at_ms: now_ms,
            execution_id: u.id,
            namespace: u.ns,
        };
        tx.set(&qkey, &encode(&rec))?;
        Ok(())
    }

    /// Processes one lease check and writes its execution; what it did.
    fn lease_check(
        &self,
        tx: &Transaction,
        mut e: Execution,
        t: &TimerKey,
        now_ms: i64,
        wm: i64,
    ) -> Result<Fired> {
        let before = e.status;
        let timed_out = self.on_lease_check(tx, &mut e, now_ms, wm)?;
        e.updated_at_ms = now_ms;
        self.save_execution(tx, Some(before), &e)?;
        Ok(fired(&e, t, timed_out))
    }

    /// The lease check of a RUNNING execution: past its deadline the attempt TIMED_OUT (then
    /// the retry policy, or CANCELLED if asked); otherwise the timer moves to the renewed
    /// deadline. Returns whether the attempt's own timeout (not a lost lease) ended it.
    fn on_lease_check(
        &self,
        tx: &Transaction,
        e: &mut Execution,
        now_ms: i64,
        wm: i64,
    ) -> Result<bool> {
        if e.status != ExecutionStatus::Running as i32 {
            return Ok(false);
        }
        let deadline = attempt_deadline_ms(e);
        if now_ms < deadline {
            self.set_timer_with(tx, e, TimerKind::LeaseCheck, deadline, wm)?;
            return Ok(false);
        }
        let by_timeout = attempt_timeout_at_ms(e).is_some_and(|t| now_ms >= t);
        let unconfirmed = e.worker_id.is_empty() || !e.worker_confirmed;
        if unconfirmed && !by_timeout && e.attempts_released < RELEASES_UNCOUNTED_MAX {
            // Never confirmed by a worker: claimed by a node's dispatch buffer, or started for
            // a waiting worker (by a claim or the fire transaction) whose node died before
            // handing it over. It never ran as far as anyone knows — release it, uncounted.
            self.release_attempt(tx, e, now_ms)?;
            return Ok(false);
        }
        let error = ExecutionError {
            message: if by_timeout {
                format!(
                    "attempt {} exceeded its timeout of {} ms",
                    e.attempt_count, e.attempt_timeout_ms
                )
            } else {
                format!(
                    "attempt {} lost its lease: no heartbeat before {deadline} ms",
                    e.attempt_count
                )
            },
            retryable: true,
            code: if by_timeout { "attempt_timeout" } else { "lease_expired" }.into(),
        };
        self.end_attempt_unsuccessfully(tx, e, AttemptEvent::TimeOut, error, now_ms, wm)?;
        Ok(by_timeout)
    }

    /// Processes one timer of `shard` (an execution supervisor's deadline), fenced by `epoch`
    /// like `fire_due`. `None` if the timer is gone (already processed or replaced) or not due.
    pub async fn fire_timer(
        &self,
        shard: u32,
        epoch: u64,
        timer: &TimerKey,
        now_ms: i64,
    ) -> Result<Option<Fired>> {
        if timer.shard != shard || timer.fire_at_ms > now_ms {
            return Ok(None);
        }
        let key = &self.ks.timer(timer);
        self.db
            .run(|tx| async move {
                let (owner, wm, found) = futures_util::future::try_join3(
                    check_epoch(&tx, self, Space::Executions, shard, epoch),
                    watermark(&tx, &self.ks, shard),
                    async { Ok(tx.get(key).await?) },
                )
                .await?;
                let () = owner;
                let Some(v) = found else { return Ok(None) };
                tx.clear(key)?;
                let rows = vec![KeyValue { key: key.clone().into(), value: v }];
                let Some(step) = self.steps(&tx, rows).await?.pop() else { return Ok(None) };
                match step {
                    Step::Stale => Ok(None),
                    Step::Ready(mut e, t) => {
                        let before = e.status;
                        e.status = execution_transition(e.status(), fire_event(&t))? as i32;
                        e.updated_at_ms = now_ms;
                        self.enqueue_ready(&tx, &mut e, now_ms)?;
                        self.save_execution(&tx, Some(before), &e)?;
                        Ok(Some(fired(&e, &t, false)))
                    }
                    Step::LeaseCheck(e, t) => Ok(Some(self.lease_check(&tx, e, &t, now_ms, wm)?)),
                    Step::LeaseChecks(members) => {
                        // (Execution timers follow lease checks of their own only; a shared one
                        // is fired by its shard's scan. Processed here all the same.)
                        let mut first = None;
                        for (e, t) in members {
                            let f = self.lease_check(&tx, e, &t, now_ms, wm)?;
                            first = first.or(Some(f));
                        }
                        Ok(first)
                    }
                    Step::Quarantine(u) => {
                        self.quarantine(&tx, shard, now_ms, u)?;
                        Ok(None)
                    }
                }
            })
            .await
    }

    /// The timers of `shard` with `after_ms < fire_at <= until_ms`, earliest first, at most
    /// `limit`; `true` if the limit cut the list short. Snapshot reads: a shard owner loads
    /// its window with this, then fires through the fenced paths.
    pub async fn load_timers(
        &self,
        shard: u32,
        after_ms: i64,
        until_ms: i64,
        limit: usize,
    ) -> Result<(Vec<TimerKey>, bool)> {
        let width = self.config.bucket_width_ms;
        self.db
            .run(|tx| async move {
                let wm = watermark(&tx, &self.ks, shard).await?;
                let mut out = Vec::new();
                let first = bucket_of(after_ms, width).max(wm);
                for bucket in first..=bucket_of(until_ms, width) {
                    let left = limit - out.len();
                    let range =
                        self.ks.timers_between(bucket, shard, after_ms, until_ms).limit(left + 1);
                    let rows = tx.get_range(&range, true).await?;
                    for kv in rows.iter().take(left) {
                        out.push(self.ks.parse_timer(&kv.key)?);
                    }
                    if rows.len() > left {
                        return Ok((out, true));
                    }
                }
                Ok((out, false))
            })
            .await
    }
}

/// Due timers one fire transaction looks at by default (a snapshot read) to share its batch between
/// namespaces: a namespace with timers among the first `FAIR_SCAN_ROWS` due timers of a shard
/// gets its weighted share of the batch, however many timers another namespace has ahead of
/// it.
pub const FAIR_SCAN_ROWS: usize = 4_096;

/// Takes `n` of `rows` (in key order: earliest due first), shared between their namespaces by
/// weighted round robin (each round, every namespace with timers left gives up to its weight,
/// earliest first; namespaces in the order of their earliest timer). Returns the rows taken, in
/// key order, and whether any was left.
pub(crate) fn fair_pick(
    rows: Vec<KeyValue>,
    n: usize,
    weights: &BTreeMap<String, u32>,
) -> (Vec<KeyValue>, bool) {
    if rows.len() <= n {
        return (rows, false);
    }
    // Groups by namespace, in order of first appearance; an undecodable entry is its own
    // group (its step quarantines it).
    let mut order: Vec<String> = Vec::new();
    let mut groups: BTreeMap<String, std::collections::VecDeque<usize>> = BTreeMap::new();
    for (i, kv) in rows.iter().enumerate() {
        let ns = decode::<TimerEntry>("timer", &kv.value).map(|e| e.namespace).unwrap_or_default();
        let g = groups.entry(ns.clone()).or_default();
        if g.is_empty() && !order.contains(&ns) {
            order.push(ns);
        }
        g.push_back(i);
    }
    if order.len() == 1 {
        let mut rows = rows;
        rows.truncate(n);
        return (rows, true);
    }
    let mut taken: Vec<usize> = Vec::with_capacity(n);
    while taken.len() < n {
        let before = taken.len();
        for ns in &order {
            let w = weights.get(ns).copied().unwrap_or(1).max(1) as usize;
            let g = groups.get_mut(ns).expect("a group per namespace");
            for _ in 0..w {
                if taken.len() == n {
                    break;
                }
                match g.pop_front() {
                    Some(i) => taken.push(i),
                    None => break,
                }
            }
        }
        if taken.len() == before {
            break;
        }
    }
    taken.sort_unstable();
    let mut keep = vec![false; rows.len()];
    for i in &taken {
        keep[*i] = true;
    }
    let picked = rows.into_iter().zip(keep).filter_map(|(kv, k)| k.then_some(kv)).collect();
    (picked, true)
}

impl Step {
    /// What processing it writes at most.
    fn bytes(&self) -> usize {
        match self {
            Step::Stale => 0,
            Step::Ready(e, _) | Step::LeaseCheck(e, _) => budget::execution_bytes(e),
            Step::LeaseChecks(members) => {
                members.iter().map(|(e, _)| budget::execution_bytes(e)).sum()
            }
            Step::Quarantine(u) => {
                u.key.len() + u.value.len() + u.reason.len() + crate::limits::ITEM_OVERHEAD_BYTES
            }
        }
    }
}

/// Keeps the steps (in timer order, `rows` giving each one's bucket and timer key) whose writes
/// fit the transaction's budget, clearing their timers; a timer left out stays for the next
/// call (`more`), the watermark kept at or below its bucket.
fn within_budget(
    tx: &Transaction,
    rows: &[(i64, Bytes)],
    steps: Vec<Step>,
    out: &mut FireOutcome,
) -> Result<Vec<Step>> {
    assert_eq!(rows.len(), steps.len(), "a step per timer row");
    let mut used = tx.approximate_size();
    let mut kept = Vec::with_capacity(steps.len());
    for ((bucket, key), step) in rows.iter().zip(steps) {
        let bytes = step.bytes() + key.len();
        if !kept.is_empty() && !budget::fits(used, bytes) {
            out.more = true;
            out.watermark = out.watermark.min(*bucket);
            break;
        }
        used += bytes;
        tx.clear(key)?;
        kept.push(step);
    }
    Ok(kept)
}

/// The outcome of a fire (or pre-fire) retried after an unknown commit result that finds its
/// receipt: what the committed try started (`more`: call again for the rest).
pub(super) async fn replayed(
    tx: &Transaction,
    sched: &Scheduler,
    receipt: &[u8],
    more: bool,
) -> Result<FireOutcome> {
    let matched = load_receipt(tx, sched, receipt).await?;
    let matched = matched.into_iter().map(|(claim, slot)| Match { claim, slot }).collect();
    Ok(FireOutcome { matched, more, ..FireOutcome::default() })
}

/// Whether the execution's timer is `t` (else the key is stale).
fn names(e: &Execution, t: &TimerKey) -> bool {
    e.timer
        .as_ref()
        .is_some_and(|r| r.fire_at_ms == t.fire_at_ms && r.kind == t.kind && r.bucket == t.bucket)
}

/// The event a DUE or RETRY timer applies.
pub(super) fn fire_event(t: &TimerKey) -> ExecutionEvent {
    if t.kind == TimerKind::Due as i32 { ExecutionEvent::Fire } else { ExecutionEvent::RetryDue }
}

pub(super) fn fired(e: &Execution, t: &TimerKey, timed_out: bool) -> Fired {
    Fired {
        namespace: e.namespace.clone(),
        execution_id: e.id.clone(),
        kind: TimerKind::try_from(t.kind).unwrap_or(TimerKind::Unspecified),
        fire_at_ms: t.fire_at_ms,
        execute_at_ms: e.execute_at_ms,
        status: e.status(),
        queue: e.queue.clone(),
        next_timer: super::timer_of(e),
        timed_out,
    }
}
