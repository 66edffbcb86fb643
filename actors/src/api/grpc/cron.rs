//! `kairos.v1.CronService` over the node's cron operations. Requests become the layer's spec and
//! patch; every error names the API field (`expression`, `timezone`, `overlap`, `inputs.x`, …).

use kairos_layer::cron::utc_rfc3339;
use kairos_layer::definition::{definition_uri, parse_definition_uri};
use kairos_layer::ops::cron::spec::with_defaults;
use kairos_layer::ops::cron::{CronPatch, preview};
use kairos_layer::ops::{self, error::invalid};
use kairos_proto::storage::v1 as storage;
use kairos_proto::v1::cron_service_server::CronService;
use kairos_proto::v1::*;
use tonic::{Request, Response, Status};

use super::{Api, or_default};
use crate::api::convert;
use crate::api::errors::status;
use crate::server::auth::Scope;

type Reply<T> = Result<Response<T>, Status>;

fn fail(e: ops::Error) -> Status {
    status(&e)
}

/// The API view of a cron job.
pub fn cron_job(j: &storage::CronJob) -> CronJob {
    let p = j.policies.clone().unwrap_or_default();
    CronJob {
        cron_job_id: j.id.clone(),
        namespace: j.namespace.clone(),
        definition_uri: definition_uri(&j.definition_name),
        definition_version: j.definition_version,
        inputs_json: String::from_utf8_lossy(&j.inputs_json).into_owned(),
        expression: j.expression.clone(),
        timezone: j.timezone.clone(),
        policies: Some(CronPolicies {
            dst_gap: p.dst_gap,
            dst_fold: p.dst_fold,
            missed: p.missed,
            catch_up_window_ms: Some(p.catch_up_window_ms),
            overlap: p.overlap,
            pause_on_failure: p.pause_on_failure,
            jitter_ms: p.jitter_ms,
        }),
        // Same numbers in both enums.
        status: j.status,
        next_run_at_ms: j.next_run_at_ms,
        last_occurrence_ms: j.last_occurrence_ms,
        last_execution_id: j.last_execution_id.clone(),
        start_at_ms: j.start_at_ms,
        end_at_ms: j.end_at_ms,
        remaining_runs: j.remaining_runs,
        notes: j.notes.clone(),
        created_at_ms: j.created_at_ms,
        updated_at_ms: j.updated_at_ms,
        pause_reason: j.pause_reason.clone(),
        paused_at_ms: j.paused_at_ms,
        materialized_count: j.materialized_count,
        skipped_overlap_count: j.skipped_overlap_count,
        missed_count: j.missed_count,
        waiting_occurrences_ms: j.queue.iter().map(|q| q.occurrence_ms).collect(),
    }
}

/// Inputs JSON as given (empty = `{}`), checked to be an object.
pub(crate) fn inputs_bytes(json: &str) -> Result<Vec<u8>, ops::Error> {
    if json.trim().is_empty() {
        return Ok(b"{}".to_vec());
    }
    let v: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| invalid("inputs", format!("malformed JSON: {e}")))?;
    if !v.is_object() {
        return Err(invalid("inputs", "must be a JSON object"));
    }
    serde_json::to_vec(&v).map_err(|e| invalid("inputs", e.to_string()))
}

fn definition_name(uri: &str) -> Result<String, ops::Error> {
    parse_definition_uri(uri).map_err(|e| invalid(e.field(), e.reason()))
}

/// The stored policies of a request's (defaults for what is absent).
pub(crate) fn stored_policies(p: Option<CronPolicies>) -> storage::CronPolicies {
    let p = p.unwrap_or_default();
    let given = p.catch_up_window_ms.is_some();
    with_defaults(
        storage::CronPolicies {
            dst_gap: p.dst_gap,
            dst_fold: p.dst_fold,
            missed: p.missed,
            catch_up_window_ms: p.catch_up_window_ms.unwrap_or_default(),
            overlap: p.overlap,
            pause_on_failure: p.pause_on_failure,
            jitter_ms: p.jitter_ms,
        },
        given,
    )
}

