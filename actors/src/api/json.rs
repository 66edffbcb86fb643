//! The JSON views of the HTTP API: the SDK's ([`kairos_sdk::views`], one per object, which
//! `kairosctl --json` prints too) of the API's messages, and RFC 3339 times.

use chrono::DateTime;
use kairos_proto::storage::v1::{Attempt, Execution, JobDefinition};
use serde_json::Value;

use super::convert;

pub use kairos_sdk::views::rfc3339;

/// Parses an RFC 3339 timestamp (with offset) into milliseconds since the epoch.
pub fn parse_rfc3339(s: &str) -> Result<i64, String> {
    DateTime::parse_from_rfc3339(s).map(|t| t.timestamp_millis()).map_err(|e| {
        format!("must be an RFC 3339 timestamp like 2026-08-13T02:00:00Z ({e}), got {s:?}")
    })
}

/// The view of an execution (with its attempts when given).
pub fn execution(e: &Execution, attempts: Option<&[Attempt]>) -> Value {
    let attempts: Option<Vec<_>> = attempts.map(|a| a.iter().map(convert::attempt).collect());
    kairos_sdk::views::execution(&convert::execution(e), attempts.as_deref())
}

/// The view of a definition: the file's own shape plus where it lives.
pub fn definition(d: &JobDefinition) -> Value {
    kairos_sdk::views::definition(&convert::definition(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_and_bad_ones_are_explained() {
        let ms = parse_rfc3339("2026-08-13T02:00:00Z").unwrap();
        assert_eq!(rfc3339(ms).unwrap(), "2026-08-13T02:00:00.000Z");
        assert_eq!(parse_rfc3339("2026-08-13T04:00:00+02:00").unwrap(), ms);
        assert!(parse_rfc3339("2026-13-13T02:00:00Z").unwrap_err().contains("RFC 3339"));
        assert!(parse_rfc3339("tomorrow").is_err());
        assert_eq!(rfc3339(0), None);
    }

    #[test]
    fn a_definition_reads_as_its_file() {
        let src = "name: echo\nversion: 2\ninputs:\n  name: string\n  n: {type: int, default: 3}\nexecution:\n  type: command\n  command: [cat]\nretry: {max_attempts: 4}\n";
        let d = kairos_layer::definition::parse_definition(src).unwrap();
        let mut v = definition(&d);
        let file = kairos_layer::definition::to_json(&d);
        for k in ["definitionUri", "namespace", "createdAt"] {
            v.as_object_mut().unwrap().remove(k);
        }
        assert_eq!(v, file, "the SDK's view of the API message is the file's own shape");
    }
}
