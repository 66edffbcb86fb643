//! API keys and the audit log.
//!
//! A key belongs to one namespace (or to every namespace, `*`) and carries scopes. Its token is
//! `kai_<id>_<secret>`: the id finds the record (tag 27), the secret is checked against the
//! SHA-256 stored there (the secret itself is never stored; it is 192 random bits, so a fast
//! hash is enough). Audited actions (definition registrations, key changes, cancels, replays)
//! are written in the same transaction as the action (tag 28, by namespace and time).

use kairos_proto::storage::v1::{ApiKey, AuditRecord};
use sha2::{Digest, Sha256};

use super::Scheduler;
use super::error::{Error, Result, invalid};
use super::records::{decode, encode};
use crate::kv::Transaction;
use crate::limits::{AUDIT_DETAIL_BYTES_MAX, AUDIT_PAGE_MAX, KEY_NAME_BYTES_MAX};

/// The scopes a key may carry.
pub const SCOPES: [&str; 5] = ["submit", "read", "worker", "definitions", "admin"];

/// The namespace of a key that may act in every namespace.
pub const ALL_NAMESPACES: &str = "*";

/// Prefix of every token.
pub const TOKEN_PREFIX: &str = "kai_";

/// A key just created: its record and the token, shown once.
#[derive(Debug, Clone)]
pub struct NewKey {
    /// The stored record.
    pub key: ApiKey,
    /// `kai_<id>_<secret>`: the only time the secret is seen.
    pub token: String,
}

/// One action to record in the audit log.
#[derive(Debug, Clone)]
pub struct Audit<'a> {
    /// Who asked (`key:<id>`, `cron`, `dev (authentication off)`, …).
    pub who: &'a str,
    /// What was done (`definition.register`, `execution.cancel`, …).
    pub action: &'static str,
    /// What it was done to.
    pub target: String,
    /// More, free text (cut at 512 bytes).
    pub detail: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of a token's secret part.
pub fn secret_digest(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// Splits a token into `(id, secret)`, or says what is wrong with it.
pub fn parse_token(token: &str) -> std::result::Result<(&str, &str), &'static str> {
    let rest = token
        .strip_prefix(TOKEN_PREFIX)
        .ok_or("an API key starts with `kai_` (the whole token printed when it was created)")?;
    let (id, secret) = rest.split_once('_').ok_or("an API key is `kai_<id>_<secret>`")?;
    let hexish = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hexish(id, 16) || !hexish(secret, 48) {
        return Err("an API key is `kai_` then 16 and 48 hexadecimal digits");
    }
    Ok((id, secret))
}

