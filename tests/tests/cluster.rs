//! A cluster you can run, proven with real processes: three `kairos serve` nodes on one
//! PostgreSQL, each in a network namespace of its own made by the test (veth pairs), each with
//! a worker process beside it ([`kairos_tests::cluster`]). Faults: a node SIGKILLed in the
//! middle of a burst; a node cut off from the database (its link down) and back; a rolling
//! restart of every node under load; the primary SIGKILLed and its synchronous standby
//! promoted. Every acknowledged execution must start (0 lost), none before its time, and a
//! second start of one only after an attempt lease ran out. The figures (failover times) are
//! printed.
//!
//! They need root, network namespaces and PostgreSQL's server: `#[ignore]`d in `cargo test
//! --workspace`, run by `.ci/run` (`cargo test -p kairos-tests --test cluster -- --ignored`);
//! without what they need they fail saying so.
#![allow(clippy::disallowed_methods)] // real processes, real time

use std::time::Duration;

use anyhow::{Result, ensure};
use kairos_tests::cluster::load::{self, Acked, submit_burst, verdict, wait_started};
use kairos_tests::cluster::observe::{self, now_ms};
use kairos_tests::cluster::{Binaries, Cluster, Options, SHARD_LEASE_MS};

const IGNORE: &str = "needs root + network namespaces: run by .ci/run";

fn bins() -> Binaries {
    Binaries {
        kairos: env!("CARGO_BIN_EXE_e2e-kairos").into(),
        kairosctl: env!("CARGO_BIN_EXE_e2e-kairosctl").into(),
    }
}

/// Waits for every acknowledged execution to start, then checks the verdict: 0 lost, 0 early,
/// duplicates only after an attempt lease ran out. Prints it.
async fn settle(c: &Cluster, name: &str, acked: &[Acked], within: Duration) -> Result<()> {
    let all = wait_started(acked, &c.starts, within).await;
    tokio::time::sleep(Duration::from_secs(1)).await; // late duplicates
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
    ensure!(
        bad.is_empty(),
        "{name}: started again before a lease ran out: {:?}",
        &bad[..bad.len().min(5)]
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root + network namespaces: run by .ci/run"]
async fn a_node_killed_mid_burst_loses_nothing_and_its_shards_move() -> Result<()> {
    let _ = IGNORE;
    let mut c = Cluster::start(&bins(), &Options::default()).await?;
    let clients = c.clients().await?;
    let due = now_ms() + 8_000;
    let acked = submit_burst(&clients, "kill", 20_000, due).await?;
    observe::wait_fraction(&c.starts, &acked, 0.3, Duration::from_secs(60)).await;
    let (shards, count) = observe::owned_by(&clients[0], "n2").await?;
    ensure!(!shards.is_empty(), "n2 held no shard");
    let kill_ms = now_ms();
    tokio::task::block_in_place(|| c.nodes[1].kill());
    let moved =
        observe::wait_moved(&clients[0], "n2", &shards, kill_ms, Duration::from_secs(30)).await?;
    settle(&c, "sigkill", &acked, Duration::from_secs(120)).await?;
    let starts = load::starts_now(&c.starts);
    let fire =
        observe::first_fire_after(&clients[0], &starts, &shards, count, kill_ms, &[1, 3]).await?;
    let (fired, started) = fire.ok_or_else(|| anyhow::anyhow!("no shard of n2 fired again"))?;
    println!(
        "sigkill: {} shards of n2 moved {moved:?} after the kill; first fire of one on another \
         node {} ms after it, its start {} ms (shard lease {SHARD_LEASE_MS} ms)",
        shards.len(),
        fired - kill_ms,
        started - kill_ms
    );
    let bound = SHARD_LEASE_MS as i64 + 5_000;
    ensure!(fired - kill_ms <= bound, "fired again only after {} ms", fired - kill_ms);
    Ok(())
}
