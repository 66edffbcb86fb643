//! Job definition files: parsing a YAML or JSON file into a [`JobDefinition`] record, rendering
//! a record back in the file's shape, and validating an execution's inputs against it.
//!
//! ```yaml
//! name: generate-report          # [a-z0-9][a-z0-9-_.]{0,127}
//! version: 3                     # positive integer
//! description: Daily report      # optional
//! inputs:                        # name: type, or the long form below; order is kept
//!   dataset_uri: string
//!   report_date: {type: date, required: false, default: "2026-01-01", description: "..."}
//! outputs:
//!   report_uri: string           # or {type: ..., description: ...}
//! execution:                     # required, opaque to the scheduler, needs a string `type`
//!   type: container
//!   image: report-generator:v3
//! queue: reports                 # optional, defaults to the name
//! retry: {max_attempts: 3, base_delay: 1s, max_delay: 5m}
//! timeouts: {attempt: 0, lease: 30s}   # "500ms", "30s", "5m", "2h", "1d" or integer ms
//! ```
//!
//! A file is JSON when its first non-space character is `{`, YAML otherwise. Every error is a
//! [`DefinitionError`] naming the offending field path (`inputs.report_date.type`) and why; errors
//! about the file as a whole (size, encoding, syntax) use the field `definition`. A `null` value
//! (`description:` with nothing after it) counts as absent everywhere.

use std::collections::HashSet;
use std::fmt;

use kairos_proto::storage::v1::{InputDecl, InputType, JobDefinition, OutputDecl, RetryPolicy};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value, json};

#[cfg(test)]
mod tests;

/// Largest definition file accepted, in bytes (256 KiB).
pub const MAX_DEFINITION_BYTES: usize = 256 * 1024;
/// `retry.max_attempts` when the file does not set it.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// `retry.base_delay` when the file does not set it (1s).
pub const DEFAULT_BASE_DELAY_MS: u64 = 1_000;
/// `retry.max_delay` when the file does not set it (5m).
pub const DEFAULT_MAX_DELAY_MS: u64 = 5 * 60_000;
/// `timeouts.lease` when the file does not set it (30s).
pub const DEFAULT_LEASE_MS: u64 = 30_000;
/// Longest duration accepted anywhere in a definition (30 days). Keeps `now + duration`
/// arithmetic on millisecond timestamps far from overflow in every caller.
pub const MAX_DURATION_MS: u64 = 30 * DAY_MS;

const DAY_MS: u64 = 24 * 3_600_000;
const URI_PREFIX: &str = "registry://jobs/";
const NAME_PATTERN: &str = "[a-z0-9][a-z0-9-_.]{0,127}";
// Input and output names become JSON keys, template variables and environment variables in
// workers, and a dot would make field paths ambiguous: identifiers only. Loosening this later
// is compatible; tightening would not be.
const IDENT_PATTERN: &str = "[A-Za-z_][A-Za-z0-9_]{0,127}";
const TYPE_NAMES: &str = "string, int, number, bool, date, datetime, uri, object, list";
const TYPES: [(&str, InputType); 9] = [
    ("string", InputType::String),
    ("int", InputType::Int),
    ("number", InputType::Number),
    ("bool", InputType::Bool),
    ("date", InputType::Date),
    ("datetime", InputType::Datetime),
    ("uri", InputType::Uri),
    ("object", InputType::Object),
    ("list", InputType::List),
];
const TOP_KEYS: &[&str] = &[
    "name",
    "version",
    "description",
    "inputs",
    "outputs",
    "execution",
    "queue",
    "retry",
    "timeouts",
];

/// A definition file or an input snapshot that is not valid: which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct DefinitionError {
    field: String,
    reason: String,
}

impl DefinitionError {
    /// An error about `field` (a dotted path such as `inputs.report_date.type`).
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        DefinitionError { field: field.into(), reason: reason.into() }
    }
    /// The path of the offending field (`definition` for the file as a whole).
    pub fn field(&self) -> &str {
        &self.field
    }
    /// Why the field is rejected.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> DefinitionError {
    DefinitionError::new(field, reason)
}

