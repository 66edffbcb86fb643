//! Command-line flags of `kairosctl bench` and of its hidden `worker` subcommand, declared
//! with clap (a subcommand of `kairosctl`, so `--help`, completions and usage errors with exit
//! code 2 work as for every other command).

use std::path::PathBuf;

use clap::{Args as ClapArgs, Subcommand};

/// What the load generator is (`kairosctl bench --help`).
pub const ABOUT: &str = "\
The Kairos load generator. Drives a node through its public gRPC API, with the node, the
workers and this generator in separate processes. By default it spawns its own node on a
fresh data directory and kills it at the end. Prints a table, then ONE JSON line (last line
of stdout). See docs/load-generator.md.

Every scenario takes the same options: `kairosctl bench s2 --help` lists them with their
defaults.

Exit codes: 0 ok · 1 the run failed, or a --quick assertion failed · 2 usage";

/// `kairosctl bench …`.
#[derive(Debug, ClapArgs)]
#[command(about = "The load generator (docs/load-generator.md)", long_about = ABOUT)]
pub struct Bench {
    #[command(subcommand)]
    pub command: Command,
}

/// A scenario, or the hidden worker.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Submit throughput: --count via SubmitBatch (--batch per call, --in-flight calls), then
    /// --single-count single Submit calls from --clients concurrent clients; all due in 1 hour
    /// (no worker runs).
    #[command(alias = "S1")]
    S1(Args),
    /// Burst: workers first, then --count executions all due at one instant T (submission
    /// start + --lead-ms); waits until every one started; lateness, drain, duplicates.
    #[command(alias = "S2")]
    S2(Args),
    /// Precision: --rate executions/s falling due steadily for --duration s, each submitted
    /// ~1 s ahead; lateness, missing, early.
    #[command(alias = "S3")]
    S3(Args),
    /// Scale: s3, then --preload executions due 1-30 days ahead, then s3 again; both p99s,
    /// their ratio, node RSS after the preload.
    #[command(alias = "S4")]
    S4(Args),
    /// Recovery (spawned node only): an s2 burst of --count; when --kill-at of them have
    /// started, SIGKILL the node and restart it on the same data dir and ports; lost, time to
    /// fire again, duplicates.
    #[command(alias = "S5")]
    S5(Args),
    /// Fairness: workers in two namespaces; bench-b trickles --trickle/s (baseline alone), then
    /// bench-a floods --count due at one instant while bench-b trickles on: bench-b's lateness
    /// during the flood against its baseline.
    #[command(alias = "S6")]
    S6(Args),
    /// Due now, end to end: workers first, then --count executions submitted due at once
    /// (no execute_at; --delayed-share of them delayed by --delay-ms), as fast as the node
    /// takes them; completions/s from the first submission to the last start, lateness.
    #[command(alias = "S7")]
    S7(Args),
    /// A worker process of the generator (spawned by it).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

impl Command {
    /// The scenario's flags, with the scenario set; `Err` for the worker.
    pub fn into_run(self) -> Result<Args, WorkerArgs> {
        let (scenario, mut a) = match self {
            Command::S1(a) => (Scenario::S1, a),
            Command::S2(a) => (Scenario::S2, a),
            Command::S3(a) => (Scenario::S3, a),
            Command::S4(a) => (Scenario::S4, a),
            Command::S5(a) => (Scenario::S5, a),
            Command::S6(a) => (Scenario::S6, a),
            Command::S7(a) => (Scenario::S7, a),
            Command::Worker(w) => return Err(w),
        };
        a.scenario = scenario;
        a.batch = a.batch.min(CALL_BYTES / a.input_bytes.max(1)).max(1);
        Ok(a)
    }
}

/// A scenario of the load generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scenario {
    /// Submit throughput.
    #[default]
    S1,
    /// Burst.
    S2,
    /// Precision.
    S3,
    /// Scale.
    S4,
    /// Recovery.
    S5,
    /// Fairness.
    S6,
    /// Due now, end to end.
    S7,
}

impl Scenario {
    /// Its name on the command line and in the JSON (`s1`…).
    pub fn name(self) -> &'static str {
        match self {
            Scenario::S1 => "s1",
            Scenario::S2 => "s2",
            Scenario::S3 => "s3",
            Scenario::S4 => "s4",
            Scenario::S5 => "s5",
            Scenario::S6 => "s6",
            Scenario::S7 => "s7",
        }
    }
}

