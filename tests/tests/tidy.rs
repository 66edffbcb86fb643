//! Tidy: the shape of the code, checked on every test run (Tiger Style's limits).
//!
//! Over every workspace crate's `src/`, `tests/` and `benches/`:
//! - a function is at most [`FN_LINES_MAX`] lines, a file at most [`FILE_LINES_MAX`];
//! - a `*_MAX` / `*_MIN` bound (optionally with a unit: `*_MAX_MS`) is defined only in a
//!   limits module (a file named `limits.rs`), where related bounds are checked together;
//! - no import circle ties a module's children together (each child with everything under it),
//!   at any level of any crate: a newcomer can read the rooms bottom up.
//!
//! What is not held to these rules is listed in [`EXCEPTIONS`], each with its reason.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[path = "tidy/scan.rs"]
mod scan;

/// Longest function, in lines (its signature to its closing brace).
const FN_LINES_MAX: usize = 70;
/// Longest file, in lines.
const FILE_LINES_MAX: usize = 800;

/// What the rules let pass: (path from the workspace root or a prefix of it ending in `/`,
/// the item — a function's name, `file`, `bound NAME` or `circle` — and why).
const EXCEPTIONS: &[(&str, &str, &str)] = &[
    (
        "tests/tests/console.rs",
        "executions_sign_in_search_attempts_and_cancel",
        "an end-to-end scenario with real processes and a real browser, read top to bottom",
    ),
    (
        "tests/tests/cron_e2e.rs",
        "a_per_second_schedule_survives_a_sigkill_without_losing_or_doubling_an_occurrence",
        "an end-to-end scenario with real processes, read top to bottom",
    ),
    (
        "tests/tests/tls.rs",
        "the_binaries_over_https_with_mutual_tls",
        "an end-to-end scenario with real processes, read top to bottom",
    ),
    (
        "tests/tests/e2e.rs",
        "a_user_session_with_real_processes",
        "an end-to-end scenario with real processes, read top to bottom",
    ),
    (
        "tests/tests/cli.rs",
        "serve_requires_keys_and_kairosctl_manages_them",
        "an end-to-end scenario with real processes, read top to bottom",
    ),
    ("layer/tests/crash.rs", "embedded_survives_sigkill", "a crash scenario, read top to bottom"),
    (
        "simulation/src/",
        "*",
        "the seed runner, the workload and the checker are long scripted scenarios whose order \
         is the trace (splitting them must keep every seed's trace hash): the next to split",
    ),
    (
        "sdk/ctl/src/bench/",
        "*",
        "each load-generator scenario's `run` is its script of phases, read top to bottom",
    ),
    ("sdk/src/worker.rs", "run", "the worker's stream loop: to be rewritten with chunked resends"),
    ("sdk/src/executors/http.rs", "run_http", "the http executor's request, to split next"),
];