/// Whether `secret` is the key's secret (compared in constant time).
pub fn secret_matches(key: &ApiKey, secret: &str) -> bool {
    let d = secret_digest(secret);
    d.len() == key.secret_sha256.len()
        && d.iter().zip(&key.secret_sha256).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// Whether a key administers every namespace (`*` with the `admin` scope).
pub fn is_cluster_admin(key: &ApiKey) -> bool {
    key.namespace == ALL_NAMESPACES && key.scopes.iter().any(|s| s == "admin")
}

/// Checks a key's namespace: `*` or a namespace name.
pub fn check_key_namespace(ns: &str) -> Result<()> {
    if ns == ALL_NAMESPACES {
        return Ok(());
    }
    super::validate::check_name("namespace", ns)
}

/// The scopes, checked, sorted and without repeats.
pub fn check_scopes(scopes: &[String]) -> Result<Vec<String>> {
    if scopes.is_empty() {
        return Err(invalid("scopes", format!("give at least one of {}", SCOPES.join(", "))));
    }
    let mut out = Vec::new();
    for s in scopes {
        let s = s.trim();
        if !SCOPES.contains(&s) {
            return Err(invalid(
                "scopes",
                format!(
                    "unknown scope {}: the scopes are {}",
                    super::error::shown(s),
                    SCOPES.join(", ")
                ),
            ));
        }
        out.push(s.to_string());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

impl Scheduler {
    /// Creates an API key of `namespace` (or `*`) with `scopes`, recorded in the audit log as
    /// done by `by`.
    pub async fn create_api_key(
        &self,
        namespace: &str,
        scopes: &[String],
        name: &str,
        by: &str,
    ) -> Result<NewKey> {
        check_key_namespace(namespace)?;
        let scopes = check_scopes(scopes)?;
        if name.len() > KEY_NAME_BYTES_MAX || name.chars().any(char::is_control) {
            return Err(invalid(
                "name",
                format!("must be at most {KEY_NAME_BYTES_MAX} bytes of printable text"),
            ));
        }
        let id = hex(&self.rng.secret(8));
        let secret = hex(&self.rng.secret(24));
        let now_ms = self.clock.now().as_millis();
        let key = ApiKey {
            id: id.clone(),
            namespace: namespace.to_string(),
            scopes,
            secret_sha256: secret_digest(&secret),
            name: name.to_string(),
            created_at_ms: now_ms,
            created_by: by.to_string(),
            revoked_at_ms: 0,
            revoked_by: String::new(),
        };
        let audit_id = self.audit_id();
        self.db
            .run(|tx| {
                let key = key.clone();
                let audit_id = audit_id.clone();
                async move {
                    if tx.get(&self.ks.api_key(&key.id)).await?.is_some() {
                        return Err(Error::AlreadyExists { what: "API key", id: key.id });
                    }
                    tx.set(&self.ks.api_key(&key.id), &encode(&key))?;
                    let audit = Audit {
                        who: by,
                        action: "key.create",
                        target: key.id.clone(),
                        detail: format!("scopes {} name {:?}", key.scopes.join(","), key.name),
                    };
                    self.write_audit(&tx, &key.namespace, now_ms, &audit_id, &audit)
                }
            })
            .await?;
        Ok(NewKey { token: format!("{TOKEN_PREFIX}{id}_{secret}"), key })
    }

    /// The key with this id, revoked or not.
    pub async fn api_key(&self, id: &str) -> Result<Option<ApiKey>> {
        let key = self.ks.api_key(id);
        let key = &key;
        let v = self.db.run(|tx| async move { Ok::<_, Error>(tx.get(key).await?) }).await?;
        v.map(|v| decode("api key", &v)).transpose()
    }

    /// Keys (revoked ones included), of `namespace` only when given, by id.
    pub async fn list_api_keys(&self, namespace: Option<&str>) -> Result<Vec<ApiKey>> {
        let range = self.ks.api_keys();
        let range = &range;
        let rows = self
            .db
            .run(|tx| async move { Ok::<_, Error>(tx.get_range(range, true).await?) })
            .await?;
        let mut out = Vec::new();
        for kv in rows {
            let k: ApiKey = decode("api key", &kv.value)?;
            if namespace.is_none_or(|ns| k.namespace == ns) {
                out.push(k);
            }
        }
        Ok(out)
    }

    /// Whether any key that is not revoked exists.
    pub async fn has_live_api_keys(&self) -> Result<bool> {
        Ok(self.list_api_keys(None).await?.iter().any(|k| k.revoked_at_ms == 0))
    }

    /// Revokes a key (for good; idempotent), recorded as done by `by`.
    pub async fn revoke_api_key(&self, id: &str, by: &str) -> Result<ApiKey> {
        let now_ms = self.clock.now().as_millis();
        let audit_id = self.audit_id();
        self.db
            .run(|tx| {
                let audit_id = audit_id.clone();
                async move {
                    let Some(v) = tx.get(&self.ks.api_key(id)).await? else {
                        return Err(Error::NotFound {
                            what: "API key",
                            id: super::error::shown(id),
                        });
                    };
                    let mut key: ApiKey = decode("api key", &v)?;
                    if key.revoked_at_ms != 0 {
                        return Ok(key);
                    }
                    if is_cluster_admin(&key) && self.cluster_admins(&tx).await? <= 1 {
                        return Err(Error::FailedPrecondition(format!(
                            "API key {} is the last admin key of every namespace (`*`): revoking \
                             it would leave nobody able to administer the cluster. Create another \
                             first (kairosctl keys create --for '*' --scope admin), or recover \
                             access on a stopped node with `kairos admin-key --data-dir DIR`",
                            key.id
                        )));
                    }
                    key.revoked_at_ms = now_ms;
                    key.revoked_by = by.to_string();
                    tx.set(&self.ks.api_key(id), &encode(&key))?;
                    let audit = Audit {
                        who: by,
                        action: "key.revoke",
                        target: key.id.clone(),
                        detail: format!("name {:?}", key.name),
                    };
                    self.write_audit(&tx, &key.namespace, now_ms, &audit_id, &audit)?;
                    Ok(key)
                }
            })
            .await
    }

    /// How many live admin keys of every namespace exist (read in `tx`, so a concurrent revoke
    /// of another one conflicts with this transaction).
    async fn cluster_admins(&self, tx: &Transaction) -> Result<usize> {
        let rows = tx.get_range(&self.ks.api_keys(), false).await?;
        let mut n = 0;
        for kv in rows {
            let k: ApiKey = decode("api key", &kv.value)?;
            n += usize::from(k.revoked_at_ms == 0 && is_cluster_admin(&k));
        }
        Ok(n)
    }

    /// A fresh audit record id (chosen outside a transaction's retry loop, so a retried
    /// transaction writes the same record).
    pub(crate) fn audit_id(&self) -> String {
        hex(&self.rng.secret(6))
    }

    /// Writes an audit record in `tx`.
    pub(crate) fn write_audit(
        &self,
        tx: &Transaction,
        ns: &str,
        at_ms: i64,
        id: &str,
        audit: &Audit<'_>,
    ) -> Result<()> {
        let mut detail = audit.detail.clone();
        if detail.len() > AUDIT_DETAIL_BYTES_MAX {
            let mut cut = AUDIT_DETAIL_BYTES_MAX;
            while !detail.is_char_boundary(cut) {
                cut -= 1;
            }
            detail.truncate(cut);
        }
        let record = AuditRecord {
            namespace: ns.to_string(),
            at_ms,
            id: id.to_string(),
            who: audit.who.to_string(),
            action: audit.action.to_string(),
            target: audit.target.clone(),
            detail,
        };
        tx.set(&self.ks.audit(ns, at_ms, id), &encode(&record))?;
        Ok(())
    }

    /// A namespace's audit records (`*` for key changes of all-namespace keys) from `from_ms`
    /// on, oldest first, at most `limit` (≤ [`AUDIT_PAGE_MAX`]).
    pub async fn audit_log(
        &self,
        ns: &str,
        from_ms: i64,
        limit: usize,
    ) -> Result<Vec<AuditRecord>> {
        check_key_namespace(ns)?;
        let range = self.ks.audit_from(ns, from_ms).limit(limit.clamp(1, AUDIT_PAGE_MAX));
        let range = &range;
        let rows = self
            .db
            .run(|tx| async move { Ok::<_, Error>(tx.get_range(range, true).await?) })
            .await?;
        rows.iter().map(|kv| decode("audit", &kv.value)).collect()
    }

    /// Deletes a namespace's audit records older than `before_ms` (one transaction, at most
    /// `max`); returns how many.
    pub async fn sweep_audit(&self, ns: &str, before_ms: i64, max: usize) -> Result<u64> {
        let range = self.ks.audit_before(ns, before_ms).limit(max.max(1));
        let range = &range;
        self.db
            .run(|tx| async move {
                let rows = tx.get_range(range, false).await?;
                for kv in &rows {
                    tx.clear(&kv.key)?;
                }
                Ok::<_, Error>(rows.len() as u64)
            })
            .await
    }

    /// Namespaces that hold audit records (`*` included), in order.
    pub async fn audit_namespaces(&self) -> Result<Vec<String>> {
        let mut out: Vec<String> = Vec::new();
        let mut range = self.ks.subspace_range(crate::keys::Tag::Audit);
        loop {
            let r = range.clone().limit(1);
            let r = &r;
            let rows = self
                .db
                .run(|tx| async move { Ok::<_, Error>(tx.get_range(r, true).await?) })
                .await?;
            let Some(kv) = rows.first() else { break };
            let (ns, _, _) = self.ks.parse_audit(&kv.key)?;
            // Skip past every record of this namespace.
            range.begin = self.ks.audit_all(&ns).end;
            out.push(ns);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_only_in_their_shape() {
        let good = format!("kai_{}_{}", "a".repeat(16), "0".repeat(48));
        assert_eq!(parse_token(&good).unwrap(), ("aaaaaaaaaaaaaaaa", "0".repeat(48).as_str()));
        for bad in [
            "",
            "kai_",
            "bearer",
            "kai_abc_def",
            &good[..good.len() - 1],
            &format!("kai_{}_{}", "g".repeat(16), "0".repeat(48)),
        ] {
            assert!(parse_token(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn scopes_are_checked_and_normalized() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(check_scopes(&s(&["read", "submit", "read"])).unwrap(), s(&["read", "submit"]));
        assert!(check_scopes(&[]).is_err());
        let e = check_scopes(&s(&["root"])).unwrap_err();
        assert!(e.to_string().contains("scopes") && e.to_string().contains("root"), "{e}");
    }

    #[test]
    fn only_the_right_secret_matches() {
        let key = ApiKey { secret_sha256: secret_digest("abc"), ..Default::default() };
        assert!(secret_matches(&key, "abc"));
        assert!(!secret_matches(&key, "abd"));
        assert!(!secret_matches(&ApiKey::default(), "abc"));
    }
}
