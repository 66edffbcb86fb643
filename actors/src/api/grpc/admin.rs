//! `AdminService`: nodes, shards and leases, stats, failed and quarantined executions, API
//! keys and the audit log, who am I, a namespace's limits.

use kairos_layer::keys::Space;
use kairos_layer::ops::{self, error::invalid};
use kairos_proto::storage::v1 as storage;
use kairos_proto::v1::admin_service_server::AdminService;
use kairos_proto::v1::*;
use tonic::Request;

use super::executions::list_query;
use super::{ALL, Api, Reply, convert, ok, or_default, status};
use crate::server::auth::{AuthMode, Scope};
use kairos_layer::state::is_terminal;

#[tonic::async_trait]
impl AdminService for Api {
    type BackupStream = super::backup::BackupStream;

    async fn backup(&self, req: Request<BackupRequest>) -> Reply<Self::BackupStream> {
        self.authorize(&req, ALL, Scope::Admin).await?;
        let db = self.node.scheduler().database().clone();
        if let Some(refused) = super::backup::refused(db.backend_name()) {
            return Err(refused);
        }
        ok(super::backup::start(db, &self.node.config().data_dir))
    }

    async fn nodes(&self, req: Request<Empty>) -> Reply<NodesResponse> {
        self.authorize(&req, ALL, Scope::Admin).await?;
        let nodes = self.node.cluster_nodes().await.map_err(|e| status(&e))?;
        ok(NodesResponse {
            nodes: nodes.iter().map(|n| convert::node(&n.record, n.shards)).collect(),
        })
    }

    async fn shards(&self, req: Request<ShardsRequest>) -> Reply<ShardsResponse> {
        self.authorize(&req, ALL, Scope::Admin).await?;
        let space = match req.into_inner().space.as_str() {
            "" | "executions" => Space::Executions,
            "cron" => Space::Cron,
            other => {
                return Err(status(&invalid(
                    "space",
                    format!("{other:?} is not executions or cron"),
                )));
            }
        };
        let sched = self.node.scheduler();
        let leases = sched.partition_leases(space).await.map_err(|e| status(&e))?;
        ok(ShardsResponse {
            leases: leases.iter().map(convert::lease).collect(),
            shard_count: sched.partition_count(space),
        })
    }

    async fn stats(&self, req: Request<StatsRequest>) -> Reply<StatsResponse> {
        // Every namespace's counts are for keys of every namespace.
        let ns = match req.get_ref().namespace.as_str() {
            "" => ALL.to_string(),
            ns => ns.to_string(),
        };
        self.authorize(&req, &ns, Scope::Read).await?;
        let r = req.into_inner();
        let sched = self.node.scheduler();
        let counts = if r.namespace.is_empty() {
            sched.all_status_counts().await
        } else {
            sched.status_counts(&r.namespace).await
        }
        .map_err(|e| status(&e))?;
        let executions =
            counts.into_iter().map(|(s, n)| StatusCount { status: s as i32, count: n }).collect();
        ok(StatsResponse { executions })
    }

