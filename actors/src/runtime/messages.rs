//! What the node's actors say to each other: every actor's message type and the plain values
//! they carry. A leaf — it names the layer's types and nothing of this crate — so every actor,
//! the context and the node facade can import it without importing each other.

use kairos_layer::keys::{Space, TimerKey};
use kairos_layer::ops::Error;
use kairos_layer::ops::claim::{ClaimOutcome, Claimed};
use kairos_layer::ops::cron::owner::CronDue;
use kairos_layer::ops::cron::round::RoundReport;
use kairos_layer::ops::fire::{FireOutcome, Fired};
use ractor::RpcReplyPort;
use tokio::sync::mpsc;

/// (namespace, queue).
pub type QueueKey = (String, String);

/// A waiting worker's slot, reserved for one execution (by a claim or a fire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The worker (empty: a queue's dispatch buffer).
    pub worker_id: String,
    /// The lease its attempts get (the definition's when `None`).
    pub lease_ms: Option<u64>,
    /// The matchmaker's handle of the waiting worker (which poll or stream gets the work).
    pub slot: u64,
}

/// A worker's long poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerPoll {
    /// Namespace.
    pub namespace: String,
    /// Queue.
    pub queue: String,
    /// The polling worker.
    pub worker_id: String,
    /// Most executions wanted (1 to `CLAIM_BATCH_MAX`).
    pub max: usize,
    /// Lease per execution (the definition's when `None`).
    pub lease_ms: Option<u64>,
    /// How long to wait for work.
    pub wait_ms: u64,
}

/// The reply to a poll.
pub type PollReply = Result<Vec<Claimed>, Error>;

/// Where a worker stream's tasks go.
pub type TaskSender = mpsc::UnboundedSender<Vec<Claimed>>;

/// A worker stream opening (the `Work` call).
#[derive(Debug)]
pub struct WorkerStream {
    /// Namespace.
    pub namespace: String,
    /// Queue.
    pub queue: String,
    /// The worker.
    pub worker_id: String,
    /// Lease per execution (the definition's when `None`).
    pub lease_ms: Option<u64>,
    /// Free slots to start with.
    pub credits: usize,
    /// Where its tasks go.
    pub tasks: TaskSender,
}

/// Messages of the dispatcher.
#[derive(Debug)]
pub enum DispatcherMsg {
    /// A worker polls.
    Poll(WorkerPoll, RpcReplyPort<PollReply>),
    /// A worker stream opens; the reply is its id.
    Open(WorkerStream, RpcReplyPort<u64>),
    /// A worker stream has more free slots.
    Credits(u64, usize),
    /// A worker stream closed.
    Close(u64),
    /// A queue may have new ready work.
    Ready(QueueKey),
    /// The periodic claim of a queue served without a watch (past the node's watch bound).
    Reclaim(QueueKey),
    /// A fire transaction started these executions for the waiting workers of these slots.
    Matched(Vec<(Claimed, u64)>),
    /// Claimed executions without a worker.
    Orphans(Vec<Claimed>),
    /// A claim for the listed grants of a queue finished.
    Claimed(QueueKey, Vec<Grant>, Result<ClaimOutcome, Error>),
    /// A claim for a queue's dispatch buffer finished.
    Buffered(QueueKey, Result<ClaimOutcome, Error>),
    /// A poll's wait ran out.
    Expire(u64),
    /// A poll that got work stops lingering.
    Flush(u64),
    /// A watch on a queue's ready signals ended.
    WatchEnded(QueueKey),
    /// Executions of a queue left flight (results, releases).
    Finished(QueueKey, usize),
    /// Release dispatch-buffer items that waited too long.
    AgeBuffers,
    /// Stop serving: answer waiting polls with no work, close worker streams.
    Drain(RpcReplyPort<()>),
}

/// Messages of a shard owner.
#[derive(Debug)]
pub enum OwnerMsg {
    /// Time to re-evaluate.
    Wake,
    /// A timer was written on this node.
    Hint(TimerKey),
    /// A `fire_due` at the given time finished (its effects are done).
    Fired(Result<FireOutcome, Error>, i64),
    /// A pre-fire finished (its effects are done).
    Prefired(Result<FireOutcome, Error>),
    /// A window load up to the given time finished.
    Loaded(Result<(Vec<TimerKey>, bool), Error>, i64),
    /// The node's workers have room: fire the executions the last fire held back.
    Room,
}

/// Messages of an execution timer.
#[derive(Debug)]
pub enum TimerMsg {
    /// The deadline may have passed.
    Wake,
    /// The execution has a newer timer.
    Reschedule(TimerKey),
    /// `fire_timer` finished.
    Fired(Box<Result<Option<Fired>, Error>>),
}

/// Messages of a cron shard owner.
#[derive(Debug)]
pub enum CronMsg {
    /// Time to re-evaluate.
    Wake,
    /// A client changed a job on this node: look at it now.
    Hint {
        /// Namespace.
        namespace: String,
        /// The job.
        cron_job_id: String,
    },
    /// A scan finished.
    Scanned(Result<Vec<CronDue>, Error>),
    /// A round of a job (namespace, id) finished.
    Done((String, String), Result<RoundReport, Error>),
}

/// A partition of a space.
pub type PartitionId = (Space, u32);

/// What a lease round did.
#[derive(Debug, Default)]
pub struct RoundOutcome {
    /// Partitions acquired: (partition, epoch, lease expiry).
    pub acquired: Vec<(PartitionId, u64, i64)>,
    /// Partitions renewed: (partition, lease expiry).
    pub renewed: Vec<(PartitionId, i64)>,
    /// Partitions whose lease was lost.
    pub lost: Vec<PartitionId>,
    /// Partitions given up.
    pub released: Vec<PartitionId>,
    /// Other nodes found dead (no heartbeat for `node_ttl_ms`) recently enough that their claim
    /// receipts may still list attempts: (node id, when that run started).
    pub dead_nodes: Vec<(String, i64)>,
}

/// Messages of the lease manager.
#[derive(Debug)]
pub enum LeaseMsg {
    /// Stop the workers of lapsed leases; run a round unless one is running. Sent every
    /// `shard_lease_ms / 3`.
    Tick,
    /// A round finished.
    Round(Result<RoundOutcome, Error>),
    /// Stop every partition actor and release every lease.
    Drain(RpcReplyPort<()>),
}

/// The children of a node's supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Child {
    /// The shard lease manager (and, below it, the shard owners).
    Leases,
    /// The dispatcher.
    Dispatcher,
}

/// Messages of the node supervisor.
#[derive(Debug)]
pub enum SupervisorMsg {
    /// Start (or restart) a child.
    Start(Child),
    /// Drain the node.
    Drain(RpcReplyPort<()>),
}
