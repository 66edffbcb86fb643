//! The `kairosctl` command line, declared with clap: one-shot commands and, with the same
//! definitions, the lines of `kairosctl console`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand};
use serde_json::Value;

mod cron;
pub mod values;

pub use cron::{Cron, CronCreate, CronUpdate, Policies};
use values::{cursor, json_value, page_limit, rfc3339, seconds};

/// What the exit codes mean (shown under `--help`).
pub const EXIT_CODES: &str = "Exit codes: 0 ok · 1 other error · 2 usage · 3 not found · \
4 conflict (already exists, wrong state, fenced) · 5 invalid argument · 6 unavailable or timed out · \
7 not allowed (no or bad API key, missing scope)";

/// The connection flags, which may also follow the command (`kairosctl list --namespace a`).
const CONNECTION_FLAGS: [&str; 7] = [
    "--endpoint",
    "--namespace",
    "--api-key",
    "--api-key-file",
    "--ca-cert",
    "--client-cert",
    "--client-key",
];

/// Moves the connection flags written after the command in front of it, where clap reads them
/// (`global` would hand their defaults to `bench`'s own `--endpoint`). `bench` keeps its own
/// flags; after `--` nothing moves.
pub fn hoist_connection_flags(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let flag_of = |a: &std::ffi::OsStr| {
        let a = a.to_str()?;
        CONNECTION_FLAGS.iter().find(|f| a == **f || a.starts_with(&format!("{f}="))).copied()
    };
    // The command: the first word that is neither a flag nor a connection flag's value.
    let mut i = 1;
    while i < args.len() {
        match flag_of(&args[i]) {
            Some(f) if args[i].len() == f.len() => i += 2,
            _ if args[i].to_str().is_some_and(|a| a.starts_with('-')) => i += 1,
            _ => break,
        }
    }
    if i >= args.len() || args[i] == "bench" {
        return args;
    }
    let (mut front, mut rest) = (args[..i].to_vec(), Vec::new());
    let mut tail = args[i..].iter().cloned();
    while let Some(a) = tail.next() {
        if a == "--" {
            rest.push(a);
            rest.extend(tail.by_ref());
            break;
        }
        match flag_of(&a) {
            Some(f) if a.len() == f.len() => {
                front.push(a);
                front.extend(tail.next());
            }
            Some(_) => front.push(a),
            None => rest.push(a),
        }
    }
    front.extend(rest);
    front
}

/// `kairosctl …`.
#[derive(Debug, Parser)]
#[command(
    name = "kairosctl",
    bin_name = "kairosctl",
    version,
    about = "The Kairos admin console: one-shot commands, or `console` for an interactive session.",
    after_help = EXIT_CODES,
    subcommand_required = true,
    arg_required_else_help = true
)]
pub struct Cli {
    /// The node's gRPC endpoint: http://host:port, https://host:port for TLS, or host:port
    /// (plain http://). Like every flag here, it may come before or after the command.
    #[arg(
        long,
        env = "KAIROS_ENDPOINT",
        hide_env_values = true,
        default_value = "http://127.0.0.1:7071",
        value_name = "URL"
    )]
    pub endpoint: String,
    #[command(flatten)]
    pub tls: kairos_sdk::TlsArgs,
    /// The namespace.
    #[arg(
        long,
        env = "KAIROS_NAMESPACE",
        hide_env_values = true,
        default_value = "default",
        value_name = "NS"
    )]
    pub namespace: String,
    /// The API key (`kai_…`) sent with every call (nodes run by `kairos serve` require one).
    /// Prefer KAIROS_API_KEY or --api-key-file: a flag's value is visible to other users in
    /// `ps`.
    #[arg(long, env = "KAIROS_API_KEY", hide_env_values = true, value_name = "KEY")]
    pub api_key: Option<String>,
    /// A file holding the API key (its first line), e.g. the node's DATA_DIR/admin-key.
    #[arg(
        long,
        env = "KAIROS_API_KEY_FILE",
        hide_env_values = true,
        value_name = "FILE",
        conflicts_with = "api_key"
    )]
    pub api_key_file: Option<std::path::PathBuf>,
    /// JSON output, for scripts: results on stdout, errors (usage errors too) on stderr as
    /// {"error": {"code", "message", "exitCode"}}.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// The commands of the command line.
