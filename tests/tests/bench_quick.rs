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
    assert_lateness(&v["lateness_ms"], 2_000);
    assert!(v["node_cpu_s"].as_f64().is_some() && v["node_peak_rss_mib"].as_f64().is_some(), "{v}");
}

#[test]
fn s7_due_now_and_a_mix() {
    let v = quick("s7", &[]);
    assert_eq!(v["count"], 2_000, "{v}");
    assert!(num(&v, "e2e_per_s") > 0.0, "{v}");
    assert_lateness(&v["lateness_ms"], 2_000);
    // Half of them delayed by 300 ms: none may start before its time (checked by quick()).
    let v = quick("s7", &["--delayed-share", "0.5", "--delay-ms", "300"]);
    assert_eq!(v["count"], 2_000, "{v}");
    assert_eq!(v["delayed_share"], 0.5, "{v}");
    assert_lateness(&v["lateness_ms"], 2_000);
    assert!(num(&v, "span_s") >= 0.25, "the delayed half starts 300 ms after submission: {v}");
}

/// A number of the JSON line (panics, naming the field, if it is not one).
fn num(v: &Value, field: &str) -> f64 {
    v[field].as_f64().unwrap_or_else(|| panic!("{field} is not a number: {v}"))
}

/// A phase's lateness: a start seen for each of its `count` executions, none before its
/// `execute_at` (min ≥ 0), and percentiles in order.
fn assert_lateness(l: &Value, count: u64) {
    assert_eq!(l["n"], count, "a start for every execution: {l}");
    let [min, p50, p90, p99, max] = ["min", "p50", "p90", "p99", "max"].map(|f| num(l, f));
    assert!(0.0 <= min && min <= p50 && p50 <= p90 && p90 <= p99 && p99 <= max, "{l}");
}

/// A steady phase of s3 or s4: every execution submitted, acknowledged and started once at
/// least, none missing or early.
fn assert_steady(v: &Value, count: u64) {
    assert_eq!(v["count"], count, "{v}");
    assert_eq!(v["missing"], 0, "{v}");
    assert_eq!(v["early"], 0, "{v}");
    assert!(v["acked_late"].as_u64().is_some_and(|n| n <= count), "{v}");
    // s3 reports {"total", "retried", "redelivered"}, each s4 phase the total alone.
    let duplicates = v["duplicates"].get("total").unwrap_or(&v["duplicates"]);
    assert!(duplicates.as_u64().is_some_and(|n| n <= count), "{v}");
    assert_lateness(&v["lateness_ms"], count);
}

#[test]
fn s3_precision() {
    let v = quick("s3", &[]);
    assert_eq!((v["rate"].clone(), v["duration_s"].clone()), (200.into(), 3.into()), "{v}");
    assert_steady(&v, 600);
    assert_eq!(v["timed_out"], false, "{v}");
    assert!(num(&v, "node_cpu_s") > 0.0 && num(&v, "node_peak_rss_mib") > 0.0, "{v}");
}

#[test]
fn s4_scale() {
    let v = quick("s4", &[]);
    assert_eq!(v["preload"], 20_000, "{v}");
    assert!(num(&v, "preload_per_s") > 0.0, "{v}");
    assert_steady(&v["baseline"], 600);
    assert_steady(&v["after"], 600);
    assert_eq!(v["timed_out"], false, "{v}");
    let (before, after) = (num(&v, "p99_before_ms"), num(&v, "p99_after_ms"));
    assert_eq!(before, num(&v["baseline"]["lateness_ms"], "p99"), "{v}");
    assert_eq!(after, num(&v["after"]["lateness_ms"], "p99"), "{v}");
    if before > 0.05 {
        // The ratio is of the unrounded p99s (each printed to 0.05 ms), rounded to 0.005.
        let ratio = num(&v, "p99_ratio");
        let (low, high) = ((after - 0.05) / (before + 0.05), (after + 0.05) / (before - 0.05));
        assert!(low - 0.005 <= ratio && ratio <= high + 0.005, "{v}");
    }
    assert!(num(&v, "node_rss_after_preload_mib") > 0.0, "{v}");
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
    for scenario in ["s1", "s2", "s3", "s4", "s5", "s6", "s7"] {
        assert!(stdout.contains(scenario), "--help lacks {scenario}:\n{stdout}");
    }
    let (code, stdout, _) = bench(&["s2", "--help"]);
    assert_eq!(code, 0);
    for flag in
        ["--count", "--workers", "--slots", "--endpoint", "--kairos", "--quick", "--preload"]
    {
        assert!(stdout.contains(flag), "--help lacks {flag}:\n{stdout}");
    }
    let (code, _, stderr) = bench(&["s9"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("'s9'"), "{stderr}");
    let (code, _, stderr) = bench(&["s2", "--frobnicate"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--frobnicate"), "{stderr}");
    let (code, _, stderr) = bench(&["s2", "--kairos", "/nonexistent/kairos"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("/nonexistent/kairos"), "{stderr}");
}
