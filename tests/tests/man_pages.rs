//! The manual pages (issue 36): `kairos man --out DIR` and `kairosctl man --out DIR`, made from
//! the clap definitions, write a page per command and subcommand, and each page names every
//! long flag of its command. The real binaries.
#![allow(clippy::disallowed_methods)] // real processes

use std::path::Path;
use std::process::Command;

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const KAIROSCTL: &str = env!("CARGO_BIN_EXE_e2e-kairosctl");

/// Runs `bin man --out dir`, then checks `cmd`'s pages there; the number of pages checked.
fn pages_of(bin: &str, mut cmd: clap::Command, dir: &Path) -> usize {
    let out = Command::new(bin).args(["man", "--out", dir.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    cmd.build();
    let name = cmd.get_name().to_string();
    let n = check(&cmd, &name, dir);
    let files = std::fs::read_dir(dir).unwrap().count();
    assert_eq!(files, n, "one page per command, no other file in {}", dir.display());
    n
}

fn check(cmd: &clap::Command, name: &str, dir: &Path) -> usize {
    let path = dir.join(format!("{name}.1"));
    let page = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("no page {} ({e})", path.display()));
    assert!(page.starts_with(".ie") || page.contains(".TH"), "a roff page: {}", path.display());
    for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        if let Some(long) = arg.get_long() {
            let roff = format!("\\-\\-{}", long.replace('-', "\\-"));
            assert!(page.contains(&roff), "{} names --{long}", path.display());
        }
    }
    let mut n = 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        n += check(sub, &format!("{name}-{}", sub.get_name()), dir);
    }
    n
}

#[test]
fn kairos_writes_a_page_per_subcommand_naming_its_flags() {
    let dir = tempfile::tempdir().unwrap();
    let n = pages_of(KAIROS, kairos_actors::cli::command(), dir.path());
    for page in ["kairos", "kairos-serve", "kairos-backup", "kairos-restore", "kairos-config-check"]
    {
        assert!(dir.path().join(format!("{page}.1")).exists(), "{page}.1");
    }
    assert!(n >= 12, "{n} pages");
}

#[test]
fn kairosctl_writes_a_page_per_subcommand_naming_its_flags() {
    use clap::CommandFactory as _;
    let dir = tempfile::tempdir().unwrap();
    let n = pages_of(KAIROSCTL, kairos_ctl::args::Cli::command(), dir.path());
    for page in ["kairosctl", "kairosctl-submit", "kairosctl-cron-create", "kairosctl-keys-create"]
    {
        assert!(dir.path().join(format!("{page}.1")).exists(), "{page}.1");
    }
    assert!(n >= 40, "{n} pages");
}

#[test]
fn a_directory_that_cannot_be_made_is_a_failure_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = Command::new(KAIROS).args(["man", "--out", file.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--out"), "{out:?}");
}
