//! `kairos config check FILE` through the real binary: every unknown key and bad value of a
//! settings file is printed with its line, and the command exits 1; a good file exits 0.

use std::process::Command;

fn config_check(text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.yaml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kairos"))
        .args(["config", "check", file.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).replace(file.to_str().unwrap(), "FILE");
    (out.status.code(), said)
}

#[test]
fn every_bad_key_is_reported_with_its_line_and_a_good_file_passes() {
    let (code, said) = config_check(
        "# a node\nshard_cont: 64\nstore_cache_mib: 4\nretention_days: many\nbackend: postgres\n",
    );
    assert_eq!(code, Some(1), "{said}");
    for line in [
        "FILE:2: shard_cont: unknown field `shard_cont`",
        "FILE:3: store_cache_mib: must be between 8 and 65536",
        "FILE:4: retention_days: invalid type: string \"many\"",
        "FILE: postgres_url: required with backend postgres",
    ] {
        assert!(said.contains(line), "{line:?} missing from:\n{said}");
    }
    let (code, said) = config_check("shard_count: 16\nauth: keys\n");
    assert_eq!((code, said.trim()), (Some(0), "FILE: ok"));
}
