//! `ExecutionService`: submit (one or a batch), get, cancel, list, replay.

use kairos_layer::definition::parse_definition_uri;
use kairos_layer::ops::query::ListQuery;
use kairos_layer::ops::submit::SubmitRequest as LayerSubmit;
use kairos_layer::ops::{self, error::invalid};
use kairos_proto::storage::v1 as storage;
use kairos_proto::v1::execution_service_server::ExecutionService;
use kairos_proto::v1::*;
use tonic::Request;
use tracing::Instrument as _;

use super::{Api, Reply, convert, ok, or_default, status, traceparent_of};
use crate::server::auth::Scope;

impl Api {
    /// A submit request for the layer; `trace` is the call's `traceparent` metadata, used
    /// when the request has none of its own.
    pub(super) fn submit_request(
        &self,
        r: SubmitRequest,
        trace: Option<&str>,
    ) -> Result<(LayerSubmit, bool), ops::Error> {
        let inputs: serde_json::Value = if r.inputs_json.trim().is_empty() {
            serde_json::json!({})
        } else {
            serde_json::from_str(&r.inputs_json)
                .map_err(|e| invalid("inputs", format!("malformed JSON: {e}")))?
        };
        let (execute_at_ms, delay_ms) = match r.when {
            Some(submit_request::When::ExecuteAtMs(ms)) => (ms, None),
            Some(submit_request::When::DelayMs(d)) => (0, Some(d)),
            None => {
                return Err(invalid(
                    "executeAt",
                    "is required (or delayMs: a delay counted by the node's clock, 0 = now)",
                ));
            }
        };
        Ok((
            LayerSubmit {
                namespace: or_default(&r.namespace),
                definition: parse_definition_uri(&r.definition_uri)
                    .map_err(|e| invalid(e.field(), e.reason()))?,
                definition_version: r.definition_version,
                inputs,
                execute_at_ms,
                delay_ms,
                idempotency_key: (!r.idempotency_key.is_empty()).then_some(r.idempotency_key),
                traceparent: Some(r.traceparent)
                    .filter(|t| !t.is_empty())
                    .or_else(|| trace.map(str::to_string)),
            },
            r.return_execution,
        ))
    }
}

pub(super) fn list_query(r: ListExecutionsRequest) -> Result<ListQuery, ops::Error> {
    let status = match storage::ExecutionStatus::try_from(r.status) {
        Ok(storage::ExecutionStatus::Unspecified) => None,
        Ok(s) => Some(s),
        Err(_) => return Err(invalid("status", format!("unknown status {}", r.status))),
    };
    Ok(ListQuery {
        namespace: or_default(&r.namespace),
        status,
        definition: (!r.definition.is_empty()).then_some(r.definition),
        from_ms: (r.from_ms != 0).then_some(r.from_ms),
        to_ms: (r.to_ms != 0).then_some(r.to_ms),
        limit: r.limit as usize,
        cursor: (!r.cursor.is_empty()).then_some(r.cursor),
    })
}

fn submit_response(s: &ops::submit::Submitted, full: bool) -> SubmitResponse {
    SubmitResponse {
        execution_id: s.execution.id.clone(),
        created: s.created,
        status: s.execution.status,
        execute_at_ms: s.execution.execute_at_ms,
        execution: full.then(|| convert::execution(&s.execution)),
    }
}

fn error_item(e: &ops::Error) -> SubmitBatchItem {
    let s = status(e);
    SubmitBatchItem {
        result: Some(submit_batch_item::Result::Error(ItemError {
            code: s.code() as i32,
            message: s.message().to_string(),
        })),
    }
}

