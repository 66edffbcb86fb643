//! Command-line flags of `kairosctl bench` and of its hidden `worker` subcommand.

use std::path::PathBuf;

/// The usage text (`kairosctl bench --help`): every flag and its default.
pub const USAGE: &str = "\
usage: kairosctl bench <s1|s2|s3|s4|s5> [options]

The Kairos load generator. Drives a node through its public gRPC API, with the node, the
workers and this generator in separate processes. By default it spawns its own node on a
fresh data directory and kills it at the end. Prints a table, then ONE JSON line (last line
of stdout). See docs/load-generator.md.

scenarios:
  s1   submit throughput: --count via SubmitBatch (--batch per call, --in-flight calls),
       then --single-count single Submit calls from --clients concurrent clients; all due
       in 1 hour (no worker runs)
  s2   burst: workers first, then --count executions all due at one instant T (submission
       start + --lead-ms); waits until every one started; lateness, drain, duplicates
  s3   precision: --rate executions/s falling due steadily for --duration s, each
       submitted ~1 s ahead; lateness, missing, early
  s4   scale: s3, then --preload executions due 1-30 days ahead, then s3 again; both p99s,
       their ratio, node RSS after the preload
  s5   recovery (spawned node only): an s2 burst of --count; when --kill-at of them have
       started, SIGKILL the node and restart it on the same data dir and ports; lost,
       time to fire again, duplicates

node:
  --kairos PATH        the kairos binary to spawn (default: `kairos` next to this
                       executable, else `e2e-kairos` next to it)
  --endpoint URL       drive a running node (http://host:port, gRPC) instead of spawning
                       one; no s5; node CPU/RSS only with --node-pid
  --node-pid PID       the running node's pid, for CPU seconds and RSS (with --endpoint)
  --node-log LEVEL     --log of the spawned node (default warn)
  --keep               keep the temp dir (node data and logs; always kept on failure)

workers:
  --workers N          worker processes (default 1)
  --slots N            concurrent tasks per worker (default 50)

submission:
  --batch N            requests per SubmitBatch call (default 1000, at most 1000)
  --in-flight N        SubmitBatch calls in flight (default 4)
  --clients N          s1: concurrent clients sending single Submit calls (default 64)
  --connections N      gRPC connections the generator spreads its calls over (default 4)

sizes (full / with --quick):
  --count N            s1 batched: 100000 / 5000; s2: 100000 / 2000; s5: 50000 / 2000
  --single-count N     s1 single calls: 20000 / 1000
  --lead-ms MS         s2, s5: T = submission start + MS (default: count/20000 s + 2 s;
                       quick: 2000)
  --rate N             s3, s4: executions falling due per second (default 200)
  --duration S         s3, s4: seconds of steady load (30 / 3)
  --preload N          s4: executions stored 1-30 days ahead (10000000 / 20000)
  --kill-at F          s5: fraction of the burst started before the SIGKILL (default 0.3)
  --timeout S          s2, s3, s4, s5: stop collecting after S seconds (default 300)

other:
  --quick              small sizes for CI, and correctness assertions: exit 1 when
                       missing, lost or early > 0 (full runs exit 0 unless the run failed)
  --progress           progress bars on stderr even when stderr is not a terminal
  --threads N          runtime threads of this generator and of each worker (default 2)
  -h, --help           this text

exit codes: 0 ok · 1 the run failed, or a --quick assertion failed · 2 usage";

/// A scenario of the load generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Submit throughput.
    S1,
    /// Burst.
    S2,
    /// Precision.
    S3,
    /// Scale.
    S4,
    /// Recovery.
    S5,
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
        }
    }
}

/// Parsed `kairosctl bench <scenario>` flags. Sizes left unset take the scenario's default
/// (see the getters), which `--quick` makes small.
#[derive(Debug, Clone)]
pub struct Args {
    pub scenario: Scenario,
    pub quick: bool,
    pub kairos: Option<PathBuf>,
    pub endpoint: Option<String>,
    pub node_pid: Option<u32>,
    pub node_log: String,
    pub keep: bool,
    pub workers: usize,
    pub slots: usize,
    pub batch: usize,
    pub in_flight: usize,
    pub clients: usize,
    pub connections: usize,
    count: Option<u64>,
    single_count: Option<u64>,
    lead_ms: Option<u64>,
    pub rate: u64,
    duration_s: Option<u64>,
    preload: Option<u64>,
    pub kill_at: f64,
    pub timeout_s: u64,
    pub progress: bool,
    pub threads: usize,
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    /// `--help`.
    Help,
    /// A scenario.
    Run(Box<Args>),
    /// The hidden worker subcommand.
    Worker(WorkerArgs),
}

