//! The cluster as one node sees it: every node's record with the execution shards it holds
//! now — `/healthz` and the Nodes RPC show it.

use kairos_layer::keys::Space;
use kairos_layer::ops;
use kairos_proto::storage::v1::NodeRecord;

use super::Node;

/// One node of the cluster, as the store holds it.
#[derive(Debug, Clone)]
pub struct NodeView {
    /// Its record (address, region, database, last commit, heartbeat).
    pub record: NodeRecord,
    /// Execution shards whose lease it holds and which have not run out.
    pub shards: u32,
    /// Milliseconds since its last heartbeat, by this node's clock.
    pub heartbeat_age_ms: i64,
}

impl Node {
    /// Every node recorded in the store (a node stays listed a while after it stopped: its
    /// heartbeat age says so), with its live execution-shard leases.
    pub async fn cluster_nodes(&self) -> ops::Result<Vec<NodeView>> {
        let sched = self.scheduler();
        let (nodes, leases) =
            tokio::try_join!(sched.nodes(), sched.partition_leases(Space::Executions))?;
        let now = self.ctx().now_ms();
        Ok(nodes
            .into_iter()
            .map(|record| {
                let shards = leases
                    .iter()
                    .filter(|l| l.owner == record.node_id && l.expires_at_ms > now)
                    .count() as u32;
                let heartbeat_age_ms = (now - record.heartbeat_at_ms).max(0);
                NodeView { record, shards, heartbeat_age_ms }
            })
            .collect())
    }
}
