//! The invariant checkers: safety (always) and liveness (once faults stop), over the history
//! the client and workers recorded and the final state read back through the API.

use std::collections::BTreeMap;

use kairos_layer::limits::RELEASES_UNCOUNTED_MAX;
use kairos_proto::v1::{AttemptStatus, ExecutionStatus};

use crate::plan::Plan;
use crate::workload::{History, Mode};

/// Every violated invariant, one line each (empty: all hold).
pub fn check(plan: &Plan, h: &History) -> Vec<String> {
    let mut v = Vec::new();
    // Clocks may differ by the skew spread; hosts step one tick apart.
    // A node whose clock runs ahead fires by its clock: early in true time by its skew; node
    // records (started_at) are by the claiming node's clock, up to the spread apart.
    let ahead = plan.nodes.iter().map(|n| n.skew_ms).max().unwrap_or(0).max(0);
    let tolerance = ahead.max(plan.skew_spread_ms()) + plan.tick_ms as i64;
    // Liveness: every acknowledged execution terminal by the deadline.
    if h.all_terminal_at_ms.is_none() {
        let open: Vec<&String> = h.acked.keys().filter(|id| !h.finals.contains_key(*id)).collect();
        v.push(format!(
            "liveness: {} acknowledged executions not terminal {} ms after faults stopped \
             (bound {} ms): {:?}",
            open.len(),
            h.deadline_ms - h.quiet_at_ms,
            plan.liveness_bound().as_millis(),
            open.iter().take(10).collect::<Vec<_>>()
        ));
    }
    // Isolation: every task a worker received was of the worker's own namespace and queue
    // (checked on receipt, by the task and by the inputs its submitter gave it).
    if !h.foreign.is_empty() {
        v.push(format!(
            "isolation: {} tasks reached a worker of another namespace or queue, e.g. {}",
            h.foreign.len(),
            h.foreign.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        ));
    }
    // ... and as the store recorded it: an execution read back is in the lane it was submitted
    // to, and each of its attempts names a worker of that lane (or none: never reached one).
    let mut stray = Vec::new();
    for (id, a) in &h.acked {
        let lane = &plan.lanes[a.lane];
        let Some((e, attempts)) = h.finals.get(id) else { continue };
        if e.namespace != lane.namespace || e.queue != lane.queue {
            stray.push(format!("{id} of {lane} stored as {}/{}", e.namespace, e.queue));
        }
        for at in attempts.iter().filter(|at| !at.worker_id.is_empty()) {
            match h.workers.get(&at.worker_id) {
                Some(&w) if w == a.lane => {}
                Some(&w) => stray.push(format!(
                    "{id} of {lane}: attempt {} recorded on worker {} of {}",
                    at.number, at.worker_id, plan.lanes[w]
                )),
                None => stray.push(format!(
                    "{id} of {lane}: attempt {} recorded on unknown worker {:?}",
                    at.number, at.worker_id
                )),
            }
        }
    }
    if !stray.is_empty() {
        v.push(format!(
            "isolation: {} attempts or executions recorded outside their namespace and queue, \
             e.g. {}",
            stray.len(),
            stray.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
        ));
    }
    // No acknowledged execution lost.
    for (id, why) in &h.missing {
        v.push(format!("lost: acknowledged execution {id} not found: {why}"));
    }
    // One execution per idempotency key: as answered, and as stored.
    for (key, ids) in &h.ids_by_key {
        if ids.len() > 1 {
            v.push(format!(
                "idempotency: key {key} answered with {} executions: {ids:?}",
                ids.len()
            ));
        }
    }
    let mut stored: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for e in &h.listed {
        if !e.idempotency_key.is_empty() {
            stored.entry((&e.namespace, &e.idempotency_key)).or_default().push(&e.execution_id);
        }
    }
    for ((ns, key), ids) in &stored {
        if ids.len() > 1 {
            v.push(format!(
                "idempotency: key {key} has {} stored executions in {ns}: {ids:?}",
                ids.len()
            ));
        }
    }
    // Each cron occurrence materialized at most once.
    let mut occurrences: BTreeMap<(&str, &str, i64), Vec<&str>> = BTreeMap::new();
    for e in &h.listed {
        if !e.cron_job_id.is_empty() {
            occurrences
                .entry((&e.namespace, &e.cron_job_id, e.cron_occurrence_ms))
                .or_default()
                .push(&e.execution_id);
        }
    }
    for ((_, job, at), ids) in &occurrences {
        if ids.len() > 1 {
            v.push(format!(
                "cron: {job} occurrence {at} materialized {} times: {ids:?}",
                ids.len()
            ));
        }
    }
    for id in h.acked.keys() {
        if !h.listed.is_empty() && !h.listed.iter().any(|e| &e.execution_id == id) {
            v.push(format!("lost: acknowledged execution {id} missing from the list"));
        }
    }
    for (id, a) in &h.acked {
        let replays = h.replayed.get(id).copied().unwrap_or(0);
        let max_attempts = plan.max_attempts * (1 + replays);
        let starts = h.starts.get(id).map(Vec::as_slice).unwrap_or(&[]);
        // Never started before execute_at.
        for s in starts {
            if s.at_ms < a.execute_at_ms - tolerance {
                v.push(format!(
                    "early: {id} attempt {} started {} ms before execute_at",
                    s.attempt,
                    a.execute_at_ms - s.at_ms
                ));
            }
        }
        // Attempts a node released uncounted (it never heard from a worker) may still have
        // reached a handler late (a worker's stream held up): at most that many more runs.
        let runs_max = max_attempts + RELEASES_UNCOUNTED_MAX * (1 + replays);
        if starts.len() as u32 > runs_max {
            v.push(format!("attempts: {id} ran {} times > {runs_max}", starts.len()));
        }
        let Some((e, attempts)) = h.finals.get(id) else { continue };
        if e.ready_at_ms != 0 && e.ready_at_ms < a.execute_at_ms - tolerance {
            v.push(format!(
                "early: {id} READY {} ms before execute_at",
                a.execute_at_ms - e.ready_at_ms
            ));
        }
        for at in attempts {
            if at.started_at_ms != 0 && at.started_at_ms < a.execute_at_ms - tolerance {
                v.push(format!(
                    "early: {id} attempt {} recorded started {} ms before execute_at",
                    at.number,
                    a.execute_at_ms - at.started_at_ms
                ));
            }
        }
        // Counted attempts: all but those released uncounted (ABANDONED).
        let counted =
            attempts.iter().filter(|at| at.status != AttemptStatus::Abandoned as i32).count()
                as u32;
        if counted > max_attempts {
            v.push(format!(
                "attempts: {id} has {counted} counted attempts > max {max_attempts} ({} in all)",
                e.attempt_count
            ));
        }
        let status = ExecutionStatus::try_from(e.status).unwrap_or(ExecutionStatus::Unspecified);
        if status == ExecutionStatus::Succeeded {
            // The committed result carries the token it ran with: it must be the token of the
            // newest attempt any worker was given for this execution (an older one's is a stale
            // commit). Tokens are unguessable values, not counters: attempts are ordered by
            // their number.
            let out: serde_json::Value = serde_json::from_str(&e.output_json).unwrap_or_default();
            let token = out["token"].as_u64();
            let newest = starts.iter().max_by_key(|s| s.attempt).map(|s| s.token);
            let ran = |t: u64| starts.iter().find(|s| s.token == t).map(|s| s.attempt);
            match (token, newest) {
                (Some(t), Some(n)) if t != n && ran(t).is_some() => v.push(format!(
                    "fencing: {id} committed a result of attempt {:?} (token {t}) after token {n} \
                     was granted",
                    ran(t)
                )),
                (Some(t), Some(n)) if t != n => v.push(format!(
                    "fencing: {id} committed token {t} that no worker ran (newest seen {n})"
                )),
                (None, _) | (_, None) => v.push(format!(
                    "fencing: {id} succeeded without a handler run it can be traced to ({:?})",
                    e.output_json
                )),
                _ => {}
            }
            // A flaky one fails every counted attempt, but attempts released uncounted raise
            // the attempt number its handler sees.
            let released = attempts.iter().any(|at| at.status == AttemptStatus::Abandoned as i32);
            let permanent = a.mode == Mode::Fail
                || (a.mode == Mode::Flaky
                    && a.fail_until >= max_attempts
                    && replays == 0
                    && !released);
            if permanent {
                v.push(format!(
                    "outcome: {id} ({:?}) succeeded though every attempt fails",
                    a.mode
                ));
            }
        }
    }
    v
}

/// FNV-1a over the trace and the final state: equal for equal runs.
pub fn trace_hash(h: &History) -> u64 {
    let mut x: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            x ^= u64::from(*b);
            x = x.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for line in &h.trace {
        eat(line.as_bytes());
        eat(b"\n");
    }
    for (id, (e, attempts)) in &h.finals {
        eat(format!(
            "{id} {} {} {} {}\n",
            e.status,
            e.attempt_count,
            e.output_json,
            attempts.len()
        )
        .as_bytes());
    }
    x
}
