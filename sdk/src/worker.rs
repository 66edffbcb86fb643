//! The worker: polls a queue, runs handlers registered by definition name with a concurrency
//! limit, heartbeats each attempt before its lease runs out, hands the handler a cancellation
//! signal (a client asked to stop, or the lease was lost), and reports results fenced by the
//! attempt's token — retryable or permanent failures. `command` definitions run a process.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kairos_proto::storage::v1::{Attempt, Execution, ExecutionError};
use kairos_proto::v1::{CompleteRequest, FailRequest, HeartbeatRequest, PollRequest};
use tokio::sync::{Semaphore, watch};

use crate::client::{Client, Error};

/// A claimed execution handed to a handler.
#[derive(Debug, Clone)]
pub struct Task {
    /// The execution (inputs in `input_json`).
    pub execution: Execution,
    /// This attempt (its fencing token is what results must carry).
    pub attempt: Attempt,
    /// The definition's `execution` block (JSON).
    pub definition_execution: serde_json::Value,
    /// Becomes `true` when the handler should stop: cancellation requested, or the lease lost.
    pub cancelled: watch::Receiver<bool>,
}

impl Task {
    /// The inputs as JSON.
    pub fn inputs(&self) -> serde_json::Value {
        serde_json::from_slice(&self.execution.input_json).unwrap_or(serde_json::Value::Null)
    }
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
    handlers: BTreeMap<String, Arc<dyn Handler>>,
    fallback: Option<Arc<dyn Handler>>,
}

impl Worker {
    /// A worker of `queue` named `worker_id`, running at most 16 tasks at once.
    pub fn new(client: Client, queue: impl Into<String>, worker_id: impl Into<String>) -> Self {
        Worker {
            client,
            queue: queue.into(),
            worker_id: worker_id.into(),
            concurrency: 16,
            handlers: BTreeMap::new(),
            fallback: None,
        }
    }

    /// At most `n` tasks at once.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
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

    /// Polls and runs tasks until `shutdown` becomes true; then stops polling and lets the
    /// running tasks finish and report (graceful shutdown).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) -> Result<(), Error> {
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let this = Arc::new(self);
        while !*shutdown.borrow() {
            // Poll only with a free slot, for as many tasks as there are free slots.
            drop(slots.clone().acquire_owned().await.expect("semaphore open"));
            let free = slots.available_permits().max(1);
            let req = PollRequest {
                namespace: this.client.namespace().to_string(),
                queue: this.queue.clone(),
                worker_id: this.worker_id.clone(),
                max_executions: free.min(256) as u32,
                lease_ms: 0,
                wait_ms: 5_000,
            };
            let mut workers = this.client.workers();
            let poll = this.client.call(Duration::from_secs(20), workers.poll(req));
            let polled = tokio::select! {
                r = poll => r,
                _ = shutdown.wait_for(|s| *s) => break,
            };
            let tasks = match polled {
                Ok(r) => r.tasks,
                // A misconfigured worker (bad queue or namespace name) stops with the error;
                // anything else (node restarting, connection reset, store busy) is waited out.
                Err(e) if e.code() == tonic::Code::InvalidArgument => return Err(e),
                Err(e) => {
                    if !e.is_transient() {
                        eprintln!("kairos worker: poll failed: {e}; retrying");
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
            for t in tasks {
                let permit = slots.clone().acquire_owned().await.expect("semaphore open");
                let this = this.clone();
                tokio::spawn(async move {
                    this.run_task(t).await;
                    drop(permit);
                });
            }
        }
        // Let running tasks finish and report.
        let _ = slots.acquire_many(this.concurrency as u32).await;
        Ok(())
    }

    async fn run_task(&self, t: kairos_proto::v1::Task) {
        let (Some(execution), Some(attempt)) = (t.execution, t.attempt) else { return };
        let ns = execution.namespace.clone();
        let id = execution.id.clone();
        let token = attempt.fencing_token;
        let handler = self
            .handlers
            .get(&execution.definition_name)
            .cloned()
            .or_else(|| self.fallback.clone());
        let (cancel_tx, cancel_rx) = watch::channel(false);
        let lease = Duration::from_millis(execution.lease_ms.max(1_000));
        // Heartbeats at a third of the lease keep it; a fenced-out answer cancels the task.
        let heart = {
            let (client, ns, id) = (self.client.clone(), ns.clone(), id.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(lease / 3).await;
                    let req = HeartbeatRequest {
                        namespace: ns.clone(),
                        execution_id: id.clone(),
                        fencing_token: token,
                    };
                    match client.call(lease / 3, client.workers().heartbeat(req)).await {
                        Ok(h) if h.cancel_requested => {
                            let _ = cancel_tx.send(true);
                        }
                        Ok(_) => {}
                        Err(e) if e.code() == tonic::Code::FailedPrecondition => {
                            let _ = cancel_tx.send(true); // fenced out: the lease is gone
                            return;
                        }
                        Err(_) => {}
                    }
                }
            })
        };
        let result = match handler {
            Some(h) => {
                let task = Task {
                    definition_execution: serde_json::from_str(&t.definition_execution_json)
                        .unwrap_or(serde_json::Value::Null),
                    execution,
                    attempt,
                    cancelled: cancel_rx,
                };
                h.run(task).await
            }
            None => Err(TaskError::permanent(format!(
                "no handler for definition {:?} on worker {}",
                id, self.worker_id
            ))),
        };
        heart.abort();
        let report = match result {
            Ok(output) => {
                let output_json = if output.is_null() { String::new() } else { output.to_string() };
                let req = CompleteRequest {
                    namespace: ns,
                    execution_id: id,
                    fencing_token: token,
                    output_json,
                    output_reference: String::new(),
                };
                self.client
                    .call(Duration::from_secs(30), self.client.workers().complete(req))
                    .await
                    .map(|_| ())
            }
            Err(e) => {
                let error =
                    ExecutionError { message: e.message, retryable: e.retryable, code: e.code };
                let req = FailRequest {
                    namespace: ns,
                    execution_id: id,
                    fencing_token: token,
                    error: Some(error),
                };
                self.client
                    .call(Duration::from_secs(30), self.client.workers().fail(req))
                    .await
                    .map(|_| ())
            }
        };
        if let Err(e) = report {
            // Fenced out or unreachable: the lease decides; the execution is retried.
            eprintln!("kairos worker: reporting a result failed: {e}");
        }
    }
}