fn excepted(path: &str, item: &str) -> bool {
    EXCEPTIONS.iter().any(|(p, i, _)| {
        let path_ok = if p.ends_with('/') { path.starts_with(p) } else { path == *p };
        path_ok && (*i == "*" || *i == item)
    })
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// The workspace's member crates (as `Cargo.toml` lists them).
fn members(root: &Path) -> Vec<String> {
    let toml = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let list = toml.split("members").nth(1).expect("members");
    let list = &list[list.find('[').expect("[") + 1..list.find(']').expect("]")];
    list.split(',')
        .map(|m| m.trim().trim_matches('"').to_string())
        .filter(|m| !m.is_empty())
        .collect()
}

/// Every `.rs` file of a crate's `src/`, `tests/` and `benches/`, relative to the workspace.
fn rust_files(root: &Path, krate: &str) -> Vec<String> {
    let mut out = Vec::new();
    for dir in ["src", "tests", "benches"] {
        walk(root, &Path::new(krate).join(dir), &mut out);
    }
    out.sort();
    out
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(root.join(rel)) else { return };
    for e in entries.flatten() {
        let rel = rel.join(e.file_name());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(root, &rel, out);
        } else if rel.extension().is_some_and(|x| x == "rs") {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

fn all_files() -> Vec<(String, String)> {
    let root = workspace();
    members(&root)
        .iter()
        .flat_map(|k| rust_files(&root, k))
        .map(|f| {
            let text = std::fs::read_to_string(root.join(&f)).expect("a source file");
            (f, text)
        })
        .collect()
}

#[test]
fn functions_and_files_are_short() {
    let mut over = Vec::new();
    for (path, text) in all_files() {
        let lines = text.lines().count();
        if lines > FILE_LINES_MAX && !excepted(&path, "file") {
            over.push(format!("{path}: {lines} lines (at most {FILE_LINES_MAX})"));
        }
        for f in scan::functions(&scan::clean(&text)) {
            if f.lines > FN_LINES_MAX && !excepted(&path, &f.name) {
                over.push(format!("{path}:{}: fn {} is {} lines", f.line, f.name, f.lines));
            }
        }
    }
    assert!(
        over.is_empty(),
        "too long (split it, or name it in EXCEPTIONS with why):\n{}",
        over.join("\n")
    );
}

#[test]
fn bounds_are_defined_in_limits_modules() {
    let mut stray = Vec::new();
    for (path, text) in all_files() {
        if path.ends_with("/limits.rs") || !path.contains("/src/") {
            continue;
        }
        for (line, name) in scan::consts(&scan::clean(&text)) {
            if scan::is_bound(&name) && !excepted(&path, &format!("bound {name}")) {
                stray.push(format!("{path}:{line}: {name}"));
            }
        }
    }
    assert!(
        stray.is_empty(),
        "bounds outside a limits module (move them to limits.rs):\n{}",
        stray.join("\n")
    );
}

#[test]
fn no_import_circle_ties_modules_together() {
    let root = workspace();
    let mut circles = Vec::new();
    for krate in members(&root) {
        let files: BTreeMap<Vec<String>, String> = rust_files(&root, &krate)
            .into_iter()
            .filter(|f| f.starts_with(&format!("{krate}/src/")))
            .filter_map(|f| {
                let module = scan::module_path(f.strip_prefix(&format!("{krate}/src/"))?)?;
                Some((module, std::fs::read_to_string(root.join(&f)).ok()?))
            })
            .collect();
        let modules: BTreeSet<Vec<String>> = files.keys().cloned().collect();
        let edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = files
            .iter()
            .map(|(m, text)| (m.clone(), scan::references(&scan::clean(text), m, &modules)))
            .collect();
        for cycle in scan::sibling_cycles(&modules, &edges) {
            let shown = format!("{krate}: {}", cycle.join(" → "));
            if !excepted(&format!("{krate}/"), "circle") {
                circles.push(shown);
            }
        }
    }
    assert!(circles.is_empty(), "import circles:\n{}", circles.join("\n"));
}

#[test]
fn the_scanner_sees_what_it_checks() {
    let text = "fn a() {\n    let s = \"}\";\n    // }\n}\nconst X_MAX_MS: u64 = 1;\n";
    let f = scan::functions(&scan::clean(text));
    assert_eq!((f[0].name.as_str(), f[0].lines), ("a", 4));
    assert_eq!(scan::consts(&scan::clean(text)), vec![(5, "X_MAX_MS".to_string())]);
    assert!(scan::is_bound("CLAIM_BATCH_MAX") && scan::is_bound("LEASE_MS_MIN"));
    assert!(scan::is_bound("RETRY_PAUSE_MAX_MS") && !scan::is_bound("MAX_ATTEMPTS_DEFAULT"));
    let modules: BTreeSet<Vec<String>> =
        [vec![], vec!["a".into()], vec!["b".into()]].into_iter().collect();
    let edges = BTreeMap::from([
        (vec!["a".to_string()], scan::references("use crate::b::X;", &["a".into()], &modules)),
        (
            vec!["b".to_string()],
            scan::references("fn f() { super::a::g() }", &["b".into()], &modules),
        ),
    ]);
    assert_eq!(scan::sibling_cycles(&modules, &edges).len(), 1, "a ↔ b is a circle");
    assert!(excepted("simulation/src/run.rs", "anything") && !excepted("layer/src/lib.rs", "x"));
}
