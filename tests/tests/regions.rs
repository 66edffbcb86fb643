//! Two regions with real processes ([`kairos_tests::cluster::regions`]): region A (the
//! PostgreSQL primary, nodes 1 and 2, their workers) and region B (the synchronous standby,
//! nodes 3 and 4, their workers), every path between them through a delaying TCP proxy (30 ms
//! each way). Faults: the whole of region A lost, the whole of region B lost, the link cut and
//! healed. Every acknowledged execution must start (0 lost), none before its time.
//!
//! Root, network namespaces and PostgreSQL's server, like the cluster tests: `#[ignore]`d, run
//! with `cargo test --release -p kairos-tests --test regions -- --ignored --test-threads 1`.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use kairos_sdk::Client;
use kairos_tests::cluster::load::{self, Acked, submit_burst, verdict, wait_started};
use kairos_tests::cluster::observe::{self, now_ms};
use kairos_tests::cluster::{Binaries, Cluster, Options};

fn bins() -> Binaries {
    Binaries {
        kairos: env!("CARGO_BIN_EXE_e2e-kairos").into(),
        kairosctl: env!("CARGO_BIN_EXE_e2e-kairosctl").into(),
    }
}

fn two_regions() -> Options {
    Options { nodes: 4, regions: true, ..Options::default() }
}

/// Waits for every acknowledged execution to start; 0 lost, 0 early, duplicates only after a
/// lease ran out. Prints the verdict.
async fn settle(c: &Cluster, name: &str, acked: &[Acked], within: Duration) -> Result<()> {
    let all = wait_started(acked, &c.starts, within).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let v = verdict(acked, &load::starts_now(&c.starts));
    println!(
        "{name}: acknowledged {}, lost {}, early {}, duplicates {}",
        v.acked,
        v.lost.len(),
        v.early.len(),
        v.duplicates.len()
    );
    ensure!(
        all && v.lost.is_empty(),
        "{name}: {} lost, e.g. {:?}\n{}",
        v.lost.len(),
        v.lost.first(),
        c.logs()
    );
    ensure!(v.early.is_empty(), "{name}: started early: {:?}", &v.early[..v.early.len().min(5)]);
    let bad = observe::early_duplicates(&v);
    ensure!(bad.is_empty(), "{name}: started again before a lease ran out: {bad:?}");
    Ok(())
}

