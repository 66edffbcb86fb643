//! The worker side of a node: long polls and worker streams (served by the dispatcher),
//! heartbeats and results (batched into few transactions by the batcher). A worker's request
//! is checked here, once, before any actor sees it.

use std::time::Duration;

use kairos_layer::limits::CLAIM_BATCH_MAX;
use kairos_layer::ops::claim::Claimed;
use kairos_layer::ops::validate::{check_lease_ms, check_name};
use kairos_layer::ops::worker::{Beat, HeartbeatOutcome, Report};
use kairos_layer::ops::{self, Error, error::invalid};
use kairos_proto::storage::v1::Execution;
use ractor::rpc::CallResult;

use super::Node;
use crate::runtime::effects;
use crate::runtime::messages::{DispatcherMsg, WorkerPoll, WorkerStream};

/// How much longer than its own wait a poll's call to the dispatcher may take.
const CALL_SLACK: Duration = Duration::from_secs(10);

/// Checks what a waiting worker names: its queue, itself, the lease it asks for.
fn check_worker(ns: &str, queue: &str, worker_id: &str, lease_ms: Option<u64>) -> ops::Result<()> {
    check_name("namespace", ns)?;
    check_name("queue", queue)?;
    check_name("workerId", worker_id)?;
    check_lease_ms(lease_ms)
}

impl Node {
    /// A worker's long poll: READY executions of the queue, waiting up to `wait_ms` for some.
    pub async fn poll(&self, req: WorkerPoll) -> ops::Result<Vec<Claimed>> {
        check_worker(&req.namespace, &req.queue, &req.worker_id, req.lease_ms)?;
        if req.max == 0 || req.max > CLAIM_BATCH_MAX {
            return Err(invalid(
                "maxExecutions",
                format!("must be between 1 and {CLAIM_BATCH_MAX}"),
            ));
        }
        let Some(d) = self.ctx().routes.dispatcher() else {
            return Err(Error::FailedPrecondition(
                "the node is not serving polls (draining or restarting)".into(),
            ));
        };
        let wait = req.wait_ms.min(self.ctx().config.poll_wait_max_ms);
        let timeout = Duration::from_millis(wait) + CALL_SLACK;
        match d.call(|r| DispatcherMsg::Poll(req, r), Some(timeout)).await {
            Ok(CallResult::Success(r)) => r,
            Ok(CallResult::Timeout) => Ok(Vec::new()),
            Ok(CallResult::SenderError) | Err(_) => Err(Error::FailedPrecondition(
                "the dispatcher stopped while polling; poll again".into(),
            )),
        }
    }

    /// Opens a worker stream in the dispatcher; its tasks go to `open.tasks`. Returns the
    /// stream's id.
    pub async fn open_stream(&self, open: WorkerStream) -> ops::Result<u64> {
        check_worker(&open.namespace, &open.queue, &open.worker_id, open.lease_ms)?;
        let Some(d) = self.ctx().routes.dispatcher() else {
            return Err(Error::FailedPrecondition(
                "the node is not serving workers (draining or restarting)".into(),
            ));
        };
        match d.call(|r| DispatcherMsg::Open(open, r), Some(CALL_SLACK)).await {
            Ok(CallResult::Success(id)) => Ok(id),
            _ => Err(Error::FailedPrecondition("the dispatcher stopped; reconnect".into())),
        }
    }

    /// A worker stream has `n` more free slots.
    pub fn stream_credits(&self, id: u64, n: usize) {
        self.dispatcher_cast(DispatcherMsg::Credits(id, n));
    }

    /// A worker stream closed.
    pub fn close_stream(&self, id: u64) {
        self.dispatcher_cast(DispatcherMsg::Close(id));
    }

    /// Claimed executions whose worker vanished before getting them.
    pub fn orphans(&self, claimed: Vec<Claimed>) {
        if claimed.is_empty() {
            return;
        }
        match self.ctx().routes.dispatcher() {
            Some(d) => {
                let _ = d.send_message(DispatcherMsg::Orphans(claimed));
            }
            None => {
                tracing::warn!(n = claimed.len(), "undelivered executions wait for their lease")
            }
        }
    }

    fn dispatcher_cast(&self, msg: DispatcherMsg) {
        if let Some(d) = self.ctx().routes.dispatcher() {
            let _ = d.send_message(msg);
        }
    }

    /// Extends attempts' leases (fenced), batched with other heartbeats arriving meanwhile
    /// into one transaction; each gets its own result.
    pub async fn heartbeat(
        &self,
        beats: Vec<Beat>,
    ) -> ops::Result<Vec<ops::Result<HeartbeatOutcome>>> {
        let out = self.ctx().batcher.heartbeat(beats).await?;
        effects::heartbeats(self.ctx(), &out);
        Ok(out)
    }

    /// Applies workers' results (fenced), batched with other results arriving meanwhile into
    /// one transaction; each gets its own result, in order (an item the caller refused
    /// already, an `Err`, passes through).
    pub async fn report(
        &self,
        items: Vec<ops::Result<Report>>,
    ) -> ops::Result<Vec<ops::Result<Execution>>> {
        let kinds = effects::report_kinds(&items);
        let out = self.ctx().batcher.report(items).await?;
        effects::reported(self.ctx(), &kinds, &out);
        Ok(out)
    }
}
