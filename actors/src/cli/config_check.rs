//! `kairos config check FILE`: every unknown key and bad value of a node's YAML settings file,
//! each with its line, rather than the first one only (which is what a node's start says).
//!
//! Each top-level key is read on its own over the defaults (an unknown key, a value of the
//! wrong kind); then the keys that read are checked together ([`NodeConfig::validate`], which
//! names the first setting out of its range): the setting it names is reported and left out,
//! and the check runs again, until the rest is valid.

use std::path::Path;

use anyhow::{Context, bail};
use serde_yaml_ng::{Mapping, Value};

use crate::server::config::NodeConfig;

/// `kairos config …`.
#[derive(Debug, clap::Subcommand)]
pub(super) enum ConfigCommand {
    /// Reports every unknown key and bad value of a YAML settings file, with its line; exits 1
    /// when there is any.
    Check {
        /// The YAML settings file.
        file: std::path::PathBuf,
    },
}

/// One problem: the line of its key (0: the file as a whole), the setting, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Problem {
    pub line: usize,
    pub setting: String,
    pub reason: String,
}

/// Runs a `kairos config` command.
pub(super) fn run(command: ConfigCommand) -> anyhow::Result<()> {
    let ConfigCommand::Check { file } = command;
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let problems = check(&text);
    report(&file, &problems);
    if !problems.is_empty() {
        bail!("{}: {} problem(s)", file.display(), problems.len());
    }
    Ok(())
}

fn report(file: &Path, problems: &[Problem]) {
    if problems.is_empty() {
        println!("{}: ok", file.display());
    }
    for p in problems {
        // Line 0: a setting the file does not hold (one another setting requires).
        let at = if p.line == 0 { String::new() } else { format!(":{}", p.line) };
        println!("{}{at}: {}: {}", file.display(), p.setting, p.reason);
    }
}

/// Every problem of the settings file `text`, in the order of their lines.
pub(super) fn check(text: &str) -> Vec<Problem> {
    let map = match serde_yaml_ng::from_str::<Value>(text) {
        Ok(Value::Mapping(m)) => m,
        Ok(Value::Null) => return Vec::new(),
        Ok(_) => return vec![whole("the file must be a mapping of settings")],
        Err(e) => {
            let line = e.location().map_or(0, |l| l.line());
            return vec![Problem { line, setting: "file".into(), reason: e.to_string() }];
        }
    };
    let mut problems = Vec::new();
    let mut good = Mapping::new();
    for (key, value) in &map {
        let name = key.as_str().map_or_else(|| format!("{key:?}"), str::to_string);
        let mut one = Mapping::new();
        one.insert(key.clone(), value.clone());
        match serde_yaml_ng::from_value::<NodeConfig>(Value::Mapping(one)) {
            Ok(_) => {
                good.insert(key.clone(), value.clone());
            }
            Err(e) => problems.push(Problem {
                line: line_of(text, &name),
                setting: name,
                reason: e.to_string(),
            }),
        }
    }
    problems.extend(out_of_range(text, good));
    problems.sort_by_key(|p| p.line);
    problems
}

/// The range problems of the keys that read: each setting `validate` names, left out in turn.
fn out_of_range(text: &str, mut good: Mapping) -> Vec<Problem> {
    let mut problems = Vec::new();
    loop {
        let config = match serde_yaml_ng::from_value::<NodeConfig>(Value::Mapping(good.clone())) {
            Ok(c) => c,
            Err(e) => {
                problems.push(whole(&e.to_string()));
                return problems;
            }
        };
        let Err(e) = config.validate() else { return problems };
        // `namespace_weights.a` is the key `namespace_weights`.
        let key = e.setting.split('.').next().unwrap_or_default().to_string();
        let line = line_of(text, &key);
        problems.push(Problem { line, setting: e.setting.clone(), reason: e.reason.clone() });
        if good.remove(Value::String(key)).is_none() {
            // A setting the file does not hold (e.g. one another setting requires): no more
            // can be told apart.
            return problems;
        }
    }
}

fn whole(reason: &str) -> Problem {
    Problem { line: 0, setting: "file".into(), reason: reason.to_string() }
}

/// The line (from 1) where the top-level key `key` is written, or 0.
fn line_of(text: &str, key: &str) -> usize {
    text.lines()
        .position(|l| {
            let l = l.trim_end();
            [key.to_string(), format!("\"{key}\""), format!("'{key}'")].iter().any(|k| {
                l.strip_prefix(k.as_str()).is_some_and(|rest| rest.trim_start().starts_with(':'))
            })
        })
        .map_or(0, |i| i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unknown_key_and_bad_value_is_reported_with_its_line() {
        let text = "\
# a node
shard_cont: 64
listen_http: 127.0.0.1:7070
store_cache_mib: 4
retention_days: many
'bogus': 1
store_checkpoint_ms: 120000
shard_count: 128
ready_partitions: 100
";
        let got: Vec<(usize, String)> =
            check(text).into_iter().map(|p| (p.line, p.setting)).collect();
        let want = [
            (2, "shard_cont"),
            (4, "store_cache_mib"),
            (5, "retention_days"),
            (6, "bogus"),
            (7, "store_checkpoint_ms"),
        ];
        let want: Vec<(usize, String)> = want.iter().map(|(l, s)| (*l, s.to_string())).collect();
        assert_eq!(got, want, "ready_partitions 100 is fine with shard_count 128: no false report");
        let p = check(text);
        assert!(p[0].reason.contains("unknown field `shard_cont`"), "{p:?}");
        assert!(p[1].reason.contains("between 8 and 65536"), "{p:?}");
    }

    #[test]
    fn a_good_file_and_an_empty_one_have_no_problem_and_a_broken_one_names_its_line() {
        assert!(check("shard_count: 16\nauth: keys\n").is_empty());
        assert!(check("").is_empty());
        let broken = check("shard_count: 16\n  : [\n");
        assert_eq!(broken.len(), 1, "{broken:?}");
        assert!(broken[0].line >= 1, "{broken:?}");
    }
}
