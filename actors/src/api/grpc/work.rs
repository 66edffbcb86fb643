//! The `Work` stream: a worker opens it with its queue and free slots, gets tasks as the
//! dispatcher hands them out, and sends credits, results and heartbeats on the same stream.
//! Authenticated at open; a key (not the node's own principal) is checked again as the stream
//! goes on, so a revoked key ends it (a busy store does not).

use kairos_layer::ops::claim::Claimed;
use kairos_layer::ops::{self, error::invalid};
use kairos_proto::v1::{Task, WorkOpen, WorkRequest, WorkResponse};
use tokio::sync::mpsc;
use tonic::codegen::tokio_stream;
use tonic::{Request, Status, Streaming};

use super::results::lease_of;
use super::{Api, WorkStream, or_default, status};
use crate::limits::WORK_MESSAGE_BYTES_MAX;
use crate::node::WorkerStream;
use crate::server::auth::{CACHE_MS, Principal, Scope};

type Out = mpsc::Sender<Result<WorkResponse, Status>>;

/// Responses queued on one worker stream before its writer waits.
const STREAM_BUFFER: usize = 256;

/// An open stream, as its request loop serves it.
struct Conn {
    api: Api,
    caller: Principal,
    /// The key to check again as the stream goes on (`None`: the node's own principal).
    recheck: Option<Vec<u8>>,
    ns: String,
    worker: String,
    id: u64,
    out: Out,
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
            queue: open.queue,
            worker_id: open.worker_id.clone(),
            lease_ms: lease_of(open.lease_ms),
            credits: open.credits as usize,
            tasks,
        };
        let id = self.node.open_stream(stream).await.map_err(|e| status(&e))?;
        tokio::spawn(self.clone().tasks_out(task_rx, out.clone()));
        let conn = Conn { api: self.clone(), caller, recheck, ns, worker: open.worker_id, id, out };
        tokio::spawn(conn.serve(inbound, first));
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(out_rx)))
    }

    /// Tasks out: what the dispatcher hands this stream, converted; anything the client can no
    /// longer take goes back as orphans. Ends the stream when the dispatcher lets go of it.
    async fn tasks_out(self, mut task_rx: mpsc::UnboundedReceiver<Vec<Claimed>>, out: Out) {
        while let Some(mut claimed) = task_rx.recv().await {
            let mut tasks = self.tasks(&claimed).await;
            // Chunked to the stated message size, each chunk its own message.
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
        // The dispatcher let go of this stream (the node is draining): end it, so the worker
        // reconnects elsewhere.
        let _ = out.send(Err(Status::unavailable("the node is draining; reconnect"))).await;
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
    /// Requests in: credits, results and heartbeats, until the worker closes the stream.
    async fn serve(self, mut inbound: Streaming<WorkRequest>, first: WorkRequest) {
        let clock = self.api.node.scheduler().clock().clone();
        let mut checked_ms = clock.now().as_millis();
        let mut next = Some(first);
        loop {
            let m = match next.take() {
                Some(m) => m,
                None => match inbound.message().await {
                    Ok(Some(m)) => m,
                    Ok(None) | Err(_) => break,
                },
            };
            let now = clock.now().as_millis();
            if now.saturating_sub(checked_ms) >= CACHE_MS {
                checked_ms = now;
                if !self.key_still_valid().await {
                    break;
                }
            }
            if !self.handle(m).await {
                break;
            }
        }
        self.api.node.close_stream(self.id);
    }

    /// Whether the stream's key still authenticates (only a refused key ends the stream).
    async fn key_still_valid(&self) -> bool {
        let Some(header) = &self.recheck else { return true };
        let h = (!header.is_empty()).then_some(header.as_slice());
        match self.api.node.auth().authenticate(h).await {
            Err(e @ ops::Error::Unauthenticated(_)) => {
                let _ = self.out.send(Err(status(&e))).await;
                false
            }
            _ => true,
        }
    }

    /// One request; `false` ends the stream.
    async fn handle(&self, m: WorkRequest) -> bool {
        if m.open.is_some() {
            let e = invalid("open", "only the first message opens the stream");
            let _ = self.out.send(Err(status(&e))).await;
            return false;
        }
        if m.credits > 0 {
            self.api.node.stream_credits(self.id, m.credits as usize);
        }
        if !m.results.is_empty() {
            let (api, out, caller) = (self.api.clone(), self.out.clone(), self.caller.clone());
            let (ns, worker) = (self.ns.clone(), self.worker.clone());
            tokio::spawn(async move {
                let msg = match api.report(&caller, &ns, &worker, m.results).await {
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
            let (ns, worker) = (self.ns.clone(), self.worker.clone());
            tokio::spawn(async move {
                if let Ok(heartbeats) = api.heartbeats(&ns, &worker, m.heartbeats).await {
                    let _ =
                        out.send(Ok(WorkResponse { heartbeats, ..WorkResponse::default() })).await;
                }
            });
        }
        true
    }
}