#[tonic::async_trait]
impl ExecutionService for Api {
    async fn submit(&self, req: Request<SubmitRequest>) -> Reply<SubmitResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let trace = traceparent_of(&req);
        let (r, full) =
            self.submit_request(req.into_inner(), trace.as_deref()).map_err(|e| status(&e))?;
        let span = crate::server::telemetry::execution_span(
            "kairos.submit",
            r.traceparent.as_deref().unwrap_or_default(),
        );
        let s = self.node.submit(r).instrument(span.clone()).await.map_err(|e| status(&e))?;
        span.record("execution_id", s.execution.id.as_str());
        ok(submit_response(&s, full))
    }

    async fn submit_batch(&self, req: Request<SubmitBatchRequest>) -> Reply<SubmitBatchResponse> {
        let caller = self.principal(&req).await?;
        let trace = traceparent_of(&req);
        let reqs = req.into_inner().requests;
        let mut full = Vec::with_capacity(reqs.len());
        // Each item names its namespace: one the key may not submit to fails alone, in place.
        let items = reqs
            .into_iter()
            .map(|r| {
                full.push(r.return_execution);
                caller
                    .allow(&or_default(&r.namespace), Scope::Submit)
                    .and_then(|()| self.submit_request(r, trace.as_deref()).map(|(r, _)| r))
            })
            .collect();
        let results = self.node.submit_batch(items).await.map_err(|e| status(&e))?;
        let items = results
            .into_iter()
            .zip(full)
            .map(|(r, f)| match r {
                Ok(s) => SubmitBatchItem {
                    result: Some(submit_batch_item::Result::Ok(submit_response(&s, f))),
                },
                Err(e) => error_item(&e),
            })
            .collect();
        ok(SubmitBatchResponse { items })
    }

    async fn get(&self, req: Request<GetExecutionRequest>) -> Reply<GetExecutionResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let r = req.into_inner();
        let ns = or_default(&r.namespace);
        let sched = self.node.scheduler();
        let e = match (r.execution_id.is_empty(), r.idempotency_key.is_empty()) {
            (false, true) => sched.get(&ns, &r.execution_id).await,
            (true, false) => sched.get_by_idempotency_key(&ns, &r.idempotency_key).await,
            (true, true) => Err(invalid("executionId", "is required (or idempotencyKey)")),
            (false, false) => {
                Err(invalid("idempotencyKey", "give executionId or idempotencyKey, not both"))
            }
        }
        .map_err(|e| status(&e))?;
        let limit = (r.attempts_limit != 0).then_some(u64::from(r.attempts_limit));
        let (after, limit) =
            crate::api::attempts_page(Some(&r.attempts_cursor), limit).map_err(|e| status(&e))?;
        let page = sched.attempts_page(&ns, &e.id, after, limit).await.map_err(|e| status(&e))?;
        ok(GetExecutionResponse {
            execution: Some(convert::execution(&e)),
            attempts: page.attempts.iter().map(convert::attempt).collect(),
            attempts_next_cursor: page.next.map(|n| n.to_string()).unwrap_or_default(),
        })
    }

    async fn cancel(&self, req: Request<ExecutionRef>) -> Reply<CancelResponse> {
        let caller = self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let r = req.into_inner();
        let c = self
            .node
            .cancel(&or_default(&r.namespace), &r.execution_id, &caller.who)
            .await
            .map_err(|e| status(&e))?;
        ok(CancelResponse { execution: Some(convert::execution(&c.execution)), cancelled: c.done })
    }

    async fn list(&self, req: Request<ListExecutionsRequest>) -> Reply<ListExecutionsResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let q = list_query(req.into_inner()).map_err(|e| status(&e))?;
        let page = self.node.scheduler().list(&q).await.map_err(|e| status(&e))?;
        ok(ListExecutionsResponse {
            executions: page.executions.iter().map(convert::execution).collect(),
            next_cursor: page.next_cursor.unwrap_or_default(),
            unreadable_ids: page.unreadable,
        })
    }

    async fn replay(&self, req: Request<ExecutionRef>) -> Reply<ExecutionResponse> {
        let caller = self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let r = req.into_inner();
        let e = self
            .node
            .replay(&or_default(&r.namespace), &r.execution_id, &caller.who)
            .await
            .map_err(|e| status(&e))?;
        ok(ExecutionResponse { execution: Some(convert::execution(&e)) })
    }
}
