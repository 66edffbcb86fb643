//! Network namespaces a test makes for itself: one per node, each joined to the test's own
//! namespace by a veth pair on a /24 of its own (`10.<n>.<i>.1` on the test's side, where
//! PostgreSQL listens; `10.<n>.<i>.2` inside, where the node listens). Taking the test's end
//! of the pair down cuts the node off from everything outside its namespace — the database
//! and the test — while its own worker still reaches it over the namespace's loopback.
//!
//! Needs root and iproute2's `ip`; [`require_root`] says so (a test fails, it never skips).
//! Dropping a [`Netns`] deletes it (and with it the veth pair).

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// What the cluster tests need, said when it is missing.
pub const NEEDS: &str = "the cluster tests need root and network namespaces (iproute2's \
    `ip netns`, veth pairs) and PostgreSQL's server (.ci/install-postgres); .ci/run runs them";

/// Fails, saying what is needed, unless this process runs as root and `ip netns` works.
pub fn require_root() -> Result<()> {
    let uid = Command::new("id").arg("-u").output().context("running id -u")?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        bail!("not running as root: {NEEDS}");
    }
    let ip = Command::new("ip").args(["netns", "list"]).output();
    match ip {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => bail!("`ip netns list` failed ({}): {NEEDS}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => bail!("cannot run `ip` ({e}): {NEEDS}"),
    }
}

/// Runs `ip ARGS`, failing with its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// A network namespace joined to the test's namespace by a veth pair.
#[derive(Debug)]
pub struct Netns {
    /// The namespace's name (`ip netns exec NAME …`).
    pub name: String,
    /// The test's end of the veth pair.
    host_if: String,
    /// The address of the test's end (where PostgreSQL listens for this namespace).
    pub host_ip: Ipv4Addr,
    /// The address inside the namespace (where the node listens).
    pub ns_ip: Ipv4Addr,
}

impl Netns {
    /// Namespace `index` (1-250) of this process: `kairos-<pid>-<index>`.
    pub fn create(index: u8) -> Result<Netns> {
        let pid = std::process::id();
        let tag = format!("{pid:x}");
        // Interface names are at most 15 bytes: "kh" + at most 6 hex digits + the index.
        let ns = Netns {
            name: format!("kairos-{pid}-{index}"),
            host_if: format!("kh{tag}x{index}"),
            host_ip: Ipv4Addr::new(10, 100 + (pid % 100) as u8, index, 1),
            ns_ip: Ipv4Addr::new(10, 100 + (pid % 100) as u8, index, 2),
        };
        let ns_if = format!("kn{tag}x{index}");
        // A namespace left by a killed earlier process with the same pid: remove it first.
        let _ = ip(&["netns", "del", &ns.name]);
        ip(&["netns", "add", &ns.name])?;
        ip(&[
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
            "netns",
            &ns.name,
        ])?;
        ip(&["addr", "add", &format!("{}/24", ns.host_ip), "dev", &ns.host_if])?;
        ip(&["link", "set", &ns.host_if, "up"])?;
        ip(&["-n", &ns.name, "addr", "add", &format!("{}/24", ns.ns_ip), "dev", &ns_if])?;
        ip(&["-n", &ns.name, "link", "set", &ns_if, "up"])?;
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Sets the test's end of the link up or down (down: the namespace is cut off).
    pub fn set_link(&self, up: bool) -> Result<()> {
        ip(&["link", "set", &self.host_if, if up { "up" } else { "down" }])
    }

    /// A command running `program` inside the namespace (`ip netns exec` execs it: the child's
    /// pid is the program's).
    pub fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// `GET path` on `addr` from inside the namespace (bash's `/dev/tcp`, so it works while
    /// the namespace is cut off): status and body.
    pub fn http_get(&self, addr: std::net::SocketAddr, path: &str) -> Result<(u16, String)> {
        let script = format!(
            "exec 3<>/dev/tcp/{}/{} && printf 'GET {path} HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' >&3 \
             && timeout 5 cat <&3",
            addr.ip(),
            addr.port()
        );
        let out = self.command(Path::new("bash")).args(["-c", &script]).output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.trim().to_string());
        Ok((status, body.unwrap_or_default()))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&["link", "del", &self.host_if]);
    }
}
