//! The `Work` stream: a worker opens it with its queue and free slots, gets tasks as the
//! dispatcher hands them out, and sends credits, results and heartbeats on the same stream.
//! Authenticated at open; a key (not the node's own principal) is checked again while the
//! stream lives — before each delivery and every [`CACHE_MS`] even when the worker sends
//! nothing — so a revoked key gets no more work and its stream ends with UNAUTHENTICATED (a
//! busy store does not end it). Results and heartbeats on a stream are bound to its worker and
//! queue. How a stream ends says why: UNAUTHENTICATED (key refused), UNAVAILABLE (the node is
//! draining), or a clean end when the worker closed its side.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kairos_layer::ops::claim::Claimed;
use kairos_layer::ops::{self, error::invalid};
use kairos_proto::v1::{Task, WorkOpen, WorkRequest, WorkResponse};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::codegen::tokio_stream;
use tonic::{Request, Status, Streaming};

use super::results::{lease_of, within_message_limit};
use super::{Api, WorkStream, or_default, status};
use crate::limits::{WORK_MESSAGE_BYTES_MAX, WORK_STREAM_IN_FLIGHT_MAX};
use crate::node::{Node, WorkerStream};
use crate::server::auth::{CACHE_MS, Principal, Scope};

type Out = mpsc::Sender<Result<WorkResponse, Status>>;

/// Responses queued on one worker stream before its writer waits.
const STREAM_BUFFER: usize = 256;

/// The stream is open.
const OPEN: u8 = 0;
/// The worker closed its side: the stream ends cleanly.
const CLIENT_CLOSED: u8 = 1;
/// The key was refused: the stream ended with UNAUTHENTICATED.
const KEY_REFUSED: u8 = 2;

/// What a stream's request loop and its delivery loop share: its key, when it was last
/// checked, and why the stream is ending.
struct Shared {
    /// The key to check again as the stream goes on (`None`: the node's own principal).
    recheck: Option<Vec<u8>>,
    /// When the key was last checked (node clock, ms).
    checked_ms: Mutex<i64>,
    /// [`OPEN`], [`CLIENT_CLOSED`] or [`KEY_REFUSED`].
    ending: AtomicU8,
}

impl Shared {
    fn ending(&self) -> u8 {
        self.ending.load(Ordering::Acquire)
    }

    /// Whether the stream's key still authenticates: read again once the last check is
    /// [`CACHE_MS`] old. Only a refused key fails (a busy store does not end the stream).
    async fn key_ok(&self, node: &Node) -> Result<(), Status> {
        if self.ending() == KEY_REFUSED {
            return Err(Status::unauthenticated("the stream's API key was refused"));
        }
        let Some(header) = &self.recheck else { return Ok(()) };
        let now = node.scheduler().clock().now().as_millis();
        {
            let mut at = self.checked_ms.lock().unwrap_or_else(|e| e.into_inner());
            if now.saturating_sub(*at) < CACHE_MS {
                return Ok(());
            }
            *at = now;
        }
        let h = (!header.is_empty()).then_some(header.as_slice());
        match node.auth().authenticate(h).await {
            Err(e @ ops::Error::Unauthenticated(_)) => {
                self.ending.store(KEY_REFUSED, Ordering::Release);
                Err(status(&e))
            }
            _ => Ok(()),
        }
    }
}

/// An open stream, as its request loop serves it.
struct Conn {
    api: Api,
    caller: Principal,
    shared: Arc<Shared>,
    ns: String,
    worker: String,
    queue: String,
    id: u64,
    out: Out,
    /// Result and heartbeat messages being applied ([`WORK_STREAM_IN_FLIGHT_MAX`] at most).
    in_flight: Arc<Semaphore>,
}

