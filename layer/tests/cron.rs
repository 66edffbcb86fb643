//! The cron service's transactions on the memory backend with a hand-driven clock: checks
//! naming the field, rounds that materialize each occurrence once (a crash between the
//! materialization and the advance included), pause / resume, update, backfill, runs, and
//! cron timers never below their watermark.

mod common;

use common::*;
use kairos_layer::cron::occurrence_key;
use kairos_layer::keys::{Space, Tag};
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::Error;
use kairos_layer::ops::Scheduler;
use kairos_layer::ops::cron::CronPatch;
use kairos_layer::ops::cron::round::{Executions, ExecutionsError, Materialization, Materialized};
use kairos_proto::storage::v1::{CronJob, CronPolicies, CronStatus, ExecutionStatus};

const MIN: i64 = 60_000;
const LOOKAHEAD: i64 = 5_000;

struct Cron {
    w: World,
    epochs: Vec<u64>,
}

async fn cron_world() -> Cron {
    let w = world(7, FaultConfig::none()).await;
    let wanted: Vec<(Space, u32)> = (0..SHARDS).map(|s| (Space::Cron, s)).collect();
    let leases = w.sched.acquire_partitions(&wanted, NODE, 3_600_000, 0).await.unwrap();
    let epochs = leases.into_iter().map(|l| l.unwrap().epoch).collect();
    Cron { w, epochs }
}

fn spec(id: &str, expr: &str) -> CronJob {
    CronJob {
        namespace: NS.into(),
        id: id.into(),
        definition_name: "report".into(),
        definition_version: 1,
        inputs_json: serde_json::to_vec(&serde_json::json!({
            "dataset_uri": "s3://datasets/orders",
            "report_date": "{{occurrence.date-1}}",
        }))
        .unwrap(),
        expression: expr.into(),
        timezone: "Europe/Berlin".into(),
        policies: Some(CronPolicies {
            catch_up_window_ms: 24 * 3_600_000,
            ..CronPolicies::default()
        }),
        ..CronJob::default()
    }
}

impl Cron {
    /// Runs every round due now on every cron shard, until none is due.
    async fn run_due(&self) -> u64 {
        let exec = DirectExecutions(self.w.sched.clone());
        let mut created = 0;
        for _ in 0..50 {
            let mut any = false;
            for shard in 0..SHARDS {
                let now = self.w.now_ms();
                let due = self
                    .w
                    .sched
                    .cron_scan(shard, self.epochs[shard as usize], now, now)
                    .await
                    .unwrap();
                for d in due {
                    any = true;
                    let r = self
                        .w
                        .sched
                        .cron_round(
                            &exec,
                            shard,
                            self.epochs[shard as usize],
                            &d.namespace,
                            &d.cron_job_id,
                            LOOKAHEAD,
                        )
                        .await
                        .unwrap();
                    assert!(r.errors.is_empty(), "{:?}", r.errors);
                    created += r.created;
                }
            }
            if !any {
                return created;
            }
        }
        panic!("rounds never settle");
    }

    async fn runs(&self, id: &str) -> Vec<(i64, ExecutionStatus)> {
        let page = self.w.sched.cron_runs(NS, id, 1_000, None).await.unwrap();
        page.executions.iter().map(|e| (e.cron_occurrence_ms, e.status())).collect()
    }

    /// Every cron timer is at or above its shard's watermark and is its job's current timer.
    async fn check_timers(&self) {
        let dump = self.w.dump().await;
        let ks = &self.w.ks;
        let r = ks.subspace_range(Tag::CronTimer);
        for (k, _) in dump.range(r.begin..r.end) {
            let t = ks.parse_cron_timer(k).unwrap();
            let wm = dump.get(&ks.cron_watermark(t.shard)).expect("a watermark");
            let wm = i64::from_be_bytes(wm[..8].try_into().unwrap());
            assert!(t.bucket >= wm, "cron timer {t:?} below watermark {wm}");
            let job = self.w.sched.get_cron_job(NS, &t.cron_job_id).await.unwrap();
            let jt = job.timer.expect("the job knows its timer");
            assert_eq!((jt.fire_at_ms, jt.bucket), (t.fire_at_ms, t.bucket), "stale cron timer");
        }
    }
}

