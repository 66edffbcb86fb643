//! CronShardOwner: one per cron shard this node holds a lease on (the same leased-partition
//! mechanism as the shard owners, space `cron`). It scans its shard's cron timers every poll
//! interval (and is hinted by local API calls), and runs a round for each job whose timer is
//! due: the round decides under the job's policies and materializes occurrences **through the
//! SDK client** over an in-process channel to this node's API, each with the idempotency key
//! `cron:{job}:{occurrence}` (see `kairos_layer::ops::cron::round`). Rounds run in spawned
//! tasks (a handler never waits on the store or the API) and report back; a job is in at most
//! one round at a time on this node, and the epoch fences rounds against another owner.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use kairos_layer::ops::Error;
use ractor::{Actor, ActorProcessingErr, ActorRef};

use super::context::{Ctx, send_after};
use super::messages::CronMsg;
use crate::limits::CRON_ROUNDS_IN_FLIGHT_MAX;
use crate::server::log_limit::LogLimit;
use kairos_layer::ops::cron::owner::CronDue;
use kairos_layer::ops::cron::round::RoundReport;

/// After a failed round, the job is tried again this much later.
const ROUND_RETRY_MS: i64 = 1_000;

/// The cron shard owner actor.
pub struct CronShardOwner;

/// Arguments of a cron shard owner.
pub struct CronOwnerArgs {
    /// Node context.
    pub ctx: Ctx,
    /// The cron shard.
    pub shard: u32,
    /// The lease epoch every write is fenced with.
    pub epoch: u64,
}

type JobId = (String, String);

/// State of a cron shard owner: when each known job is due, and the rounds in flight.
pub struct CronOwnerState {
    ctx: Ctx,
    shard: u32,
    epoch: u64,
    due: BTreeSet<(i64, JobId)>,
    due_at: BTreeMap<JobId, i64>,
    running: BTreeSet<JobId>,
    /// Jobs hinted while in a round: look again when it ends.
    again: BTreeSet<JobId>,
    scanning: bool,
    next_scan: i64,
    wake_at: Option<i64>,
}

impl CronOwnerState {
    fn lookahead_ms(&self) -> i64 {
        self.ctx.config.cron_lookahead_ms as i64
    }

    fn add(&mut self, at: i64, job: JobId) {
        if let Some(old) = self.due_at.get(&job).copied() {
            if old <= at {
                return;
            }
            self.due.remove(&(old, job.clone()));
        }
        self.due_at.insert(job.clone(), at);
        self.due.insert((at, job));
    }

    fn schedule_wake(&mut self, myself: &ActorRef<CronMsg>, at: i64) {
        let now = self.ctx.now_ms();
        if self.wake_at.is_some_and(|w| w <= at && w > now) {
            return;
        }
        self.wake_at = Some(at);
        let d = Duration::from_millis(u64::try_from(at - now).unwrap_or(0));
        send_after(&self.ctx.clock, d, myself.clone(), CronMsg::Wake);
    }

    fn evaluate(&mut self, myself: &ActorRef<CronMsg>) {
        let now = self.ctx.now_ms();
        if !self.scanning && now >= self.next_scan {
            self.scanning = true;
            let (sched, me) = (self.ctx.sched.clone(), myself.clone());
            let (shard, epoch) = (self.shard, self.epoch);
            let until = now + self.ctx.config.window_ms as i64;
            tokio::spawn(async move {
                let r = sched.cron_scan(shard, epoch, now, until).await;
                let _ = me.send_message(CronMsg::Scanned(r));
            });
        }
        while self.running.len() < CRON_ROUNDS_IN_FLIGHT_MAX {
            let Some((at, job)) = self.due.iter().find(|(_, j)| !self.running.contains(j)).cloned()
            else {
                break;
            };
            if at > now {
                break;
            }
            self.due.remove(&(at, job.clone()));
            self.due_at.remove(&job);
            self.running.insert(job.clone());
            let (sched, me, exec) =
                (self.ctx.sched.clone(), myself.clone(), self.ctx.cron_api.clone());
            let (shard, epoch, lookahead) = (self.shard, self.epoch, self.lookahead_ms());
            tokio::spawn(async move {
                let r = sched.cron_round(&exec, shard, epoch, &job.0, &job.1, lookahead).await;
                let _ = me.send_message(CronMsg::Done(job, r));
            });
        }
        // Wake for what this actor can start then: not for a due round while the rounds in
        // flight are at their limit, nor for the next scan while one runs (their answers
        // evaluate again). Waking for them would be a wake at `now`, again and again: a busy
        // loop until the answer comes, which under simulated time never does.
        let next_due = (self.running.len() < CRON_ROUNDS_IN_FLIGHT_MAX)
            .then(|| self.due.iter().find(|(_, j)| !self.running.contains(j)).map(|(t, _)| *t))
            .flatten();
        let next_scan = (!self.scanning).then_some(self.next_scan);
        let at = match (next_due, next_scan) {
            (Some(d), Some(s)) => d.min(s),
            (Some(t), None) | (None, Some(t)) => t,
            (None, None) => return,
        };
        self.schedule_wake(myself, at.max(now));
    }
}