impl Api {
    /// Opens a worker stream: the first message must carry `open`.
    pub(super) async fn work_stream(
        &self,
        req: Request<Streaming<WorkRequest>>,
    ) -> Result<WorkStream, Status> {
        let caller = self.principal(&req).await?;
        let recheck = req.extensions().get::<Principal>().is_none().then(|| {
            req.metadata().get("authorization").map(|v| v.as_bytes().to_vec()).unwrap_or_default()
        });
        let mut inbound = req.into_inner();
        let (first, open) = opening(&mut inbound).await?;
        let ns = or_default(&open.namespace);
        caller.allow(&ns, Scope::Worker).map_err(|e| status(&e))?;
        let (out, out_rx) = mpsc::channel::<Result<WorkResponse, Status>>(STREAM_BUFFER);
        let (tasks, task_rx) = mpsc::unbounded_channel::<Vec<Claimed>>();
        let stream = WorkerStream {
            namespace: ns.clone(),
            queue: open.queue.clone(),
            worker_id: open.worker_id.clone(),
            lease_ms: lease_of(open.lease_ms),
            credits: open.credits as usize,
            tasks,
        };
        let id = self.node.open_stream(stream).await.map_err(|e| status(&e))?;
        let now = self.node.scheduler().clock().now().as_millis();
        let shared =
            Arc::new(Shared { recheck, checked_ms: Mutex::new(now), ending: AtomicU8::new(OPEN) });
        tokio::spawn(self.clone().tasks_out(task_rx, out.clone(), shared.clone(), id));
        let conn = Conn {
            api: self.clone(),
            caller,
            shared,
            ns,
            worker: open.worker_id,
            queue: open.queue,
            id,
            out,
            in_flight: Arc::new(Semaphore::new(WORK_STREAM_IN_FLIGHT_MAX)),
        };
        tokio::spawn(conn.serve(inbound, first));
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(out_rx)))
    }

    /// Tasks out: what the dispatcher hands this stream, converted and chunked to the stated
    /// message size, once its key is known to be still good (checked every [`CACHE_MS`] even
    /// while nothing comes); anything the client can no longer take goes back as orphans. Ends
    /// the stream when the dispatcher lets go of it.
    async fn tasks_out(
        self,
        mut task_rx: mpsc::UnboundedReceiver<Vec<Claimed>>,
        out: Out,
        shared: Arc<Shared>,
        id: u64,
    ) {
        let clock = self.node.scheduler().clock().clone();
        let every = Duration::from_millis(CACHE_MS.unsigned_abs());
        loop {
            let next = tokio::select! {
                c = task_rx.recv() => c,
                () = clock.sleep(every) => match shared.key_ok(&self.node).await {
                    Ok(()) => continue,
                    Err(s) => return self.refuse(task_rx, &out, id, s).await,
                },
            };
            let Some(mut claimed) = next else { break };
            if let Err(s) = shared.key_ok(&self.node).await {
                self.node.orphans(claimed);
                return self.refuse(task_rx, &out, id, s).await;
            }
            let mut tasks = self.tasks(&claimed).await;
            while !tasks.is_empty() {
                let n = fitting(&tasks, WORK_MESSAGE_BYTES_MAX);
                let chunk: Vec<Task> = tasks.drain(..n).collect();
                let sent: Vec<Claimed> = claimed.drain(..n).collect();
                let msg = WorkResponse { tasks: chunk, ..WorkResponse::default() };
                if out.send(Ok(msg)).await.is_err() {
                    self.node.orphans(sent);
                    self.node.orphans(claimed);
                    while let Ok(more) = task_rx.try_recv() {
                        self.node.orphans(more);
                    }
                    return;
                }
            }
        }
        // The dispatcher let go of this stream. Because the worker closed its side: a clean
        // end. Because the node is draining: say so, so the worker reconnects elsewhere.
        if shared.ending() == OPEN {
            let _ = out.send(Err(Status::unavailable("the node is draining; reconnect"))).await;
        }
    }

    /// Ends a stream whose key was refused: no more tasks (what the dispatcher sent meanwhile
    /// goes back), then UNAUTHENTICATED.
    async fn refuse(
        &self,
        mut task_rx: mpsc::UnboundedReceiver<Vec<Claimed>>,
        out: &Out,
        id: u64,
        s: Status,
    ) {
        self.node.close_stream(id);
        task_rx.close();
        while let Some(more) = task_rx.recv().await {
            self.node.orphans(more);
        }
        let _ = out.send(Err(s)).await;
    }
}

