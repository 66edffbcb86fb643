//! Checking an execution's inputs against a definition: [`validate_inputs`] and the per-type
//! value checks it shares with the parsing of `default` values.

use kairos_proto::storage::v1::{InputType, JobDefinition};
use serde_json::{Map, Value};

use super::{Result, describe, err, type_name};

/// Checks an execution's inputs (a JSON object) against `def` and returns the snapshot to store:
/// the given values (ints written as `1.0` normalised to `1`) plus the defaults of absent ones;
/// absent optional inputs without a default are left out. `null` counts as absent. Errors name
/// the input (`inputs.report_date`), or `inputs` when the value is not an object.
pub fn validate_inputs(def: &JobDefinition, inputs: &Value) -> Result<Value> {
    let Value::Object(given) = inputs else {
        return Err(err("inputs", format!("must be a JSON object, got {}", describe(inputs))));
    };
    let declared = || def.inputs.iter().map(|d| d.name.as_str());
    let unknown: Vec<&str> =
        given.keys().map(String::as_str).filter(|k| !declared().any(|d| d == *k)).collect();
    if let Some(first) = unknown.first() {
        let names: Vec<&str> = declared().collect();
        let expected = if names.is_empty() {
            "the definition declares no inputs".to_owned()
        } else {
            format!("declared: {}", names.join(", "))
        };
        let also = if unknown.len() > 1 {
            format!("; also unknown: {}", unknown[1..].join(", "))
        } else {
            String::new()
        };
        return Err(err(format!("inputs.{first}"), format!("unknown input ({expected}{also})")));
    }
    let mut snapshot = Map::new();
    for decl in &def.inputs {
        let path = format!("inputs.{}", decl.name);
        match given.get(&decl.name).filter(|v| !v.is_null()) {
            Some(v) => {
                let v = check_value(decl.r#type(), v).map_err(|r| err(&path, r))?;
                snapshot.insert(decl.name.clone(), v);
            }
            None if !decl.default_json.is_empty() => {
                let v = serde_json::from_slice(&decl.default_json)
                    .map_err(|_| err(&path, "the definition's default is not valid JSON"))?;
                snapshot.insert(decl.name.clone(), v);
            }
            None if decl.required => return Err(err(path, "required input is missing")),
            None => {}
        }
    }
    Ok(Value::Object(snapshot))
}

/// Checks `v` against `ty`; returns the value to store or the reason it is rejected.
pub(super) fn check_value(ty: InputType, v: &Value) -> Result<Value, String> {
    let ok = match ty {
        InputType::String => v.is_string(),
        InputType::Int => {
            // Some encoders (JavaScript, Python floats) write integral numbers as 1.0. Accept
            // those while exact (|n| <= 2^53) and store them as integers.
            if v.is_f64()
                && let Some(f) = v.as_f64()
                && f.fract() == 0.0
                && f.abs() <= 9_007_199_254_740_992.0
            {
                return Ok(Value::from(f as i64));
            }
            v.is_i64()
        }
        InputType::Number => v.is_number(),
        InputType::Bool => v.is_boolean(),
        InputType::Date => v.as_str().is_some_and(|s| is_date(s.as_bytes())),
        InputType::Datetime => v.as_str().is_some_and(|s| is_datetime(s.as_bytes())),
        InputType::Uri => v.as_str().is_some_and(is_uri),
        InputType::Object => v.is_object(),
        InputType::List => v.is_array(),
        InputType::Unspecified => {
            return Err("the definition declares no known type for this input".to_owned());
        }
    };
    if ok {
        return Ok(v.clone());
    }
    let expected = match ty {
        InputType::Date => "date (YYYY-MM-DD)",
        InputType::Datetime => "datetime (RFC 3339, e.g. 2026-08-13T02:00:00Z)",
        InputType::Uri => "uri (scheme:rest, no whitespace)",
        InputType::Int => "int (a 64-bit signed integer)",
        other => type_name(other),
    };
    Err(format!("expected {expected}, got {}", describe(v)))
}

fn number(b: &[u8]) -> Option<u32> {
    if b.is_empty() || b.len() > 4 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(b.iter().fold(0, |n, c| n * 10 + u32::from(c - b'0')))
}

/// `YYYY-MM-DD`, a real day of the proleptic Gregorian calendar.
fn is_date(b: &[u8]) -> bool {
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let (Some(y), Some(m), Some(d)) = (number(&b[0..4]), number(&b[5..7]), number(&b[8..10]))
    else {
        return false;
    };
    let leap = y.is_multiple_of(4) && (!y.is_multiple_of(100) || y.is_multiple_of(400));
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&d)
}

/// RFC 3339 `date-time`: `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`, `T` and `Z` in either case.
/// Second 60 (a leap second) is rejected: most consumers cannot represent it.
fn is_datetime(b: &[u8]) -> bool {
    let hm = |h: &[u8], m: &[u8]| {
        number(h).is_some_and(|h| h <= 23) && number(m).is_some_and(|m| m <= 59)
    };
    if b.len() < 20 || !is_date(&b[..10]) || !matches!(b[10], b'T' | b't') {
        return false;
    }
    let time = &b[11..19];
    if time[2] != b':' || time[5] != b':' || !hm(&time[0..2], &time[3..5]) {
        return false;
    }
    if number(&time[6..8]).is_none_or(|s| s > 59) {
        return false;
    }
    let mut rest = &b[19..];
    if let Some(frac) = rest.strip_prefix(b".") {
        let digits = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return false;
        }
        rest = &frac[digits..];
    }
    match rest {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => hm(&[*h1, *h2], &[*m1, *m2]),
        _ => false,
    }
}

/// `scheme:rest` with an RFC 3986 scheme, a non-empty rest and no whitespace anywhere.
fn is_uri(s: &str) -> bool {
    let Some((scheme, rest)) = s.split_once(':') else { return false };
    let b = scheme.as_bytes();
    matches!(b.first(), Some(c) if c.is_ascii_alphabetic())
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"+.-".contains(c))
        && !rest.is_empty()
        && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}
