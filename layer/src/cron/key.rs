//! The idempotency key of an occurrence: `cron:{cron_job_id}:{occurrence as RFC 3339 UTC}`.
//! The cron service submits each occurrence with it, so a retry (after a crash between
//! materializing and advancing, a lost reply, a second owner) finds the same execution; a submit
//! carrying such a key records the cron job and occurrence on its execution.

use chrono::DateTime;

use super::zone::utc_rfc3339;

/// The prefix of every occurrence key.
pub const PREFIX: &str = "cron:";

/// The idempotency key of `cron_job_id`'s occurrence at `occurrence_ms`.
pub fn occurrence_key(cron_job_id: &str, occurrence_ms: i64) -> String {
    format!("{PREFIX}{cron_job_id}:{}", utc_rfc3339(occurrence_ms))
}

/// The prefix shared by the keys of every occurrence of `cron_job_id` (they sort by time).
pub fn job_key_prefix(cron_job_id: &str) -> String {
    format!("{PREFIX}{cron_job_id}:")
}

/// The cron job id and occurrence (ms) of an occurrence key; `None` for any other key.
pub fn parse_occurrence_key(key: &str) -> Option<(String, i64)> {
    let rest = key.strip_prefix(PREFIX)?;
    let (id, at) = rest.split_once(':')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        return None;
    }
    let t = DateTime::parse_from_rfc3339(at).ok()?;
    // Only the canonical form: one occurrence, one key.
    let ms = t.timestamp_millis();
    (occurrence_key(id, ms) == key).then(|| (id.to_string(), ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_other_keys_are_not_occurrences() {
        let k = occurrence_key("01JOB", 1_786_586_400_000);
        assert_eq!(k, "cron:01JOB:2026-08-13T02:00:00Z");
        assert_eq!(parse_occurrence_key(&k), Some(("01JOB".into(), 1_786_586_400_000)));
        assert_eq!(occurrence_key("J", 1_500), "cron:J:1970-01-01T00:00:01.500Z");
        assert_eq!(parse_occurrence_key("cron:J:1970-01-01T00:00:01.500Z").unwrap().1, 1_500);
        for other in [
            "cron-42:2026-08-13T02:00:00Z",
            "cron::2026-08-13T02:00:00Z",
            "cron:J:2026-08-13T04:00:00+02:00",
            "cron:J:tomorrow",
            "demo-1",
        ] {
            assert_eq!(parse_occurrence_key(other), None, "{other}");
        }
        assert!(k.starts_with(&job_key_prefix("01JOB")));
    }
}
