//! `WorkerService`: long polls, heartbeats and results (one, or many per call: [`super::results`]),
//! and the `Work` stream ([`super::work`]). A worker's request is checked by the node ([`Node::poll`] and
//! friends), a result's outcome here.
//!
//! [`Node::poll`]: crate::node::Node::poll

use kairos_layer::ops::worker::{Beat, Outcome, Report};
use kairos_layer::ops::{self, Error};
use kairos_proto::storage::v1 as storage;
use kairos_proto::v1::worker_service_server::WorkerService;
use kairos_proto::v1::*;
use tonic::{Request, Status, Streaming};

use super::results::lease_of;
use super::{Api, Reply, WorkStream, ok, or_default, status};
use crate::limits::POLL_TASKS_MAX;
use crate::node::WorkerPoll;
use crate::server::auth::Scope;

impl Api {
    /// Applies one result; its acknowledgement's status, or the error.
    async fn report_one(&self, r: Report) -> Result<i32, Status> {
        let out = self.node.report(vec![Ok(r)]).await.map_err(|e| status(&e))?;
        let e =
            out.into_iter().next().unwrap_or_else(|| Err(Error::Corrupt("result missing".into())));
        e.map(|e| e.status).map_err(|e| status(&e))
    }
}

#[tonic::async_trait]
impl WorkerService for Api {
    type WorkStream = WorkStream;

    async fn work(&self, req: Request<Streaming<WorkRequest>>) -> Reply<Self::WorkStream> {
        ok(self.work_stream(req).await?)
    }

    async fn poll(&self, req: Request<PollRequest>) -> Reply<PollResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Worker).await?;
        let r = req.into_inner();
        let poll = WorkerPoll {
            namespace: or_default(&r.namespace),
            queue: r.queue,
            worker_id: r.worker_id,
            max: (r.max_executions.max(1) as usize).min(POLL_TASKS_MAX),
            lease_ms: lease_of(r.lease_ms),
            wait_ms: r.wait_ms,
        };
        let claimed = self.node.poll(poll).await.map_err(|e| status(&e))?;
        ok(PollResponse { tasks: self.tasks(&claimed).await })
    }

    async fn heartbeat(&self, req: Request<HeartbeatRequest>) -> Reply<HeartbeatResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Worker).await?;
        let r = req.into_inner();
        let now = self.node.scheduler().clock().now().as_millis();
        let beat = Beat {
            namespace: or_default(&r.namespace),
            execution_id: r.execution_id,
            token: r.fencing_token,
            worker_id: (!r.worker_id.is_empty()).then_some(r.worker_id),
            queue: None,
        };
        let h = self
            .node
            .heartbeat(vec![beat])
            .await
            .map_err(|e| status(&e))?
            .pop()
            .unwrap_or_else(|| Err(ops::Error::Corrupt("heartbeat result missing".into())))
            .map_err(|e| status(&e))?;
        ok(HeartbeatResponse {
            lease_expires_at_ms: h.lease_expires_at_ms,
            cancel_requested: h.cancel_requested,
            lease_remaining_ms: u64::try_from(h.lease_expires_at_ms - now).unwrap_or(0),
        })
    }

    async fn complete(&self, req: Request<CompleteRequest>) -> Reply<ResultResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Worker).await?;
        let r = req.into_inner();
        let report = Report {
            namespace: or_default(&r.namespace),
            execution_id: r.execution_id,
            token: r.fencing_token,
            outcome: Outcome::Success {
                output_json: r.output_json.into_bytes(),
                output_reference: r.output_reference,
            },
            worker_id: (!r.worker_id.is_empty()).then_some(r.worker_id),
            queue: None,
        };
        ok(ResultResponse { status: self.report_one(report).await? })
    }

    async fn fail(&self, req: Request<FailRequest>) -> Reply<ResultResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Worker).await?;
        let r = req.into_inner();
        let error = r.error.map_or(
            storage::ExecutionError {
                message: "failed".into(),
                retryable: true,
                code: String::new(),
            },
            |e| storage::ExecutionError {
                message: e.message,
                retryable: e.retryable,
                code: e.code,
            },
        );
        let report = Report {
            namespace: or_default(&r.namespace),
            execution_id: r.execution_id,
            token: r.fencing_token,
            outcome: Outcome::Failure(error),
            worker_id: (!r.worker_id.is_empty()).then_some(r.worker_id),
            queue: None,
        };
        ok(ResultResponse { status: self.report_one(report).await? })
    }

    async fn report(&self, req: Request<ReportRequest>) -> Reply<ReportResponse> {
        let caller = self.authorize(&req, &req.get_ref().namespace, Scope::Worker).await?;
        let r = req.into_inner();
        let acks =
            Api::report(self, &caller, &or_default(&r.namespace), (&r.worker_id, None), r.results)
                .await?;
        ok(ReportResponse { acks })
    }
}