/// Parsed `kairosctl bench <scenario>` flags. Sizes left unset take the scenario's default
/// (see the getters), which `--quick` makes small.
#[derive(Debug, Clone, ClapArgs)]
pub struct Args {
    /// The scenario (set from the subcommand).
    #[arg(skip)]
    pub scenario: Scenario,
    /// Small sizes for CI, and correctness assertions: exit 1 when missing, lost or early > 0
    /// (full runs exit 0 unless the run failed).
    #[arg(long, help_heading = "Other")]
    pub quick: bool,
    /// The kairos binary to spawn [default: `kairos` next to this executable, else `e2e-kairos`
    /// next to it].
    #[arg(long, value_name = "PATH", conflicts_with = "endpoint", help_heading = "Node")]
    pub kairos: Option<PathBuf>,
    /// Drive a running node (http://host:port, gRPC) instead of spawning one; no s5; node
    /// CPU/RSS only with --node-pid.
    #[arg(long, value_name = "URL", help_heading = "Node")]
    pub endpoint: Option<String>,
    /// The running node's pid, for CPU seconds and RSS (with --endpoint).
    #[arg(long, value_name = "PID", requires = "endpoint", value_parser = number::<u32>, help_heading = "Node")]
    pub node_pid: Option<u32>,
    /// --log of the spawned node.
    #[arg(long, value_name = "LEVEL", default_value = "warn", help_heading = "Node")]
    pub node_log: String,
    /// Nodes to spawn (more than one needs a store they can share: --postgres-url). The
    /// generator's connections and the workers are spread over them in turn; node CPU adds up
    /// every node, peak RSS is the largest.
    #[arg(long, value_name = "N", default_value = "1", value_parser = positive_usize, conflicts_with = "endpoint", help_heading = "Node")]
    pub nodes: usize,
    /// Spawned nodes on this PostgreSQL database (`--backend postgres --postgres-url URL`), in
    /// a schema of their own for this run (`bench_<run>`, left in the database afterwards).
    #[arg(long, value_name = "URL", conflicts_with = "endpoint", help_heading = "Node")]
    pub postgres_url: Option<String>,
    /// One more flag for every spawned node, e.g. --node-arg=--shard-count=128 (repeatable).
    #[arg(
        long,
        value_name = "ARG",
        allow_hyphen_values = true,
        conflicts_with = "endpoint",
        help_heading = "Node"
    )]
    pub node_arg: Vec<String>,
    /// Keep the temp dir (node data and logs; always kept on failure).
    #[arg(long, help_heading = "Node")]
    pub keep: bool,
    /// Worker processes.
    #[arg(long, value_name = "N", default_value = "1", value_parser = positive_usize, help_heading = "Workers")]
    pub workers: usize,
    /// Concurrent tasks per worker.
    #[arg(long, value_name = "N", default_value = "50", value_parser = positive_usize, help_heading = "Workers")]
    pub slots: usize,
    /// Requests per SubmitBatch call (at most 1000, the API's limit).
    #[arg(long, value_name = "N", default_value = "1000", value_parser = batch, help_heading = "Submission")]
    pub batch: usize,
    /// SubmitBatch calls in flight.
    #[arg(long, value_name = "N", default_value = "4", value_parser = positive_usize, help_heading = "Submission")]
    pub in_flight: usize,
    /// s1: concurrent clients sending single Submit calls.
    #[arg(long, value_name = "N", default_value = "64", value_parser = positive_usize, help_heading = "Submission")]
    pub clients: usize,
    /// gRPC connections the generator spreads its calls over.
    #[arg(long, value_name = "N", default_value = "4", value_parser = positive_usize, help_heading = "Submission")]
    pub connections: usize,
    /// s1 batched: 100000 (quick 5000); s2: 100000 (2000); s5: 50000 (2000).
    #[arg(long, value_name = "N", value_parser = positive, help_heading = "Sizes")]
    count: Option<u64>,
    /// s1 single calls: 20000 (quick 1000).
    #[arg(long, value_name = "N", value_parser = number::<u64>, help_heading = "Sizes")]
    single_count: Option<u64>,
    /// s2, s5: T = submission start + MS [default: count/20000 s + 2 s; quick: 2000].
    #[arg(long, value_name = "MS", value_parser = number::<u64>, help_heading = "Sizes")]
    lead_ms: Option<u64>,
    /// s3, s4: executions falling due per second.
    #[arg(long, value_name = "N", default_value = "200", value_parser = positive, help_heading = "Sizes")]
    pub rate: u64,
    /// s3, s4: seconds of steady load: 30 (quick 3).
    #[arg(long = "duration", value_name = "S", value_parser = positive, help_heading = "Sizes")]
    duration_s: Option<u64>,
    /// s4: executions stored 1-30 days ahead: 10000000 (quick 20000).
    #[arg(long, value_name = "N", value_parser = number::<u64>, help_heading = "Sizes")]
    preload: Option<u64>,
    /// s6: executions per second the second namespace submits.
    #[arg(long, value_name = "N", default_value = "10", value_parser = positive, help_heading = "Sizes")]
    pub trickle: u64,
    /// s7: the share of executions delayed by --delay-ms (0: all due now; 0.5: a 50/50 mix).
    #[arg(long, value_name = "F", default_value = "0", value_parser = share, help_heading = "Sizes")]
    pub delayed_share: f64,
    /// s7: the delay of the delayed share.
    #[arg(long, value_name = "MS", default_value = "1000", value_parser = number::<u64>, help_heading = "Sizes")]
    pub delay_ms: u64,
    /// s5: fraction of the burst started before the SIGKILL.
    #[arg(long, value_name = "F", default_value = "0.3", value_parser = fraction, help_heading = "Sizes")]
    pub kill_at: f64,
    /// Each execution's inputs: a JSON object of N bytes (`{"payload":"xx…"}`; 0: `{}`), at
    /// most 32768 (the API's input limit). SubmitBatch calls are then cut to --batch or what
    /// fits 3 MiB, inside the node's 4 MiB request limit.
    #[arg(long, value_name = "N", default_value = "0", value_parser = input_bytes, help_heading = "Sizes")]
    pub input_bytes: usize,
    /// s2, s3, s4, s5: stop collecting after S seconds.
    #[arg(long = "timeout", value_name = "S", default_value = "300", value_parser = positive, help_heading = "Sizes")]
    pub timeout_s: u64,
    /// Progress bars on stderr even when stderr is not a terminal.
    #[arg(long, help_heading = "Other")]
    pub progress: bool,
    /// Runtime threads of this generator and of each worker (at most 64).
    #[arg(long, value_name = "N", default_value = "2", value_parser = threads, help_heading = "Other")]
    pub threads: usize,
}

