//! A single `kairos dev` node in a real process, on a data directory of the test's: started on
//! free ports, waited for until it owns its shards, SIGKILLed when dropped.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A port free at the time of the call (another process may take it before it is bound).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Two free ports for a node's HTTP and gRPC listeners, never the same one (both held while
/// the second is picked: two calls of [`free_port`] can be handed one port twice).
pub fn free_port_pair() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
}

/// Spawns `bin dev --log warn` on `dir`, listening on 127.0.0.1 at `http` and `grpc`, its
/// output discarded (not waited for).
pub fn spawn_dev(bin: &str, dir: &Path, http: u16, grpc: u16) -> Killed {
    let child = Command::new(bin)
        .args(["dev", "--data-dir", dir.to_str().unwrap(), "--log", "warn"])
        .args(["--listen-http", &format!("127.0.0.1:{http}")])
        .args(["--listen-grpc", &format!("127.0.0.1:{grpc}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kairos starts");
    Killed(child)
}

/// A running `kairos dev` node.
pub struct DevNode {
    /// The process (dropping the node SIGKILLs it).
    pub process: Killed,
    /// Its HTTP port on 127.0.0.1.
    pub http: u16,
    /// Its gRPC endpoint, `http://127.0.0.1:<port>`.
    pub endpoint: String,
}

impl DevNode {
    /// Starts `kairos` (the binary at `bin`) as `kairos dev --log warn` on `dir`, its log
    /// discarded, and waits up to 30 s until `/healthz` says it owns all 64 shards.
    pub async fn start(bin: &str, dir: &Path) -> DevNode {
        let (http, grpc) = free_port_pair();
        let process = spawn_dev(bin, dir, http, grpc);
        let node = DevNode { process, http, endpoint: format!("http://127.0.0.1:{grpc}") };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            if let Ok((200, body)) = crate::http_request(http, "GET", "/healthz", &[], b"")
                && body.contains("shards=64")
            {
                return node;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("node did not become healthy within 30 s");
    }
}
