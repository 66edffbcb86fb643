//! One-item forms of the node's batched worker operations, as tests use them (a worker's
//! results and heartbeats go through `Node::report` and `Node::heartbeat`, many at a time).
#![allow(dead_code)]

use kairos_actors::node::Node;
use kairos_layer::ops::worker::{Beat, HeartbeatOutcome, Outcome, Report};
use kairos_layer::ops::{Error, Result};
use kairos_proto::storage::v1::{Execution, ExecutionError};

fn one<T>(mut v: Vec<Result<T>>) -> Result<T> {
    v.pop().unwrap_or_else(|| Err(Error::Corrupt("result missing".into())))
}

/// A worker's single calls.
#[allow(async_fn_in_trait)]
pub trait NodeTestOps {
    /// Applies one result.
    async fn report_one(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        outcome: Outcome,
    ) -> Result<Execution>;
    /// Extends one attempt's lease.
    async fn heartbeat_one(&self, ns: &str, id: &str, token: u64) -> Result<HeartbeatOutcome>;
    /// Completes an attempt.
    async fn complete(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        output_json: Vec<u8>,
        output_reference: String,
    ) -> Result<Execution> {
        let outcome = Outcome::Success { output_json, output_reference };
        self.report_one(ns, id, token, outcome).await
    }
    /// Fails an attempt.
    async fn fail(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        error: ExecutionError,
    ) -> Result<Execution> {
        self.report_one(ns, id, token, Outcome::Failure(error)).await
    }
}

impl NodeTestOps for Node {
    async fn report_one(
        &self,
        ns: &str,
        id: &str,
        token: u64,
        outcome: Outcome,
    ) -> Result<Execution> {
        let r = Report {
            namespace: ns.into(),
            execution_id: id.into(),
            token,
            outcome,
            worker_id: None,
            queue: None,
        };
        one(self.report(vec![Ok(r)]).await?)
    }

    async fn heartbeat_one(&self, ns: &str, id: &str, token: u64) -> Result<HeartbeatOutcome> {
        let beat = Beat {
            namespace: ns.into(),
            execution_id: id.into(),
            token,
            worker_id: None,
            queue: None,
        };
        one(self.heartbeat(vec![beat]).await?)
    }
}
