//! API keys, the audit log, the caller, a namespace's limits, its queues and online backups
//! (`AdminService`).

use kairos_proto::v1::*;

use super::{Client, Error};

impl Client {
    /// Creates an API key of `namespace` (`*`: every namespace) with `scopes` (submit, read,
    /// worker, definitions, admin). The token (`kai_…`) is returned once and never again.
    pub async fn create_api_key(
        &self,
        namespace: &str,
        scopes: &[String],
        name: &str,
    ) -> Result<CreateApiKeyResponse, Error> {
        let req = CreateApiKeyRequest {
            namespace: namespace.to_string(),
            scopes: scopes.to_vec(),
            name: name.to_string(),
        };
        self.call(self.timeout, self.admin().create_api_key(req)).await
    }

    /// API keys (revoked ones too) of `namespace`, or every key the caller administers.
    pub async fn list_api_keys(&self, namespace: Option<&str>) -> Result<Vec<ApiKey>, Error> {
        let req = ListApiKeysRequest { namespace: namespace.unwrap_or_default().to_string() };
        Ok(self.call(self.timeout, self.admin().list_api_keys(req)).await?.keys)
    }

    /// Revokes an API key, for good.
    pub async fn revoke_api_key(&self, id: &str) -> Result<ApiKey, Error> {
        let req = RevokeApiKeyRequest { id: id.to_string() };
        let r = self.call(self.timeout, self.admin().revoke_api_key(req)).await?;
        r.key.ok_or_else(|| Error::Invalid("the node returned no key".into()))
    }

    /// The client's namespace's audit log (or `namespace` when given, e.g. `*`) from
    /// `from_ms` on, oldest first.
    pub async fn audit_log(
        &self,
        namespace: Option<&str>,
        from_ms: i64,
        limit: u32,
    ) -> Result<Vec<AuditEntry>, Error> {
        let req = AuditLogRequest {
            namespace: namespace.unwrap_or(&self.namespace).to_string(),
            from_ms,
            limit,
        };
        Ok(self.call(self.timeout, self.admin().audit_log(req)).await?.entries)
    }

    /// Who the node takes this client for.
    pub async fn who_am_i(&self) -> Result<WhoAmIResponse, Error> {
        self.call(self.timeout, self.admin().who_am_i(Empty {})).await
    }

    /// The client's namespace's quotas, retention and pending executions.
    pub async fn limits(&self) -> Result<LimitsResponse, Error> {
        let req = LimitsRequest { namespace: self.namespace.clone() };
        self.call(self.timeout, self.admin().limits(req)).await
    }

    /// Per queue: READY executions, the age of the oldest, the worker streams connected to
    /// the node and their free credits — of the client's namespace, or of every namespace
    /// (`all`, with a key of `*`).
    pub async fn queues(&self, all: bool) -> Result<QueuesResponse, Error> {
        let namespace = if all { "*".to_string() } else { self.namespace.clone() };
        self.call(self.timeout, self.admin().queues(QueuesRequest { namespace })).await
    }

    /// Starts an online backup of the node's embedded store (an admin key of namespace `*`):
    /// the node takes one consistent snapshot while it serves, then streams the store file.
    /// The first chunk says the file's size and the snapshot's version; read every chunk with
    /// `message()` (no per-call time-out applies to the stream). The node refuses
    /// (FAILED_PRECONDITION) on a postgres or fdb backend.
    pub async fn backup(&self) -> Result<tonic::Streaming<BackupChunk>, Error> {
        self.call(self.timeout, self.admin().backup(BackupRequest {})).await
    }
}
