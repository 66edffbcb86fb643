//! Cluster administration cannot be lost (issue 24): the last admin key of every namespace
//! cannot be revoked (refused with the reason), and `kairos admin-key --data-dir DIR` on the
//! stopped node makes a new one — refused while the node runs.
#![allow(clippy::disallowed_methods)] // real processes, real time

use kairos_tests::dev::{Killed, free_port_pair};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KAIROS: &str = env!("CARGO_BIN_EXE_e2e-kairos");
const KAIROSCTL: &str = env!("CARGO_BIN_EXE_e2e-kairosctl");

/// `kairos serve` on `data` with the given ports.
fn serve(data: &Path, http: u16, grpc: u16) -> Killed {
    Killed(
        Command::new(KAIROS)
            .args(["serve", "--data-dir", data.to_str().unwrap(), "--log", "warn"])
            .args(["--listen-http", &format!("127.0.0.1:{http}")])
            .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Stops the node with SIGTERM (it drains and closes its store).
fn stop(mut node: Killed) {
    let pid = node.0.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let t = Instant::now();
    while node.0.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(30), "the node did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `kairosctl args` with `key`: `(exit code, stdout + stderr)`.
fn ctl(grpc: u16, key: &str, args: &[&str]) -> (i32, String) {
    let o = Command::new(KAIROSCTL)
        .args(["--endpoint", &format!("http://127.0.0.1:{grpc}")])
        .args(args)
        .env("KAIROS_API_KEY", key)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.code().unwrap_or(-1), text)
}

/// Waits for `file` to hold a token, and for the node to answer with it.
fn token(file: &Path, grpc: u16) -> String {
    let t = Instant::now();
    loop {
        if let Ok(k) = std::fs::read_to_string(file)
            && !k.trim().is_empty()
            && ctl(grpc, k.trim(), &["whoami"]).0 == 0
        {
            return k.trim().to_string();
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no working key in {}", file.display());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn admin_key(data: &Path) -> std::process::Output {
    Command::new(KAIROS)
        .args(["admin-key", "--data-dir", data.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn the_last_admin_key_stays_and_a_stopped_node_makes_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (http, grpc) = free_port_pair();
    let node = serve(&data, http, grpc);
    let file = data.join("admin-key");
    let first = token(&file, grpc);
    let id = first.split('_').nth(1).unwrap().to_string();
    // The only admin key of every namespace: its revocation is refused, with the reason.
    let (code, out) = ctl(grpc, &first, &["keys", "revoke", &id]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("last admin key") && out.contains("kairos admin-key"), "{out}");
    assert_eq!(ctl(grpc, &first, &["whoami"]).0, 0, "the key still works");
    // While the node runs, the embedded store is its: admin-key is refused.
    let o = admin_key(&data);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("is the node stopped?"), "{o:?}");

    // The token is lost (the file deleted): recovery on the stopped node.
    stop(node);
    std::fs::remove_file(&file).unwrap();
    let o = admin_key(&data);
    assert!(o.status.success(), "{o:?}");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the token file is its owner's only");
    let _node = serve(&data, http, grpc);
    let second = token(&file, grpc);
    assert_ne!(second, first);
    let (code, out) = ctl(grpc, &second, &["keys", "list"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("recovery"), "{out}");
    // kairosctl reads the key from a file too (no secret in `ps`).
    let with_file = |f: &Path| {
        Command::new(KAIROSCTL)
            .args(["--endpoint", &format!("http://127.0.0.1:{grpc}"), "--api-key-file"])
            .arg(f)
            .arg("whoami")
            .env_remove("KAIROS_API_KEY")
            .output()
            .unwrap()
    };
    let o = with_file(&file);
    assert!(o.status.success(), "{o:?}");
    let second_id = second.split('_').nth(1).unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains(second_id), "{o:?}");
    let o = with_file(&dir.path().join("missing"));
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--api-key-file"));
    // With two admin keys, the first may go now.
    let (code, out) = ctl(grpc, &second, &["keys", "revoke", &id]);
    assert_eq!(code, 0, "{out}");
}

/// The modes of `dir` and of the files the node keeps in it.
fn modes(dir: &Path) -> Vec<(String, u32)> {
    let mut out =
        vec![(".".to_string(), std::fs::metadata(dir).unwrap().permissions().mode() & 0o777)];
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let mode = e.metadata().unwrap().permissions().mode() & 0o777;
        out.push((e.file_name().to_string_lossy().into_owned(), mode));
    }
    out.sort();
    out
}

#[test]
fn the_data_directory_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (http, grpc) = free_port_pair();
    let node = serve(&data, http, grpc);
    token(&data.join("admin-key"), grpc);
    stop(node);
    let found = modes(&data);
    for name in [".", "kv.redb", "node-id", "store-created", "admin-key"] {
        assert!(found.iter().any(|(n, _)| n == name), "{name} missing: {found:?}");
    }
    for (name, mode) in &found {
        let private = if name == "." { 0o700 } else { 0o600 };
        assert_eq!(*mode & 0o077, 0, "{name} is {mode:o}: {found:?}");
        assert!(*mode <= private, "{name} is {mode:o}");
    }
    // A store made readable by others (as older builds left it): made private at start, loudly.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = data.join("kv.redb");
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o644)).unwrap();
    let log = dir.path().join("err.log");
    let mut node = Killed(
        Command::new(KAIROS)
            .args(["serve", "--data-dir", data.to_str().unwrap(), "--log", "warn"])
            .args(["--listen-http", &format!("127.0.0.1:{http}")])
            .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    token(&data.join("admin-key"), grpc);
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(err.contains("WARNING: the data directory was readable by other users"), "{err}");
    assert!(err.contains("kv.redb: 644 → 600"), "{err}");
    assert_eq!(std::fs::metadata(&data).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(std::fs::metadata(&store).unwrap().permissions().mode() & 0o777, 0o600);
    let _ = node.0.kill();
}
