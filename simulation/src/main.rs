//! The seed runner: `kairos-simulation --seeds 1..1000`, `--seed N --trace`.
// Outside the simulation: the sweep's wall time and the livelock watchdog read the real clock.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: kairos-simulation (--seed N [--trace] | --seeds A..B) [--twice]\n  \
         --seed N     run one seed (--trace prints its event trace)\n  \
         --seeds A..B run seeds A to B-1 and sum up what they reached\n  \
         --twice      run each seed twice (each run in a fresh process) and compare trace hashes\n  \
         --child      run one seed and print its summary as lines (what a sweep's parent reads)"
    );
    ExitCode::from(2)
}

/// What the runner keeps of one seed's run.
struct Summary {
    passed: bool,
    hash: u64,
    simulated_ms: u64,
    reached: Vec<(String, u64)>,
    enabled: Vec<String>,
}

/// Runs `seed` in this process. `--trace` prints the trace and knobs; a child prints its
/// summary as lines for its parent (and a failure's report on stderr either way).
fn here(seed: u64, trace: bool, child: bool) -> Summary {
    if kairos_simulation::workload::LIVE.load(std::sync::atomic::Ordering::Relaxed) {
        eprint!("{}", kairos_simulation::plan::Plan::from_seed(seed).describe());
    }
    let out = kairos_simulation::run(seed);
    if trace {
        for line in &out.trace {
            println!("{line}");
        }
        print!("{}", out.plan.describe());
    }
    if !out.passed() {
        eprint!("{}", out.report());
    }
    let sum = Summary {
        passed: out.passed(),
        hash: out.hash,
        simulated_ms: out.simulated.as_millis() as u64,
        reached: out.reached.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
        enabled: out.plan.enabled.iter().map(|f| f.to_string()).collect(),
    };
    if child {
        println!("hash {:016x}", sum.hash);
        println!("passed {}", sum.passed);
        println!("simulated_ms {}", sum.simulated_ms);
        for f in &sum.enabled {
            println!("enabled {f}");
        }
        for (k, n) in &sum.reached {
            println!("reached {n} {k}");
        }
    }
    sum
}

