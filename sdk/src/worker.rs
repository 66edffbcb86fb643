//! The worker: one `Work` stream per worker to its node. It opens the stream for its queue with
//! as many credits as free slots; the node pushes tasks (never more than the credits it holds);
//! the worker runs each with the handler registered for its definition, heartbeats running
//! tasks before their lease runs out (the due heartbeats together, up to [`MESSAGE_ITEMS_MAX`]
//! per message), hands the handler a cancellation signal (a client asked to stop, or the lease
//! was lost), and sends results — many per message (up to the same bound), each with the
//! credit it frees. Results are acknowledged on the stream; on
//! a broken stream the worker reconnects and sends the unacknowledged ones again (results are
//! idempotent), while running tasks go on. `command` and `http` definitions run with the
//! generic executors.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kairos_proto::v1::{
    ExecutionError, Success, TaskRef, TaskResult, WorkOpen, WorkRequest, WorkResponse, task_result,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::client::Client;
use crate::error::Error;
use crate::limits::{MESSAGE_ITEMS_MAX, RESULTS_MESSAGE_BYTES_MAX, RESULTS_PER_MESSAGE_MAX};

/// A claimed execution handed to a handler.
#[derive(Debug, Clone)]
pub struct Task {
    /// The task as the node sent it (execution id, inputs, attempt number, fencing token…).
    pub task: kairos_proto::v1::Task,
    /// The definition's `execution` block (JSON).
    pub definition_execution: serde_json::Value,
    /// Becomes `true` when the handler should stop: cancellation requested, or the lease lost.
    pub cancelled: watch::Receiver<bool>,
}

impl Task {
    /// The inputs as JSON.
    pub fn inputs(&self) -> serde_json::Value {
        serde_json::from_str(&self.task.inputs_json).unwrap_or(serde_json::Value::Null)
    }
    /// The execution's id.
    pub fn execution_id(&self) -> &str {
        &self.task.execution_id
    }
    /// This attempt's number (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.task.attempt
    }
    /// The definition's name (from `registry://jobs/<name>`).
    pub fn definition_name(&self) -> &str {
        definition_name(&self.task.definition_uri)
    }
}

fn definition_name(uri: &str) -> &str {
    uri.strip_prefix("registry://jobs/").unwrap_or(uri)
}

/// A handler's failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskError {
    /// What went wrong.
    pub message: String,
    /// Whether another attempt may succeed.
    pub retryable: bool,
    /// A machine-readable code (e.g. `exit:3`).
    pub code: String,
}

impl TaskError {
    /// A failure another attempt may fix.
    pub fn retryable(message: impl Into<String>) -> Self {
        TaskError { message: message.into(), retryable: true, code: String::new() }
    }
    /// A failure no retry will fix.
    pub fn permanent(message: impl Into<String>) -> Self {
        TaskError { message: message.into(), retryable: false, code: String::new() }
    }
    /// The handler stopped because the task was cancelled (a client asked, or the lease was
    /// lost): not retried; the execution ends CANCELLED when a client asked for it.
    pub fn cancelled() -> Self {
        TaskError { message: "cancelled".into(), retryable: false, code: "cancelled".into() }
    }
}

/// A handler's future: the output JSON (or empty) or a failure.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<serde_json::Value, TaskError>> + Send>>;

/// Runs tasks of one definition.
pub trait Handler: Send + Sync + 'static {
    /// Runs one task.
    fn run(&self, task: Task) -> HandlerFuture;
}

impl<F, Fut> Handler for F
where
    F: Fn(Task) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<serde_json::Value, TaskError>> + Send + 'static,
{
    fn run(&self, task: Task) -> HandlerFuture {
        Box::pin(self(task))
    }
}

/// A worker for one queue.
pub struct Worker {
    client: Client,
    queue: String,
    worker_id: String,
    concurrency: usize,
    lease_ms: u64,
    handlers: BTreeMap<String, Arc<dyn Handler>>,
    fallback: Option<Arc<dyn Handler>>,
}

