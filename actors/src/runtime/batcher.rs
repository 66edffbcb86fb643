//! The node's result and heartbeat batcher: results and heartbeats that arrive at about the same
//! time — from any worker stream or unary call — are applied in one transaction (up to the
//! batch bound), so a thousand workers completing one task each cost a handful of commits, not
//! a thousand. A few transactions run at once (while one waits for its fsync, the next batch
//! forms); each caller gets its own items' results back.

use std::sync::Arc;

use crate::limits::BATCHES_IN_FLIGHT_MAX;
use kairos_layer::limits::{HEARTBEAT_BATCH_MAX, REPORT_BATCH_MAX};
use kairos_layer::ops::worker::{Beat, HeartbeatOutcome, Report};
use kairos_layer::ops::{Error, Result, Scheduler};
use kairos_proto::storage::v1::Execution;
use tokio::sync::{Semaphore, mpsc, oneshot};

type ReportReply = oneshot::Sender<Result<Vec<Result<Execution>>>>;
/// Results, each checked by its caller already (an `Err` passes through).
type Reports = Vec<Result<Report>>;
/// A caller's items and where their results go.
type Request<T, R> = (Vec<T>, oneshot::Sender<Result<Vec<R>>>);
type BeatReply = oneshot::Sender<Result<Vec<Result<HeartbeatOutcome>>>>;

/// A handle on the batcher; cheap to clone.
#[derive(Clone)]
pub struct Batcher {
    reports: mpsc::UnboundedSender<(Reports, ReportReply)>,
    beats: mpsc::UnboundedSender<(Vec<Beat>, BeatReply)>,
}

impl Batcher {
    /// Starts the batcher's tasks over `sched`.
    pub fn start(sched: Scheduler) -> Batcher {
        let (reports, rx) = mpsc::unbounded_channel();
        let s = sched.clone();
        tokio::spawn(run(rx, REPORT_BATCH_MAX, move |items| {
            let s = s.clone();
            async move { s.report(items).await }
        }));
        let (beats, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, HEARTBEAT_BATCH_MAX, move |items| {
            let s = sched.clone();
            async move { s.heartbeat(items).await }
        }));
        Batcher { reports, beats }
    }

    /// Applies results (with others arriving meanwhile, in one transaction).
    pub async fn report(&self, items: Reports) -> Result<Vec<Result<Execution>>> {
        let (tx, rx) = oneshot::channel();
        self.reports.send((items, tx)).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Extends leases (with others arriving meanwhile, in one transaction).
    pub async fn heartbeat(&self, beats: Vec<Beat>) -> Result<Vec<Result<HeartbeatOutcome>>> {
        let (tx, rx) = oneshot::channel();
        self.beats.send((beats, tx)).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

fn stopped() -> Error {
    Error::FailedPrecondition("the node is stopping; send again".into())
}

/// Merges queued requests into batches of at most `max` items and runs `apply` on each.
async fn run<T, R, F, Fut>(mut rx: mpsc::UnboundedReceiver<Request<T, R>>, max: usize, apply: F)
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(Vec<T>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Vec<R>>> + Send + 'static,
{
    let permits = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT_MAX));
    let apply = Arc::new(apply);
    let mut carry: Option<Request<T, R>> = None;
    loop {
        // Wait for a free transaction slot first: requests queue up meanwhile and make the
        // next batch bigger.
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let first = match carry.take() {
            Some(c) => c,
            None => match rx.recv().await {
                Some(c) => c,
                None => return,
            },
        };
        let mut items = Vec::new();
        let mut callers = Vec::new();
        let mut push = |(mut v, reply): Request<T, R>, items: &mut Vec<T>| {
            callers.push((v.len(), reply));
            items.append(&mut v);
        };
        push(first, &mut items);
        while items.len() < max {
            match rx.try_recv() {
                Ok(next) if items.len() + next.0.len() <= max => push(next, &mut items),
                Ok(next) => {
                    carry = Some(next);
                    break;
                }
                Err(_) => break,
            }
        }
        let apply = apply.clone();
        let total = items.len();
        tokio::spawn(async move {
            let out = apply(items).await;
            drop(permit);
            match out {
                Ok(results) => {
                    // Each caller takes its own items' results, in order: one per item.
                    assert_eq!(results.len(), total, "one result per batched item");
                    let mut results = results.into_iter();
                    for (n, reply) in callers {
                        let mine: Vec<R> = results.by_ref().take(n).collect();
                        let _ = reply.send(Ok(mine));
                    }
                }
                Err(e) => {
                    for (_, reply) in callers {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}