#[derive(Debug, Subcommand)]
pub enum Command {
    #[command(flatten)]
    Api(Api),
    Bench(Box<crate::bench::args::Bench>),
    /// An interactive session: one command per line, with history, editing and completion.
    Console,
    /// Prints a shell completion script, e.g. `kairosctl completions bash > /etc/bash_completion.d/kairosctl`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Writes the manual pages (kairosctl.1 and one per subcommand) into DIR, e.g.
    /// `kairosctl man --out /usr/share/man/man1`.
    Man {
        /// The directory of the pages (created if missing).
        #[arg(long, value_name = "DIR")]
        out: std::path::PathBuf,
    },
}

/// A line of `kairosctl console`.
#[derive(Debug, Parser)]
#[command(
    name = "",
    no_binary_name = true,
    disable_version_flag = true,
    subcommand_required = true,
    arg_required_else_help = true,
    help_template = "Commands (one per line; `help COMMAND` for its flags):\n{subcommands}\n\n{options}\n\n{after-help}",
    after_help = "Quote arguments with spaces as in a shell: submit registry://jobs/echo 1 --inputs '{\"name\": \"a b\"}'.\nUp/Down: history · Tab: completes commands and execution ids seen in this session · Ctrl-D or `quit`: leave."
)]
pub struct ConsoleLine {
    /// JSON output for this command.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: ConsoleCommand,
}

/// What a console line may ask.
#[derive(Debug, Subcommand)]
pub enum ConsoleCommand {
    #[command(flatten)]
    Api(Api),
    /// Shows the session's namespace, or switches the following commands to another.
    #[command(alias = "ns")]
    Namespace {
        /// The namespace to switch to.
        name: Option<String>,
    },
    /// Leaves the console.
    #[command(alias = "exit")]
    Quit,
}

/// The commands that talk to a node.
#[derive(Debug, Subcommand)]
pub enum Api {
    /// Submits an execution (due now unless --at or --after).
    Submit(Submit),
    /// An execution and its attempts, by id or by idempotency key.
    #[command(group(ArgGroup::new("which").required(true).args(["execution_id", "key"])))]
    Get {
        /// The execution id.
        execution_id: Option<String>,
        /// Look it up by the idempotency key it was submitted with.
        #[arg(long, value_name = "IDEMPOTENCY_KEY")]
        key: Option<String>,
    },
    /// Cancels an execution (a running one is asked to stop).
    Cancel {
        /// The execution id.
        execution_id: String,
    },
    /// Runs a FAILED execution again, as its next attempt with a fresh retry budget (only
    /// FAILED ones: a SUCCEEDED or CANCELLED execution is final).
    Replay {
        /// The execution id.
        execution_id: String,
    },
    /// Waits until an execution ends.
    Wait {
        /// The execution id.
        execution_id: String,
        /// Give up after this many seconds.
        #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = seconds)]
        timeout: Duration,
    },
    /// Lists executions, a page at a time (by execute-at, then id).
    List {
        /// Only executions in this status.
        #[arg(long, value_parser = STATUSES, ignore_case = true)]
        status: Option<String>,
        /// Only executions of this definition (registry://jobs/NAME, or its name).
        #[arg(long, value_name = "URI", default_value = "")]
        definition: String,
        /// At most this many in the page (1 to 1000).
        #[arg(long, value_name = "N", default_value_t = 100, value_parser = page_limit)]
        limit: u32,
        /// The page after the one that printed this cursor.
        #[arg(long, value_name = "CURSOR", value_parser = cursor)]
        cursor: Option<values::Cursor>,
    },
    /// Job definitions: apply, get, list.
    #[command(subcommand)]
    Definitions(Definitions),
    /// Durable schedules (docs/cron.md).
    #[command(subcommand)]
    Cron(Box<Cron>),
    /// The cluster's live nodes.
    Nodes,
    /// Shard leases.
    Shards {
        /// The shard space.
        #[arg(long, default_value = "executions", value_parser = ["executions", "cron"])]
        space: String,
    },
    /// Executions per status.
    Stats {
        /// Over every namespace.
        #[arg(long)]
        all: bool,
    },
    /// Records put aside as unprocessable.
    Quarantined {
        /// At most this many (1 to 1000).
        #[arg(long, value_name = "N", default_value_t = 100, value_parser = page_limit)]
        limit: u32,
    },
    /// API keys: create, list, revoke (scope `admin`).
    #[command(subcommand)]
    Keys(Keys),
    /// The namespace's audit log: definition registrations, key changes, cancels, replays.
    Audit {
        /// From this time on.
        #[arg(long, value_name = "RFC3339", value_parser = rfc3339)]
        from: Option<i64>,
        /// At most this many (1 to 1000).
        #[arg(long, value_name = "N", default_value_t = 100, value_parser = page_limit)]
        limit: u32,
        /// The log of changes to keys of every namespace (`*`) instead.
        #[arg(long)]
        all_namespaces: bool,
    },
    /// Who the node takes this API key for.
    Whoami,
    /// The namespace's quotas and retention, and its executions not yet finished.
    Limits,
    /// Per queue: READY executions, the oldest one's age, worker streams on the node and their
    /// free credits.
    Queues {
        /// Over every namespace (a key of `*`).
        #[arg(long)]
        all: bool,
    },
}