/// `items` in messages' worth: at most [`MESSAGE_ITEMS_MAX`] each, none empty.
fn chunks<T>(mut items: Vec<T>) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    while items.len() > MESSAGE_ITEMS_MAX {
        let rest = items.split_off(MESSAGE_ITEMS_MAX);
        out.push(std::mem::replace(&mut items, rest));
    }
    if !items.is_empty() {
        out.push(items);
    }
    out
}

/// How often the worker looks for heartbeats that are due.
const HEARTBEAT_TICK: Duration = Duration::from_millis(100);
/// How long a graceful shutdown waits for acknowledgements of the last results.
const SHUTDOWN_ACK_WAIT: Duration = Duration::from_secs(10);

/// A running task, as the stream loop sees it.
struct Running {
    token: u64,
    next_beat: Instant,
    lease_ms: u64,
    cancel: watch::Sender<bool>,
}

impl Worker {
    /// A worker of `queue` named `worker_id`, running at most 16 tasks at once.
    pub fn new(client: Client, queue: impl Into<String>, worker_id: impl Into<String>) -> Self {
        Worker {
            client,
            queue: queue.into(),
            worker_id: worker_id.into(),
            concurrency: 16,
            lease_ms: 0,
            handlers: BTreeMap::new(),
            fallback: None,
        }
    }