#[tokio::test]
async fn bad_jobs_are_refused_naming_the_field() {
    let c = cron_world().await;
    let s = &c.w.sched;
    let bad = |f: &dyn Fn(&mut CronJob)| {
        let mut j = spec("bad", "0 2 * * *");
        f(&mut j);
        j
    };
    let cases: Vec<(CronJob, &str)> = vec![
        (bad(&|j| j.expression = "0 25 * * *".into()), "expression"),
        (bad(&|j| j.timezone = "Mars/Olympus".into()), "timezone"),
        (bad(&|j| j.policies.as_mut().unwrap().dst_gap = "jump".into()), "dstGap"),
        (bad(&|j| j.policies.as_mut().unwrap().overlap = "queue".into()), "overlap"),
        (bad(&|j| j.policies.as_mut().unwrap().jitter_ms = -1), "jitterMs"),
        (bad(&|j| j.id = "has space".into()), "cronJobId"),
        (
            bad(&|j| {
                j.start_at_ms = T0 + MIN;
                j.end_at_ms = T0;
            }),
            "endAt",
        ),
        (
            bad(&|j| {
                j.inputs_json =
                    br#"{"dataset_uri": "s3://x", "report_date": "{{tomorrow}}"}"#.to_vec()
            }),
            "inputs.report_date",
        ),
        (
            bad(&|j| {
                j.inputs_json =
                    br#"{"dataset_uri": "s3://x", "report_date": "{{occurrence}}"}"#.to_vec()
            }),
            "inputs.report_date",
        ),
    ];
    for (job, field) in cases {
        match s.create_cron_job(job, false).await {
            Err(Error::InvalidArgument { field: f, reason }) => assert_eq!(f, field, "{reason}"),
            other => panic!("{field}: {other:?}"),
        }
    }
    let unknown = bad(&|j| j.definition_version = 9);
    match s.create_cron_job(unknown, false).await {
        Err(e @ Error::NotFound { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("version 9") && text.contains(&format!("in namespace {NS}")),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    let e = s.get_definition(NS, "no-such", None).await.unwrap_err().to_string();
    assert!(e.contains("registry://jobs/no-such in namespace"), "{e}");
}

#[tokio::test]
async fn create_get_list_and_a_repeated_create() {
    let c = cron_world().await;
    let s = &c.w.sched;
    let (job, created) = s.create_cron_job(spec("nightly", "0 2 * * *"), false).await.unwrap();
    assert!(created);
    assert_eq!(job.status(), CronStatus::Active);
    assert!(job.next_run_at_ms > T0 && job.next_run_at_ms <= T0 + 24 * 3_600_000);
    assert_eq!(job.policies.as_ref().unwrap().overlap, "skip", "defaults spelled out");
    let (again, created) = s.create_cron_job(spec("nightly", "0 2 * * *"), false).await.unwrap();
    assert!(!created);
    assert_eq!(again.created_at_ms, job.created_at_ms);
    let other = s.create_cron_job(spec("nightly", "0 3 * * *"), false).await;
    assert!(matches!(other, Err(Error::AlreadyExists { .. })), "{other:?}");
    let (generated, _) = s.create_cron_job(spec("", "@hourly"), false).await.unwrap();
    assert_eq!(generated.id.len(), 26);
    let page = s.list_cron_jobs(NS, 1, None).await.unwrap();
    assert_eq!(page.jobs.len(), 1);
    let rest = s.list_cron_jobs(NS, 10, page.next_cursor.as_deref()).await.unwrap();
    assert_eq!(rest.jobs.len(), 1);
    assert!(rest.next_cursor.is_none());
    s.delete_cron_job(NS, "nightly").await.unwrap();
    assert!(matches!(s.get_cron_job(NS, "nightly").await, Err(Error::NotFound { .. })));
    c.check_timers().await;
}

#[tokio::test]
async fn each_occurrence_becomes_one_execution_carrying_the_job_and_occurrence() {
    let c = cron_world().await;
    let mut sp = spec("minutely", "* * * * *");
    sp.policies.as_mut().unwrap().overlap = "allow".into();
    let (job, _) = c.w.sched.create_cron_job(sp, false).await.unwrap();
    let first = job.next_run_at_ms;
    assert_eq!(c.run_due().await, 0, "created: the owner looks, nothing is due yet");
    for k in 0..5 {
        let o = first + k * MIN;
        c.w.clock.set(kairos_layer::env::Timestamp::from_millis(o - LOOKAHEAD));
        assert_eq!(c.run_due().await, 1, "occurrence {k} materialized ahead");
        c.check_timers().await;
    }
    let runs = c.runs("minutely").await;
    assert_eq!(
        runs.iter().map(|r| r.0).collect::<Vec<_>>(),
        (0..5).map(|k| first + k * MIN).collect::<Vec<_>>()
    );
    let e = c.w.sched.get_by_idempotency_key(NS, &occurrence_key("minutely", first)).await.unwrap();
    assert_eq!(e.cron_job_id, "minutely");
    assert_eq!(e.cron_occurrence_ms, first);
    assert_eq!(e.execute_at_ms, first);
    let inputs: serde_json::Value = serde_json::from_slice(&e.input_json).unwrap();
    assert_eq!(inputs["report_date"].as_str().unwrap().len(), 10, "{inputs}");
    let job = c.w.sched.get_cron_job(NS, "minutely").await.unwrap();
    assert_eq!(job.materialized_count, 5);
}

#[tokio::test]
async fn a_crash_between_materializing_and_advancing_makes_exactly_one_execution() {
    let c = cron_world().await;
    let mut s = spec("crashy", "* * * * *");
    s.policies.as_mut().unwrap().overlap = "allow".into();
    let (job, _) = c.w.sched.create_cron_job(s, false).await.unwrap();
    c.run_due().await;
    let o = job.next_run_at_ms;
    c.w.clock.set(kairos_layer::env::Timestamp::from_millis(o - LOOKAHEAD));
    // The owner's round up to the submit, then a crash before it settles.
    let job = c.w.sched.get_cron_job(NS, "crashy").await.unwrap();
    let shard = job.shard;
    let epoch = c.epochs[shard as usize];
    let round =
        kairos_layer::ops::cron::spec::round_of(&job, c.w.now_ms(), LOOKAHEAD, &Default::default())
            .unwrap();
    let schedule = kairos_layer::ops::cron::spec::schedule_of(&job).unwrap();
    let d = kairos_layer::cron::plan::plan(&round, |t| {
        kairos_layer::ops::cron::spec::next_occurrence(&job, &schedule, t)
    });
    assert_eq!(d.materialize.len(), 1);
    let applied =
        c.w.sched
            .cron_apply(
                shard,
                epoch,
                NS,
                "crashy",
                (job.generation, job.round),
                &d,
                c.w.now_ms(),
                c.w.now_ms() + 10_000,
            )
            .await
            .unwrap();
    let now_job = c.w.sched.get_cron_job(NS, "crashy").await.unwrap();
    let applied = applied.unwrap_or_else(|| panic!("not applied: {job:?}\nnow {now_job:?}"));
    assert_eq!(applied.pending.len(), 1, "the outbox");
    let inputs = kairos_layer::ops::cron::spec::occurrence_inputs(&applied, &schedule, o).unwrap();
    let exec = DirectExecutions(c.w.sched.clone());
    let first = exec
        .submit(vec![Materialization {
            namespace: NS.into(),
            idempotency_key: occurrence_key("crashy", o),
            definition: "report".into(),
            definition_version: 1,
            inputs,
            execute_at_ms: Some(o),
        }])
        .await
        .unwrap();
    assert!(first[0].as_ref().unwrap().created);
    // Crash. The restarted node takes the shard back (a new epoch); the recovery timer fires.
    let lease =
        c.w.sched.acquire_partitions(&[(Space::Cron, shard)], NODE, 3_600_000, 0).await.unwrap();
    let epoch_b = lease[0].as_ref().unwrap().epoch;
    c.w.advance_ms(10_000);
    let due = c.w.sched.cron_scan(shard, epoch_b, c.w.now_ms(), c.w.now_ms()).await.unwrap();
    assert!(due.iter().any(|d| d.cron_job_id == "crashy"), "the recovery timer is due");
    let r = c.w.sched.cron_round(&exec, shard, epoch_b, NS, "crashy", LOOKAHEAD).await.unwrap();
    assert_eq!((r.created, r.existing), (0, 1), "submitted again: the same execution");
    // The old owner is fenced out.
    let stale = c.w.sched.cron_round(&exec, shard, epoch, NS, "crashy", LOOKAHEAD).await;
    assert!(matches!(stale, Err(Error::OwnershipLost { .. })), "{stale:?}");
    let runs = c.runs("crashy").await;
    assert_eq!(runs.iter().filter(|r| r.0 == o).count(), 1, "exactly one execution: {runs:?}");
    let job = c.w.sched.get_cron_job(NS, "crashy").await.unwrap();
    assert!(job.pending.is_empty());
    assert_eq!(job.last_occurrence_ms, o);
    assert_eq!(job.next_run_at_ms, o + MIN);
}

#[tokio::test]
async fn pause_resume_with_and_without_catch_up_and_update() {
    let c = cron_world().await;
    let s = &c.w.sched;
    let mut sp = spec("p", "*/10 * * * *");
    sp.policies.as_mut().unwrap().overlap = "allow".into();
    sp.policies.as_mut().unwrap().missed = "all".into();
    let (job, _) = s.create_cron_job(sp, false).await.unwrap();
    let o0 = job.next_run_at_ms;
    s.pause_cron_job(NS, "p").await.unwrap();
    c.w.clock.set(kairos_layer::env::Timestamp::from_millis(o0 + 35 * MIN));
    assert_eq!(c.run_due().await, 0, "paused: nothing");
    // With catch-up: the four passed occurrences are missed ones, `all` within the window.
    let resumed = s.resume_cron_job(NS, "p", true).await.unwrap();
    assert_eq!(resumed.next_run_at_ms, o0);
    assert_eq!(c.run_due().await, 4);
    // Pause again; without catch-up the passed ones are dropped.
    s.pause_cron_job(NS, "p").await.unwrap();
    c.w.advance_ms(30 * 60_000);
    let resumed = s.resume_cron_job(NS, "p", false).await.unwrap();
    assert!(resumed.next_run_at_ms > c.w.now_ms());
    assert_eq!(c.run_due().await, 0);
    assert_eq!(c.runs("p").await.len(), 4);
    // Update: the next occurrence follows the new expression; the runs stay.
    let patch = CronPatch { expression: Some("0 * * * *".into()), ..CronPatch::default() };
    let updated = s.update_cron_job(NS, "p", patch).await.unwrap();
    assert_eq!(updated.expression, "0 * * * *");
    assert_eq!(updated.next_run_at_ms % (60 * MIN), 0);
    assert!(updated.generation > resumed.generation);
    let bad = CronPatch { timezone: Some("Nowhere/Town".into()), ..CronPatch::default() };
    assert!(
        matches!(s.update_cron_job(NS, "p", bad).await, Err(Error::InvalidArgument { field, .. }) if field == "timezone")
    );
    assert_eq!(c.runs("p").await.len(), 4);
    c.check_timers().await;
}

#[tokio::test]
async fn backfill_materializes_a_past_range_once() {
    let c = cron_world().await;
    let s = &c.w.sched;
    let mut sp = spec("bf", "0 * * * *");
    sp.policies.as_mut().unwrap().overlap = "allow".into();
    s.create_cron_job(sp, false).await.unwrap();
    c.run_due().await;
    let from = T0 - 6 * 3_600_000;
    let (_, queued) = s.backfill_cron_job(NS, "bf", from, T0, None).await.unwrap();
    assert_eq!(queued.len(), 6);
    assert_eq!(c.run_due().await, 6);
    // Again: the same occurrences, the same executions.
    s.backfill_cron_job(NS, "bf", from, T0, None).await.unwrap();
    assert_eq!(c.run_due().await, 0);
    let runs = c.runs("bf").await;
    assert_eq!(runs.len(), 6);
    assert!(runs.windows(2).all(|w| w[0].0 < w[1].0), "by occurrence");
    let future = s.backfill_cron_job(NS, "bf", T0, T0 + 3_600_000, None).await;
    assert!(matches!(future, Err(Error::InvalidArgument { field, .. }) if field == "until"));
    let bad = s.backfill_cron_job(NS, "bf", from, T0, Some("sometimes")).await;
    assert!(matches!(bad, Err(Error::InvalidArgument { field, .. }) if field == "overlap"));
}

#[tokio::test]
async fn cancel_previous_cancels_an_unfinished_execution() {
    let c = cron_world().await;
    let s = &c.w.sched;
    let mut sp = spec("cp", "* * * * *");
    sp.policies.as_mut().unwrap().overlap = "cancel-previous".into();
    let (job, _) = s.create_cron_job(sp, false).await.unwrap();
    let o = job.next_run_at_ms;
    c.w.clock.set(kairos_layer::env::Timestamp::from_millis(o - LOOKAHEAD));
    assert_eq!(c.run_due().await, 1);
    // The next one is due while the first never ran (no worker): it is cancelled.
    c.w.clock.set(kairos_layer::env::Timestamp::from_millis(o + MIN));
    assert_eq!(c.run_due().await, 1);
    let runs = c.runs("cp").await;
    assert_eq!(runs, [(o, ExecutionStatus::Cancelled), (o + MIN, ExecutionStatus::Scheduled)]);
}

#[tokio::test]
async fn runs_complete_a_job_and_an_update_gives_it_more() {
    let c = cron_world().await;
    let s = &c.w.sched;
    let mut sp = spec("twice", "* * * * *");
    sp.policies.as_mut().unwrap().overlap = "allow".into();
    sp.remaining_runs = Some(2);
    let (job, _) = s.create_cron_job(sp, false).await.unwrap();
    let zero = CronJob { remaining_runs: Some(0), ..spec("zero", "* * * * *") };
    assert!(
        matches!(s.create_cron_job(zero, false).await, Err(Error::InvalidArgument { field, .. }) if field == "remainingRuns")
    );
    for k in 0..3 {
        let at = job.next_run_at_ms + k * MIN - LOOKAHEAD;
        c.w.clock.set(kairos_layer::env::Timestamp::from_millis(at));
        c.run_due().await;
    }
    let done = s.get_cron_job(NS, "twice").await.unwrap();
    assert_eq!(done.status(), CronStatus::Completed);
    assert_eq!(c.runs("twice").await.len(), 2);
    // A completed job can still be changed: two more runs.
    let patch = CronPatch { remaining_runs: Some(2), ..CronPatch::default() };
    let again = s.update_cron_job(NS, "twice", patch).await.unwrap();
    assert_eq!(again.status(), CronStatus::Active);
    c.w.clock.set(kairos_layer::env::Timestamp::from_millis(again.next_run_at_ms - LOOKAHEAD));
    assert_eq!(c.run_due().await, 1);
    c.check_timers().await;
}

/// The executions API straight over the scheduler's operations (for these tests; a node goes
/// through its own gRPC API instead).
#[derive(Debug, Clone)]
struct DirectExecutions(Scheduler);

fn classify(e: kairos_layer::ops::Error) -> ExecutionsError {
    use kairos_layer::ops::Error as E;
    match e {
        E::IdempotencyConflict { .. } => ExecutionsError::Conflict(e.to_string()),
        E::Kv(k) if k.is_retryable() => ExecutionsError::Transient(k.to_string()),
        E::Kv(kairos_layer::kv::Error::DatabaseClosed) => ExecutionsError::Transient(e.to_string()),
        // A namespace over its quota, a full disk: the occurrence waits, it is not dropped.
        E::QuotaExceeded { .. } | E::Kv(kairos_layer::kv::Error::StorageFull(_)) => {
            ExecutionsError::Transient(e.to_string())
        }
        other => ExecutionsError::Permanent(other.to_string()),
    }
}

impl Executions for DirectExecutions {
    async fn submit(
        &self,
        batch: Vec<Materialization>,
    ) -> Result<Vec<Result<Materialized, ExecutionsError>>, ExecutionsError> {
        let reqs = batch
            .into_iter()
            .map(|m| {
                Ok(kairos_layer::ops::submit::SubmitRequest {
                    namespace: m.namespace,
                    definition: m.definition,
                    definition_version: m.definition_version,
                    inputs: m.inputs,
                    execute_at_ms: m.execute_at_ms.unwrap_or(0),
                    delay_ms: m.execute_at_ms.is_none().then_some(0),
                    idempotency_key: Some(m.idempotency_key),
                    traceparent: None,
                })
            })
            .collect();
        let out = self.0.submit_batch(reqs).await.map_err(classify)?;
        Ok(out
            .into_iter()
            .map(|r| {
                r.map(|s| Materialized { execution_id: s.execution.id, created: s.created })
                    .map_err(classify)
            })
            .collect())
    }

    async fn status(&self, ns: &str, id: &str) -> Result<Option<ExecutionStatus>, ExecutionsError> {
        match self.0.get(ns, id).await {
            Ok(e) => Ok(Some(e.status())),
            Err(kairos_layer::ops::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(classify(e)),
        }
    }

    async fn by_key(&self, ns: &str, key: &str) -> Result<Option<String>, ExecutionsError> {
        match self.0.get_by_idempotency_key(ns, key).await {
            Ok(e) => Ok(Some(e.id)),
            Err(kairos_layer::ops::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(classify(e)),
        }
    }

    async fn cancel(&self, ns: &str, id: &str) -> Result<(), ExecutionsError> {
        match self.0.cancel(ns, id, "cron").await {
            Ok(_) | Err(kairos_layer::ops::Error::FailedPrecondition(_)) => Ok(()),
            Err(kairos_layer::ops::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }
}
