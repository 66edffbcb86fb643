//! The load generator end to end: `kairosctl bench <s> --quick` for every scenario, each with
//! its own spawned `kairos` node and worker processes. Every run must exit 0 and end with one
//! JSON line saying nothing was missing (or lost) and nothing started early.
//!
//! The scenarios run one at a time (they share two cores and measure time); debug builds take
//! about a minute for all five.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::Value;

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const KAIROSCTL: &str = env!("CARGO_BIN_EXE_e2e-kairosctl");

/// One scenario at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `kairosctl bench <args…>`: exit code, stdout, stderr.
fn bench(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(KAIROSCTL).arg("bench").args(args).output().expect("kairosctl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs a scenario with `--quick` on its own node; checks the exit code and the JSON line.
fn quick(scenario: &str, extra: &[&str]) -> Value {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = Instant::now();
    let mut args = vec![scenario, "--quick", "--kairos", KAIROS];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = bench(&args);
    eprintln!("bench {scenario}: {:.1} s\n{stdout}{stderr}", t.elapsed().as_secs_f64());
    assert_eq!(code, 0, "bench {scenario} exited {code}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let last = stdout.lines().last().expect("some output");
    let v: Value = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("the last line is not JSON ({e}): {last}"));
    assert_eq!(v["scenario"], scenario, "{v}");
    let missing = v.get("missing").or_else(|| v.get("lost")).expect("missing or lost reported");
    assert_eq!(missing, 0, "{v}");
    assert_eq!(v["early"], 0, "{v}");
    v
}

#[test]
fn s1_submit_throughput() {
    let v = quick("s1", &[]);
    assert!(v["batched_per_s"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["single_per_s"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(v["acknowledged"], 6_000, "{v}");
    assert_eq!(v["stored_scheduled"], 6_000, "{v}");
}

#[test]
fn s2_burst() {
    let v = quick("s2", &[]);
    assert_eq!(v["count"], 2_000, "{v}");
    assert!(v["completions_per_s"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["lateness_ms"]["p99"].as_f64().is_some(), "{v}");
    assert!(v["node_cpu_s"].as_f64().is_some() && v["node_peak_rss_mib"].as_f64().is_some(), "{v}");
}

#[test]
fn s3_precision() {
    let v = quick("s3", &[]);
    assert_eq!(v["count"], 600, "{v}");
    assert!(v["lateness_ms"]["p99"].as_f64().is_some(), "{v}");
}

#[test]
fn s4_scale() {
    let v = quick("s4", &[]);
    assert_eq!(v["preload"], 20_000, "{v}");
    assert!(v["p99_ratio"].as_f64().is_some(), "{v}");
    assert!(v["node_rss_after_preload_mib"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn s5_recovery() {
    let v = quick("s5", &[]);
    assert_eq!(v["lost"], 0, "{v}");
    assert!(v["killed_after_started"].as_u64().unwrap() > 0, "{v}");
    assert!(v["time_to_fire_again_ms"].as_f64().is_some(), "{v}");
}

#[test]
fn usage_errors_name_the_culprit() {
    let (code, stdout, _) = bench(&["--help"]);
    assert_eq!(code, 0);
    for scenario in ["s1", "s2", "s3", "s4", "s5"] {
        assert!(stdout.contains(scenario), "--help lacks {scenario}:\n{stdout}");
    }
    let (code, stdout, _) = bench(&["s2", "--help"]);
    assert_eq!(code, 0);
    for flag in
        ["--count", "--workers", "--slots", "--endpoint", "--kairos", "--quick", "--preload"]
    {
        assert!(stdout.contains(flag), "--help lacks {flag}:\n{stdout}");
    }
    let (code, _, stderr) = bench(&["s7"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("'s7'"), "{stderr}");
    let (code, _, stderr) = bench(&["s2", "--frobnicate"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--frobnicate"), "{stderr}");
    let (code, _, stderr) = bench(&["s2", "--kairos", "/nonexistent/kairos"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("/nonexistent/kairos"), "{stderr}");
}
