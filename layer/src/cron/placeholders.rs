//! Input placeholders: `{{…}}` inside the string values of a cron job's inputs (at any depth)
//! are replaced for each occurrence before it is submitted.
//!
//! | placeholder | for an occurrence at 2026-08-13 02:00 in Europe/Berlin (00:00Z) |
//! |---|---|
//! | `{{occurrence}}` | `2026-08-13T00:00:00Z` (RFC 3339, UTC) |
//! | `{{occurrence.local}}` | `2026-08-13T02:00:00+02:00` (RFC 3339, the schedule's zone) |
//! | `{{occurrence.date}}` | `2026-08-13` (local date) |
//! | `{{occurrence.date-N}}` / `{{occurrence.date+N}}` | the local date N days before / after (`{{occurrence.date-1}}` = `2026-08-12`) |
//! | `{{occurrence.unix}}` | `1786579200` (seconds; a JSON number when it is the whole value) |
//! | `{{cronJobId}}` | the cron job's id |
//!
//! Anything else between `{{` and `}}` is rejected when the job is created or updated.

use chrono::Duration;
use serde_json::Value;

use super::zone::{Schedule, utc_rfc3339};
use crate::limits::CRON_DATE_SHIFT_DAYS_MAX;

/// What placeholders are replaced with.
pub struct Occurrence<'a> {
    /// The cron job.
    pub cron_job_id: &'a str,
    /// The occurrence.
    pub occurrence_ms: i64,
    /// The schedule (for local times).
    pub schedule: &'a Schedule,
}

fn value_of(name: &str, o: &Occurrence<'_>) -> Option<String> {
    let local = || o.schedule.local(o.occurrence_ms);
    Some(match name {
        "occurrence" => utc_rfc3339(o.occurrence_ms),
        "occurrence.local" => o.schedule.local_rfc3339(o.occurrence_ms),
        "occurrence.date" => local().format("%Y-%m-%d").to_string(),
        "occurrence.unix" => o.occurrence_ms.div_euclid(1_000).to_string(),
        "cronJobId" => o.cron_job_id.to_string(),
        other => {
            let rest = other.strip_prefix("occurrence.date")?;
            let (sign, n) = match rest.split_at_checked(1)? {
                ("-", n) => (-1, n),
                ("+", n) => (1, n),
                _ => return None,
            };
            let n: i64 = n.parse().ok().filter(|n| (0..=CRON_DATE_SHIFT_DAYS_MAX).contains(n))?;
            let date = local().date_naive() + Duration::days(sign * n);
            date.format("%Y-%m-%d").to_string()
        }
    })
}

const KNOWN: &str = "{{occurrence}}, {{occurrence.local}}, {{occurrence.date}}, \
                     {{occurrence.date-N}}, {{occurrence.date+N}}, {{occurrence.unix}}, {{cronJobId}}";

/// Replaces the placeholders of one string; `Err` names the first unknown or unclosed one.
fn render_str(s: &str, o: &Occurrence<'_>) -> Result<Value, String> {
    if s == "{{occurrence.unix}}" {
        return Ok(Value::from(o.occurrence_ms.div_euclid(1_000)));
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let j = after.find("}}").ok_or_else(|| format!("{{{{ without }}}} in {s:?}"))?;
        let name = after[..j].trim();
        let v = value_of(name, o)
            .ok_or_else(|| format!("unknown placeholder {{{{{name}}}}} (known: {KNOWN})"))?;
        out.push_str(&v);
        rest = &after[j + 2..];
    }
    out.push_str(rest);
    Ok(Value::String(out))
}

fn walk(v: &Value, path: &str, o: &Occurrence<'_>) -> Result<Value, (String, String)> {
    Ok(match v {
        Value::String(s) if s.contains("{{") => {
            render_str(s, o).map_err(|reason| (path.to_string(), reason))?
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, x)| walk(x, &format!("{path}[{i}]"), o))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| Ok((k.clone(), walk(x, &format!("{path}.{k}"), o)?)))
                .collect::<Result<_, (String, String)>>()?,
        ),
        other => other.clone(),
    })
}

/// The inputs of one occurrence. `Err((field, reason))` names the value at fault
/// (`inputs.reportDate`).
pub fn render(inputs: &Value, o: &Occurrence<'_>) -> Result<Value, (String, String)> {
    walk(inputs, "inputs", o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cron::{Expr, FoldPolicy, GapPolicy, parse_zone};

    #[test]
    fn the_seeds_report_date_is_the_local_day_before() {
        let sched = Schedule::new(
            Expr::parse("0 2 * * *").unwrap(),
            parse_zone("Europe/Berlin").unwrap(),
            GapPolicy::default(),
            FoldPolicy::default(),
        );
        // 2026-08-13T02:00+02:00 = 2026-08-13T00:00Z.
        let o =
            Occurrence { cron_job_id: "J1", occurrence_ms: 1_786_579_200_000, schedule: &sched };
        let inputs = serde_json::json!({
            "reportDate": "{{occurrence.date-1}}",
            "at": "{{ occurrence }} / {{occurrence.local}}",
            "n": 3,
            "tags": ["{{cronJobId}}", "day {{occurrence.date}}"],
            "unix": "{{occurrence.unix}}",
        });
        let out = render(&inputs, &o).unwrap();
        assert_eq!(out["reportDate"], "2026-08-12");
        assert_eq!(out["at"], "2026-08-13T00:00:00Z / 2026-08-13T02:00:00+02:00");
        assert_eq!(out["tags"], serde_json::json!(["J1", "day 2026-08-13"]));
        assert_eq!(out["n"], 3);
        assert_eq!(out["unix"], 1_786_579_200i64);
        let (field, reason) =
            render(&serde_json::json!({"a": {"b": ["{{occurence}}"]}}), &o).unwrap_err();
        assert_eq!(field, "inputs.a.b[0]");
        assert!(reason.contains("unknown placeholder {{occurence}}"), "{reason}");
        let (_, reason) = render(&serde_json::json!({"a": "{{occurrence"}), &o).unwrap_err();
        assert!(reason.contains("without"), "{reason}");
        assert!(render(&serde_json::json!({"a": "{{occurrence.date-99999}}"}), &o).is_err());
    }
}
