//! Who is calling: API keys on both APIs (`authorization: Bearer kai_…`), checked against the
//! store's hashed keys, and what a caller may do (a namespace, or every one, and scopes).
//!
//! Every handler asks [`Auth::authorize`] for the namespace and the [`Scope`] it acts on before
//! it does anything else, so a missing or bad key is 401 / UNAUTHENTICATED and a key of
//! another namespace or without the scope is 403 / PERMISSION_DENIED, whatever else is wrong
//! with the request. With authentication off (`kairos dev`) every caller may do everything.
//!
//! Valid keys are cached for [`CACHE_MS`]: a key revoked through another node stops working
//! there within that time (at once on the node that revoked it).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::limits::AUTH_CACHE_KEYS_MAX;
use kairos_layer::ops::access::{ALL_NAMESPACES, parse_token, secret_matches};
use kairos_layer::ops::{self, Error, Scheduler};
use kairos_proto::storage::v1::ApiKey;

/// How long a verified key is trusted before it is read again.
pub const CACHE_MS: i64 = 2_000;

/// Whether the node checks API keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Every call needs a valid API key (`kairos serve`'s default).
    Keys,
    /// No keys: every caller may do everything (`kairos dev`'s default; embedded nodes).
    Off,
}

/// What a call does, for the key's scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Submit, cancel and replay executions; create and change cron jobs.
    Submit,
    /// Read executions, attempts, definitions, cron jobs and their runs.
    Read,
    /// Claim executions, heartbeat and report results.
    Worker,
    /// Register definitions (which name what workers run).
    Definitions,
    /// Everything above, plus keys, the audit log and cluster-wide views.
    Admin,
}

impl Scope {
    /// The scope's name in keys and messages.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Submit => "submit",
            Scope::Read => "read",
            Scope::Worker => "worker",
            Scope::Definitions => "definitions",
            Scope::Admin => "admin",
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// As written in the audit log: `key:<id>`, `cron`, `dev (authentication off)`.
    pub who: String,
    /// `*` or one namespace.
    pub namespace: String,
    /// The key's scopes (`admin` implies the others).
    pub scopes: Vec<String>,
}

impl Principal {
    /// A caller that may do everything (authentication off, or the node itself).
    pub fn unrestricted(who: &str) -> Principal {
        Principal {
            who: who.to_string(),
            namespace: ALL_NAMESPACES.into(),
            scopes: vec![Scope::Admin.name().into()],
        }
    }

    fn of_key(k: &ApiKey) -> Principal {
        Principal {
            who: format!("key:{}", k.id),
            namespace: k.namespace.clone(),
            scopes: k.scopes.clone(),
        }
    }

    /// Whether the caller holds `scope` (or `admin`).
    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.iter().any(|s| s == scope.name() || s == Scope::Admin.name())
    }

    /// Whether the caller may act in every namespace.
    pub fn all_namespaces(&self) -> bool {
        self.namespace == ALL_NAMESPACES
    }

    /// Allows acting on `ns` (or `*`: every namespace) with `scope`, or says what is missing.
    pub fn allow(&self, ns: &str, scope: Scope) -> ops::Result<()> {
        if !self.all_namespaces() && self.namespace != ns {
            let wanted = if ns == ALL_NAMESPACES { "every namespace" } else { ns };
            return Err(Error::PermissionDenied(format!(
                "{} may act in namespace {} only, not in {}",
                self.who,
                self.namespace,
                ops::error::shown(wanted)
            )));
        }
        if !self.has(scope) {
            return Err(Error::PermissionDenied(format!(
                "{} lacks the `{}` scope (it has: {})",
                self.who,
                scope.name(),
                self.scopes.join(", ")
            )));
        }
        Ok(())
    }
}

/// The node's key checks.
pub struct Auth {
    mode: AuthMode,
    sched: Scheduler,
    /// id → (key, read at ms).
    cache: Mutex<HashMap<String, (ApiKey, i64)>>,
}

/// The `who` of callers when authentication is off.
pub const DEV_PRINCIPAL: &str = "dev (authentication off)";

impl Auth {
    /// Checks keys (or not) against `sched`'s store.
    pub fn new(mode: AuthMode, sched: Scheduler) -> Auth {
        Auth { mode, sched, cache: Mutex::default() }
    }

    /// Whether keys are required.
    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// The caller of a call whose `authorization` value is `header`.
    pub async fn authenticate(&self, header: Option<&[u8]>) -> ops::Result<Principal> {
        if self.mode == AuthMode::Off {
            return Ok(Principal::unrestricted(DEV_PRINCIPAL));
        }
        let Some(header) = header else {
            return Err(Error::Unauthenticated(
                "this node requires an API key: send `authorization: Bearer kai_…` \
                 (SDK and CLIs: --api-key or KAIROS_API_KEY)"
                    .into(),
            ));
        };
        let value = std::str::from_utf8(header)
            .map_err(|_| Error::Unauthenticated("the authorization value is not text".into()))?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or_else(|| {
                Error::Unauthenticated("authorization must be `Bearer <API key>`".into())
            })?
            .trim();
        let (id, secret) = parse_token(token).map_err(|r| Error::Unauthenticated(r.into()))?;
        let key = self.key(id).await?;
        let Some(key) = key.filter(|k| secret_matches(k, secret)) else {
            return Err(Error::Unauthenticated(format!("API key {id} is not valid")));
        };
        if key.revoked_at_ms != 0 {
            return Err(Error::Unauthenticated(format!("API key {id} was revoked")));
        }
        Ok(Principal::of_key(&key))
    }

    /// Authenticates, then allows `ns` and `scope`.
    pub async fn authorize(
        &self,
        header: Option<&[u8]>,
        ns: &str,
        scope: Scope,
    ) -> ops::Result<Principal> {
        let p = self.authenticate(header).await?;
        p.allow(ns, scope)?;
        Ok(p)
    }

    async fn key(&self, id: &str) -> ops::Result<Option<ApiKey>> {
        let now = self.sched.clock().now().as_millis();
        if let Some((k, at)) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(id)
            && now.saturating_sub(*at) < CACHE_MS
        {
            return Ok(Some(k.clone()));
        }
        let key = self.sched.api_key(id).await?;
        if let Some(k) = &key {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if cache.len() >= AUTH_CACHE_KEYS_MAX {
                cache.clear();
            }
            cache.insert(id.to_string(), (k.clone(), now));
        }
        Ok(key)
    }

    /// Forgets a cached key (after it was revoked here).
    pub fn forget(&self, id: &str) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, scopes: &[&str]) -> Principal {
        Principal {
            who: "key:k".into(),
            namespace: ns.into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_key_acts_in_its_namespace_with_its_scopes() {
        let worker = key("a", &["worker"]);
        assert!(worker.allow("a", Scope::Worker).is_ok());
        let e = worker.allow("a", Scope::Submit).unwrap_err();
        assert!(matches!(&e, Error::PermissionDenied(m) if m.contains("`submit`")), "{e}");
        let e = worker.allow("b", Scope::Worker).unwrap_err();
        assert!(matches!(&e, Error::PermissionDenied(m) if m.contains("namespace a only")), "{e}");
        assert!(worker.allow(ALL_NAMESPACES, Scope::Worker).is_err());
        let admin = key("a", &["admin"]);
        assert!(admin.allow("a", Scope::Definitions).is_ok());
        assert!(admin.allow("b", Scope::Read).is_err());
        let root = key("*", &["admin"]);
        assert!(root.allow("b", Scope::Read).is_ok() && root.allow("*", Scope::Admin).is_ok());
    }
}
