//! The dispatcher's state, the events it takes and the actions it returns (the types its
//! pure core — [`super::core`], [`super::polls`], [`super::streams`], [`super::buffer`] —
//! works on; a leaf).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use kairos_layer::ops::Error;
use kairos_layer::ops::claim::{ClaimOutcome, ClaimSlot, Claimed};
use kairos_layer::ops::retry::doubling_ms;

use crate::runtime::matchmaker::Matchmaker;
use crate::runtime::messages::{Grant, QueueKey};

/// A waiting worker arriving: a poll or a worker stream (`credits` = the poll's max).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// The id the dispatcher gave it.
    pub id: u64,
    /// Its queue.
    pub queue: QueueKey,
    /// The worker.
    pub worker_id: String,
    /// The lease it asks for (the definition's when `None`).
    pub lease_ms: Option<u64>,
    /// Executions it can take now.
    pub credits: usize,
}

/// What happened, as the dispatcher's core sees it.
#[derive(Debug)]
pub enum Event {
    /// A worker polls, waiting up to the given time (ms) for work.
    Poll(Waiting, u64),
    /// A worker stream opened.
    Open(Waiting),
    /// A worker stream has more free slots.
    Credits(u64, usize),
    /// A worker stream closed.
    Close(u64),
    /// A queue may have new ready work.
    Ready(QueueKey),
    /// Time for the periodic claim of a queue served without a watch.
    Reclaim(QueueKey),
    /// A fire started these executions for these waiting workers.
    Matched(Vec<(Claimed, u64)>),
    /// Claimed executions without a worker (a worker stream let go of them).
    Orphans(Vec<Claimed>),
    /// The actor could not hand these to the poll or stream `id`: it is gone.
    Undelivered(u64, Vec<Claimed>),
    /// A claim for these grants of a queue finished.
    Claimed(QueueKey, Vec<Grant>, Result<ClaimOutcome, Error>),
    /// A claim for a queue's dispatch buffer finished.
    Buffered(QueueKey, Result<ClaimOutcome, Error>),
    /// A poll's wait ran out.
    Expire(u64),
    /// A poll that got work stops lingering.
    Flush(u64),
    /// A watch on a queue's ready signals ended.
    WatchEnded(QueueKey),
    /// Executions of a queue left flight.
    Finished(QueueKey, usize),
    /// Time to release buffered executions that waited too long.
    AgeBuffers,
    /// Stop serving.
    Drain,
}

/// Something to come back as an event later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Timer {
    /// A poll's wait runs out.
    Expire(u64),
    /// A lingering poll answers.
    Flush(u64),
    /// Buffers are checked for stale items.
    AgeBuffers,
    /// A queue is looked at again (after a failed claim).
    Retry(QueueKey),
    /// A queue served without a watch is claimed from again.
    Reclaim(QueueKey),
}

/// What the actor does.
#[derive(Debug)]
pub enum Action {
    /// Answer poll `id` with these executions (the poll ends).
    Answer(u64, Vec<Claimed>),
    /// Hand these executions to worker stream `id`.
    Send(u64, Vec<Claimed>),
    /// Let go of worker stream `id` (it ends).
    EndStream(u64),
    /// Claim for these grants of a queue, as these claim slots.
    Claim(QueueKey, Vec<Grant>, Vec<ClaimSlot>),
    /// Claim ahead for a queue's dispatch buffer.
    Refill(QueueKey, Vec<ClaimSlot>),
    /// Watch a queue's ready signals.
    Watch(QueueKey),
    /// Give executions back: READY again at once, the attempts not counted.
    Release(Vec<Claimed>),
    /// Come back with this after a while.
    Later(Duration, Timer),
    /// A claim failed, `failures` in a row (for the log; the retry is planned).
    ClaimFailed(QueueKey, u32, Error),
    /// Work of another queue was about to go to waiting worker `id` (kept back; a bug).
    Misrouted(u64, QueueKey, usize),
    /// Waiting workers have room worth a fire: wake a shard owner holding executions for them.
    Room,
}

