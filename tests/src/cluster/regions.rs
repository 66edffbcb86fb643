//! Two regions for the region tests (`tests/tests/regions.rs`): region A is the PostgreSQL
//! primary and nodes 1 and 2, region B the synchronous standby and nodes 3 and 4. Every path
//! from one region to the other goes through a delaying [`Link`] (30 ms each way): B's nodes to
//! the primary, A's nodes to the standby, and the standby's replication from the primary.
//! Within a region, direct. Every node says `primary_region: a`: while a node of region A
//! lives, only region A's nodes hold shard leases, so the leases sit beside the primary and a
//! commit does not cross the link twice.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Result;

use super::link::{Link, Links, REGION_DELAY};
use super::netns::Netns;
use super::pg::PgServer;

/// Nodes `0..REGION_A_NODES` (0-based) are region A's; the rest region B's.
pub const REGION_A_NODES: usize = 2;

/// The region of node `i` (0-based).
pub fn region_of(i: usize) -> &'static str {
    if i < REGION_A_NODES { "a" } else { "b" }
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port)
}

/// The standby of `primary`, replicating through a new link (pushed onto `links`).
pub fn standby(primary: &PgServer, links: &mut Links) -> Result<PgServer> {
    let link = Link::start(local(0), local(primary.port), REGION_DELAY)?;
    let standby = PgServer::standby_via(primary, link.addr.port())?;
    links.all.push(Arc::new(link));
    Ok(standby)
}

/// Each node's database hosts, primary first: the server of its own region direct, the other
/// through a new link listening on the node's veth far end.
pub fn routes(
    primary: &PgServer,
    standby: &PgServer,
    nets: &[Netns],
    links: &mut Links,
) -> Result<Vec<Vec<String>>> {
    let mut out = Vec::new();
    for (i, net) in nets.iter().enumerate() {
        let in_a = region_of(i) == "a";
        let (near, far) = if in_a { (primary, standby) } else { (standby, primary) };
        let link =
            Link::start(SocketAddr::new(net.host_ip.into(), 0), local(far.port), REGION_DELAY)?;
        let (near, far) = (near.addr(net.host_ip), link.addr.to_string());
        out.push(if in_a { vec![near, far] } else { vec![far, near] });
        links.all.push(Arc::new(link));
    }
    Ok(out)
}

/// `base` (a node's YAML settings) with `region: <region>` and `primary_region: a`.
pub fn yaml(base: &str, region: &str) -> String {
    let keep =
        base.lines().filter(|l| !l.starts_with("region:") && !l.starts_with("primary_region:"));
    let mut out: Vec<String> = keep.map(String::from).collect();
    out.push(format!("region: {region}"));
    out.push("primary_region: a".to_string());
    out.join("\n") + "\n"
}
