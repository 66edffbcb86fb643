//! `kairosctl bench <s1|…|s7>`: the load generator (see docs/load-generator.md).
//!
//! Everything goes through the public gRPC API, with the node, the workers and the generator
//! in separate processes: by default the bench spawns `kairos dev` on a fresh data dir and
//! free ports ([`node`]), registers its own no-op definition, spawns `--workers` processes of
//! itself (`kairosctl bench worker`, [`workers`]) whose handlers report each start on stdout,
//! submits ([`submit`]) and matches starts against submissions ([`track`]); [`env`] holds what
//! every scenario works with. The scenarios live in [`throughput`] (s1), [`burst`] (s2, s5),
//! [`precision`] (s3, s4), [`fairness`] (s6) and [`duenow`] (s7); [`stats`] prints the table and the final JSON
//! line.

pub mod args;
mod burst;
mod duenow;
mod env;
mod fairness;
mod node;
mod precision;
mod progress;
mod stats;
mod submit;
mod throughput;
mod track;
mod workers;

use std::time::Duration;

use args::{Args, Command, Scenario};
use env::Env;
use node::WorkDir;

/// Runs `kairosctl bench` with its parsed command line; returns the exit code.
///
/// The generator runs on its own multi-threaded runtime (`--threads`, default 2) in a thread
/// of its own: `kairosctl`'s runtime is single-threaded.
pub async fn main(cmd: Command) -> i32 {
    let cmd = cmd.into_run();
    if let Ok(a) = &cmd
        && let Err(e) = a.check()
    {
        eprintln!("kairosctl bench: {e}");
        return 2;
    }
    let threads = match &cmd {
        Ok(a) => a.threads,
        Err(w) => w.threads,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new().name("kairos-bench".into()).spawn(move || {
        let rt = match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("kairos-bench")
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("kairosctl bench: starting the runtime: {e}");
                let _ = tx.send(1);
                return;
            }
        };
        let code = rt.block_on(async move {
            match cmd {
                Ok(a) => run(a).await,
                Err(w) => workers::worker_main(w).await,
            }
        });
        rt.shutdown_timeout(Duration::from_secs(1));
        let _ = tx.send(code);
    });
    if let Err(e) = spawned {
        eprintln!("kairosctl bench: starting a thread: {e}");
        return 1;
    }
    rx.await.unwrap_or_else(|_| {
        eprintln!("kairosctl bench: the run panicked");
        1
    })
}

/// Writes to stdout (a closed pipe, as with `| head`, is not an error).
fn out(text: &str) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes());
    let _ = o.flush();
}

async fn run(args: Args) -> i32 {
    let dir = match WorkDir::create() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("kairosctl bench: {e:#}");
            return 1;
        }
    };
    let (quick, keep) = (args.quick, args.keep);
    let mut env = match Env::setup(args, dir).await {
        Ok(env) => env,
        Err((e, dir)) => {
            eprintln!("kairosctl bench: {e:#}");
            let empty = std::fs::read_dir(&dir.path).map_or(true, |mut d| d.next().is_none());
            if empty {
                dir.remove();
            } else {
                eprintln!("kairosctl bench: node data and logs kept in {}", dir.path.display());
            }
            return 1;
        }
    };
    let result = match env.args.scenario {
        Scenario::S1 => throughput::run(&mut env).await,
        Scenario::S2 => burst::run(&mut env, false).await,
        Scenario::S3 => precision::run_s3(&mut env).await,
        Scenario::S4 => precision::run_s4(&mut env).await,
        Scenario::S5 => burst::run(&mut env, true).await,
        Scenario::S6 => fairness::run(&mut env).await,
        Scenario::S7 => duenow::run(&mut env).await,
    };
    env.shutdown().await;
    let report = match result {
        Ok(mut r) if env.args.endpoint.is_none() => {
            // Where the nodes kept their data, and how many there were.
            let store = if env.args.postgres_url.is_some() { "postgres" } else { "embedded" };
            r.set("store", store);
            r.set("nodes", env.args.nodes as u64);
            r
        }
        Ok(r) => r,
        Err(e) => {
            eprintln!("kairosctl bench {}: {e:#}", env.args.scenario.name());
            eprintln!("kairosctl bench: node data and logs kept in {}", env.dir.path.display());
            return 1;
        }
    };
    out(&report.table());
    for f in &report.failures {
        eprintln!("kairosctl bench: {}: {f}", if quick { "FAILED" } else { "warning" });
    }
    let failed = quick && !report.failures.is_empty();
    if failed || keep {
        eprintln!("kairosctl bench: node data and logs kept in {}", env.dir.path.display());
    } else {
        env.dir.remove();
    }
    out(&format!("{}\n", report.json_line()));
    i32::from(failed)
}
