//! Reading HTTP requests: JSON bodies and query strings whose errors name the field (the
//! path serde reports, or the unknown / missing field), and the namespace header — all
//! checked as the gRPC API checks them.

use axum::extract::rejection::QueryRejection;
use axum::http::HeaderMap;
use kairos_layer::ops::{self, error::invalid};
use serde::de::DeserializeOwned;

/// The namespace of a request (`Kairos-Namespace`, default `default`), checked like a
/// write path's.
pub fn namespace(headers: &HeaderMap) -> Result<String, ops::Error> {
    let ns = match headers.get("kairos-namespace") {
        None => return Ok("default".into()),
        Some(v) => v.to_str().map_err(|_| invalid("namespace", "must be printable ASCII"))?,
    };
    ops::validate::check_name("namespace", ns)?;
    Ok(ns.to_string())
}

/// The caller of a request (its `Authorization` API key) and the namespace it names, once the
/// caller may act there with `scope`. Authentication comes first: a call without a valid key
/// is 401 whatever else is wrong with it.
pub async fn authorized(
    node: &crate::Node,
    headers: &HeaderMap,
    scope: crate::server::auth::Scope,
) -> Result<(String, crate::server::auth::Principal), ops::Error> {
    let header = headers.get(axum::http::header::AUTHORIZATION).map(|v| v.as_bytes());
    let caller = node.auth().authenticate(header).await?;
    let ns = namespace(headers)?;
    caller.allow(&ns, scope)?;
    Ok((ns, caller))
}

/// A JSON object body as `T`. Not JSON or not an object: field `body`; a field of the wrong
/// type or value: that field (dotted path); an unknown or missing field: its name.
pub fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ops::Error> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| invalid("body", format!("malformed JSON: {e}")))?;
    if !v.is_object() {
        return Err(invalid("body", "must be a JSON object"));
    }
    serde_path_to_error::deserialize(v).map_err(|e| {
        let inner = e.inner().to_string();
        let path = e.path().to_string();
        invalid(field_of(&inner, &path), inner)
    })
}

/// A query-string error naming its parameter.
pub fn query_error(e: QueryRejection) -> ops::Error {
    let text = e.body_text();
    // "Failed to deserialize query string: limit: invalid digit found in string"
    let detail = text.split_once("query string: ").map_or(text.as_str(), |(_, d)| d);
    let (path, inner) = match detail.split_once(": ") {
        Some((p, rest)) if p.chars().all(|c| c.is_ascii_alphanumeric() || c == '.') => (p, rest),
        _ => ("", detail),
    };
    invalid(field_of(inner, path), inner.to_string())
}

fn field_of(message: &str, path: &str) -> String {
    let path = if path == "." { "" } else { path };
    for marker in ["unknown field `", "missing field `"] {
        if let Some((_, rest)) = message.split_once(marker) {
            let name = rest.split('`').next().unwrap_or_default();
            // serde_path_to_error's path already ends at an unknown field.
            return if path.is_empty() || path == name || path.ends_with(&format!(".{name}")) {
                if path.is_empty() { name.to_string() } else { path.to_string() }
            } else {
                format!("{path}.{name}")
            };
        }
    }
    if path.is_empty() { "body".to_string() } else { path.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        definition_version: u32,
        inner: Option<Inner>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        n: u8,
    }

    fn field(body: &str) -> String {
        match json_body::<Body>(body.as_bytes()).unwrap_err() {
            ops::Error::InvalidArgument { field, .. } => field,
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn body_errors_name_their_field() {
        assert_eq!(field(r#"{"definitionVersion": 1, "bogus": 2}"#), "bogus");
        assert_eq!(field(r#"{"definitionVersion": -1}"#), "definitionVersion");
        assert_eq!(field(r#"{}"#), "definitionVersion");
        assert_eq!(field(r#"{"definitionVersion": 1, "inner": {"n": 300}}"#), "inner.n");
        assert_eq!(field(r#"[{"definitionVersion": 1}]"#), "body");
        assert_eq!(field(r#"{"definitionVersion": "#), "body");
    }
}