/// `kairosctl bench worker --endpoint URL --queue Q --slots N [--id ID] [--threads N]`.
#[derive(Debug, Clone, ClapArgs)]
pub struct WorkerArgs {
    /// The node.
    #[arg(long, value_name = "URL")]
    pub endpoint: String,
    /// The queue.
    #[arg(long, default_value = "bench")]
    pub queue: String,
    /// The namespace.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Concurrent tasks.
    #[arg(long, value_name = "N", default_value = "50", value_parser = positive_usize)]
    pub slots: usize,
    /// This worker's id [default: bench-worker-PID].
    #[arg(long, default_value_t = format!("bench-worker-{}", std::process::id()), hide_default_value = true)]
    pub id: String,
    /// Runtime threads.
    #[arg(long, value_name = "N", default_value = "2", value_parser = threads)]
    pub threads: usize,
}

/// What one SubmitBatch call carries at most in inputs: 3 MiB (the node takes 4 MiB).
const CALL_BYTES: usize = 3 * 1024 * 1024;
/// The JSON around the payload string.
const PAYLOAD_JSON_BYTES: usize = r#"{"payload":""}"#.len();

fn input_bytes(s: &str) -> Result<usize, String> {
    let n: usize = number(s)?;
    if n != 0 && !(PAYLOAD_JSON_BYTES..=32_768).contains(&n) {
        return Err(format!("must be 0 or {PAYLOAD_JSON_BYTES}-32768 bytes"));
    }
    Ok(n)
}