fn create_spec(r: CreateCronJobRequest) -> Result<(storage::CronJob, bool), ops::Error> {
    Ok((
        storage::CronJob {
            namespace: or_default(&r.namespace),
            id: r.cron_job_id,
            definition_name: definition_name(&r.definition_uri)?,
            definition_version: r.definition_version,
            inputs_json: inputs_bytes(&r.inputs_json)?,
            expression: r.expression,
            timezone: r.timezone,
            policies: Some(stored_policies(r.policies)),
            start_at_ms: r.start_at_ms,
            end_at_ms: r.end_at_ms,
            remaining_runs: (r.remaining_runs != 0).then_some(r.remaining_runs),
            notes: r.notes,
            ..storage::CronJob::default()
        },
        r.paused,
    ))
}

fn patch(r: &UpdateCronJobRequest) -> Result<CronPatch, ops::Error> {
    Ok(CronPatch {
        definition: r.definition_uri.as_deref().map(definition_name).transpose()?,
        definition_version: r.definition_version,
        inputs: match &r.inputs_json {
            Some(j) => Some(serde_json::from_slice(&inputs_bytes(j)?).unwrap_or_default()),
            None => None,
        },
        expression: r.expression.clone(),
        timezone: r.timezone.clone(),
        dst_gap: r.dst_gap.clone(),
        dst_fold: r.dst_fold.clone(),
        missed: r.missed.clone(),
        catch_up_window_ms: r.catch_up_window_ms,
        overlap: r.overlap.clone(),
        pause_on_failure: r.pause_on_failure,
        jitter_ms: r.jitter_ms,
        start_at_ms: r.start_at_ms,
        end_at_ms: r.end_at_ms,
        remaining_runs: r.remaining_runs,
        notes: r.notes.clone(),
    })
}

/// One page of a preview: `[from, until)` (from 0 = now; until 0 = a week after from),
/// computed on the blocking pool (up to 1,000 occurrences, each a time-zone computation: off
/// the runtime threads that serve requests and renew leases).
pub(crate) async fn preview_occurrences(
    now: i64,
    r: PreviewRequest,
) -> Result<Vec<Occurrence>, ops::Error> {
    kairos_layer::env::off_runtime(move || preview_now(now, &r))
        .await
        .map_err(|e| invalid("expression", format!("the preview could not be computed: {e}")))?
}

fn preview_now(now: i64, r: &PreviewRequest) -> Result<Vec<Occurrence>, ops::Error> {
    let from = if r.from_ms == 0 { now } else { r.from_ms };
    let until = if r.until_ms == 0 { from + 7 * 24 * 3_600_000 } else { r.until_ms };
    let (schedule, out) = preview(
        &r.expression,
        &r.timezone,
        &r.dst_gap,
        &r.dst_fold,
        from - 1,
        until - 1,
        r.limit as usize,
    )?;
    Ok(out
        .into_iter()
        .map(|at| Occurrence {
            utc_ms: at,
            utc: utc_rfc3339(at),
            local: schedule.local_rfc3339(at),
        })
        .collect())
}

fn job_ref(r: &CronJobRef) -> (String, String) {
    (or_default(&r.namespace), r.cron_job_id.clone())
}

