use super::*;
use serde_json::json;

const SEED: &str = r#"name: generate-report
version: 3
inputs:
  dataset_uri: string
  report_date: date
outputs:
  report_uri: string
execution:
  type: container
  image: report-generator:v3
  command: ["generate"]
"#;

const SEED_JSON: &str = r#"
{
  "name": "generate-report",
  "version": 3,
  "inputs": {"dataset_uri": "string", "report_date": "date"},
  "outputs": {"report_uri": "string"},
  "execution": {"type": "container", "image": "report-generator:v3", "command": ["generate"]}
}"#;

fn parse(src: &str) -> JobDefinition {
    parse_definition(src).unwrap_or_else(|e| panic!("{e}\n--- source:\n{src}"))
}

/// The error of parsing `src`, as (field, display).
fn parse_err(src: &str) -> (String, String) {
    match parse_definition(src) {
        Ok(def) => panic!("expected an error, parsed {def:?}\n--- source:\n{src}"),
        Err(e) => (e.field().to_owned(), e.to_string()),
    }
}

/// A minimal valid definition with `extra` appended as further top-level YAML.
fn with(extra: &str) -> String {
    format!("name: job\nversion: 1\nexecution: {{type: shell}}\n{extra}")
}

fn def_with_input(decl: &str) -> JobDefinition {
    parse(&with(&format!("inputs:\n  x: {decl}\n")))
}

fn check(ty: &str, value: Value) -> Result<Value> {
    validate_inputs(&def_with_input(ty), &json!({ "x": value }))
}

fn accepts(ty: &str, value: Value) {
    if let Err(e) = check(ty, value.clone()) {
        panic!("{ty} should accept {value}: {e}");
    }
}

fn rejects(ty: &str, value: Value) -> String {
    match check(ty, value.clone()) {
        Ok(v) => panic!("{ty} should reject {value}, got {v}"),
        Err(e) => {
            assert_eq!(e.field(), "inputs.x", "{e}");
            e.to_string()
        }
    }
}

#[test]
fn seed_example_parses() {
    let def = parse(SEED);
    assert_eq!(def.name, "generate-report");
    assert_eq!(def.version, 3);
    assert_eq!(def.namespace, "");
    assert_eq!(def.created_at_ms, 0);
    assert_eq!(def.description, "");
    let names: Vec<_> = def.inputs.iter().map(|i| (i.name.as_str(), i.r#type())).collect();
    assert_eq!(names, [("dataset_uri", InputType::String), ("report_date", InputType::Date)]);
    assert!(def.inputs.iter().all(|i| i.required && i.default_json.is_empty()));
    assert_eq!(def.outputs.len(), 1);
    assert_eq!(def.outputs[0].name, "report_uri");
    assert_eq!(def.outputs[0].r#type(), InputType::String);
    let exec: Value = serde_json::from_slice(&def.execution_json).unwrap();
    assert_eq!(
        exec,
        json!({"type": "container", "image": "report-generator:v3", "command": ["generate"]})
    );
    assert_eq!(def.queue, "generate-report");
    let retry = def.retry_policy.unwrap();
    assert_eq!((retry.max_attempts, retry.base_delay_ms, retry.max_delay_ms), (3, 1_000, 300_000));
    assert_eq!((def.attempt_timeout_ms, def.lease_ms), (0, 30_000));
}

#[test]
fn json_file_parses_to_the_same_record() {
    assert_eq!(parse(SEED_JSON), parse(SEED));
    // Leading whitespace and a byte-order mark do not defeat the detection.
    assert_eq!(parse(&format!("\u{feff}\n  {SEED_JSON}")), parse(SEED));
}

#[test]
fn input_order_is_kept() {
    let names = ["zeta", "alpha", "mid", "b", "a"];
    let yaml: String = names.iter().map(|n| format!("  {n}: string\n")).collect();
    let def = parse(&with(&format!("inputs:\n{yaml}")));
    assert_eq!(def.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), names);
    let json_src = r#"{"name": "j", "version": 1, "execution": {"type": "x"},
        "inputs": {"zeta": "string", "alpha": "int", "mid": "bool"}}"#;
    let def = parse(json_src);
    assert_eq!(def.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), names[..3]);
}