impl CronOwnerState {
    /// A scan finished: its due jobs are added. `true` if ownership was lost (stopping).
    fn scanned(
        &mut self,
        myself: &ActorRef<CronMsg>,
        r: Result<Vec<CronDue>, Error>,
        now: i64,
    ) -> bool {
        self.scanning = false;
        self.next_scan = now + self.ctx.config.poll_interval_ms as i64;
        match r {
            Ok(due) => {
                for d in due {
                    self.add(d.fire_at_ms, (d.namespace, d.cron_job_id));
                }
            }
            Err(e) => return self.failed(myself, e, now, None),
        }
        false
    }

    /// A round finished: what it did is counted and the job's next wake-up planned (or a retry).
    /// `true` if ownership was lost (stopping).
    fn round_done(
        &mut self,
        myself: &ActorRef<CronMsg>,
        job: JobId,
        r: Result<RoundReport, Error>,
        now: i64,
    ) -> bool {
        self.running.remove(&job);
        match r {
            Ok(report) => {
                self.ctx.cron_metrics.record(&report);
                for e in &report.errors {
                    tracing::warn!(cron_job = %job.1, error = %e, "cron occurrence");
                }
                if report.paused {
                    tracing::warn!(cron_job = %job.1, "cron job paused: an execution failed");
                }
                let horizon = now + self.ctx.config.window_ms as i64;
                if let Some(w) = report.wake_ms.filter(|w| *w <= horizon) {
                    self.add(w, job.clone());
                }
            }
            Err(e) => {
                if self.failed(myself, e, now, Some(&job)) {
                    return true;
                }
                self.add(now + ROUND_RETRY_MS, job.clone());
            }
        }
        if self.again.remove(&job) {
            self.add(now, job);
        }
        false
    }

    /// A scan or round failed: ownership lost stops the owner (`true`); anything else is logged
    /// (at most once a second).
    fn failed(&self, myself: &ActorRef<CronMsg>, e: Error, now: i64, job: Option<&JobId>) -> bool {
        if let Error::OwnershipLost { shard, epoch, current } = e {
            tracing::warn!(shard, epoch, current, "cron shard ownership lost");
            myself.stop(Some("ownership lost".into()));
            return true;
        }
        static SCANS: LogLimit = LogLimit::new(1_000);
        static ROUNDS: LogLimit = LogLimit::new(1_000);
        match job {
            Some(job) => {
                if let Some(suppressed) = ROUNDS.allow(now) {
                    tracing::warn!(cron_job = %job.1, error = %e, suppressed, "cron round failed; retrying");
                }
            }
            None => {
                if let Some(suppressed) = SCANS.allow(now) {
                    tracing::warn!(shard = self.shard, error = %e, suppressed, "cron scan failed");
                }
            }
        }
        false
    }
}

impl Actor for CronShardOwner {
    type Msg = CronMsg;
    type State = CronOwnerState;
    type Arguments = CronOwnerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<CronMsg>,
        args: CronOwnerArgs,
    ) -> Result<CronOwnerState, ActorProcessingErr> {
        args.ctx.routes.set_cron_owner(args.shard, myself.clone());
        args.ctx.cron_metrics.shards_owned.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(shard = args.shard, epoch = args.epoch, "cron shard owner started");
        let mut s = CronOwnerState {
            next_scan: args.ctx.now_ms(),
            ctx: args.ctx,
            shard: args.shard,
            epoch: args.epoch,
            due: BTreeSet::new(),
            due_at: BTreeMap::new(),
            running: BTreeSet::new(),
            again: BTreeSet::new(),
            scanning: false,
            wake_at: None,
        };
        s.evaluate(&myself);
        Ok(s)
    }

    async fn post_stop(
        &self,
        myself: ActorRef<CronMsg>,
        s: &mut CronOwnerState,
    ) -> Result<(), ActorProcessingErr> {
        s.ctx.routes.remove_cron_owner(s.shard, myself.get_id());
        s.ctx.cron_metrics.shards_owned.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<CronMsg>,
        msg: CronMsg,
        s: &mut CronOwnerState,
    ) -> Result<(), ActorProcessingErr> {
        let now = s.ctx.now_ms();
        match msg {
            CronMsg::Wake => {
                if s.wake_at.is_some_and(|w| w <= now) {
                    s.wake_at = None;
                }
            }
            CronMsg::Hint { namespace, cron_job_id } => {
                let job = (namespace, cron_job_id);
                if s.running.contains(&job) {
                    s.again.insert(job);
                } else {
                    s.add(now, job);
                }
            }
            CronMsg::Scanned(r) => {
                if s.scanned(&myself, r, now) {
                    return Ok(()); // stopping
                }
            }
            CronMsg::Done(job, r) => {
                if s.round_done(&myself, job, r, now) {
                    return Ok(()); // stopping
                }
            }
        }
        s.evaluate(&myself);
        Ok(())
    }
}
