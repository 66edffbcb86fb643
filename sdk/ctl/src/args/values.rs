//! The parsers of flag values: times, seconds, JSON. Each error says what was expected.

use std::time::Duration;

use serde_json::Value;

/// An RFC 3339 time → ms since the epoch.
pub fn rfc3339(v: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("not an RFC 3339 time like 2026-03-08T00:00:00Z ({e})"))
}

/// An RFC 3339 time, or "" (0: none).
pub fn rfc3339_or_empty(v: &str) -> Result<i64, String> {
    if v.is_empty() { Ok(0) } else { rfc3339(v) }
}

/// Seconds (fractions allowed, not negative).
pub fn seconds(v: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("not a number of seconds: {v:?}"))
}

/// Seconds → ms.
pub fn seconds_ms(v: &str) -> Result<i64, String> {
    seconds(v).map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A JSON value.
pub fn json_value(v: &str) -> Result<Value, String> {
    serde_json::from_str(v).map_err(|e| format!("malformed JSON: {e}"))
}

/// A JSON value, re-serialized.
pub fn json_text(v: &str) -> Result<String, String> {
    json_value(v).map(|j| j.to_string())
}

/// A page size: 1 to the node's page bound.
pub fn page_limit(v: &str) -> Result<u32, String> {
    let max = kairos_sdk::limits::LIST_PAGE_MAX;
    match v.parse::<u32>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be a number from 1 to {max} (a page: --cursor gives the next)")),
    }
}

/// A cursor's bytes. An alias, so that clap's derive takes `Option<Cursor>` for one optional
/// value (it reads `Option<Vec<u8>>` as any number of `u8` values, and panicked at the first
/// `--cursor`).
pub type Cursor = Vec<u8>;

/// A list cursor, as a page printed it.
pub fn cursor(v: &str) -> Result<Cursor, String> {
    kairos_sdk::views::parse_cursor(v)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| "not a cursor printed by a list (hex)".to_string())
}