/// Waits until every execution shard has a live owner among `owners`; ms since `since_ms`.
async fn wait_owned_by(
    client: &Client,
    owners: &[&str],
    since_ms: i64,
    within: Duration,
) -> Result<i64> {
    let t = Instant::now();
    loop {
        if let Ok((leases, count)) = client.shards("executions").await {
            let now = now_ms();
            let live = leases
                .iter()
                .filter(|l| owners.contains(&l.owner.as_str()) && l.expires_at_ms > now);
            if live.count() == count as usize {
                return Ok(now - since_ms);
            }
        }
        if t.elapsed() > within {
            bail!("the shards were not all owned by {owners:?} within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first start of one of `probes`, in ms after `since_ms`.
fn first_start(c: &Cluster, probes: &[Acked], since_ms: i64) -> Result<i64> {
    let ids: std::collections::BTreeSet<&str> = probes.iter().map(|a| a.id.as_str()).collect();
    let starts = load::starts_now(&c.starts);
    let first = starts.iter().filter(|s| ids.contains(s.id.as_str())).map(|s| s.at_us / 1_000);
    first.min().map(|t| t - since_ms).ok_or_else(|| anyhow::anyhow!("no probe started"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root + network namespaces + PostgreSQL"]
async fn region_a_lost_the_standby_promoted_region_b_takes_every_shard() -> Result<()> {
    let mut c = Cluster::start(&bins(), &two_regions()).await?;
    let clients = c.clients().await?;
    let mut acked = submit_burst(&clients, "a-lost", 4_000, now_ms() + 6_000).await?;
    observe::wait_fraction(&c.starts, &acked, 0.3, Duration::from_secs(60)).await;
    let kill_ms = now_ms();
    c.nodes[0].kill();
    c.nodes[1].kill();
    c.pg.kill()?;
    c.links.cut();
    let standby = c.standby.as_ref().expect("a standby");
    tokio::task::block_in_place(|| standby.promote())?; // the operator's step
    let b = clients[2..].to_vec();
    let owned = wait_owned_by(&b[0], &["n3", "n4"], kill_ms, Duration::from_secs(60)).await?;
    let probes = submit_burst(&b, "after-a", 300, now_ms()).await?;
    acked.extend(probes.iter().cloned());
    // Executions acknowledged by A's nodes before the kill are in the synchronous standby.
    settle(&c, "region A lost", &acked, Duration::from_secs(120)).await?;
    let first = first_start(&c, &probes, kill_ms)?;
    println!(
        "region A lost: every shard owned in B {owned} ms after the kill; first start in B {first} ms after it"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root + network namespaces + PostgreSQL"]
async fn region_b_lost_region_a_carries_on_once_the_sync_standby_is_dropped() -> Result<()> {
    let mut c = Cluster::start(&bins(), &two_regions()).await?;
    let clients = c.clients().await?;
    let mut acked = submit_burst(&clients, "b-lost", 4_000, now_ms() + 6_000).await?;
    observe::wait_fraction(&c.starts, &acked, 0.3, Duration::from_secs(60)).await;
    let kill_ms = now_ms();
    c.nodes[2].kill();
    c.nodes[3].kill();
    c.links.cut();
    // The operator's step: commits no longer wait for the lost standby.
    // Two statements: ALTER SYSTEM cannot run inside the transaction of a multi-statement -c.
    tokio::task::block_in_place(|| c.pg.psql("ALTER SYSTEM SET synchronous_standby_names = ''"))?;
    tokio::task::block_in_place(|| c.pg.psql("SELECT pg_reload_conf()"))?;
    let a = clients[..2].to_vec();
    let owned = wait_owned_by(&a[0], &["n1", "n2"], kill_ms, Duration::from_secs(60)).await?;
    let probes = submit_burst(&a, "after-b", 300, now_ms()).await?;
    acked.extend(probes.iter().cloned());
    settle(&c, "region B lost", &acked, Duration::from_secs(120)).await?;
    let first = first_start(&c, &probes, kill_ms)?;
    println!(
        "region B lost: every shard owned in A {owned} ms after the kill; first start {first} ms after it"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root + network namespaces + PostgreSQL"]
async fn the_link_cut_and_healed_never_owns_a_shard_twice() -> Result<()> {
    let c = Cluster::start(&bins(), &two_regions()).await?;
    let clients = c.clients().await?;
    let acked = submit_burst(&clients, "cut", 4_000, now_ms() + 4_000).await?;
    let mut epochs: BTreeMap<u32, u64> = BTreeMap::new();
    let t = Instant::now();
    c.links.cut();
    while t.elapsed() < Duration::from_secs(20) {
        if t.elapsed() > Duration::from_secs(10) && c.links.all.iter().any(|l| l.is_cut()) {
            c.links.heal();
        }
        // The store's leases (through region A's node, next to the primary).
        if let Ok((leases, _)) = clients[0].shards("executions").await {
            let now = now_ms();
            let mut live: BTreeMap<u32, &str> = BTreeMap::new();
            for l in leases.iter().filter(|l| l.expires_at_ms > now && !l.owner.is_empty()) {
                if let Some(other) = live.insert(l.partition, &l.owner) {
                    bail!("shard {} owned by {other} and {} at once", l.partition, l.owner);
                }
                let seen = epochs.entry(l.partition).or_insert(l.epoch);
                ensure!(
                    l.epoch >= *seen,
                    "shard {}: epoch fell from {seen} to {}",
                    l.partition,
                    l.epoch
                );
                *seen = l.epoch;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    settle(&c, "link cut and healed", &acked, Duration::from_secs(120)).await
}
