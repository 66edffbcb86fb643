//! Storage records → the API's own messages. The API never shows storage internals: no
//! fencing token (only a claiming worker's Task carries its own), no request fingerprint, no
//! timer keys.

use kairos_layer::definition::definition_uri;
use kairos_layer::ops::claim::Claimed;
use kairos_layer::ops::leases::PartitionLease;
use kairos_proto::storage::v1 as storage;
use kairos_proto::v1 as api;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn error(e: &Option<storage::ExecutionError>) -> Option<api::ExecutionError> {
    e.as_ref().map(|e| api::ExecutionError {
        message: e.message.clone(),
        retryable: e.retryable,
        code: e.code.clone(),
    })
}

/// The API view of an execution.
pub fn execution(e: &storage::Execution) -> api::Execution {
    api::Execution {
        execution_id: e.id.clone(),
        namespace: e.namespace.clone(),
        definition_uri: definition_uri(&e.definition_name),
        definition_version: e.definition_version,
        inputs_json: text(&e.input_json),
        execute_at_ms: e.execute_at_ms,
        idempotency_key: e.idempotency_key.clone(),
        // Same numbers in both enums (checked by a test).
        status: e.status,
        attempt_count: e.attempt_count,
        queue: e.queue.clone(),
        output_json: text(&e.output_json),
        output_reference: e.output_reference.clone(),
        error: error(&e.error),
        created_at_ms: e.created_at_ms,
        updated_at_ms: e.updated_at_ms,
        ready_at_ms: e.ready_at_ms,
        started_at_ms: e.started_at_ms,
        finished_at_ms: e.finished_at_ms,
        cancel_requested: e.cancel_requested,
        next_timer_at_ms: e.timer.as_ref().map_or(0, |t| t.fire_at_ms),
        cron_job_id: e.cron_job_id.clone(),
        cron_occurrence_ms: e.cron_occurrence_ms,
        traceparent: e.traceparent.clone(),
    }
}

/// The API view of an attempt.
pub fn attempt(a: &storage::Attempt) -> api::Attempt {
    api::Attempt {
        number: a.number,
        worker_id: a.worker_id.clone(),
        status: a.status,
        started_at_ms: a.started_at_ms,
        ended_at_ms: a.ended_at_ms,
        lease_expires_at_ms: a.lease_expires_at_ms,
        error: error(&a.error),
    }
}

/// The task handed to the worker that claimed it (the only message carrying a fencing token).
pub fn task(c: &Claimed, definition_execution_json: String, now_ms: i64) -> api::Task {
    let e = &c.execution;
    api::Task {
        execution_id: e.id.clone(),
        namespace: e.namespace.clone(),
        definition_uri: definition_uri(&e.definition_name),
        definition_version: e.definition_version,
        inputs_json: text(&e.input_json),
        execute_at_ms: e.execute_at_ms,
        idempotency_key: e.idempotency_key.clone(),
        attempt: c.attempt.number,
        fencing_token: c.attempt.fencing_token,
        lease_ms: e.lease_ms,
        lease_remaining_ms: u64::try_from(e.lease_expires_at_ms - now_ms).unwrap_or(0),
        definition_execution_json,
        queue: e.queue.clone(),
        traceparent: e.traceparent.clone(),
    }
}

fn type_name(t: i32) -> String {
    storage::InputType::try_from(t)
        .map(|t| t.as_str_name().trim_start_matches("INPUT_TYPE_").to_ascii_lowercase())
        .unwrap_or_default()
}

/// The API view of a definition.
pub fn definition(d: &storage::JobDefinition) -> api::Definition {
    api::Definition {
        namespace: d.namespace.clone(),
        name: d.name.clone(),
        version: d.version,
        description: d.description.clone(),
        inputs: d
            .inputs
            .iter()
            .map(|i| api::InputDecl {
                name: i.name.clone(),
                r#type: type_name(i.r#type),
                required: i.required,
                description: i.description.clone(),
                default_json: text(&i.default_json),
            })
            .collect(),
        outputs: d
            .outputs
            .iter()
            .map(|o| api::OutputDecl {
                name: o.name.clone(),
                r#type: type_name(o.r#type),
                description: o.description.clone(),
            })
            .collect(),
        execution_json: text(&d.execution_json),
        queue: d.queue.clone(),
        retry_policy: d.retry_policy.map(|r| api::RetryPolicy {
            max_attempts: r.max_attempts,
            base_delay_ms: r.base_delay_ms,
            max_delay_ms: r.max_delay_ms,
        }),
        attempt_timeout_ms: d.attempt_timeout_ms,
        lease_ms: d.lease_ms,
        created_at_ms: d.created_at_ms,
    }
}