/// `keys …`.
#[derive(Debug, Subcommand)]
pub enum Keys {
    /// Creates a key and prints its token (shown once: store it now).
    Create {
        /// The namespace the key acts in; `*` for every namespace.
        #[arg(long = "for", value_name = "NS")]
        for_namespace: String,
        /// A scope (repeat or comma-separate): submit, read, worker, definitions, admin.
        #[arg(long = "scope", value_name = "SCOPE", required = true, value_delimiter = ',',
              value_parser = ["submit", "read", "worker", "definitions", "admin"])]
        scopes: Vec<String>,
        /// A label: who or what uses the key.
        #[arg(long, default_value = "")]
        name: String,
    },
    /// Lists keys (revoked ones too).
    List {
        /// Only keys of this namespace (`*`: keys of every namespace).
        #[arg(long = "for", value_name = "NS")]
        for_namespace: Option<String>,
    },
    /// Revokes a key, for good.
    Revoke {
        /// The key's id (the part after `kai_`, before the next `_`).
        id: String,
    },
}

/// The statuses `list --status` takes.
pub const STATUSES: [&str; 7] =
    ["scheduled", "ready", "running", "retry_wait", "succeeded", "failed", "cancelled"];

/// `submit`.
#[derive(Debug, Args)]
pub struct Submit {
    /// registry://jobs/NAME
    pub definition_uri: String,
    /// The definition's version.
    pub version: u32,
    /// The inputs, a JSON object.
    #[arg(long, value_name = "JSON", value_parser = json_value)]
    pub inputs: Option<Value>,
    /// Run at this time.
    #[arg(long, value_name = "RFC3339", value_parser = rfc3339, conflicts_with = "after")]
    pub at: Option<i64>,
    /// Run this many seconds after the node receives the request (counted by the node's clock,
    /// so a retry with the same --key is the same request).
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    pub after: Option<Duration>,
    /// The idempotency key: the same key with the same request gives the same execution.
    #[arg(long)]
    pub key: Option<String>,
}