/// How many of `items`, from the first, fit `bytes` encoded (at least one).
pub(super) fn fitting<M: prost::Message>(items: &[M], bytes: usize) -> usize {
    let mut used = 0;
    for (i, m) in items.iter().enumerate() {
        used += m.encoded_len() + 8; // the field's tag and length
        if i > 0 && used > bytes {
            return i;
        }
    }
    items.len()
}

/// The first message and its `open`.
async fn opening(inbound: &mut Streaming<WorkRequest>) -> Result<(WorkRequest, WorkOpen), Status> {
    let mut first = match inbound.message().await? {
        Some(m) => m,
        None => return Err(status(&invalid("open", "the stream ended before opening"))),
    };
    let open = first
        .open
        .take()
        .ok_or_else(|| status(&invalid("open", "the first message must carry `open`")))?;
    Ok((first, open))
}

impl Conn {
    /// Requests in: credits, results and heartbeats, until the worker closes the stream (or
    /// its key is refused).
    async fn serve(self, mut inbound: Streaming<WorkRequest>, first: WorkRequest) {
        let mut next = Some(first);
        loop {
            let m = match next.take() {
                Some(m) => m,
                None => match inbound.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) | Err(_) => break,
                },
            };
            if let Err(s) = self.shared.key_ok(&self.api.node).await {
                let _ = self.out.send(Err(s)).await;
                break;
            }
            if !self.handle(m).await {
                break;
            }
        }
        // Unless the key was refused (already said), the worker ended its side.
        let _ = self.shared.ending.compare_exchange(
            OPEN,
            CLIENT_CLOSED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        self.api.node.close_stream(self.id);
    }

    /// One request; `false` ends the stream.
    async fn handle(&self, m: WorkRequest) -> bool {
        if m.open.is_some() {
            let e = invalid("open", "only the first message opens the stream");
            let _ = self.out.send(Err(status(&e))).await;
            return false;
        }
        // Over the limit: refused before anything of the message is applied, and the stream
        // ends (a worker that sends such a message is not one of ours).
        let sizes = within_message_limit("results", m.results.len())
            .and_then(|()| within_message_limit("heartbeats", m.heartbeats.len()));
        if let Err(s) = sizes {
            let _ = self.out.send(Err(s)).await;
            return false;
        }
        if m.credits > 0 {
            self.api.node.stream_credits(self.id, m.credits as usize);
        }
        if !m.results.is_empty() {
            let (api, out, caller) = (self.api.clone(), self.out.clone(), self.caller.clone());
            let (ns, worker, queue) = (self.ns.clone(), self.worker.clone(), self.queue.clone());
            let permit = self.permit().await;
            tokio::spawn(async move {
                let _permit = permit;
                let who = (worker.as_str(), Some(queue.as_str()));
                let msg = match api.report(&caller, &ns, who, m.results).await {
                    Ok(acks) => Ok(WorkResponse { acks, ..WorkResponse::default() }),
                    // Not applied (the store is unavailable): the worker sends them again on
                    // its next stream.
                    Err(s) => Err(s),
                };
                let _ = out.send(msg).await;
            });
        }
        if !m.heartbeats.is_empty() {
            let (api, out) = (self.api.clone(), self.out.clone());
            let (ns, worker, queue) = (self.ns.clone(), self.worker.clone(), self.queue.clone());
            let permit = self.permit().await;
            tokio::spawn(async move {
                let _permit = permit;
                let who = (worker.as_str(), Some(queue.as_str()));
                if let Ok(heartbeats) = api.heartbeats(&ns, who, m.heartbeats).await {
                    let _ =
                        out.send(Ok(WorkResponse { heartbeats, ..WorkResponse::default() })).await;
                }
            });
        }
        true
    }

    /// A place among the stream's messages being applied: waits (and so stops reading the
    /// stream) while [`WORK_STREAM_IN_FLIGHT_MAX`] are.
    async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        // The semaphore is never closed: `None` cannot happen, and would only lift the bound.
        self.in_flight.clone().acquire_owned().await.ok()
    }
}