    /// At most `n` tasks at once.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.clamp(1, 100_000);
        self
    }

    /// The lease each task gets (default: the definition's).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Runs tasks of definition `name` with `handler`.
    pub fn handle(mut self, name: impl Into<String>, handler: impl Handler) -> Self {
        self.handlers.insert(name.into(), Arc::new(handler));
        self
    }

    /// Runs tasks of any other definition with `handler` (e.g. the generic executors).
    pub fn fallback(mut self, handler: impl Handler) -> Self {
        self.fallback = Some(Arc::new(handler));
        self
    }

    /// Takes tasks and runs them until `shutdown` becomes true; then takes no more, lets the
    /// running tasks finish and report (graceful shutdown).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) -> Result<(), Error> {
        let this = Arc::new(self);
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<TaskResult>();
        let mut running: BTreeMap<String, Running> = BTreeMap::new();
        // Results sent and not yet acknowledged: sent again on a new stream.
        let mut unacked: BTreeMap<String, TaskResult> = BTreeMap::new();
        let mut stopping = false;
        let mut backoff = Duration::from_millis(100);
        loop {
            stopping |= *shutdown.borrow();
            if stopping && running.is_empty() && unacked.is_empty() {
                return Ok(());
            }
            let (out_tx, out_rx) = mpsc::channel::<WorkRequest>(1_024);
            let credits = if stopping { 0 } else { this.concurrency.saturating_sub(running.len()) };
            let open = WorkOpen {
                namespace: this.client.namespace().to_string(),
                queue: this.queue.clone(),
                worker_id: this.worker_id.clone(),
                credits: u32::try_from(credits).unwrap_or(u32::MAX),
                lease_ms: this.lease_ms,
            };
            // The unacknowledged results again, chunked by count and bytes (the
            // node refuses more than MESSAGE_ITEMS_MAX); the channel holds 1,024 messages.
            let mut resend = result_chunks(unacked.values().cloned().collect()).into_iter();
            let first = WorkRequest {
                open: Some(open),
                results: resend.next().unwrap_or_default(),
                ..WorkRequest::default()
            };
            let _ = out_tx.try_send(first);
            for results in resend {
                let _ = out_tx.try_send(WorkRequest { results, ..WorkRequest::default() });
            }
            let stream = tokio_stream_of(out_rx);
            let mut workers = this.client.workers();
            let opened = tokio::time::timeout(Duration::from_secs(10), workers.work(stream)).await;
            let mut inbound = match opened {
                Ok(Ok(r)) => r.into_inner(),
                // A bad setting, or a key the node refuses (missing, revoked, without the
                // `worker` scope for this namespace): retrying cannot help.
                Ok(Err(s))
                    if matches!(
                        s.code(),
                        tonic::Code::InvalidArgument
                            | tonic::Code::Unauthenticated
                            | tonic::Code::PermissionDenied
                    ) =>
                {
                    return Err(Error::Status(s));
                }
                // The node refused this worker's certificate (mutual TLS): a setting to fix.
                Ok(Err(s)) if Error::Status(s.clone()).is_tls_failure() => {
                    return Err(Error::Status(s));
                }
                Ok(Err(_)) | Err(_) => {
                    // Node restarting or unreachable: running tasks go on; try again.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    continue;
                }
            };
            backoff = Duration::from_millis(100);
            // Every running task beats at the first tick of the new stream: a node restarted
            // after a crash releases the attempts no worker has confirmed a few seconds after
            // it starts, and a task's first beat may have gone down with the old stream.
            let now = Instant::now();
            for r in running.values_mut() {
                r.next_beat = now;
            }
            let mut tick = tokio::time::interval(HEARTBEAT_TICK);
            let ack_deadline = Instant::now() + SHUTDOWN_ACK_WAIT;
            let broken = loop {
                if stopping && running.is_empty() && unacked.is_empty() {
                    return Ok(());
                }
                if stopping && running.is_empty() && Instant::now() > ack_deadline {
                    eprintln!(
                        "kairos worker: {} results unacknowledged at shutdown",
                        unacked.len()
                    );
                    return Ok(());
                }
                tokio::select! {
                    msg = inbound.message() => match msg {
                        Ok(Some(m)) => this.on_response(m, &mut running, &mut unacked, &done_tx),
                        Ok(None) | Err(_) => break true,
                    },
                    Some(first) = done_rx.recv() => {
                        let mut results = vec![first];
                        while results.len() < MESSAGE_ITEMS_MAX {
                            let Ok(r) = done_rx.try_recv() else { break };
                            results.push(r);
                        }
                        for r in &results {
                            running.remove(&r.execution_id);
                            unacked.insert(r.execution_id.clone(), r.clone());
                        }
                        let mut failed = false;
                        for results in result_chunks(results) {
                            let credits = if stopping { 0 } else { results.len() as u32 };
                            let m = WorkRequest { credits, results, ..WorkRequest::default() };
                            failed |= out_tx.send(m).await.is_err();
                        }
                        if failed {
                            break true;
                        }
                    }
                    _ = tick.tick() => {
                        let now = Instant::now();
                        let due: Vec<TaskRef> = running
                            .iter_mut()
                            .filter(|(_, r)| r.next_beat <= now)
                            .map(|(id, r)| {
                                // Not again before the answer could come back.
                                r.next_beat = now + Duration::from_millis(r.lease_ms / 3).max(HEARTBEAT_TICK);
                                TaskRef { execution_id: id.clone(), fencing_token: r.token }
                            })
                            .collect();
                        let mut gone = false;
                        for heartbeats in chunks(due) {
                            let m = WorkRequest { heartbeats, ..WorkRequest::default() };
                            gone |= out_tx.send(m).await.is_err();
                        }
                        if gone {
                            break true;
                        }
                    }
                    r = shutdown.changed(), if !stopping => {
                        // A dropped sender stops the worker too.
                        if r.is_err() || *shutdown.borrow() {
                            stopping = true;
                        }
                    }
                }
            };
            if broken && !(stopping && running.is_empty() && unacked.is_empty()) {
                tokio::time::sleep(backoff).await;
            }
        }
    }

    fn on_response(
        self: &Arc<Self>,
        m: WorkResponse,
        running: &mut BTreeMap<String, Running>,
        unacked: &mut BTreeMap<String, TaskResult>,
        done: &mpsc::UnboundedSender<TaskResult>,
    ) {
        for ack in m.acks {
            unacked.remove(&ack.execution_id);
            let fenced = ack.code == tonic::Code::FailedPrecondition as i32;
            if ack.code != 0 && !fenced {
                eprintln!("kairos worker: result of {} refused: {}", ack.execution_id, ack.message);
            }
        }
        for hb in m.heartbeats {
            if let Some(r) = running.get_mut(&hb.execution_id) {
                if hb.code != 0 || hb.cancel_requested {
                    // Cancelled by a client, or the lease is no longer ours: stop the handler.
                    let _ = r.cancel.send(true);
                }
                if hb.code == 0 {
                    let third = Duration::from_millis(hb.lease_remaining_ms / 3);
                    r.next_beat = Instant::now() + third.max(HEARTBEAT_TICK);
                }
            }
        }
        for t in m.tasks {
            let (cancel_tx, cancel_rx) = watch::channel(false);
            running.insert(
                t.execution_id.clone(),
                Running {
                    token: t.fencing_token,
                    // The first heartbeat at the next tick: it tells the node the task reached
                    // this worker (until then a lost lease is released uncounted, as if the
                    // hand-over had failed). A task done within the tick sends its result instead.
                    next_beat: Instant::now() + HEARTBEAT_TICK,
                    lease_ms: t.lease_ms.max(1_000),
                    cancel: cancel_tx,
                },
            );
            let this = self.clone();
            let done = done.clone();
            tokio::spawn(async move {
                let r = this.run_task(t, cancel_rx).await;
                let _ = done.send(r);
            });
        }
    }

    async fn run_task(
        &self,
        t: kairos_proto::v1::Task,
        cancelled: watch::Receiver<bool>,
    ) -> TaskResult {
        let name = definition_name(&t.definition_uri).to_string();
        let handler = self.handlers.get(&name).cloned().or_else(|| self.fallback.clone());
        let (id, token, ns) = (t.execution_id.clone(), t.fencing_token, t.namespace.clone());
        let result = match handler {
            Some(h) => {
                let task = Task {
                    definition_execution: serde_json::from_str(&t.definition_execution_json)
                        .unwrap_or(serde_json::Value::Null),
                    task: t,
                    cancelled,
                };
                h.run(task).await
            }
            None => Err(TaskError::permanent(format!(
                "no handler for definition {name:?} on worker {}",
                self.worker_id
            ))),
        };
        let outcome = match result {
            Ok(output) => task_result::Outcome::Success(Success {
                output_json: if output.is_null() { String::new() } else { output.to_string() },
                output_reference: String::new(),
            }),
            Err(e) => task_result::Outcome::Failure(ExecutionError {
                message: e.message,
                retryable: e.retryable,
                code: e.code,
            }),
        };
        TaskResult { execution_id: id, fencing_token: token, outcome: Some(outcome), namespace: ns }
    }
}