/// `kairosctl bench worker --endpoint URL --queue Q --slots N [--id ID] [--threads N]`.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    pub endpoint: String,
    pub queue: String,
    pub slots: usize,
    pub id: String,
    pub threads: usize,
}

impl Args {
    fn new(scenario: Scenario) -> Args {
        Args {
            scenario,
            quick: false,
            kairos: None,
            endpoint: None,
            node_pid: None,
            node_log: "warn".into(),
            keep: false,
            workers: 1,
            slots: 50,
            batch: 1_000,
            in_flight: 4,
            clients: 64,
            connections: 4,
            count: None,
            single_count: None,
            lead_ms: None,
            rate: 200,
            duration_s: None,
            preload: None,
            kill_at: 0.3,
            timeout_s: 300,
            progress: false,
            threads: 2,
        }
    }

    /// s1 batched, s2 and s5: executions submitted.
    pub fn count(&self) -> u64 {
        self.count.unwrap_or(match (self.scenario, self.quick) {
            (Scenario::S5, false) => 50_000,
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

fn value(
    flag: &str,
    inline: Option<String>,
    rest: &mut impl Iterator<Item = String>,
) -> Result<String, String> {
    match inline.or_else(|| rest.next()) {
        Some(v) => Ok(v),
        None => Err(format!("flag {flag} needs a value (kairosctl bench --help)")),
    }
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.trim()
        .replace('_', "")
        .parse()
        .map_err(|_| format!("flag {flag}: {v:?} is not a valid number"))
}

fn positive(flag: &str, v: &str) -> Result<u64, String> {
    match number::<u64>(flag, v)? {
        0 => Err(format!("flag {flag}: must be at least 1")),
        n => Ok(n),
    }
}

/// Splits `--flag=value` into its parts.
fn split(arg: String) -> (String, Option<String>) {
    match arg.split_once('=') {
        Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
        _ => (arg, None),
    }
}

/// Parses the arguments after `bench`.
pub fn parse(args: Vec<String>) -> Result<Command, String> {
    if args.iter().any(|a| a == "-h" || a == "--help") || args.first().is_some_and(|a| a == "help")
    {
        return Ok(Command::Help);
    }
    let mut it = args.into_iter();
    let Some(first) = it.next() else {
        return Err(
            "missing scenario: kairosctl bench <s1|s2|s3|s4|s5> [options] (--help for more)".into(),
        );
    };
    let scenario = match first.as_str() {
        "s1" | "S1" => Scenario::S1,
        "s2" | "S2" => Scenario::S2,
        "s3" | "S3" => Scenario::S3,
        "s4" | "S4" => Scenario::S4,
        "s5" | "S5" => Scenario::S5,
        "worker" => return parse_worker(it).map(Command::Worker),
        other if other.starts_with('-') => {
            return Err(format!(
                "the scenario comes first: kairosctl bench <s1|s2|s3|s4|s5> [options] (got {other})"
            ));
        }
        other => {
            return Err(format!("unknown scenario {other:?}: expected s1, s2, s3, s4 or s5"));
        }
    };
    let mut a = Args::new(scenario);
    while let Some(arg) = it.next() {
        let (flag, inline) = split(arg);
        let f = flag.as_str();
        match f {
            "--quick" => a.quick = true,
            "--progress" => a.progress = true,
            "--keep" => a.keep = true,
            "--kairos" => a.kairos = Some(PathBuf::from(value(f, inline, &mut it)?)),
            "--endpoint" => a.endpoint = Some(value(f, inline, &mut it)?),
            "--node-pid" => a.node_pid = Some(number(f, &value(f, inline, &mut it)?)?),
            "--node-log" => a.node_log = value(f, inline, &mut it)?,
            "--workers" => a.workers = positive(f, &value(f, inline, &mut it)?)? as usize,
            "--slots" => a.slots = positive(f, &value(f, inline, &mut it)?)? as usize,
            "--batch" => {
                a.batch = positive(f, &value(f, inline, &mut it)?)? as usize;
                if a.batch > 1_000 {
                    return Err(
                        "flag --batch: at most 1000 (the API's limit per SubmitBatch)".into()
                    );
                }
            }
            "--in-flight" => a.in_flight = positive(f, &value(f, inline, &mut it)?)? as usize,
            "--clients" => a.clients = positive(f, &value(f, inline, &mut it)?)? as usize,
            "--connections" => a.connections = positive(f, &value(f, inline, &mut it)?)? as usize,
            "--count" => a.count = Some(positive(f, &value(f, inline, &mut it)?)?),
            "--single-count" => a.single_count = Some(number(f, &value(f, inline, &mut it)?)?),
            "--lead-ms" => a.lead_ms = Some(number(f, &value(f, inline, &mut it)?)?),
            "--rate" => a.rate = positive(f, &value(f, inline, &mut it)?)?,
            "--duration" => a.duration_s = Some(positive(f, &value(f, inline, &mut it)?)?),
            "--preload" => a.preload = Some(number(f, &value(f, inline, &mut it)?)?),
            "--kill-at" => {
                let v: f64 = number(f, &value(f, inline, &mut it)?)?;
                if !(v > 0.0 && v < 1.0) {
                    return Err("flag --kill-at: a fraction between 0 and 1 (e.g. 0.3)".into());
                }
                a.kill_at = v;
            }
            "--timeout" => a.timeout_s = positive(f, &value(f, inline, &mut it)?)?,
            "--threads" => a.threads = positive(f, &value(f, inline, &mut it)?)?.min(64) as usize,
            _ if f.starts_with('-') => {
                return Err(format!("unknown flag {f} (kairosctl bench --help lists them)"));
            }
            _ => return Err(format!("unexpected argument {f:?} (kairosctl bench --help)")),
        }
    }
    if a.node_pid.is_some() && a.endpoint.is_none() {
        return Err(
            "flag --node-pid: only with --endpoint (a spawned node is measured anyway)".into()
        );
    }
    if a.endpoint.is_some() && a.kairos.is_some() {
        return Err("flags --endpoint and --kairos exclude each other".into());
    }
    if a.scenario == Scenario::S5 && a.endpoint.is_some() {
        return Err(
            "s5 kills and restarts the node: it needs a spawned node, not --endpoint".into()
        );
    }
    Ok(Command::Run(Box::new(a)))
}

fn parse_worker(mut it: impl Iterator<Item = String>) -> Result<WorkerArgs, String> {
    let mut w = WorkerArgs {
        endpoint: String::new(),
        queue: "bench".into(),
        slots: 50,
        id: format!("bench-worker-{}", std::process::id()),
        threads: 2,
    };
    while let Some(arg) = it.next() {
        let (flag, inline) = split(arg);
        let f = flag.as_str();
        match f {
            "--endpoint" => w.endpoint = value(f, inline, &mut it)?,
            "--queue" => w.queue = value(f, inline, &mut it)?,
            "--slots" => w.slots = positive(f, &value(f, inline, &mut it)?)? as usize,
            "--id" => w.id = value(f, inline, &mut it)?,
            "--threads" => w.threads = positive(f, &value(f, inline, &mut it)?)?.min(64) as usize,
            _ => return Err(format!("bench worker: unknown argument {f}")),
        }
    }
    if w.endpoint.is_empty() {
        return Err("bench worker: --endpoint is required".into());
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Args, String> {
        match parse(args.iter().map(|s| s.to_string()).collect())? {
            Command::Run(a) => Ok(*a),
            other => Err(format!("{other:?}")),
        }
    }

    #[test]
    fn defaults_and_quick_sizes() {
        let a = run(&["s2"]).unwrap();
        assert_eq!((a.count(), a.lead_ms(), a.workers, a.slots), (100_000, 7_000, 1, 50));
        let q = run(&["s2", "--quick"]).unwrap();
        assert_eq!((q.count(), q.lead_ms()), (2_000, 2_000));
        assert_eq!(run(&["s5"]).unwrap().count(), 50_000);
        assert_eq!(run(&["s1", "--quick"]).unwrap().count(), 5_000);
        assert_eq!(run(&["s4", "--quick"]).unwrap().preload(), 20_000);
        let c = run(&["s2", "--count=300", "--lead-ms", "500", "--workers", "3"]).unwrap();
        assert_eq!((c.count(), c.lead_ms(), c.workers), (300, 500, 3));
    }

    #[test]
    fn errors_name_what_is_wrong() {
        assert!(run(&["s9"]).unwrap_err().contains("unknown scenario \"s9\""));
        assert!(run(&["s2", "--bogus"]).unwrap_err().contains("unknown flag --bogus"));
        assert!(run(&["s2", "--count"]).unwrap_err().contains("--count needs a value"));
        assert!(run(&["s2", "--count", "x"]).unwrap_err().contains("--count"));
        assert!(run(&["s5", "--endpoint", "http://x:1"]).unwrap_err().contains("s5"));
        assert!(run(&[]).unwrap_err().contains("missing scenario"));
        assert!(matches!(parse(vec!["s1".into(), "--help".into()]), Ok(Command::Help)));
    }
}
