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

use kairos_proto::storage::v1::{InputDecl, InputType, JobDefinition, OutputDecl, RetryPolicy};
use serde_json::{Map, Value, json};

use inputs::check_value;
pub use inputs::validate_inputs;
use tree::{Fields, Tree};

mod depth;
mod inputs;
mod tree;

#[cfg(test)]
mod tests;

/// Largest definition file accepted, in bytes (256 KiB).
pub const MAX_DEFINITION_BYTES: usize = 256 * 1024;
/// Deepest nesting of collections a definition file may have (a definition needs about 4).
pub const MAX_DEFINITION_NESTING: usize = 64;
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
    // Bounded before the document is parsed: a YAML parser's work grows faster than linearly
    // with nesting (100,000 levels of `[[[…]]]` took 23 s), and no definition needs more than
    // a few. JSON: a linear pre-scan (JSON's quotes are unambiguous); YAML: the parser itself,
    // stopped at the first collection past the limit ([`depth`]).
    let json = text.trim_start().starts_with('{');
    let depth = match json {
        true => Some(nesting_bound(text)).filter(|d| *d > MAX_DEFINITION_NESTING),
        false => depth::within(text, MAX_DEFINITION_NESTING).err(),
    };
    if let Some(depth) = depth {
        return Err(err(
            "definition",
            format!(
                "nests {depth} levels deep or more, over the limit of {MAX_DEFINITION_NESTING}"
            ),
        ));
    }
    let root = if json {
        serde_json::from_str::<Tree>(text)
            .map_err(|e| err("definition", format!("invalid JSON: {e}")))?
    } else {
        serde_yaml_ng::from_str::<Tree>(text)
            .map_err(|e| err("definition", format!("invalid YAML: {e}")))?
    };
    from_tree(root)
}