type Result<T, E = DefinitionError> = std::result::Result<T, E>;

/// Parses a definition file (YAML, or JSON when the first non-space character is `{`) into a
/// record with every default filled in. `namespace` is left empty and `created_at_ms` 0: the
/// caller fills them. Never panics, whatever the bytes.
pub fn parse_definition(source: impl AsRef<[u8]>) -> Result<JobDefinition> {
    let bytes = source.as_ref();
    if bytes.len() > MAX_DEFINITION_BYTES {
        return Err(err(
            "definition",
            format!("file is {} bytes, over the 256 KiB limit", bytes.len()),
        ));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| err("definition", format!("file is not valid UTF-8 ({e})")))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let root = if text.trim_start().starts_with('{') {
        serde_json::from_str::<Node>(text)
            .map_err(|e| err("definition", format!("invalid JSON: {e}")))?
    } else {
        serde_yaml_ng::from_str::<Node>(text)
            .map_err(|e| err("definition", format!("invalid YAML: {e}")))?
    };
    from_tree(root)
}

fn from_tree(root: Node) -> Result<JobDefinition> {
    if matches!(root, Node::Null) {
        return Err(err("definition", "file is empty"));
    }
    let mut top = Fields::new(root, "", "definition")?;
    top.reject_unknown(TOP_KEYS)?;
    let name = match top.take("name") {
        Some(Node::Str(s)) if is_name(&s) => s,
        Some(_) => return Err(err("name", format!("must match {NAME_PATTERN}"))),
        None => return Err(err("name", "is required")),
    };
    let version = match top.take("version") {
        Some(Node::Int(v)) if v > u32::MAX as i128 => {
            return Err(err("version", format!("must be a positive integer up to {}", u32::MAX)));
        }
        Some(Node::Int(v)) if v >= 1 => v as u32,
        Some(_) => return Err(err("version", "must be a positive integer")),
        None => return Err(err("version", "is required")),
    };
    let description = opt_string(top.take("description"), "description")?.unwrap_or_default();
    let inputs = declarations(top.take("inputs"), "inputs")?;
    let outputs = declarations(top.take("outputs"), "outputs")?;
    let execution_json = execution(top.take("execution"))?;
    let queue = match opt_string(top.take("queue"), "queue")? {
        Some(q) if is_name(&q) => q,
        Some(_) => return Err(err("queue", format!("must match {NAME_PATTERN}"))),
        None => name.clone(),
    };
    let retry_policy = retry(top.take("retry"))?;
    let (attempt_timeout_ms, lease_ms) = timeouts(top.take("timeouts"))?;
    Ok(JobDefinition {
        namespace: String::new(),
        name,
        version,
        description,
        inputs,
        outputs: outputs
            .into_iter()
            .map(|d| OutputDecl { name: d.name, r#type: d.r#type, description: d.description })
            .collect(),
        execution_json,
        queue,
        retry_policy: Some(retry_policy),
        attempt_timeout_ms,
        lease_ms,
        created_at_ms: 0,
    })
}

/// An `inputs` or `outputs` mapping. The two share their syntax except that only inputs may say
/// `required` or `default`, so outputs are parsed as inputs and converted.
fn declarations(node: Option<Node>, list: &str) -> Result<Vec<InputDecl>> {
    let entries = match node {
        None => return Ok(Vec::new()),
        Some(Node::Map(entries)) => entries,
        Some(other) => {
            return Err(err(
                list,
                format!("must be a mapping of name to type, got {}", other.kind()),
            ));
        }
    };
    let is_input = list == "inputs";
    let mut decls = Vec::with_capacity(entries.len());
    for (name, spec) in entries {
        let path = format!("{list}.{name}");
        if !is_ident(&name) {
            return Err(err(path, format!("name must match {IDENT_PATTERN}")));
        }
        let mut decl = InputDecl { name, required: true, ..Default::default() };
        match spec {
            Node::Str(ty) => decl.set_type(input_type(&ty, &format!("{path}.type"))?),
            spec @ Node::Map(_) => {
                let mut f = Fields::new(spec, &path, "")?;
                f.reject_unknown(if is_input {
                    &["type", "required", "default", "description"]
                } else {
                    &["type", "description"]
                })?;
                let ty_path = f.path("type");
                decl.set_type(match opt_string(f.take("type"), &ty_path)? {
                    Some(ty) => input_type(&ty, &ty_path)?,
                    None => return Err(err(ty_path, "is required")),
                });
                decl.description =
                    opt_string(f.take("description"), &f.path("description"))?.unwrap_or_default();
                let required = match f.take("required") {
                    None => None,
                    Some(Node::Bool(b)) => Some(b),
                    Some(_) => return Err(err(f.path("required"), "must be true or false")),
                };
                if let Some(default) = f.take("default") {
                    let default_path = f.path("default");
                    let value = default.into_json(&default_path)?;
                    let value =
                        check_value(decl.r#type(), &value).map_err(|r| err(&default_path, r))?;
                    if required == Some(true) {
                        return Err(err(
                            f.path("required"),
                            "cannot be true when a default is given",
                        ));
                    }
                    decl.default_json = serde_json::to_vec(&value).unwrap_or_default();
                    decl.required = false;
                } else {
                    decl.required = required.unwrap_or(true);
                }
            }
            other => {
                return Err(err(
                    path,
                    format!("must be a type name or a mapping with `type`, got {}", other.kind()),
                ));
            }
        }
        decls.push(decl);
    }
    Ok(decls)
}

fn input_type(name: &str, path: &str) -> Result<InputType> {
    TYPES.iter().find(|(n, _)| *n == name).map(|(_, t)| *t).ok_or_else(|| {
        err(path, format!("unknown type {} (expected one of {TYPE_NAMES})", quote(name)))
    })
}

fn type_name(ty: InputType) -> &'static str {
    TYPES.iter().find(|(_, t)| *t == ty).map_or("unspecified", |(n, _)| n)
}

fn execution(node: Option<Node>) -> Result<Vec<u8>> {
    let Some(node) = node else { return Err(err("execution", "is required")) };
    let mut f = Fields::new(node, "execution", "")?;
    match f.entries.iter().find(|(k, _)| k == "type").map(|(_, v)| v) {
        Some(Node::Str(t)) if !t.is_empty() => {}
        Some(Node::Str(_)) => return Err(err("execution.type", "must not be empty")),
        Some(_) => return Err(err("execution.type", "must be a string")),
        None => return Err(err("execution.type", "is required")),
    }
    let value = Node::Map(std::mem::take(&mut f.entries)).into_json("execution")?;
    Ok(serde_json::to_vec(&value).unwrap_or_default())
}

fn retry(node: Option<Node>) -> Result<RetryPolicy> {
    let mut policy = RetryPolicy {
        max_attempts: DEFAULT_MAX_ATTEMPTS,
        base_delay_ms: DEFAULT_BASE_DELAY_MS,
        max_delay_ms: DEFAULT_MAX_DELAY_MS,
    };
    let Some(node) = node else { return Ok(policy) };
    let mut f = Fields::new(node, "retry", "")?;
    f.reject_unknown(&["max_attempts", "base_delay", "max_delay"])?;
    match f.take("max_attempts") {
        None => {}
        Some(Node::Int(n)) if (1..=100).contains(&n) => policy.max_attempts = n as u32,
        Some(Node::Int(_)) => return Err(err("retry.max_attempts", "must be between 1 and 100")),
        Some(_) => {
            return Err(err("retry.max_attempts", "must be an integer between 1 and 100"));
        }
    }
    if let Some(d) = f.take("base_delay") {
        policy.base_delay_ms = duration(d, "retry.base_delay")?;
    }
    let max_given = f.take("max_delay").map(|d| duration(d, "retry.max_delay")).transpose()?;
    policy.max_delay_ms = max_given.unwrap_or(DEFAULT_MAX_DELAY_MS);
    if policy.max_delay_ms < policy.base_delay_ms {
        // Say when the offending value is the default: the user never wrote it.
        let note = if max_given.is_none() { " (the default)" } else { "" };
        return Err(err(
            "retry.max_delay",
            format!(
                "must be at least base_delay ({}), is {}{note}",
                format_duration(policy.base_delay_ms),
                format_duration(policy.max_delay_ms)
            ),
        ));
    }
    Ok(policy)
}

fn timeouts(node: Option<Node>) -> Result<(u64, u64)> {
    let Some(node) = node else { return Ok((0, DEFAULT_LEASE_MS)) };
    let mut f = Fields::new(node, "timeouts", "")?;
    f.reject_unknown(&["attempt", "lease"])?;
    let attempt = f.take("attempt").map(|d| duration(d, "timeouts.attempt")).transpose()?;
    let lease = f.take("lease").map(|d| duration(d, "timeouts.lease")).transpose()?;
    // A zero lease would expire every attempt the moment it is claimed.
    if lease == Some(0) {
        return Err(err("timeouts.lease", "must be greater than 0"));
    }
    Ok((attempt.unwrap_or(0), lease.unwrap_or(DEFAULT_LEASE_MS)))
}

/// A duration: an integer number of milliseconds or a string `<digits><ms|s|m|h|d>`.
fn duration(node: Node, path: &str) -> Result<u64> {
    let ms = match &node {
        Node::Int(n) if *n >= 0 => Some(u64::try_from(*n).unwrap_or(u64::MAX)),
        Node::Str(s) => {
            let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            let (digits, unit) = s.split_at(split);
            let scale = match unit {
                "ms" => Some(1),
                "s" => Some(1_000),
                "m" => Some(60_000),
                "h" => Some(3_600_000),
                "d" => Some(DAY_MS),
                _ => None,
            };
            match scale {
                // Too many digits for u64 is still a duration, just too long.
                Some(scale) if !digits.is_empty() => {
                    Some(digits.parse::<u64>().unwrap_or(u64::MAX).saturating_mul(scale))
                }
                _ => {
                    return Err(err(
                        path,
                        format!(
                            "invalid duration {} (expected milliseconds as an integer or a \
                             string like \"500ms\", \"30s\", \"5m\", \"2h\", \"1d\")",
                            quote(s)
                        ),
                    ));
                }
            }
        }
        _ => None,
    };
    match ms {
        Some(ms) if ms <= MAX_DURATION_MS => Ok(ms),
        Some(_) => Err(err(path, "must be at most 30d")),
        None => Err(err(
            path,
            format!(
                "must be a duration (integer milliseconds or a string like \"30s\"), got {}",
                node.kind()
            ),
        )),
    }
}

/// Renders a duration in the largest unit that divides it exactly, so it parses back.
fn format_duration(ms: u64) -> String {
    let units = [(DAY_MS, "d"), (3_600_000, "h"), (60_000, "m"), (1_000, "s")];
    match units.iter().find(|(scale, _)| ms != 0 && ms.is_multiple_of(*scale)) {
        Some((scale, unit)) => format!("{}{unit}", ms / scale),
        None if ms == 0 => "0s".to_owned(),
        None => format!("{ms}ms"),
    }
}

fn opt_string(node: Option<Node>, path: &str) -> Result<Option<String>> {
    match node {
        None => Ok(None),
        Some(Node::Str(s)) => Ok(Some(s)),
        Some(other) => Err(err(path, format!("must be a string, got {}", other.kind()))),
    }
}

fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    let body = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || b"-_.".contains(c);
    matches!(b.first(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && b.len() <= 128
        && b.iter().all(body)
}

fn is_ident(s: &str) -> bool {
    let b = s.as_bytes();
    matches!(b.first(), Some(c) if c.is_ascii_alphabetic() || *c == b'_')
        && b.len() <= 128
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Renders a record in the file's shape, every setting explicit (durations as strings such as
/// `"5m"`), for `definitions get`. It parses back to the same record; `namespace` and
/// `created_at_ms` are not part of a file and left out. Key order is serde_json's: sorted, unless
/// its `preserve_order` feature is on, so `inputs` may not list in declared order.
pub fn to_json(def: &JobDefinition) -> Value {
    let mut out = Map::new();
    out.insert("name".into(), def.name.clone().into());
    out.insert("version".into(), def.version.into());
    if !def.description.is_empty() {
        out.insert("description".into(), def.description.clone().into());
    }
    let inputs = def.inputs.iter().map(|d| {
        let short = d.required && d.default_json.is_empty() && d.description.is_empty();
        let ty = type_name(d.r#type());
        if short {
            return (d.name.clone(), Value::from(ty));
        }
        let mut long = Map::new();
        long.insert("type".into(), ty.into());
        if !d.required && d.default_json.is_empty() {
            long.insert("required".into(), false.into());
        }
        if !d.default_json.is_empty() {
            long.insert("default".into(), json_or_null(&d.default_json));
        }
        if !d.description.is_empty() {
            long.insert("description".into(), d.description.clone().into());
        }
        (d.name.clone(), Value::Object(long))
    });
    out.insert("inputs".into(), Value::Object(inputs.collect()));
    let outputs = def.outputs.iter().map(|d| {
        let ty = Value::from(type_name(d.r#type()));
        if d.description.is_empty() {
            return (d.name.clone(), ty);
        }
        (d.name.clone(), json!({"type": ty, "description": d.description}))
    });
    out.insert("outputs".into(), Value::Object(outputs.collect()));
    out.insert("execution".into(), json_or_null(&def.execution_json));
    out.insert("queue".into(), def.queue.clone().into());
    if let Some(r) = &def.retry_policy {
        let retry = json!({
            "max_attempts": r.max_attempts,
            "base_delay": format_duration(r.base_delay_ms),
            "max_delay": format_duration(r.max_delay_ms),
        });
        out.insert("retry".into(), retry);
    }
    let timeouts = json!({
        "attempt": format_duration(def.attempt_timeout_ms),
        "lease": format_duration(def.lease_ms),
    });
    out.insert("timeouts".into(), timeouts);
    Value::Object(out)
}

// Stored JSON was produced by this module, so it parses; should a record be corrupt anyway,
// showing null beats failing the whole `get`.
fn json_or_null(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or(Value::Null)
}

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
fn check_value(ty: InputType, v: &Value) -> Result<Value, String> {
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

/// How a rejected value is shown in an error: scalars as JSON (long strings cut), containers by
/// kind, so one bad input cannot blow up an error message.
fn describe(v: &Value) -> String {
    match v {
        Value::Object(_) => "an object".to_owned(),
        Value::Array(_) => "a list".to_owned(),
        Value::String(s) if s.chars().nth(64).is_some() => {
            let head: String = s.chars().take(64).collect();
            format!("{}… ({} chars)", quote(&head), s.chars().count())
        }
        other => other.to_string(),
    }
}

fn quote(s: &str) -> String {
    Value::from(s).to_string()
}

/// The address of a definition in the registry: `registry://jobs/<name>`.
pub fn definition_uri(name: &str) -> String {
    format!("{URI_PREFIX}{name}")
}

/// The definition name in a `registry://jobs/<name>` address (field `definitionUri` on error).
pub fn parse_definition_uri(uri: &str) -> Result<String> {
    match uri.strip_prefix(URI_PREFIX) {
        Some(name) if is_name(name) => Ok(name.to_owned()),
        _ => Err(err(
            "definitionUri",
            format!(
                "must be {URI_PREFIX}<name> with <name> matching {NAME_PATTERN}, got {}",
                describe(&Value::from(uri))
            ),
        )),
    }
}

/// The parsed file before interpretation. Unlike `serde_json::Value` (a sorted map without the
/// `preserve_order` feature) it keeps mappings in file order, which the input list depends on,
/// and one type serves both YAML and JSON.
#[derive(Debug)]
enum Node {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    List(Vec<Node>),
    Map(Vec<(String, Node)>),
}

impl Node {
    fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Int(_) => "an integer",
            Node::Float(_) => "a number",
            Node::Str(_) => "a string",
            Node::List(_) => "a list",
            Node::Map(_) => "a mapping",
        }
    }

    fn into_json(self, path: &str) -> Result<Value> {
        Ok(match self {
            Node::Null => Value::Null,
            Node::Bool(b) => b.into(),
            Node::Int(n) => match (i64::try_from(n), u64::try_from(n)) {
                (Ok(n), _) => n.into(),
                (_, Ok(n)) => n.into(),
                // As serde_json reads such integers from a JSON file: a (rounded) float.
                _ => serde_json::Number::from_f64(n as f64).map_or(Value::Null, Value::Number),
            },
            // YAML's .nan and .inf have no JSON form.
            Node::Float(f) => serde_json::Number::from_f64(f)
                .map(Value::Number)
                .ok_or_else(|| err(path, "must be a finite number"))?,
            Node::Str(s) => s.into(),
            Node::List(items) => Value::Array(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, n)| n.into_json(&format!("{path}[{i}]")))
                    .collect::<Result<_>>()?,
            ),
            Node::Map(entries) => Value::Object(
                entries
                    .into_iter()
                    .map(|(k, n)| n.into_json(&format!("{path}.{k}")).map(|v| (k, v)))
                    .collect::<Result<_>>()?,
            ),
        })
    }
}

/// A mapping being interpreted: keys are taken one by one; `path` prefixes error fields.
struct Fields {
    path: String,
    entries: Vec<(String, Node)>,
}

impl Fields {
    fn new(node: Node, path: &str, what: &str) -> Result<Self> {
        match node {
            Node::Map(entries) => Ok(Fields { path: path.to_owned(), entries }),
            other => Err(err(
                if path.is_empty() { what } else { path },
                format!("must be a mapping, got {}", other.kind()),
            )),
        }
    }

    fn path(&self, key: &str) -> String {
        if self.path.is_empty() { key.to_owned() } else { format!("{}.{key}", self.path) }
    }

    /// Rejects the first key not in `allowed`, naming it (and any further unknown ones).
    fn reject_unknown(&self, allowed: &[&str]) -> Result<()> {
        let unknown: Vec<&str> =
            self.entries.iter().map(|(k, _)| k.as_str()).filter(|k| !allowed.contains(k)).collect();
        let Some(first) = unknown.first() else { return Ok(()) };
        let also = if unknown.len() > 1 {
            format!("; also unknown: {}", unknown[1..].join(", "))
        } else {
            String::new()
        };
        Err(err(
            self.path(first),
            format!("unknown key (expected one of {}{also})", allowed.join(", ")),
        ))
    }

    /// Removes and returns `key`'s value; `null` reads as absent.
    fn take(&mut self, key: &str) -> Option<Node> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        match self.entries.remove(i).1 {
            Node::Null => None,
            node => Some(node),
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a YAML or JSON value")
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }
    fn visit_i128<E>(self, v: i128) -> Result<Node, E> {
        Ok(Node::Int(v))
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Node, E> {
        i128::try_from(v).map(Node::Int).map_err(|_| E::custom("integer out of range"))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }
    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<Node, A::Error> {
        // Only YAML tags (`!name value`) reach this: their meaning is application-defined.
        Err(de::Error::custom("YAML tags such as `!name` are not supported"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::List(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        // serde_json keeps the last of duplicate keys silently; a definition saying two
        // different things about one key is a mistake worth reporting (with its position).
        let mut entries = Vec::new();
        let mut seen = HashSet::new();
        while let Some(Key(key)) = map.next_key()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("duplicate key {}", quote(&key))));
            }
            entries.push((key, map.next_value()?));
        }
        Ok(Node::Map(entries))
    }
}

/// A mapping key: strings only, so every key has a JSON form and a field path.
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_str<E>(self, v: &str) -> Result<Key, E> {
                Ok(Key(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Key, E> {
                Ok(Key(v))
            }
        }
        d.deserialize_any(KeyVisitor)
    }
}