/// How long a poll that got work waits for more reserved for it before answering.
pub const POLL_LINGER: Duration = Duration::from_millis(2);
/// How often the buffers are checked for items waiting too long.
pub const BUFFER_AGE_CHECK: Duration = Duration::from_secs(1);

/// The pause before retrying a claim after `failures` failures in a row: 100 ms doubling, at
/// most 5 s.
pub fn claim_retry_pause(failures: u32) -> Duration {
    Duration::from_millis(doubling_ms(100, failures.saturating_sub(1), 5_000))
}

/// Whether a claimed execution still has at least half its lease: enough for its worker's
/// first heartbeat (at a third of the lease) to land in time.
pub fn fresh(c: &Claimed, now: i64) -> bool {
    let left = c.execution.lease_expires_at_ms - now;
    left.saturating_mul(2) >= c.execution.lease_ms as i64
}

/// The dispatcher's state.
#[derive(Debug, Default)]
pub struct Core {
    pub(super) next_id: u64,
    pub(super) polls: BTreeMap<u64, Poll>,
    pub(super) streams: BTreeMap<u64, Stream>,
    /// Queues with a claim in flight, and whether ready work was hinted meanwhile.
    pub(super) claiming: BTreeMap<QueueKey, bool>,
    /// Queues that may hold READY work (hinted, or not known to be empty).
    pub(super) maybe_ready: BTreeSet<QueueKey>,
    /// Queues seen so far (a first waiter claims at once: work may be ready from before).
    pub(super) known: BTreeSet<QueueKey>,
    pub(super) watching: BTreeSet<QueueKey>,
    /// Queues with waiting workers but no watch (the node holds as many as it may): a periodic
    /// claim serves them instead, one timer each.
    pub(super) unwatched: BTreeSet<QueueKey>,
    /// Most queues watched at once (the node's watch bound over the ready partitions).
    pub(super) watched_max: usize,
    pub(super) buffers: BTreeMap<QueueKey, Buffer>,
    pub(super) draining: bool,
    /// Claims failed in a row (any queue): the retry pause doubles with it, and only the 1st,
    /// 2nd, 4th… failure is logged.
    pub(super) claim_failures: u32,
    pub(super) poll_wait_max_ms: u64,
}

/// One application of an event: the core, the ledger, the time, and the actions so far.
pub(super) struct Apply<'a> {
    pub(super) core: &'a mut Core,
    pub(super) ledger: &'a Matchmaker,
    pub(super) now: i64,
    pub(super) out: Vec<Action>,
}

/// A poll waiting for work.
#[derive(Debug)]
pub(super) struct Poll {
    pub(super) queue: QueueKey,
    pub(super) max: usize,
    /// Work delivered and not yet answered.
    pub(super) got: Vec<Claimed>,
    pub(super) lingering: bool,
}

/// A worker stream.
#[derive(Debug)]
pub(super) struct Stream {
    pub(super) queue: QueueKey,
    /// The worker's slots as far as the node can tell: the credits it opened the stream with,
    /// raised to the most it has held at once. A stream may open with every slot busy
    /// (credits 0: a worker reconnecting while its tasks run) and get its slots back later as
    /// credits; sized by its opening credits alone, its queue's dispatch buffer would aim at
    /// nothing and never claim (simulation seed 437).
    pub(super) capacity: usize,
}

/// Executions claimed ahead of demand for a queue's worker streams.
#[derive(Debug, Default)]
pub(super) struct Buffer {
    pub(super) items: VecDeque<Claimed>,
    pub(super) refilling: usize,
    /// A ready hint came while a refill was in flight.
    pub(super) again: bool,
    /// The buffer's slot in the ledger: fire transactions start executions for it
    /// (unassigned) when no worker waits, so they skip the ready queue.
    pub(super) slot: Option<u64>,
}