/// `definitions …`.
#[derive(Debug, Subcommand)]
pub enum Definitions {
    /// Registers a definition from a YAML file (unchanged if already registered).
    Apply {
        /// The definition file.
        file: PathBuf,
    },
    /// A definition (its latest version unless --version).
    Get {
        /// The definition: registry://jobs/NAME, or its name.
        #[arg(value_name = "URI")]
        name: String,
        /// This version.
        #[arg(long, value_name = "N")]
        version: Option<u32>,
    },
    /// Every definition.
    List,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_definitions_are_consistent() {
        Cli::command().debug_assert();
        ConsoleLine::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("kairosctl").chain(args.iter().copied()))
    }

    #[test]
    fn usage_errors_are_refused() {
        use clap::error::ErrorKind;
        let kind = |a: &[&str]| parse(a).map(|_| ()).unwrap_err().kind();
        assert_eq!(
            kind(&["submit", "registry://jobs/x", "1", "--affter", "3600"]),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            kind(&[
                "submit",
                "registry://jobs/x",
                "1",
                "--at",
                "2026-01-01T00:00:00Z",
                "--after",
                "1"
            ]),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(kind(&["get", "a", "extra"]), ErrorKind::UnknownArgument);
        assert_eq!(kind(&["get"]), ErrorKind::MissingRequiredArgument);
        assert_eq!(kind(&["submit", "registry://jobs/x", "one"]), ErrorKind::ValueValidation);
        assert_eq!(kind(&["list", "--status", "sleeping"]), ErrorKind::InvalidValue);
        assert_eq!(kind(&["submit", "u", "1", "--after=-1"]), ErrorKind::ValueValidation);
        let jitter = ["cron", "create", "registry://jobs/x", "1", "* * * * *", "--jitter", "3601"];
        let e = parse(&jitter).map(|_| ()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueValidation);
        let text = e.to_string();
        assert!(text.contains("3600 seconds") && !text.contains("jitterMs"), "{text}");
        assert_eq!(kind(&["--help"]), ErrorKind::DisplayHelp);
        assert_eq!(kind(&["--version"]), ErrorKind::DisplayVersion);
    }

    #[test]
    fn a_cursor_is_one_value() {
        let c = parse(&["list", "--cursor", "00ab"]).unwrap();
        assert!(
            matches!(c.command, Command::Api(Api::List { cursor: Some(c), .. }) if c == [0, 0xab])
        );
        let c = parse(&["cron", "runs", "x", "--cursor", "01"]).unwrap();
        match c.command {
            Command::Api(Api::Cron(cron)) => {
                assert!(matches!(*cron, Cron::Runs { cursor: Some(c), .. } if c == [1]))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_global_flags_may_follow_the_command() {
        let parse = |args: &[&str]| {
            let args = std::iter::once("kairosctl").chain(args.iter().copied()).map(Into::into);
            Cli::try_parse_from(hoist_connection_flags(args.collect()))
        };
        let c = parse(&[
            "list",
            "--endpoint",
            "h:1",
            "--namespace",
            "team-a",
            "--api-key",
            "kai_x",
            "--limit",
            "5",
        ])
        .unwrap();
        assert_eq!((c.endpoint.as_str(), c.namespace.as_str()), ("h:1", "team-a"));
        assert_eq!(c.api_key.as_deref(), Some("kai_x"));
        let c = parse(&["cron", "get", "x", "--namespace", "team-b"]).unwrap();
        assert_eq!(c.namespace, "team-b");
        let c = parse(&["--json", "get", "X", "--api-key=kai_y", "--", "--namespace"]);
        assert!(c.is_err(), "after -- nothing moves: --namespace is an argument of get");
        let c = parse(&["get", "X", "--api-key=kai_y", "--ca-cert", "ca.pem"]).unwrap();
        assert_eq!(c.api_key.as_deref(), Some("kai_y"));
        assert!(c.tls.ca_cert.is_some());
        // `bench` has flags of its own: its --endpoint is its own, and the top-level one keeps
        // its default (bench then spawns its own node).
        let c = parse(&["bench", "s1", "--quick"]).unwrap();
        match c.command {
            Command::Bench(b) => match b.command {
                crate::bench::args::Command::S1(a) => assert_eq!(a.endpoint, None),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
        let c = parse(&["bench", "worker", "--endpoint", "http://w:1", "--slots", "2"]).unwrap();
        match c.command {
            Command::Bench(b) => match b.command {
                crate::bench::args::Command::Worker(w) => assert_eq!(w.endpoint, "http://w:1"),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn documented_invocations_parse() {
        for a in [
            &["--json", "get", "X"][..],
            &["get", "X", "--json"],
            &["get", "--key", "K"],
            &["--endpoint", "http://h:1", "--namespace", "n", "list", "--status", "FAILED"],
            &[
                "cron",
                "create",
                "registry://jobs/echo",
                "1",
                "* * * * * *",
                "--id",
                "tick",
                "--missed",
                "all",
                "--catch-up-window",
                "3600",
                "--overlap",
                "allow",
                "--inputs",
                r#"{"name": "{{occurrence}}"}"#,
            ],
            &["cron", "update", "x", "--pause-on-failure", "true", "--runs", "0", "--start", ""],
            &["bench", "s2", "--quick", "--endpoint", "http://x:1"],
            &["bench", "s2", "--quick", "--count=300", "--kairos", "k"],
            &["completions", "bash"],
            // README's quick start and docs/cron.md.
            &["definitions", "apply", "echo.yaml"],
            &["wait", "01KBK0ZQ3J4T0Y6B1MS4R8DXVW"],
            &["cron", "runs", "every-10s"],
            &[
                "cron",
                "preview",
                "30 2 * * *",
                "--tz",
                "America/New_York",
                "--from",
                "2026-03-07T00:00:00Z",
                "--until",
                "2026-03-10T00:00:00Z",
                "--dst-gap",
                "shift-by-gap",
            ],
            &["cron", "update", "nightly-report", "--expression", "30 2 * * *"],
            &["cron", "resume", "nightly-report", "--catch-up"],
            &[
                "cron",
                "backfill",
                "nightly-report",
                "--from",
                "2026-08-01T00:00:00Z",
                "--until",
                "2026-08-08T00:00:00Z",
            ],
            &["cron", "delete", "nightly-report"],
            &["shards", "--space", "cron"],
            &["quarantined"],
            &["stats", "--all"],
        ] {
            if let Err(e) = parse(a) {
                panic!("{a:?}: {e}");
            }
        }
    }
}
