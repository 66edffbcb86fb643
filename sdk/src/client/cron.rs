//! The cron service's calls: durable schedules kept by the node, which materializes each
//! occurrence as an execution (idempotency key `cron:{cron_job_id}:{occurrence}`).

use kairos_proto::v1::cron_service_client::CronServiceClient;
use kairos_proto::v1::*;

use super::{Client, Error};

impl Client {
    fn crons(&self) -> CronServiceClient<super::Service> {
        CronServiceClient::new(self.service())
    }

    fn job_ref(&self, id: &str) -> CronJobRef {
        CronJobRef { namespace: self.namespace.clone(), cron_job_id: id.to_string() }
    }

    /// Creates a cron job (in this client's namespace); returns it and whether it is new (a
    /// repeat with the same `cron_job_id` and spec returns the existing job).
    pub async fn create_cron_job(
        &self,
        mut req: CreateCronJobRequest,
    ) -> Result<(CronJob, bool), Error> {
        req.namespace = self.namespace.clone();
        let r = self.call(self.timeout, self.crons().create(req)).await?;
        Ok((r.cron_job.unwrap_or_default(), r.created))
    }

    /// Changes the fields given; the next occurrence is recomputed.
    pub async fn update_cron_job(&self, mut req: UpdateCronJobRequest) -> Result<CronJob, Error> {
        req.namespace = self.namespace.clone();
        Ok(self.call(self.timeout, self.crons().update(req)).await?.cron_job.unwrap_or_default())
    }

    /// Pauses a cron job.
    pub async fn pause_cron_job(&self, id: &str) -> Result<CronJob, Error> {
        let r = self.call(self.timeout, self.crons().pause(self.job_ref(id))).await?;
        Ok(r.cron_job.unwrap_or_default())
    }

    /// Resumes a cron job; with `catch_up`, what passed while paused is handled by its
    /// missed-run policy.
    pub async fn resume_cron_job(&self, id: &str, catch_up: bool) -> Result<CronJob, Error> {
        let req = ResumeCronJobRequest {
            namespace: self.namespace.clone(),
            cron_job_id: id.to_string(),
            catch_up,
        };
        Ok(self.call(self.timeout, self.crons().resume(req)).await?.cron_job.unwrap_or_default())
    }

    /// Deletes a cron job (its executions stay).
    pub async fn delete_cron_job(&self, id: &str) -> Result<(), Error> {
        self.call(self.timeout, self.crons().delete(self.job_ref(id))).await.map(|_| ())
    }

    /// A cron job.
    pub async fn get_cron_job(&self, id: &str) -> Result<CronJob, Error> {
        let r = self.call(self.timeout, self.crons().get(self.job_ref(id))).await?;
        Ok(r.cron_job.unwrap_or_default())
    }

    /// A page of cron jobs (and the cursor of the next; empty at the end).
    pub async fn list_cron_jobs(
        &self,
        limit: u32,
        cursor: &str,
    ) -> Result<(Vec<CronJob>, String), Error> {
        let req = ListCronJobsRequest {
            namespace: self.namespace.clone(),
            limit,
            cursor: cursor.to_string(),
        };
        let r = self.call(self.timeout, self.crons().list(req)).await?;
        Ok((r.cron_jobs, r.next_cursor))
    }

    /// The occurrences of an expression in a zone (no stored job).
    pub async fn preview_cron(&self, req: PreviewRequest) -> Result<Vec<Occurrence>, Error> {
        Ok(self.call(self.timeout, self.crons().preview(req)).await?.occurrences)
    }

    /// Materializes a job's occurrences in `[from_ms, until_ms)` (in the past) under `overlap`
    /// (empty = the job's policy); returns the job and the occurrences queued.
    pub async fn backfill_cron_job(
        &self,
        id: &str,
        from_ms: i64,
        until_ms: i64,
        overlap: &str,
    ) -> Result<(CronJob, Vec<i64>), Error> {
        let req = BackfillRequest {
            namespace: self.namespace.clone(),
            cron_job_id: id.to_string(),
            from_ms,
            until_ms,
            overlap: overlap.to_string(),
        };
        let r = self.call(self.timeout, self.crons().backfill(req)).await?;
        Ok((r.cron_job.unwrap_or_default(), r.occurrences_ms))
    }

    /// Runs an ACTIVE job now, outside its schedule: one occurrence at this instant, under
    /// `overlap` (empty = the job's policy); returns the job, the occurrence and its
    /// execution's idempotency key. Not idempotent: each call is another run (send it once).
    pub async fn trigger_cron_job(
        &self,
        id: &str,
        overlap: &str,
    ) -> Result<TriggerResponse, Error> {
        let req = TriggerRequest {
            namespace: self.namespace.clone(),
            cron_job_id: id.to_string(),
            overlap: overlap.to_string(),
        };
        self.call(self.timeout, self.crons().trigger(req)).await
    }

    /// A page of a job's runs (the executions of its occurrences, oldest first).
    pub async fn cron_runs(
        &self,
        id: &str,
        limit: u32,
        cursor: Vec<u8>,
    ) -> Result<ListExecutionsResponse, Error> {
        let req = CronRunsRequest {
            namespace: self.namespace.clone(),
            cron_job_id: id.to_string(),
            limit,
            cursor,
        };
        self.call(self.timeout, self.crons().runs(req)).await
    }
}
