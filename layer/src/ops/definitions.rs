//! Job definitions: register (new version; an existing version is immutable), get, list.

use kairos_proto::storage::v1::JobDefinition;

use super::Scheduler;
use super::error::{Error, Result};
use super::records::{decode, encode};
use super::validate::check_name;
use crate::keys::Keyspace;
use crate::kv::Transaction;
use crate::limits::LIST_PAGE_MAX;

/// Reads one definition version.
pub(crate) async fn load(
    tx: &Transaction,
    ks: &Keyspace,
    ns: &str,
    name: &str,
    version: u32,
) -> Result<Option<JobDefinition>> {
    match tx.get(&ks.definition(ns, name, version)).await? {
        Some(v) => Ok(Some(decode("definition", &v)?)),
        None => Ok(None),
    }
}

/// The parts of a definition that make its identity (not when or where it was stored).
fn content(d: &JobDefinition) -> Vec<u8> {
    encode(&JobDefinition { namespace: String::new(), created_at_ms: 0, ..d.clone() })
}

impl Scheduler {
    /// Registers a definition version in `ns`. Registering the same content again is a no-op
    /// (`created == false`); different content under an existing version is `AlreadyExists`.
    /// Recorded in the audit log as done by `who` (when it stored a new version).
    pub async fn register_definition(
        &self,
        ns: &str,
        def: JobDefinition,
        who: &str,
    ) -> Result<(JobDefinition, bool)> {
        check_name("namespace", ns)?;
        if def.name.is_empty() {
            return Err(super::error::invalid("name", "must not be empty"));
        }
        if def.version == 0 {
            return Err(super::error::invalid("version", "must be a positive integer"));
        }
        let now_ms = self.clock.now().as_millis();
        let def = JobDefinition { namespace: ns.to_string(), created_at_ms: now_ms, ..def };
        let stored = prost::Message::encoded_len(&def);
        if stored > crate::kv::limits::VALUE_BYTES_MAX {
            return Err(super::error::invalid(
                "definition",
                format!(
                    "is {stored} bytes once stored, over the limit of {} for one definition \
                     (keep large scripts and data out of the definition)",
                    crate::kv::limits::VALUE_BYTES_MAX
                ),
            ));
        }
        let audit_id = self.audit_id();
        let audit_id = &audit_id;
        self.db
            .run(|tx| {
                let def = def.clone();
                async move {
                    if let Some(existing) = load(&tx, &self.ks, ns, &def.name, def.version).await? {
                        if content(&existing) == content(&def) {
                            return Ok((existing, false));
                        }
                        return Err(Error::AlreadyExists {
                            what: "definition",
                            id: format!("registry://jobs/{} version {}", def.name, def.version),
                        });
                    }
                    tx.set(&self.ks.definition(ns, &def.name, def.version), &encode(&def))?;
                    let a = super::access::Audit {
                        who,
                        action: "definition.register",
                        target: format!("registry://jobs/{} version {}", def.name, def.version),
                        detail: format!("{} bytes", prost::Message::encoded_len(&def)),
                    };
                    self.write_audit(&tx, ns, now_ms, audit_id, &a)?;
                    Ok((def, true))
                }
            })
            .await
    }

    /// Reads a definition version, or the latest version when `version` is `None`.
    pub async fn get_definition(
        &self,
        ns: &str,
        name: &str,
        version: Option<u32>,
    ) -> Result<JobDefinition> {
        let found = self
            .db
            .run(|tx| async move {
                match version {
                    Some(v) => load(&tx, &self.ks, ns, name, v).await,
                    None => {
                        let r = self.ks.definition_versions(ns, name).limit(1).reverse(true);
                        match tx.get_range(&r, true).await?.first() {
                            Some(kv) => Ok(Some(decode("definition", &kv.value)?)),
                            None => Ok(None),
                        }
                    }
                }
            })
            .await?;
        found.ok_or_else(|| Error::NotFound {
            what: "definition",
            id: match version {
                Some(v) => format!("registry://jobs/{name} version {v} in namespace {ns}"),
                None => format!("registry://jobs/{name} in namespace {ns}"),
            },
        })
    }

    /// Lists the definitions of `ns` (every version, by name then version), at most
    /// `LIST_PAGE_MAX`.
    pub async fn list_definitions(&self, ns: &str) -> Result<Vec<JobDefinition>> {
        self.db
            .run(|tx| async move {
                let r = self.ks.definitions(ns).limit(LIST_PAGE_MAX);
                tx.get_range(&r, true)
                    .await?
                    .iter()
                    .map(|kv| decode("definition", &kv.value))
                    .collect::<Result<Vec<JobDefinition>>>()
            })
            .await
    }
}