/// Runs `seed` in a fresh process of this program.
fn in_child(seed: u64) -> Option<Summary> {
    let exe = std::env::current_exe().ok()?;
    let out = std::process::Command::new(exe)
        .args(["--seed", &seed.to_string(), "--child"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut sum = Summary {
        passed: false,
        hash: 0,
        simulated_ms: 0,
        reached: Vec::new(),
        enabled: Vec::new(),
    };
    let mut got_hash = false;
    for line in text.lines() {
        let (key, rest) = line.split_once(' ')?;
        match key {
            "hash" => {
                sum.hash = u64::from_str_radix(rest, 16).ok()?;
                got_hash = true;
            }
            "passed" => sum.passed = rest == "true",
            "simulated_ms" => sum.simulated_ms = rest.parse().ok()?,
            "enabled" => sum.enabled.push(rest.to_string()),
            "reached" => {
                let (n, what) = rest.split_once(' ')?;
                sum.reached.push((what.to_string(), n.parse().ok()?));
            }
            _ => {}
        }
    }
    got_hash.then_some(sum)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut seeds: Vec<u64> = Vec::new();
    let (mut trace, mut twice, mut child) = (false, false, false);
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--seed" => {
                let Some(n) = args.get(i + 1).and_then(|s| s.parse().ok()) else { return usage() };
                seeds.push(n);
                i += 1;
            }
            "--seeds" => {
                let Some((a, b)) = args.get(i + 1).and_then(|s| s.split_once("..")) else {
                    return usage();
                };
                let (Ok(a), Ok(b)) = (a.parse::<u64>(), b.parse::<u64>()) else { return usage() };
                seeds.extend(a..b);
                i += 1;
            }
            "--trace" => trace = true,
            "--twice" => twice = true,
            "--child" => child = true,
            "--live" => {
                kairos_simulation::workload::LIVE.store(true, std::sync::atomic::Ordering::Relaxed)
            }
            _ => return usage(),
        }
        i += 1;
    }
    if seeds.is_empty() {
        return usage();
    }
    if std::env::var_os("KAIROS_SIM_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_env("KAIROS_SIM_LOG"))
            .with_timer(SimTime)
            .with_ansi(false)
            .init();
    }
    // A step that never ends is a livelock: some task spins without letting simulated time
    // advance (a bug: in production it burns a core). Nothing else can stop it.
    let isolated = seeds.len() > 1 || twice;
    // (A sweep's runs are child processes, each with its own watchdog.)
    std::thread::spawn(move || {
        if isolated {
            return;
        }
        let mut last = u64::MAX;
        loop {
            std::thread::sleep(std::time::Duration::from_secs(60));
            let now = kairos_simulation::run::PROGRESS.load(std::sync::atomic::Ordering::Relaxed);
            if now == last {
                let seed = now >> 24;
                eprintln!(
                    "seed {seed}: LIVELOCK: simulated time stopped at {} s for a minute of wall time\nreplay: cargo run --release -p kairos-simulation -- --seed {seed} --live",
                    now & 0xFF_FFFF
                );
                std::process::exit(3);
            }
            last = now;
        }
    });
    let started = std::time::Instant::now();
    let (mut failed, mut simulated_ms) = (Vec::new(), 0u64);
    let mut reached: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    // One seed runs here; several each in a fresh process, so that every result is what
    // `--seed N` replays (a run can depend on state a library keeps per process: seeds run
    // one after another in one process do not always replay alike; see docs/simulation.md).
    for &seed in &seeds {
        let Some(out) = (if isolated { in_child(seed) } else { Some(here(seed, trace, child)) })
        else {
            eprintln!("seed {seed}: the run did not finish (crashed or livelocked)");
            failed.push(seed);
            continue;
        };
        if child {
            continue;
        }
        let mut ok = out.passed;
        if twice {
            let again = in_child(seed).map(|o| o.hash);
            if again != Some(out.hash) {
                ok = false;
                eprintln!(
                    "seed {seed}: NOT DETERMINISTIC: trace hash {:016x} then {again:016x?}\nreplay: cargo run --release -p kairos-simulation -- --seed {seed} --trace",
                    out.hash
                );
            }
        }
        simulated_ms += out.simulated_ms;
        for (k, n) in &out.reached {
            let e = reached.entry(k.clone()).or_default();
            e.0 += 1;
            e.1 += n;
        }
        for f in &out.enabled {
            *faults.entry(f.clone()).or_default() += 1;
        }
        println!(
            "seed {seed}: {} hash {:016x} ({:.0} s simulated)",
            if out.passed { "ok" } else { "FAILED" },
            out.hash,
            out.simulated_ms as f64 / 1e3
        );
        if !ok {
            failed.push(seed);
        }
    }
    if child {
        return ExitCode::SUCCESS;
    }
    let simulated = std::time::Duration::from_millis(simulated_ms);
    println!(
        "\n{} seeds, {} failed, {:.1} s wall, {:.0} s simulated",
        seeds.len(),
        failed.len(),
        started.elapsed().as_secs_f64(),
        simulated.as_secs_f64()
    );
    println!("faults enabled (seeds):");
    for (f, n) in &faults {
        println!("  {f}: {n}");
    }
    println!("reached (seeds, total):");
    for (k, (s, n)) in &reached {
        println!("  {k}: {s} seeds, {n}");
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        println!("failed seeds: {failed:?}");
        ExitCode::FAILURE
    }
}

/// Log lines are stamped with simulated time (ms since the run began, as the trace is), not
/// the wall clock: a node's log then lines up with the event trace.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match turmoil::sim_elapsed() {
            Some(t) => write!(w, "{:>8}", t.as_millis()),
            None => write!(w, "{:>8}", "-"),
        }
    }
}