    async fn failed_executions(
        &self,
        req: Request<ListExecutionsRequest>,
    ) -> Reply<ListExecutionsResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let mut q = list_query(req.into_inner()).map_err(|e| status(&e))?;
        q.status = Some(storage::ExecutionStatus::Failed);
        let page = self.node.scheduler().list(&q).await.map_err(|e| status(&e))?;
        ok(ListExecutionsResponse {
            executions: page.executions.iter().map(convert::execution).collect(),
            next_cursor: page.next_cursor.unwrap_or_default(),
            unreadable_ids: page.unreadable,
        })
    }

    async fn quarantined(&self, req: Request<QuarantinedRequest>) -> Reply<QuarantinedResponse> {
        self.authorize(&req, ALL, Scope::Admin).await?;
        let limit = match req.into_inner().limit {
            0 => 100,
            n => n as usize,
        };
        let records = self.node.scheduler().quarantined(limit).await.map_err(|e| status(&e))?;
        ok(QuarantinedResponse { records: records.iter().map(convert::quarantined).collect() })
    }

    async fn create_api_key(
        &self,
        req: Request<CreateApiKeyRequest>,
    ) -> Reply<CreateApiKeyResponse> {
        let ns = req.get_ref().namespace.clone();
        if ns.is_empty() {
            return Err(status(&invalid(
                "namespace",
                "is required: a namespace, or * for every one",
            )));
        }
        let caller = self.authorize(&req, &ns, Scope::Admin).await?;
        let r = req.into_inner();
        let k = self
            .node
            .scheduler()
            .create_api_key(&ns, &r.scopes, &r.name, &caller.who)
            .await
            .map_err(|e| status(&e))?;
        ok(CreateApiKeyResponse { key: Some(convert::api_key(&k.key)), token: k.token })
    }

    async fn list_api_keys(&self, req: Request<ListApiKeysRequest>) -> Reply<ListApiKeysResponse> {
        let caller = self.principal(&req).await?;
        let ns = req.into_inner().namespace;
        // Empty: every key the caller administers.
        let filter = match (ns.is_empty(), caller.all_namespaces()) {
            (true, true) => None,
            (true, false) => Some(caller.namespace.clone()),
            (false, _) => Some(ns),
        };
        caller.allow(filter.as_deref().unwrap_or(ALL), Scope::Admin).map_err(|e| status(&e))?;
        let keys =
            self.node.scheduler().list_api_keys(filter.as_deref()).await.map_err(|e| status(&e))?;
        ok(ListApiKeysResponse { keys: keys.iter().map(convert::api_key).collect() })
    }

    async fn revoke_api_key(&self, req: Request<RevokeApiKeyRequest>) -> Reply<ApiKeyResponse> {
        let caller = self.principal(&req).await?;
        let id = req.into_inner().id;
        let sched = self.node.scheduler();
        let not_found =
            || status(&ops::Error::NotFound { what: "API key", id: ops::error::shown(&id) });
        // A key the caller does not administer is "not found" (not a hint that it exists).
        let key = sched.api_key(&id).await.map_err(|e| status(&e))?.ok_or_else(not_found)?;
        if caller.allow(&key.namespace, Scope::Admin).is_err() {
            return Err(not_found());
        }
        let key = sched.revoke_api_key(&id, &caller.who).await.map_err(|e| status(&e))?;
        self.node.auth().forget(&id);
        ok(ApiKeyResponse { key: Some(convert::api_key(&key)) })
    }

    async fn audit_log(&self, req: Request<AuditLogRequest>) -> Reply<AuditLogResponse> {
        let caller = self.authorize(&req, &req.get_ref().namespace, Scope::Admin).await?;
        drop(caller);
        let r = req.into_inner();
        let limit = if r.limit == 0 { 100 } else { r.limit as usize };
        let records = self
            .node
            .scheduler()
            .audit_log(&or_default(&r.namespace), r.from_ms, limit)
            .await
            .map_err(|e| status(&e))?;
        ok(AuditLogResponse { entries: records.iter().map(convert::audit).collect() })
    }

    async fn who_am_i(&self, req: Request<Empty>) -> Reply<WhoAmIResponse> {
        let p = self.principal(&req).await?;
        ok(WhoAmIResponse {
            who: p.who,
            namespace: p.namespace,
            scopes: p.scopes,
            authentication: self.node.auth().mode() == AuthMode::Keys,
        })
    }

    async fn limits(&self, req: Request<LimitsRequest>) -> Reply<LimitsResponse> {
        self.authorize(&req, &req.get_ref().namespace, Scope::Read).await?;
        let ns = or_default(&req.into_inner().namespace);
        let config = self.node.config();
        let quota = config.quotas.of(&ns);
        let counts = self.node.scheduler().status_counts(&ns).await.map_err(|e| status(&e))?;
        let pending = counts
            .iter()
            .filter(|(s, _)| !is_terminal(*s) && *s != storage::ExecutionStatus::Unspecified)
            .map(|(_, n)| (*n).max(0) as u64)
            .sum();
        use kairos_layer::limits as l;
        ok(LimitsResponse {
            namespace: ns.clone(),
            submit_per_s: quota.submit_per_s,
            pending_max: quota.pending_max,
            pending,
            retention_days: config
                .namespace_retention_days
                .get(&ns)
                .copied()
                .unwrap_or(config.retention_days),
            input_bytes_max: match quota.inputs_bytes_max {
                0 => l::INPUT_BYTES_MAX as u32,
                n => n.min(l::INPUT_BYTES_MAX as u32),
            },
            output_bytes_max: l::OUTPUT_BYTES_MAX as u32,
            definition_bytes_max: match quota.definition_bytes_max {
                0 => kairos_layer::kv::limits::VALUE_BYTES_MAX as u32,
                n => n.min(kairos_layer::kv::limits::VALUE_BYTES_MAX as u32),
            },
        })
    }

    async fn queues(&self, req: Request<QueuesRequest>) -> Reply<QueuesResponse> {
        let caller = self.principal(&req).await?;
        // Empty: the key's namespace (every one for a key of `*`).
        let ns = match req.get_ref().namespace.as_str() {
            "" => caller.namespace.clone(),
            ns => ns.to_string(),
        };
        caller.allow(&ns, Scope::Read).map_err(|e| status(&e))?;
        let filter = (ns != ALL).then_some(ns.as_str());
        let q = self.node.queues(filter).await.map_err(|e| status(&e))?;
        ok(QueuesResponse {
            queues: q.queues.iter().map(convert::queue).collect(),
            truncated: q.truncated,
        })
    }
}