/// The API view of a node record; `shards`: the execution shards it holds now.
pub fn node(n: &storage::NodeRecord, shards: u32) -> api::Node {
    api::Node {
        node_id: n.node_id.clone(),
        http_address: n.address.clone(),
        grpc_address: n.grpc_address.clone(),
        region: n.region.clone(),
        heartbeat_at_ms: n.heartbeat_at_ms,
        started_at_ms: n.started_at_ms,
        version: n.version.clone(),
        database: n.database.clone(),
        last_commit_us: n.last_commit_us,
        shards,
    }
}

/// The API view of a partition lease.
pub fn lease(l: &PartitionLease) -> api::PartitionLease {
    api::PartitionLease {
        space: l.space.name().to_string(),
        partition: l.partition,
        owner: l.owner.clone(),
        epoch: l.epoch,
        expires_at_ms: l.expires_at_ms,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The API view of a queue.
pub fn queue(q: &crate::node::queues::QueueView) -> api::QueueInfo {
    api::QueueInfo {
        namespace: q.namespace.clone(),
        queue: q.queue.clone(),
        depth: q.depth,
        depth_capped: q.depth_capped,
        oldest_ready_at_ms: q.oldest_ready_at_ms,
        oldest_ready_age_ms: q.oldest_ready_age_ms,
        workers: q.workers,
        credits_free: q.credits_free,
    }
}

/// The API view of a quarantined record.
pub fn quarantined(q: &storage::QuarantineRecord) -> api::QuarantinedRecord {
    api::QuarantinedRecord {
        namespace: q.namespace.clone(),
        execution_id: q.execution_id.clone(),
        reason: q.reason.clone(),
        at_ms: q.at_ms,
        key_hex: hex(&q.key),
        value_hex: hex(&q.value),
    }
}

/// An API key (never its secret).
pub fn api_key(k: &storage::ApiKey) -> api::ApiKey {
    api::ApiKey {
        id: k.id.clone(),
        namespace: k.namespace.clone(),
        scopes: k.scopes.clone(),
        name: k.name.clone(),
        created_at_ms: k.created_at_ms,
        created_by: k.created_by.clone(),
        revoked_at_ms: k.revoked_at_ms,
        revoked_by: k.revoked_by.clone(),
    }
}

/// An audit record.
pub fn audit(a: &storage::AuditRecord) -> api::AuditEntry {
    api::AuditEntry {
        namespace: a.namespace.clone(),
        at_ms: a.at_ms,
        who: a.who.clone(),
        action: a.action.clone(),
        target: a.target.clone(),
        detail: a.detail.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_numbers_are_the_same_in_storage_and_api() {
        for n in 0..=7 {
            let s = storage::ExecutionStatus::try_from(n).unwrap().as_str_name();
            let a = api::ExecutionStatus::try_from(n).unwrap().as_str_name();
            assert_eq!(s, a);
        }
        for n in 0..=6 {
            let s = storage::AttemptStatus::try_from(n).unwrap().as_str_name();
            let a = api::AttemptStatus::try_from(n).unwrap().as_str_name();
            assert_eq!(s, a);
        }
        assert!(
            api::ExecutionStatus::try_from(8).is_err()
                && storage::ExecutionStatus::try_from(8).is_err()
        );
    }

    #[test]
    fn the_api_view_carries_no_token_or_fingerprint() {
        let e = storage::Execution {
            id: "E".into(),
            fencing_token: 77,
            request_fingerprint: vec![9; 16],
            definition_name: "d".into(),
            ..storage::Execution::default()
        };
        let v = execution(&e);
        let bytes = prost::Message::encode_to_vec(&v);
        assert!(!bytes.windows(16).any(|w| w == [9; 16]), "fingerprint leaked");
        assert_eq!(v.definition_uri, "registry://jobs/d");
    }
}