impl Args {
    /// Each execution's inputs (JSON) as `--input-bytes` says.
    pub fn inputs_json(&self) -> std::sync::Arc<str> {
        match self.input_bytes {
            0 => "{}".into(),
            n => format!(r#"{{"payload":"{}"}}"#, "x".repeat(n - PAYLOAD_JSON_BYTES)).into(),
        }
    }

    /// Checks what the flags cannot say alone.
    pub fn check(&self) -> Result<(), String> {
        if self.scenario == Scenario::S5 && self.endpoint.is_some() {
            return Err(
                "s5 kills and restarts the node: it needs a spawned node, not --endpoint".into()
            );
        }
        if self.nodes > 1 && self.postgres_url.is_none() {
            return Err(format!(
                "--nodes {}: several nodes need a store they share (--postgres-url URL)",
                self.nodes
            ));
        }
        Ok(())
    }

    /// s1 batched, s2 and s5: executions submitted.
    pub fn count(&self) -> u64 {
        self.count.unwrap_or(match (self.scenario, self.quick) {
            (Scenario::S5, false) => 50_000,
            (Scenario::S7, false) => 20_000,
            (Scenario::S1, true) => 5_000,
            (_, true) => 2_000,
            (_, false) => 100_000,
        })
    }

    /// s1: single Submit calls.
    pub fn single_count(&self) -> u64 {
        self.single_count.unwrap_or(if self.quick { 1_000 } else { 20_000 })
    }

    /// s2, s5: from the start of submission to the instant every execution is due.
    pub fn lead_ms(&self) -> u64 {
        self.lead_ms.unwrap_or(if self.quick { 2_000 } else { self.count() / 20 + 2_000 })
    }

    /// s3, s4: seconds of steady load.
    pub fn duration_s(&self) -> u64 {
        self.duration_s.unwrap_or(if self.quick { 3 } else { 30 })
    }

    /// s4: executions preloaded far in the future.
    pub fn preload(&self) -> u64 {
        self.preload.unwrap_or(if self.quick { 20_000 } else { 10_000_000 })
    }
}

fn number<T: std::str::FromStr>(v: &str) -> Result<T, String> {
    v.trim().replace('_', "").parse().map_err(|_| format!("{v:?} is not a valid number"))
}

fn positive(v: &str) -> Result<u64, String> {
    match number::<u64>(v)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

fn positive_usize(v: &str) -> Result<usize, String> {
    positive(v).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

fn batch(v: &str) -> Result<usize, String> {
    match positive_usize(v)? {
        n if n > 1_000 => Err("at most 1000 (the API's limit per SubmitBatch)".into()),
        n => Ok(n),
    }
}

fn threads(v: &str) -> Result<usize, String> {
    positive_usize(v).map(|n| n.min(64))
}

fn fraction(v: &str) -> Result<f64, String> {
    match number::<f64>(v)? {
        f if f > 0.0 && f < 1.0 => Ok(f),
        _ => Err("a fraction between 0 and 1 (e.g. 0.3)".into()),
    }
}

fn share(v: &str) -> Result<f64, String> {
    match number::<f64>(v)? {
        f if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err("a share from 0 to 1 (e.g. 0.5)".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        bench: Bench,
    }

    fn parse(args: &[&str]) -> Result<Command, String> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .map(|c| c.bench.command)
            .map_err(|e| e.to_string())
    }

    fn run(args: &[&str]) -> Result<Args, String> {
        let a = parse(args)?.into_run().map_err(|w| format!("{w:?}"))?;
        a.check()?;
        Ok(a)
    }

    #[test]
    fn defaults_and_quick_sizes() {
        let a = run(&["s2"]).unwrap();
        assert_eq!((a.count(), a.lead_ms(), a.workers, a.slots), (100_000, 7_000, 1, 50));
        let q = run(&["s2", "--quick"]).unwrap();
        assert_eq!((q.count(), q.lead_ms()), (2_000, 2_000));
        assert_eq!(run(&["s5"]).unwrap().count(), 50_000);
        assert_eq!(run(&["S1", "--quick"]).unwrap().count(), 5_000);
        assert_eq!(run(&["s4", "--quick"]).unwrap().preload(), 20_000);
        let c = run(&["s2", "--count=300", "--lead-ms", "500", "--workers", "3"]).unwrap();
        assert_eq!((c.count(), c.lead_ms(), c.workers), (300, 500, 3));
        assert_eq!(run(&["s3", "--threads", "1_000"]).unwrap().threads, 64);
        let w = match parse(&["worker", "--endpoint", "http://x:1", "--slots", "5"]).unwrap() {
            Command::Worker(w) => w,
            other => panic!("{other:?}"),
        };
        assert_eq!((w.queue.as_str(), w.slots), ("bench", 5));
    }

    #[test]
    fn errors_name_what_is_wrong() {
        assert!(run(&["s9"]).unwrap_err().contains("s9"));
        assert!(run(&["s2", "--bogus"]).unwrap_err().contains("--bogus"));
        assert!(run(&["s2", "--count"]).unwrap_err().contains("--count"));
        assert!(run(&["s2", "--count", "x"]).unwrap_err().contains("--count"));
        assert!(run(&["s2", "--count", "0"]).unwrap_err().contains("at least 1"));
        assert!(run(&["s2", "--batch", "1001"]).unwrap_err().contains("1000"));
        assert!(run(&["s5", "--kill-at", "1.5"]).unwrap_err().contains("fraction"));
        assert!(run(&["s5", "--endpoint", "http://x:1"]).unwrap_err().contains("s5"));
        assert!(run(&["s2", "--node-pid", "1"]).unwrap_err().contains("--endpoint"));
        assert!(
            run(&["s2", "--endpoint", "http://x:1", "--kairos", "k"])
                .unwrap_err()
                .contains("--kairos")
        );
        assert!(run(&["worker"]).unwrap_err().contains("--endpoint"));
        assert!(parse(&[]).is_err());
    }
}
