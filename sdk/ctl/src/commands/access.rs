//! `kairosctl keys …`, `audit`, `whoami`, `limits`.

use kairos_proto::v1::ApiKey;
use kairos_sdk::Client;
use serde_json::{Value, json};

use crate::args::Keys;
use crate::output::{Failure, Opts, table, time};

fn key_json(k: &ApiKey) -> Value {
    json!({
        "id": k.id,
        "namespace": k.namespace,
        "scopes": k.scopes,
        "name": k.name,
        "createdAt": time(k.created_at_ms),
        "createdBy": k.created_by,
        "revokedAt": (k.revoked_at_ms != 0).then(|| time(k.revoked_at_ms)),
        "revokedBy": (!k.revoked_by.is_empty()).then(|| k.revoked_by.clone()),
    })
}

pub(super) async fn keys(client: &Client, o: &Opts, cmd: Keys) -> Result<String, Failure> {
    match cmd {
        Keys::Create { for_namespace, scopes, name } => {
            let r = client.create_api_key(&for_namespace, &scopes, &name).await?;
            let key = r.key.unwrap_or_default();
            if o.json {
                return Ok(json!({"key": key_json(&key), "token": r.token}).to_string());
            }
            Ok(format!(
                "created key {} for namespace {} with scopes {}\n{}\n(the token is shown once: store it now; pass it as --api-key or KAIROS_API_KEY)",
                key.id,
                key.namespace,
                key.scopes.join(","),
                r.token
            ))
        }
        Keys::List { for_namespace } => {
            let keys = client.list_api_keys(for_namespace.as_deref()).await?;
            if o.json {
                return Ok(json!(keys.iter().map(key_json).collect::<Vec<_>>()).to_string());
            }
            let rows = keys
                .iter()
                .map(|k| {
                    vec![
                        k.id.clone(),
                        k.namespace.clone(),
                        k.scopes.join(","),
                        k.name.clone(),
                        time(k.created_at_ms),
                        if k.revoked_at_ms == 0 { "-".into() } else { time(k.revoked_at_ms) },
                    ]
                })
                .collect();
            Ok(table(&["ID", "NAMESPACE", "SCOPES", "NAME", "CREATED", "REVOKED"], rows))
        }
        Keys::Revoke { id } => {
            let k = client.revoke_api_key(&id).await?;
            if o.json {
                return Ok(key_json(&k).to_string());
            }
            Ok(format!("revoked key {} ({})", k.id, time(k.revoked_at_ms)))
        }
    }
}

pub(super) async fn audit(
    client: &Client,
    o: &Opts,
    from_ms: i64,
    limit: u32,
    all_namespaces: bool,
) -> Result<String, Failure> {
    let ns = all_namespaces.then_some("*");
    let entries = client.audit_log(ns, from_ms, limit).await?;
    if o.json {
        return Ok(json!(
            entries
                .iter()
                .map(|e| json!({"namespace": e.namespace, "at": time(e.at_ms), "who": e.who,
                    "action": e.action, "target": e.target, "detail": e.detail}))
                .collect::<Vec<_>>()
        )
        .to_string());
    }
    let rows = entries
        .iter()
        .map(|e| {
            vec![time(e.at_ms), e.who.clone(), e.action.clone(), e.target.clone(), e.detail.clone()]
        })
        .collect();
    Ok(table(&["AT", "WHO", "ACTION", "TARGET", "DETAIL"], rows))
}

pub(super) async fn whoami(client: &Client, o: &Opts) -> Result<String, Failure> {
    let w = client.who_am_i().await?;
    if o.json {
        return Ok(json!({"who": w.who, "namespace": w.namespace, "scopes": w.scopes,
            "authentication": w.authentication})
        .to_string());
    }
    let auth = if w.authentication { "" } else { " (the node checks no keys)" };
    Ok(format!("{} in namespace {} with scopes {}{auth}", w.who, w.namespace, w.scopes.join(",")))
}

pub(super) async fn limits(client: &Client, o: &Opts) -> Result<String, Failure> {
    let l = client.limits().await?;
    if o.json {
        return Ok(json!({"namespace": l.namespace, "submitPerS": l.submit_per_s,
            "pendingMax": l.pending_max, "pending": l.pending, "retentionDays": l.retention_days,
            "inputBytesMax": l.input_bytes_max, "outputBytesMax": l.output_bytes_max,
            "definitionBytesMax": l.definition_bytes_max})
        .to_string());
    }
    let none = |n: u64| if n == 0 { "no limit".to_string() } else { n.to_string() };
    let rows = vec![
        vec!["submissions per second (per node)".into(), none(l.submit_per_s as u64)],
        vec!["pending executions".into(), format!("{} of {}", l.pending, none(l.pending_max))],
        vec![
            "retention of finished executions".into(),
            if l.retention_days == 0 {
                "forever".into()
            } else {
                format!("{} days", l.retention_days)
            },
        ],
        vec!["inputs".into(), format!("{} bytes", l.input_bytes_max)],
        vec!["outputs".into(), format!("{} bytes", l.output_bytes_max)],
        vec!["definition".into(), format!("{} bytes", l.definition_bytes_max)],
    ];
    Ok(format!("namespace {}\n{}", l.namespace, table(&["LIMIT", "VALUE"], rows)))
}
