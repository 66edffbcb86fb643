//! The cluster as an operator sees it: `nodes`, `shards`, `stats`, `quarantined`.

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