#[test]
fn long_form_inputs_and_outputs() {
    let def = parse(&with(
        r#"description: Daily report
inputs:
  report_date: {type: date, required: false, default: "2026-01-01", description: "day"}
  limit: {type: int, default: 10}
  tag: {type: string, required: false}
  uri: {type: uri, required: true, description: source}
outputs:
  report_uri: {type: uri, description: where it went}
"#,
    ));
    assert_eq!(def.description, "Daily report");
    let [date, limit, tag, uri] = &def.inputs[..] else { panic!("{:?}", def.inputs) };
    assert_eq!(date.r#type(), InputType::Date);
    assert!(!date.required);
    assert_eq!(date.default_json, br#""2026-01-01""#);
    assert_eq!(date.description, "day");
    assert!(!limit.required, "a default makes an input optional");
    assert_eq!(limit.default_json, b"10");
    assert!(!tag.required && tag.default_json.is_empty());
    assert!(uri.required);
    assert_eq!(uri.description, "source");
    assert_eq!(def.outputs[0].r#type(), InputType::Uri);
    assert_eq!(def.outputs[0].description, "where it went");
}

#[test]
fn every_type_name_maps() {
    let cases = [
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
    for (name, ty) in cases {
        assert_eq!(def_with_input(name).inputs[0].r#type(), ty);
        let out = parse(&with(&format!("outputs: {{o: {name}}}")));
        assert_eq!(out.outputs[0].r#type(), ty);
    }
}

#[test]
fn optional_keys() {
    let def = parse(&with(
        "queue: reports.eu\nretry: {max_attempts: 5, base_delay: 500ms, max_delay: 2h}\n\
         timeouts: {attempt: 5m, lease: 10000}\n",
    ));
    assert_eq!(def.queue, "reports.eu");
    let retry = def.retry_policy.unwrap();
    assert_eq!((retry.max_attempts, retry.base_delay_ms, retry.max_delay_ms), (5, 500, 7_200_000));
    assert_eq!((def.attempt_timeout_ms, def.lease_ms), (300_000, 10_000));
    // Null (a key with nothing after it) reads as absent.
    let def = parse(&with("description:\nretry:\ninputs:\nqueue: ~\n"));
    assert_eq!((def.queue.as_str(), def.inputs.len()), ("job", 0));
    assert_eq!(def.retry_policy.unwrap().max_attempts, 3);
}

#[test]
fn durations() {
    let lease = |v: &str| parse_definition(with(&format!("timeouts: {{lease: {v}}}")));
    for (text, ms) in [
        ("1ms", 1),
        ("30s", 30_000),
        ("5m", 300_000),
        ("2h", 7_200_000),
        ("1d", DAY_MS),
        ("30d", 30 * DAY_MS),
        ("250", 250),
        ("\"45s\"", 45_000),
    ] {
        assert_eq!(lease(text).map(|d| d.lease_ms), Ok(ms), "{text}");
    }
    for bad in ["5x", "1.5s", "s", "-1s", "10 s", "\"\"", "-5", "1.5", "true", "[1]", "31d"] {
        let e = lease(bad).unwrap_err();
        assert_eq!(e.field(), "timeouts.lease", "{bad}: {e}");
    }
    assert!(lease("5x").unwrap_err().reason().contains("invalid duration \"5x\""));
    assert_eq!(lease("0").unwrap_err().reason(), "must be greater than 0");
    assert_eq!(lease("99999999999999999999d").unwrap_err().reason(), "must be at most 30d");
    assert_eq!(lease("99999999999999999999").unwrap_err().reason(), "must be at most 30d");
    assert_eq!(lease("2592000001").unwrap_err().reason(), "must be at most 30d");
    let attempt = parse(&with("timeouts: {attempt: 0s}")).attempt_timeout_ms;
    assert_eq!(attempt, 0);
    for (ms, text) in [(0, "0s"), (1, "1ms"), (1500, "1500ms"), (90_000, "90s"), (DAY_MS, "1d")] {
        assert_eq!(format_duration(ms), text);
    }
}

#[test]
fn file_level_errors() {
    let (field, msg) = parse_err("name: [unclosed\nversion: 1\n");
    assert_eq!(field, "definition");
    assert!(msg.starts_with("definition: invalid YAML: ") && msg.contains("line"), "{msg}");
    let (field, msg) = parse_err("{\"name\": \"x\",\n \"version\": }");
    assert_eq!(field, "definition");
    assert!(msg.contains("invalid JSON") && msg.contains("line 2 column"), "{msg}");
    let (_, msg) = parse_err(&with("name: again\n"));
    assert!(msg.contains("duplicate key \"name\""), "{msg}");
    let (_, msg) = parse_err(r#"{"name": "a", "name": "b"}"#);
    assert!(msg.contains("duplicate key \"name\"") && msg.contains("line 1"), "{msg}");
    let (_, msg) = parse_err(&with("inputs: {1: string}"));
    assert!(msg.contains("string key"), "{msg}");
    assert_eq!(parse_err("").1, "definition: file is empty");
    assert_eq!(parse_err("  \n# only a comment\n").1, "definition: file is empty");
    assert_eq!(parse_err("- a\n- b\n").1, "definition: must be a mapping, got a list");
    assert_eq!(parse_err("just a string").1, "definition: must be a mapping, got a string");
    assert!(parse_err("a: 1\n---\nb: 2\n").1.contains("invalid YAML"));
    assert!(parse_err(&with("x: !custom 3")).1.starts_with("definition: invalid YAML"));
    let big = format!("{}\n# {}", with(""), "x".repeat(MAX_DEFINITION_BYTES));
    assert!(parse_err(&big).1.contains("over the 256 KiB limit"));
    let e = parse_definition([b'n', b':', 0xff, 0xfe]).unwrap_err();
    assert!(e.reason().contains("UTF-8"), "{e}");
}

#[test]
fn garbage_never_panics() {
    let samples = [
        "{",
        "}",
        "[",
        "{{{{",
        "\"",
        "name: \"unterminated",
        ":",
        "- - - -",
        "\t\tname: x",
        "&a [*a]",
        "*undefined",
        "? complex\n: key",
        "name: x\nversion: 1\nexecution: 7",
        "{\"name\": 1e999}",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
        "\u{0}",
        "%YAML 9.9\n",
        "version: 18446744073709551616000",
        "name: .nan",
        "!!binary aGVsbG8=",
    ];
    for s in samples {
        assert!(parse_definition(s).is_err(), "{s:?}");
    }
    let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    assert!(parse_definition(&deep).is_err());
    assert!(parse_definition(format!("a: {deep}")).is_err());
    // Every byte of the seed replaced by a troublesome character.
    for i in 0..SEED.len() {
        for c in ["{", "}", ":", "\n", "-", "\"", " ", "\t", "&", "*", "!", "[", "é"] {
            let _ = parse_definition(format!("{}{c}{}", &SEED[..i], &SEED[i + 1..]));
        }
    }
    // Truncated prefixes of valid files.
    for src in [SEED, SEED_JSON] {
        for end in (0..src.len()).filter(|&i| src.is_char_boundary(i)) {
            let _ = parse_definition(&src[..end]);
        }
    }
}

/// Whole files with a mistake in their top-level fields: (source, field, message).
const TOP_LEVEL_ERRORS: &[(&str, &str, &str)] = &[
    ("version: 1\nexecution: {type: x}", "name", "name: is required"),
    (
        "name: Bad\nversion: 1\nexecution: {type: x}",
        "name",
        "name: must match [a-z0-9][a-z0-9-_.]{0,127}",
    ),
    ("name: -x\nversion: 1\nexecution: {type: x}", "name", "must match"),
    ("name: 12\nversion: 1\nexecution: {type: x}", "name", "must match"),
    ("name: x\nexecution: {type: x}", "version", "version: is required"),
    ("name: x\nversion: 0\nexecution: {type: x}", "version", "version: must be a positive integer"),
    ("name: x\nversion: -3\nexecution: {type: x}", "version", "must be a positive integer"),
    ("name: x\nversion: 1.5\nexecution: {type: x}", "version", "must be a positive integer"),
    ("name: x\nversion: \"3\"\nexecution: {type: x}", "version", "must be a positive integer"),
    ("name: x\nversion: 4294967296\nexecution: {type: x}", "version", "up to 4294967295"),
    ("name: x\nversion: 1", "execution", "execution: is required"),
    ("name: x\nversion: 1\nexecution: docker", "execution", "must be a mapping, got a string"),
    ("name: x\nversion: 1\nexecution: {image: y}", "execution.type", "execution.type: is required"),
    ("name: x\nversion: 1\nexecution: {type: 3}", "execution.type", "must be a string"),
    ("name: x\nversion: 1\nexecution: {type: ''}", "execution.type", "must not be empty"),
    ("name: x\nversion: 1\nexecution: {type: x, n: [1, .nan]}", "execution.n[1]", "finite"),
    (
        "name: x\nversion: 1\nexecution: {type: command}",
        "execution.command",
        "is required for type command",
    ),
    (
        "name: x\nversion: 1\nexecution: {type: command, command: []}",
        "execution.command",
        "must not be empty",
    ),
    (
        "name: x\nversion: 1\nexecution: {type: command, command: sh}",
        "execution.command",
        "list of strings",
    ),
    (
        "name: x\nversion: 1\nexecution: {type: command, command: [sh, 1]}",
        "execution.command",
        "list of strings",
    ),
    (
        "name: x\nversion: 1\nexecution: {type: command, command: [sh], permanent_exit_codes: [a]}",
        "execution.permanent_exit_codes",
        "list of integers",
    ),
    ("name: x\nversion: 1\nexecution: {type: http}", "execution.url", "is required for type http"),
    (
        "name: x\nversion: 1\nexecution: {type: http, url: ftp://h/}",
        "execution.url",
        "http:// or https://",
    ),
    (
        "name: x\nversion: 1\nexecution: {type: http, url: 'http://h/', method: 'P OST'}",
        "execution.method",
        "HTTP method",
    ),
    (
        "name: x\nversion: 1\nexecution: {type: http, url: 'http://h/', timeout_ms: -1}",
        "execution.timeout_ms",
        "non-negative integer",
    ),
];

/// A good file with one section added or replaced: (section, field, message).
const SECTION_ERRORS: &[(&str, &str, &str)] = &[
    (
        "inputs:\n  report_date: dat",
        "inputs.report_date.type",
        "inputs.report_date.type: unknown type \"dat\" (expected one of string, int, number, bool, date, datetime, uri, object, list)",
    ),
    ("inputs: {d: {type: Date}}", "inputs.d.type", "unknown type \"Date\""),
    ("inputs: {d: {required: true}}", "inputs.d.type", "inputs.d.type: is required"),
    ("inputs: {d: {type: 5}}", "inputs.d.type", "must be a string"),
    ("inputs: {d: {type: int, required: yes}}", "inputs.d.required", "must be true or false"),
    ("inputs: {d: {type: int, default: 1, required: true}}", "inputs.d.required", "cannot be true"),
    ("inputs: {d: {type: int, default: 1.5}}", "inputs.d.default", "expected int"),
    (
        "inputs: {d: {type: date, default: \"2026-02-30\"}}",
        "inputs.d.default",
        "expected date (YYYY-MM-DD), got \"2026-02-30\"",
    ),
    (
        "inputs: {d: {type: int, defualt: 1}}",
        "inputs.d.defualt",
        "unknown key (expected one of type, required, default, description)",
    ),
    ("inputs: {d: 7}", "inputs.d", "must be a type name"),
    ("inputs: {bad-name: int}", "inputs.bad-name", "name must match [A-Za-z_]"),
    ("inputs: {9lives: int}", "inputs.9lives", "name must match"),
    ("inputs: [a, b]", "inputs", "must be a mapping of name to type, got a list"),
    (
        "outputs: {o: {type: int, default: 1}}",
        "outputs.o.default",
        "expected one of type, description",
    ),
    ("outputs: {o: {type: str}}", "outputs.o.type", "unknown type \"str\""),
    ("outputs: {o: {description: x}}", "outputs.o.type", "is required"),
    ("queue: Not-Valid", "queue", "queue: must match"),
    ("queue: 5", "queue", "must be a string"),
    (
        "retry: {max_attempts: 0}",
        "retry.max_attempts",
        "retry.max_attempts: must be between 1 and 100",
    ),
    ("retry: {max_attempts: 101}", "retry.max_attempts", "must be between 1 and 100"),
    ("retry: {max_attempts: two}", "retry.max_attempts", "must be an integer between 1 and 100"),
    (
        "retry: {base_delay: 10m}",
        "retry.max_delay",
        "must be at least base_delay (10m), is 5m (the default)",
    ),
    ("retry: {base_delay: 2s, max_delay: 1s}", "retry.max_delay", "is 1s"),
    ("retry: {max_delay: forever}", "retry.max_delay", "invalid duration \"forever\""),
    ("retry: {jitter: true}", "retry.jitter", "unknown key"),
    ("retry: 3", "retry", "retry: must be a mapping, got an integer"),
    ("timeouts: {lease: 0}", "timeouts.lease", "must be greater than 0"),
    ("timeouts: {heartbeat: 5s}", "timeouts.heartbeat", "unknown key"),
    ("description: [a]", "description", "must be a string, got a list"),
    (
        "labels: {a: b}\nowner: me",
        "labels",
        "labels: unknown key (expected one of name, version, description, inputs, outputs, execution, queue, retry, timeouts; also unknown: owner)",
    ),
];

#[test]
fn validation_errors_name_the_field() {
    for (src, field, msg) in TOP_LEVEL_ERRORS {
        let (f, m) = parse_err(src);
        assert_eq!(&f, field, "{src}: {m}");
        assert!(m.contains(msg), "{src}: {m}");
    }
    for (extra, field, msg) in SECTION_ERRORS {
        let (f, m) = parse_err(&with(extra));
        assert_eq!(&f, field, "{extra}: {m}");
        assert!(m.contains(msg), "{extra}: {m}");
    }
}

#[test]
fn names() {
    for ok in ["a", "0", "a-b_c.d", &"a".repeat(128)] {
        assert!(is_name(ok), "{ok}");
    }
    for bad in ["", "A", "-a", "_a", ".a", "a b", "é", "a/b", &"a".repeat(129)] {
        assert!(!is_name(bad), "{bad}");
    }
}

#[test]
fn definition_uris() {
    assert_eq!(definition_uri("generate-report"), "registry://jobs/generate-report");
    assert_eq!(
        parse_definition_uri("registry://jobs/generate-report"),
        Ok("generate-report".into())
    );
    for bad in [
        "registry://jobs/",
        "registry://jobs/Bad",
        "registry://job/x",
        "jobs/x",
        "",
        "registry://jobs/a/b",
    ] {
        let e = parse_definition_uri(bad).unwrap_err();
        assert_eq!(e.field(), "definitionUri", "{bad}");
        assert!(e.reason().starts_with("must be registry://jobs/<name>"), "{e}");
    }
}

#[test]
fn error_type() {
    let e = DefinitionError::new("inputs.x", "required input is missing");
    assert_eq!(e.field(), "inputs.x");
    assert_eq!(e.reason(), "required input is missing");
    assert_eq!(e.to_string(), "inputs.x: required input is missing");
}

#[test]
fn to_json_round_trips() {
    let def = parse(SEED);
    let out = to_json(&def);
    assert_eq!(
        out,
        json!({
            "name": "generate-report", "version": 3,
            "inputs": {"dataset_uri": "string", "report_date": "date"},
            "outputs": {"report_uri": "string"},
            "execution": {
                "type": "container", "image": "report-generator:v3", "command": ["generate"]
            },
            "queue": "generate-report",
            "retry": {"max_attempts": 3, "base_delay": "1s", "max_delay": "5m"},
            "timeouts": {"attempt": "0s", "lease": "30s"},
        })
    );
    let full = parse(&with(
        r#"description: d
inputs:
  a: {type: date, default: "2026-01-01", description: "day"}
  b: {type: int, required: false}
  c: {type: bool, description: flag}
  d: list
outputs: {o: {type: uri, description: out}, p: object}
queue: q
retry: {max_attempts: 7, base_delay: 1500ms, max_delay: 1d}
timeouts: {attempt: 90s, lease: 1m}
"#,
    ));
    let out = to_json(&full);
    assert_eq!(
        out["inputs"]["a"],
        json!({"type": "date", "default": "2026-01-01", "description": "day"})
    );
    assert_eq!(out["inputs"]["b"], json!({"type": "int", "required": false}));
    assert_eq!(out["inputs"]["c"], json!({"type": "bool", "description": "flag"}));
    assert_eq!(out["outputs"]["o"], json!({"type": "uri", "description": "out"}));
    // The rendering parses back to the same record (as JSON; input order aside, as serde_json
    // maps are sorted in this build).
    let back = parse(&out.to_string());
    let sorted = |d: &JobDefinition| {
        let mut d = d.clone();
        d.inputs.sort_by(|a, b| a.name.cmp(&b.name));
        d.outputs.sort_by(|a, b| a.name.cmp(&b.name));
        d
    };
    assert_eq!(sorted(&back), sorted(&full));
    assert_eq!(sorted(&parse(&to_json(&def).to_string())), sorted(&def));
}

#[test]
fn validate_inputs_basics() {
    let def = parse(&with(
        "inputs:\n  a: string\n  b: {type: int, default: 5}\n  c: {type: bool, required: false}\n",
    ));
    assert_eq!(validate_inputs(&def, &json!({"a": "x"})), Ok(json!({"a": "x", "b": 5})));
    assert_eq!(
        validate_inputs(&def, &json!({"a": "x", "b": 7, "c": true})),
        Ok(json!({"a": "x", "b": 7, "c": true}))
    );
    // null counts as missing: the default applies, an optional one is left out.
    assert_eq!(
        validate_inputs(&def, &json!({"a": "x", "b": null, "c": null})),
        Ok(json!({"a": "x", "b": 5}))
    );
    let e = validate_inputs(&def, &json!({"b": 1})).unwrap_err();
    assert_eq!(e.to_string(), "inputs.a: required input is missing");
    let e = validate_inputs(&def, &json!({"a": null})).unwrap_err();
    assert_eq!(e.field(), "inputs.a");
    let e = validate_inputs(&def, &json!({"a": "x", "zz": 1, "yy": 2})).unwrap_err();
    assert_eq!(e.field(), "inputs.yy");
    assert_eq!(e.reason(), "unknown input (declared: a, b, c; also unknown: zz)");
    for bad in [json!([]), json!("a"), json!(null), json!(3)] {
        let e = validate_inputs(&def, &bad).unwrap_err();
        assert_eq!(e.field(), "inputs", "{bad}");
        assert!(e.reason().starts_with("must be a JSON object"), "{e}");
    }
    let none = parse(&with(""));
    assert_eq!(validate_inputs(&none, &json!({})), Ok(json!({})));
    let e = validate_inputs(&none, &json!({"x": 1})).unwrap_err();
    assert_eq!(e.reason(), "unknown input (the definition declares no inputs)");
    let e = validate_inputs(
        &parse(SEED),
        &json!({"dataset_uri": "s3://b/k", "report_date": "2026-13-01"}),
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "inputs.report_date: expected date (YYYY-MM-DD), got \"2026-13-01\"");
}

#[test]
fn scalar_types() {
    accepts("string", json!(""));
    accepts("string", json!("héllo"));
    for v in [json!(1), json!(true), json!(null), json!(["a"])] {
        if !v.is_null() {
            rejects("string", v);
        }
    }
    assert_eq!(rejects("string", json!(1)), "inputs.x: expected string, got 1");
    assert_eq!(rejects("string", json!({"a": 1})), "inputs.x: expected string, got an object");
    accepts("bool", json!(false));
    assert_eq!(rejects("bool", json!("true")), "inputs.x: expected bool, got \"true\"");
    rejects("bool", json!(1));
    for v in [json!(0), json!(-1.5), json!(1e300), json!(u64::MAX)] {
        accepts("number", v);
    }
    rejects("number", json!("1"));
    accepts("object", json!({}));
    accepts("object", json!({"a": [1]}));
    assert_eq!(rejects("object", json!([])), "inputs.x: expected object, got a list");
    accepts("list", json!([]));
    accepts("list", json!([1, "a", null]));
    rejects("list", json!({}));
    rejects("list", json!("[]"));
    let long = "y".repeat(1000);
    let msg = rejects("int", json!(long));
    assert!(msg.len() < 200 && msg.contains("(1000 chars)"), "{msg}");
}

#[test]
fn int_type() {
    for v in [0, 1, -1, i64::MAX, i64::MIN] {
        assert_eq!(check("int", json!(v)), Ok(json!({ "x": v })));
    }
    // Integral floats are accepted while exact and stored as integers.
    assert_eq!(check("int", json!(1.0)), Ok(json!({"x": 1})));
    assert_eq!(check("int", json!(-0.0)), Ok(json!({"x": 0})));
    assert_eq!(
        check("int", json!(9_007_199_254_740_992.0)),
        Ok(json!({"x": 9_007_199_254_740_992_i64}))
    );
    assert_eq!(
        rejects("int", json!(1.5)),
        "inputs.x: expected int (a 64-bit signed integer), got 1.5"
    );
    rejects("int", json!(9_007_199_254_740_994.0));
    rejects("int", json!(1e300));
    rejects("int", json!(i64::MAX as u64 + 1));
    rejects("int", json!(u64::MAX));
    rejects("int", serde_json::from_str("123456789012345678901234567890").unwrap());
    rejects("int", json!("1"));
    rejects("int", json!(true));
}

#[test]
fn date_type() {
    for ok in [
        "2026-01-01",
        "2024-02-29",
        "2000-02-29",
        "2026-12-31",
        "0000-01-01",
        "9999-12-31",
        "2026-04-30",
    ] {
        accepts("date", json!(ok));
    }
    for bad in [
        "2026-13-01",
        "2026-00-10",
        "2026-01-00",
        "2026-01-32",
        "2026-02-29",
        "1900-02-29",
        "2100-02-29",
        "2026-04-31",
        "2026-1-01",
        "26-01-01",
        "2026/01/01",
        "2026-01-01T00:00:00Z",
        " 2026-01-01",
        "2026-01-01 ",
        "",
        "2026-０1-01",
        "+026-01-01",
        "2026-01-1a",
    ] {
        let msg = rejects("date", json!(bad));
        assert!(msg.contains("expected date (YYYY-MM-DD)"), "{msg}");
    }
    rejects("date", json!(20260101));
}

#[test]
fn datetime_type() {
    for ok in [
        "2026-08-13T02:00:00Z",
        "2026-08-13T02:00:00+02:00",
        "2026-08-13T02:00:00-23:59",
        "2026-08-13t02:00:00z",
        "2026-08-13T23:59:59.123456789Z",
        "2026-08-13T00:00:00.5+00:00",
        "2024-02-29T12:00:00Z",
    ] {
        accepts("datetime", json!(ok));
    }
    for bad in [
        "2026-08-13T24:00:00Z",
        "2026-08-13T23:60:00Z",
        "2026-08-13T23:59:60Z",
        "2026-08-13T02:00:00",
        "2026-08-13T02:00Z",
        "2026-08-13 02:00:00Z",
        "2026-08-13T02:00:00.Z",
        "2026-08-13T02:00:00+24:00",
        "2026-08-13T02:00:00+02:60",
        "2026-08-13T02:00:00+0200",
        "2026-08-13T02:00:00+02",
        "2026-08-13T02:00:00ZZ",
        "2025-02-29T00:00:00Z",
        "2026-08-13T2:00:00Z",
        "2026-08-13",
        "2026-08-13T02:00:00Z ",
        "2026-08-13T02:00:00é",
        "",
    ] {
        let msg = rejects("datetime", json!(bad));
        assert!(msg.contains("expected datetime (RFC 3339"), "{bad}: {msg}");
    }
}

#[test]
fn uri_type() {
    for ok in [
        "s3://bucket/key",
        "https://x.io/a?b=c",
        "urn:isbn:0451450523",
        "mailto:a@b.c",
        "a+b-c.d:x",
    ] {
        accepts("uri", json!(ok));
    }
    for bad in [
        "",
        "nocolon",
        ":x",
        "1http://x",
        "http:",
        "ht tp://x",
        "http://a b",
        "http://x\n",
        "ht_tp:x",
        "é:x",
    ] {
        let msg = rejects("uri", json!(bad));
        assert!(msg.contains("expected uri"), "{bad}: {msg}");
    }
    rejects("uri", json!(5));
}

#[test]
fn defaults_are_validated_and_typed() {
    let def = def_with_input("{type: datetime, default: 2026-08-13T02:00:00Z}");
    assert_eq!(def.inputs[0].default_json, br#""2026-08-13T02:00:00Z""#);
    let def = def_with_input("{type: object, default: {a: [1, 2.5, null]}}");
    assert_eq!(validate_inputs(&def, &json!({})), Ok(json!({"x": {"a": [1, 2.5, null]}})));
    let def = def_with_input("{type: int, default: 2.0}");
    assert_eq!(def.inputs[0].default_json, b"2");
    let (f, _) = parse_err(&with("inputs: {x: {type: uri, default: 'not a uri'}}"));
    assert_eq!(f, "inputs.x.default");
    let (f, m) = parse_err(&with("inputs: {x: {type: object, default: {a: .inf}}}"));
    assert_eq!((f.as_str(), m.contains("finite")), ("inputs.x.default.a", true), "{m}");
    // Integers beyond u64 read as floats, as serde_json reads them from a JSON file.
    let (f, m) = parse_err(&with("inputs: {x: {type: int, default: 99999999999999999999}}"));
    assert_eq!(f, "inputs.x.default", "{m}");
    let def = def_with_input("{type: number, default: 99999999999999999999}");
    assert_eq!(def.inputs[0].default_json, b"1e+20");
    // `default: null` is no default.
    let def = def_with_input("{type: int, default: null}");
    assert!(def.inputs[0].required && def.inputs[0].default_json.is_empty());
}

#[test]
fn deep_nesting_is_refused_before_the_document_is_parsed() {
    // 100,000 levels of flow sequences: what took a YAML parser 23 s. The refusal comes from
    // the depth bound (its message), so the document was never parsed whole.
    let deep = format!("x: {}{}", "[".repeat(100_000), "]".repeat(100_000));
    let e = parse_definition(&deep).unwrap_err();
    assert_eq!(e.field(), "definition");
    assert!(e.reason().contains("over the limit of 64"), "{e}");
    // The same in JSON, block sequences on one line, and mappings.
    let json = format!("{}{}", "{\"a\":".repeat(70), "}".repeat(70));
    assert!(parse_definition(&json).unwrap_err().reason().contains("nests"));
    let dashes = format!("x:\n  {}y\n", "- ".repeat(1_000));
    assert!(parse_definition(&dashes).unwrap_err().reason().contains("nests"));
    // Just at the limit (the top mapping and 63 sequences): let through (the schema then
    // refuses it); one more is not.
    let ok_depth = format!("x: {}{}", "[".repeat(63), "]".repeat(63));
    assert!(!parse_definition(&ok_depth).unwrap_err().reason().contains("nests"));
    let over = format!("x: {}{}", "[".repeat(64), "]".repeat(64));
    assert!(parse_definition(&over).unwrap_err().reason().contains("nests 65 levels"));
    let json_ok = format!("{}{}", "{\"a\":".repeat(64), "}".repeat(64));
    assert!(!parse_definition(&json_ok).unwrap_err().reason().contains("nests"));
}

#[test]
fn a_quote_inside_a_plain_scalar_does_not_hide_nesting() {
    // Issue 24: `a'b` is a plain scalar to YAML, not the start of a quoted string; the former
    // pre-scan took it for one, missed the brackets after it, and the parser spent ~89 s of CPU
    // on 240 KB of them. The parser itself now stops at the 65th level.
    let deep = format!("x: [a'b, {}{}]", "[".repeat(100_000), "]".repeat(100_000));
    let e = parse_definition(&deep).unwrap_err();
    assert!(e.reason().contains("over the limit of 64"), "{e}");
    let unclosed = format!("name: x\nversion: 1\nexecution: [a'b, {}", "[".repeat(120_000));
    assert!(parse_definition(&unclosed).unwrap_err().reason().contains("nests"));
    // Quotes, comments and block scalars holding brackets are still no nesting.
    let fine =
        "name: q\nversion: 1\nexecution: {type: command, command: [\"echo\", \"a'b [[[\"]}\n";
    parse(fine);
}

#[test]
fn brackets_in_strings_comments_and_block_scalars_are_not_nesting() {
    assert!(nesting_bound(SEED) <= 2, "{}", nesting_bound(SEED));
    let many = "[".repeat(100);
    let src = format!(
        "name: brackets\nversion: 1\n# {many}\nexecution:\n  type: command\n  command: [\"sh\", \"-c\", \"echo '{many}'\"]\n  env:\n    A: '{many}'\n    B: |\n      {many}\n      {many}\n    C: \"x\"\n"
    );
    assert!(nesting_bound(&src) <= 3, "{}", nesting_bound(&src));
    parse(&src);
}
