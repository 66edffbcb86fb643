//! The `kairos` binary.
//!
//! `kairos dev [--data-dir DIR]` opens the embedded store (zero set-up) and keeps it open
//! until Ctrl-C. Today that is the whole node: the scheduler actors, the API server and
//! `kairos serve` arrive with the node issue; see the README's status section.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use kairos_layer::env::{Rng, SharedClock, SystemClock};
use kairos_layer::kv::embedded::EmbeddedDatabase;
use kairos_layer::kv::{Error, decode_i64};

const USAGE: &str = "usage: kairos dev [--data-dir DIR]   (default DIR: ./kairos-data)";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("dev") => dev(&args[1..]).await,
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n{USAGE}"),
        None => bail!("no command given\n{USAGE}"),
    }
}

async fn dev(args: &[String]) -> anyhow::Result<()> {
    let mut data_dir = PathBuf::from("kairos-data");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--data-dir" => {
                data_dir = PathBuf::from(it.next().context("--data-dir needs a directory")?);
            }
            other => bail!("unknown flag `{other}`\n{USAGE}"),
        }
    }
    let clock: SharedClock = Arc::new(SystemClock::default());
    let path = data_dir.join("kv.redb");
    let db = EmbeddedDatabase::open_database(&path, clock, Rng::from_entropy())
        .with_context(|| format!("opening the embedded store at {}", path.display()))?;
    // Count this start durably: proves the store is writable and survives restarts.
    let starts = db
        .run(|tx| async move {
            tx.add_i64(b"\xfe/kairos/starts", 1)?;
            Ok::<_, Error>(())
        })
        .await
        .and(db.begin()?.get(b"\xfe/kairos/starts").await)
        .context("writing to the embedded store")?;
    println!(
        "kairos dev: embedded store open at {} (start #{}); Ctrl-C to stop",
        path.display(),
        decode_i64(starts.as_deref())
    );
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    db.close().await;
    println!("kairos dev: store closed");
    Ok(())
}