/// The outbound half of a `Work` stream.
fn tokio_stream_of(
    rx: mpsc::Receiver<WorkRequest>,
) -> impl tonic::codegen::tokio_stream::Stream<Item = WorkRequest> + Send + 'static {
    tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Results split into messages of at most [`RESULTS_PER_MESSAGE_MAX`] results and
/// [`RESULTS_MESSAGE_BYTES_MAX`] bytes (a result alone may pass it), in order.
fn result_chunks(results: Vec<TaskResult>) -> Vec<Vec<TaskResult>> {
    let mut out: Vec<Vec<TaskResult>> = Vec::new();
    let mut bytes = 0;
    for r in results {
        let size = prost::Message::encoded_len(&r) + 8;
        match out.last_mut() {
            Some(last)
                if last.len() < RESULTS_PER_MESSAGE_MAX
                    && bytes + size <= RESULTS_MESSAGE_BYTES_MAX =>
            {
                bytes += size;
                last.push(r);
            }
            _ => {
                bytes = size;
                out.push(vec![r]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_hold_at_most_a_messages_worth() {
        let sizes = |n: usize| chunks((0..n).collect()).iter().map(Vec::len).collect::<Vec<_>>();
        assert!(sizes(0).is_empty());
        assert_eq!(sizes(1), [1]);
        assert_eq!(sizes(MESSAGE_ITEMS_MAX), [MESSAGE_ITEMS_MAX]);
        assert_eq!(sizes(2 * MESSAGE_ITEMS_MAX + 1), [MESSAGE_ITEMS_MAX, MESSAGE_ITEMS_MAX, 1]);
        let all: Vec<usize> = chunks((0..2_500).collect()).concat();
        assert_eq!(all, (0..2_500).collect::<Vec<_>>(), "in order, none lost");
    }
}