#[tonic::async_trait]
impl CronService for Api {
    async fn create(&self, req: Request<CreateCronJobRequest>) -> Reply<CronJobResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let (spec, paused) = create_spec(req.into_inner()).map_err(fail)?;
        let (j, created) = self.node.create_cron_job(spec, paused).await.map_err(fail)?;
        Ok(Response::new(CronJobResponse { cron_job: Some(cron_job(&j)), created }))
    }

    async fn update(&self, req: Request<UpdateCronJobRequest>) -> Reply<CronJobResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let r = req.into_inner();
        let p = patch(&r).map_err(fail)?;
        let j = self
            .node
            .update_cron_job(&or_default(&r.namespace), &r.cron_job_id, p)
            .await
            .map_err(fail)?;
        Ok(Response::new(CronJobResponse { cron_job: Some(cron_job(&j)), created: false }))
    }

    async fn pause(&self, req: Request<CronJobRef>) -> Reply<CronJobResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let (ns, id) = job_ref(&req.into_inner());
        let j = self.node.pause_cron_job(&ns, &id).await.map_err(fail)?;
        Ok(Response::new(CronJobResponse { cron_job: Some(cron_job(&j)), created: false }))
    }

    async fn resume(&self, req: Request<ResumeCronJobRequest>) -> Reply<CronJobResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let r = req.into_inner();
        let j = self
            .node
            .resume_cron_job(&or_default(&r.namespace), &r.cron_job_id, r.catch_up)
            .await
            .map_err(fail)?;
        Ok(Response::new(CronJobResponse { cron_job: Some(cron_job(&j)), created: false }))
    }

    async fn delete(&self, req: Request<CronJobRef>) -> Reply<DeleteCronJobResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let (ns, id) = job_ref(&req.into_inner());
        self.node.delete_cron_job(&ns, &id).await.map_err(fail)?;
        Ok(Response::new(DeleteCronJobResponse {}))
    }

    async fn get(&self, req: Request<CronJobRef>) -> Reply<CronJobResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let (ns, id) = job_ref(&req.into_inner());
        let j = self.node.scheduler().get_cron_job(&ns, &id).await.map_err(fail)?;
        Ok(Response::new(CronJobResponse { cron_job: Some(cron_job(&j)), created: false }))
    }

    async fn list(&self, req: Request<ListCronJobsRequest>) -> Reply<ListCronJobsResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let r = req.into_inner();
        let cursor = (!r.cursor.is_empty()).then_some(r.cursor.as_str());
        let page = self
            .node
            .scheduler()
            .list_cron_jobs(&or_default(&r.namespace), r.limit as usize, cursor)
            .await
            .map_err(fail)?;
        Ok(Response::new(ListCronJobsResponse {
            cron_jobs: page.jobs.iter().map(cron_job).collect(),
            next_cursor: page.next_cursor.unwrap_or_default(),
        }))
    }

    async fn preview(&self, req: Request<PreviewRequest>) -> Reply<PreviewResponse> {
        // Touches no namespace's data: any valid key may preview.
        self.principal(&req).await?;
        let now = self.node.scheduler().clock().now().as_millis();
        let occurrences = preview_occurrences(now, req.into_inner()).await.map_err(fail)?;
        Ok(Response::new(PreviewResponse { occurrences }))
    }

    async fn backfill(&self, req: Request<BackfillRequest>) -> Reply<BackfillResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let r = req.into_inner();
        let overlap = (!r.overlap.is_empty()).then_some(r.overlap.as_str());
        let (j, occurrences) = self
            .node
            .backfill_cron_job(
                &or_default(&r.namespace),
                &r.cron_job_id,
                r.from_ms,
                r.until_ms,
                overlap,
            )
            .await
            .map_err(fail)?;
        Ok(Response::new(BackfillResponse {
            cron_job: Some(cron_job(&j)),
            occurrences_ms: occurrences,
        }))
    }

    async fn trigger(&self, req: Request<TriggerRequest>) -> Reply<TriggerResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Submit).await?;
        let r = req.into_inner();
        let overlap = (!r.overlap.is_empty()).then_some(r.overlap.as_str());
        let (j, occurrence_ms) = self
            .node
            .trigger_cron_job(&or_default(&r.namespace), &r.cron_job_id, overlap)
            .await
            .map_err(fail)?;
        Ok(Response::new(TriggerResponse {
            idempotency_key: kairos_layer::cron::occurrence_key(&j.id, occurrence_ms),
            cron_job: Some(cron_job(&j)),
            occurrence_ms,
        }))
    }

    async fn runs(&self, req: Request<CronRunsRequest>) -> Reply<ListExecutionsResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let r = req.into_inner();
        let cursor = (!r.cursor.is_empty()).then_some(r.cursor);
        let page = self
            .node
            .scheduler()
            .cron_runs(&or_default(&r.namespace), &r.cron_job_id, r.limit as usize, cursor)
            .await
            .map_err(fail)?;
        Ok(Response::new(ListExecutionsResponse {
            executions: page.executions.iter().map(convert::execution).collect(),
            next_cursor: page.next_cursor.unwrap_or_default(),
            unreadable_ids: page.unreadable,
        }))
    }
}