fn from_tree(root: Tree) -> Result<JobDefinition> {
    if matches!(root, Tree::Null) {
        return Err(err("definition", "file is empty"));
    }
    let mut top = Fields::new(root, "", "definition")?;
    top.reject_unknown(TOP_KEYS)?;
    let name = match top.take("name") {
        Some(Tree::Str(s)) if is_name(&s) => s,
        Some(_) => return Err(err("name", format!("must match {NAME_PATTERN}"))),
        None => return Err(err("name", "is required")),
    };
    let version = match top.take("version") {
        Some(Tree::Int(v)) if v > u32::MAX as i128 => {
            return Err(err("version", format!("must be a positive integer up to {}", u32::MAX)));
        }
        Some(Tree::Int(v)) if v >= 1 => v as u32,
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
fn declarations(node: Option<Tree>, list: &str) -> Result<Vec<InputDecl>> {
    let entries = match node {
        None => return Ok(Vec::new()),
        Some(Tree::Map(entries)) => entries,
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
            Tree::Str(ty) => decl.set_type(input_type(&ty, &format!("{path}.type"))?),
            spec @ Tree::Map(_) => {
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
                    Some(Tree::Bool(b)) => Some(b),
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

fn execution(node: Option<Tree>) -> Result<Vec<u8>> {
    let Some(node) = node else { return Err(err("execution", "is required")) };
    let mut f = Fields::new(node, "execution", "")?;
    match f.entries.iter().find(|(k, _)| k == "type").map(|(_, v)| v) {
        Some(Tree::Str(t)) if !t.is_empty() => {}
        Some(Tree::Str(_)) => return Err(err("execution.type", "must not be empty")),
        Some(_) => return Err(err("execution.type", "must be a string")),
        None => return Err(err("execution.type", "is required")),
    }
    let value = Tree::Map(std::mem::take(&mut f.entries)).into_json("execution")?;
    builtin_execution(&value)?;
    Ok(serde_json::to_vec(&value).unwrap_or_default())
}

/// The `execution.type`s whose executors ship with Kairos (`kairos worker`); any other type
/// is left to a worker of one's own and accepted as it is.
pub const BUILTIN_EXECUTION_TYPES: [&str; 2] = ["command", "http"];

/// Checks the block of a built-in executor as that executor reads it, so that a definition
/// it cannot run is refused at registration rather than failing at every run.
fn builtin_execution(exec: &Value) -> Result<()> {
    let field = |k: &str| exec.get(k).filter(|v| !v.is_null());
    let strings = |v: &Value| v.as_array().is_some_and(|a| a.iter().all(Value::is_string));
    match exec.get("type").and_then(Value::as_str) {
        Some("command") => {
            match field("command") {
                None => return Err(err("execution.command", "is required for type command")),
                Some(c) if !strings(c) => {
                    return Err(err("execution.command", "must be a list of strings (argv)"));
                }
                Some(c) if c.as_array().is_some_and(Vec::is_empty) => {
                    return Err(err("execution.command", "must not be empty"));
                }
                Some(_) => {}
            }
            let codes = field("permanent_exit_codes");
            if codes.is_some_and(|c| !c.as_array().is_some_and(|a| a.iter().all(Value::is_i64))) {
                return Err(err("execution.permanent_exit_codes", "must be a list of integers"));
            }
        }
        Some("http") => {
            let url = field("url").and_then(Value::as_str).unwrap_or_default();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(err(
                    "execution.url",
                    "is required for type http: an http:// or https:// URL",
                ));
            }
            let method = field("method").map(|m| m.as_str().unwrap_or_default());
            if method.is_some_and(|m| m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic())) {
                return Err(err("execution.method", "must be an HTTP method such as POST"));
            }
            for k in ["timeout_ms", "follow_redirects"] {
                if field(k).is_some_and(|v| !v.is_u64()) {
                    return Err(err(format!("execution.{k}"), "must be a non-negative integer"));
                }
            }
            if field("headers")
                .is_some_and(|h| !h.as_object().is_some_and(|m| m.values().all(Value::is_string)))
            {
                return Err(err("execution.headers", "must be a mapping of names to strings"));
            }
        }
        _ => {}
    }
    Ok(())
}

fn retry(node: Option<Tree>) -> Result<RetryPolicy> {
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
        Some(Tree::Int(n)) if (1..=100).contains(&n) => policy.max_attempts = n as u32,
        Some(Tree::Int(_)) => return Err(err("retry.max_attempts", "must be between 1 and 100")),
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

fn timeouts(node: Option<Tree>) -> Result<(u64, u64)> {
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
fn duration(node: Tree, path: &str) -> Result<u64> {
    let ms = match &node {
        Tree::Int(n) if *n >= 0 => Some(u64::try_from(*n).unwrap_or(u64::MAX)),
        Tree::Str(s) => {
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

fn opt_string(node: Option<Tree>, path: &str) -> Result<Option<String>> {
    match node {
        None => Ok(None),
        Some(Tree::Str(s)) => Ok(Some(s)),
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

/// An upper bound on how deeply a YAML or JSON text nests collections, found in one linear
/// pass without parsing: open flow brackets (`[`, `{`, outside quotes and comments) plus the
/// block-sequence dashes that start a line (`- - - x`). Indentation nesting needs a column per
/// level, so the size limit already bounds it. Block scalars (`|`, `>`) are skipped.
pub fn nesting_bound(text: &str) -> usize {
    let (mut flow, mut max) = (0usize, 0usize);
    // The indentation of a block scalar's header line while inside its content.
    let mut scalar_at: Option<usize> = None;
    for line in text.lines() {
        let body = line.trim_start_matches([' ', '\t']);
        let indent = line.len() - body.len();
        if let Some(at) = scalar_at {
            if body.is_empty() || indent > at {
                continue;
            }
            scalar_at = None;
        }
        let mut rest = body;
        let mut dashes = 0;
        while let Some(r) = rest.strip_prefix("- ").or_else(|| rest.strip_prefix("-\t")) {
            dashes += 1;
            rest = r.trim_start_matches([' ', '\t']);
        }
        let mut quote: Option<char> = None;
        let mut prev = ' ';
        for c in rest.chars() {
            match (quote, c) {
                (Some('"'), '\\') if prev == '\\' => {
                    prev = ' ';
                    continue;
                }
                (Some(q), c) if c == q && !(q == '"' && prev == '\\') => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') if prev == ' ' || prev == '\t' => break,
                (None, '[' | '{') => {
                    flow += 1;
                    max = max.max(flow + dashes);
                }
                (None, ']' | '}') => flow = flow.saturating_sub(1),
                _ => {}
            }
            prev = c;
        }
        max = max.max(dashes + flow);
        let head = rest.trim_end();
        let header = head.rsplit_once(' ').map_or(head, |(_, last)| last);
        if flow == 0 && (header.starts_with('|') || header.starts_with('>')) && header.len() <= 3 {
            scalar_at = Some(indent);
        }
    }
    max
}
