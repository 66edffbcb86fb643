//! The cluster as an operator sees it: `nodes`, `shards`, `stats`, `quarantined`,
//! `queues`.

use kairos_sdk::Client;
use serde_json::json;

use crate::output::{Failure, Opts, status_name, table, time};

/// `nodes`: the cluster's live nodes.
pub(super) async fn nodes(client: &Client, o: &Opts) -> Result<String, Failure> {
    let nodes = client.nodes().await?;
    if o.json {
        let list: Vec<_> = nodes
            .iter()
            .map(|n| {
                json!({"nodeId": n.node_id, "httpAddress": n.http_address,
                    "grpcAddress": n.grpc_address, "region": n.region, "version": n.version,
                    "shards": n.shards, "database": n.database,
                    "lastCommitUs": n.last_commit_us, "heartbeatAt": time(n.heartbeat_at_ms)})
            })
            .collect();
        return Ok(json!(list).to_string());
    }
    let rows = nodes
        .iter()
        .map(|n| {
            vec![
                n.node_id.clone(),
                n.grpc_address.clone(),
                n.region.clone(),
                n.shards.to_string(),
                n.database.clone(),
                format!("{:.1} ms", n.last_commit_us as f64 / 1000.0),
                n.version.clone(),
                time(n.heartbeat_at_ms),
            ]
        })
        .collect();
    let head =
        ["NODE", "GRPC", "REGION", "SHARDS", "DATABASE", "LAST COMMIT", "VERSION", "HEARTBEAT"];
    Ok(table(&head, rows))
}

/// `shards`: the leases of a shard space.
pub(super) async fn shards(client: &Client, o: &Opts, space: String) -> Result<String, Failure> {
    let (leases, count) = client.shards(&space).await?;
    if o.json {
        let list: Vec<_> = leases
            .iter()
            .map(|l| {
                json!({"shard": l.partition, "owner": l.owner, "epoch": l.epoch,
                    "expiresAt": time(l.expires_at_ms)})
            })
            .collect();
        return Ok(json!({"space": space, "shardCount": count, "leases": list}).to_string());
    }
    let rows = leases
        .iter()
        .map(|l| {
            vec![
                l.partition.to_string(),
                l.owner.clone(),
                l.epoch.to_string(),
                time(l.expires_at_ms),
            ]
        })
        .collect();
    Ok(format!("{count} shards\n{}", table(&["SHARD", "OWNER", "EPOCH", "EXPIRES"], rows)))
}

/// `stats`: executions per status.
pub(super) async fn stats(client: &Client, o: &Opts, all: bool) -> Result<String, Failure> {
    let counts = client.stats(all).await?;
    if o.json {
        let by_status: std::collections::BTreeMap<_, _> =
            counts.iter().map(|(s, n)| (status_name(*s), *n)).collect();
        return Ok(json!(by_status).to_string());
    }
    Ok(table(
        &["STATUS", "EXECUTIONS"],
        counts.iter().map(|(s, n)| vec![status_name(*s), n.to_string()]).collect(),
    ))
}

/// `quarantined`: records put aside as unprocessable.
pub(super) async fn quarantined(client: &Client, o: &Opts, limit: u32) -> Result<String, Failure> {
    let records = client.quarantined(limit).await?;
    if o.json {
        let list: Vec<_> = records
            .iter()
            .map(|r| {
                json!({"namespace": r.namespace, "executionId": r.execution_id,
                    "reason": r.reason, "at": time(r.at_ms), "keyHex": r.key_hex})
            })
            .collect();
        return Ok(json!(list).to_string());
    }
    let rows = records
        .iter()
        .map(|r| vec![time(r.at_ms), r.namespace.clone(), r.execution_id.clone(), r.reason.clone()])
        .collect();
    Ok(table(&["AT", "NAMESPACE", "EXECUTION", "REASON"], rows))
}

/// `queues`: READY work and connected workers per queue.
pub(super) async fn queues(client: &Client, o: &Opts, all: bool) -> Result<String, Failure> {
    let r = client.queues(all).await?;
    if o.json {
        let list: Vec<_> = r
            .queues
            .iter()
            .map(|q| {
                json!({"namespace": q.namespace, "queue": q.queue, "depth": q.depth,
                    "depthCapped": q.depth_capped, "oldestReadyAt": time(q.oldest_ready_at_ms),
                    "oldestReadyAgeSeconds": q.oldest_ready_age_ms as f64 / 1000.0,
                    "workers": q.workers, "creditsFree": q.credits_free})
            })
            .collect();
        return Ok(json!({"queues": list, "truncated": r.truncated}).to_string());
    }
    let rows = r
        .queues
        .iter()
        .map(|q| {
            let depth = format!("{}{}", q.depth, if q.depth_capped { "+" } else { "" });
            let age = if q.depth == 0 {
                "-".to_string()
            } else {
                format!("{:.1}s", q.oldest_ready_age_ms as f64 / 1000.0)
            };
            let (w, c) = (q.workers.to_string(), q.credits_free.to_string());
            vec![q.namespace.clone(), q.queue.clone(), depth, age, w, c]
        })
        .collect();
    let head = ["NAMESPACE", "QUEUE", "READY", "OLDEST", "WORKERS", "CREDITS"];
    let mut out = table(&head, rows);
    if r.truncated {
        out.push_str("\n(truncated: more queues than one scan reads)");
    }
    Ok(out)
}
