#![allow(clippy::disallowed_methods)] // a user's command line: wall time and tokio timers are the truth here
//! `kairosctl`: the Kairos admin console (the binary is a thin `main` calling [`main`]).
//! One-shot commands, or `console` for an interactive session; human-readable tables by
//! default, `--json` for scripts (errors too, as `{"error": {"code", "message", "exitCode"}}`
//! on stderr). The command line is declared in [`args`] (clap): `--help` everywhere, usage
//! errors exit 2, `kairosctl completions SHELL` prints a completion script, `kairosctl man --out
//! DIR` writes the manual pages. `kairosctl bench`
//! is the load generator ([`bench`]).
//!
//! Exit codes: 0 ok · 1 other error · 2 usage · 3 not found · 4 conflict (already exists,
//! wrong state, fenced) · 5 invalid argument · 6 unavailable or timed out · 7 not allowed.
//!
//! Rooms: [`args`] (what may be said) → [`commands`] (one function per command, over the SDK's
//! client) and [`console`] (the same commands, a line at a time) → [`output`] (what is printed,
//! and the exit code); [`bench`] stands apart.

use clap::{CommandFactory, Parser};
use kairos_sdk::Client;

pub mod args;
pub mod bench;
mod commands;
mod console;
pub mod man;
mod output;

use args::{Cli, Command};
use output::{Failure, Opts, report};

/// Whether the raw arguments ask for JSON (before clap has parsed them: for its errors).
fn wants_json<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> bool {
    args.iter().map(AsRef::as_ref).take_while(|a| *a != "--").any(|a| a == "--json")
}

/// Reports a clap outcome that is not a parsed command line: help and version on stdout
/// (exit 0), usage errors on stderr (exit 2; JSON with `--json`).
fn clap_exit(o: &Opts, e: clap::Error) -> i32 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            0
        }
        _ if o.json => {
            let text = e.render().to_string();
            report(o, Err(Failure::Usage(text.trim_start_matches("error: ").to_string())))
        }
        _ => {
            let _ = e.print();
            2
        }
    }
}

/// Runs `kairosctl` with the process arguments; exits the process with its exit code.
pub fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    std::process::exit(main_with(args));
}

/// Runs `kairosctl` with these arguments (the first is the program name); returns the exit code.
pub fn main_with(args: Vec<std::ffi::OsString>) -> i32 {
    let args = args::hoist_connection_flags(args);
    let json = wants_json(&args[1.min(args.len())..]);
    let mut cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => return clap_exit(&Opts { json }, e),
    };
    let o = Opts { json: cli.json };
    if let Some(file) = cli.api_key_file.take() {
        match std::fs::read_to_string(&file) {
            Ok(text) => cli.api_key = text.lines().next().map(|l| l.trim().to_string()),
            Err(e) => {
                let why = format!("--api-key-file {}: {e}", file.display());
                return report(&o, Err(Failure::Other(why)));
            }
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return report(&o, Err(Failure::Other(format!("starting the runtime: {e}")))),
    };
    match cli.command {
        Command::Completions { shell } => {
            // Written whole, then printed: clap_complete panics when stdout is closed.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "kairosctl", &mut script);
            output::write_stdout(&script)
        }
        Command::Man { out } => match man::write_pages(Cli::command(), &out) {
            Ok(written) => {
                println!("kairosctl man: {} pages in {}", written.len(), out.display());
                0
            }
            Err(e) => report(&o, Err(Failure::Other(format!("{e:#}")))),
        },
        Command::Bench(b) => rt.block_on(bench::main(b.command)),
        Command::Api(cmd) => rt.block_on(async {
            let client = match Client::connect_tls(&cli.endpoint, &cli.tls.tls()).await {
                Ok(c) => commands::with_key(c, cli.api_key.as_deref()),
                Err(e) => Err(e),
            };
            match client {
                Ok(c) => report(&o, commands::run(&c.with_namespace(cli.namespace), &o, cmd).await),
                Err(e) => report(&o, Err(Failure::Client(e))),
            }
        }),
        Command::Console => {
            rt.block_on(console::run(&cli.endpoint, &cli.tls.tls(), cli.api_key, cli.namespace, o))
        }
    }
}
