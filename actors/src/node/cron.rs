//! The cron service's client operations on a node: the layer's transactions, then a hint to
//! the local owner of the job's cron shard (when this node holds it) so it looks at the job at
//! once rather than at its next scan. Reads (get, list, runs, preview) go straight to the
//! scheduler.

use kairos_layer::ops;
use kairos_layer::ops::cron::CronPatch;
use kairos_proto::storage::v1::CronJob;

use super::Node;
use crate::runtime::effects;

impl Node {
    fn cron_changed(&self, job: &CronJob) {
        effects::cron_changed(self.ctx(), job);
    }

    /// Creates a cron job (see `Scheduler::create_cron_job`).
    pub async fn create_cron_job(
        &self,
        spec: CronJob,
        paused: bool,
    ) -> ops::Result<(CronJob, bool)> {
        let (job, created) = self.scheduler().create_cron_job(spec, paused).await?;
        self.cron_changed(&job);
        Ok((job, created))
    }

    /// Changes a cron job.
    pub async fn update_cron_job(
        &self,
        ns: &str,
        id: &str,
        patch: CronPatch,
    ) -> ops::Result<CronJob> {
        let job = self.scheduler().update_cron_job(ns, id, patch).await?;
        self.cron_changed(&job);
        Ok(job)
    }

    /// Pauses a cron job.
    pub async fn pause_cron_job(&self, ns: &str, id: &str) -> ops::Result<CronJob> {
        self.scheduler().pause_cron_job(ns, id).await
    }

    /// Resumes a cron job, with or without catching up what passed while paused.
    pub async fn resume_cron_job(
        &self,
        ns: &str,
        id: &str,
        catch_up: bool,
    ) -> ops::Result<CronJob> {
        let job = self.scheduler().resume_cron_job(ns, id, catch_up).await?;
        self.cron_changed(&job);
        Ok(job)
    }

    /// Deletes a cron job (its executions stay).
    pub async fn delete_cron_job(&self, ns: &str, id: &str) -> ops::Result<()> {
        self.scheduler().delete_cron_job(ns, id).await
    }

    /// Queues a past range of a cron job's occurrences.
    pub async fn backfill_cron_job(
        &self,
        ns: &str,
        id: &str,
        from_ms: i64,
        until_ms: i64,
        overlap: Option<&str>,
    ) -> ops::Result<(CronJob, Vec<i64>)> {
        let (job, occurrences) =
            self.scheduler().backfill_cron_job(ns, id, from_ms, until_ms, overlap).await?;
        self.cron_changed(&job);
        Ok((job, occurrences))
    }

    /// Runs a cron job now, outside its schedule (one occurrence at this instant).
    pub async fn trigger_cron_job(
        &self,
        ns: &str,
        id: &str,
        overlap: Option<&str>,
    ) -> ops::Result<(CronJob, i64)> {
        let (job, occurrence) = self.scheduler().trigger_cron_job(ns, id, overlap).await?;
        self.cron_changed(&job);
        Ok((job, occurrence))
    }

    /// Cron shards this node currently owns.
    pub fn owned_cron_shards(&self) -> Vec<u32> {
        self.ctx().routes.owned_cron_shards()
    }
}
