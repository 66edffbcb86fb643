//! `kairosctl console`: an interactive session. A line editor (rustyline: history, editing,
//! Tab completion of commands, subcommands, flags and the execution ids seen in this session),
//! lines split as a shell would (quotes, backslashes), each parsed by the same clap
//! definitions as the command line ([`ConsoleLine`]): `help` shows what a line may say, `quit`
//! (or Ctrl-D) leaves with exit code 0. Without a terminal it reads plain lines from stdin.
//! History is kept in `$KAIROS_CONSOLE_HISTORY`, else `~/.kairosctl_history` (terminal only).

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::{CommandFactory, Parser};
use rustyline::completion::Completer;
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::Validator;
use rustyline::{Config, Context, Editor, Helper};

use kairos_sdk::Client;

use crate::args::{Api, ConsoleCommand, ConsoleLine};
use crate::commands::{run as run_command, with_key};
use crate::output::{Failure, Opts, report};

/// Execution ids seen in this session's output, offered by Tab.
type Seen = Arc<Mutex<BTreeSet<String>>>;

/// Commands whose argument is an execution id.
const TAKES_ID: [&str; 4] = ["get", "cancel", "replay", "wait"];

/// The line editor's helper: completion only.
struct ConsoleHelper {
    command: clap::Command,
    seen: Seen,
}

impl ConsoleHelper {
    /// Candidates for the word ending at the cursor, after the words before it.
    fn candidates(&self, before: &[String], word: &str) -> Vec<String> {
        let mut cmd = &self.command;
        let mut positional = false;
        for w in before {
            if w.starts_with('-') {
                continue;
            }
            match cmd.find_subcommand(w) {
                Some(sub) if !positional => cmd = sub,
                _ => positional = true,
            }
        }
        let mut out: Vec<String> = if word.starts_with('-') {
            cmd.get_arguments()
                .filter_map(|a| a.get_long())
                .map(|l| format!("--{l}"))
                .chain(["--help".to_string()])
                .collect()
        } else if cmd.has_subcommands() && !positional {
            let mut names: Vec<String> = cmd
                .get_subcommands()
                .flat_map(|s| {
                    std::iter::once(s.get_name().to_string())
                        .chain(s.get_all_aliases().map(str::to_string))
                })
                .collect();
            if before.is_empty() {
                names.push("help".into());
            }
            names
        } else if TAKES_ID.contains(&cmd.get_name()) && !positional {
            self.seen.lock().map(|s| s.iter().cloned().collect()).unwrap_or_default()
        } else {
            Vec::new()
        };
        out.retain(|c| c.starts_with(word));
        out.sort();
        out.dedup();
        out
    }
}

impl Completer for ConsoleHelper {
    type Candidate = String;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<String>)> {
        let head = &line[..pos];
        let start = head.rfind(char::is_whitespace).map_or(0, |i| i + 1);
        let before: Vec<String> = head[..start].split_whitespace().map(str::to_string).collect();
        let mut found = self.candidates(&before, &head[start..]);
        for c in &mut found {
            c.push(' ');
        }
        Ok((start, found))
    }
}

impl Hinter for ConsoleHelper {
    type Hint = String;
}
impl Highlighter for ConsoleHelper {}
impl Validator for ConsoleHelper {}
impl Helper for ConsoleHelper {}

/// Remembers the execution ids (26-character ULIDs) in a command's output.
fn remember_ids(seen: &Seen, out: &str) {
    let Ok(mut seen) = seen.lock() else { return };
    for w in out.split(|c: char| !c.is_ascii_alphanumeric()) {
        if w.len() == 26 && w.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()) {
            seen.insert(w.to_string());
        }
    }
}

fn history_file() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KAIROS_CONSOLE_HISTORY") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kairosctl_history"))
}

/// What one line asks for.
enum Step {
    /// Nothing (an empty line, help printed, a usage error reported).
    Nothing,
    Quit,
    /// Show (`None`) or switch the session's namespace.
    Namespace(Option<String>),
    Run(Opts, Api),
}

/// Parses one line (`session_json`: the session's `--json`).
fn parse_line(line: &str, session_json: bool) -> Step {
    let o = Opts { json: session_json };
    let Some(words) = shlex::split(line) else {
        report(&o, Err(Failure::Usage("unbalanced quotes".into())));
        return Step::Nothing;
    };
    if words.is_empty() {
        return Step::Nothing;
    }
    let json = session_json || words.iter().any(|w| w == "--json");
    match ConsoleLine::try_parse_from(&words) {
        Ok(ConsoleLine { command: ConsoleCommand::Quit, .. }) => Step::Quit,
        Ok(ConsoleLine { command: ConsoleCommand::Namespace { name }, .. }) => {
            Step::Namespace(name)
        }
        Ok(ConsoleLine { json: line_json, command: ConsoleCommand::Api(cmd) }) => {
            Step::Run(Opts { json: session_json || line_json }, cmd)
        }
        Err(e) => {
            use clap::error::ErrorKind;
            match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                    if !json || e.kind() == ErrorKind::DisplayHelp =>
                {
                    let _ = crate::output::write_stdout(e.render().to_string().as_bytes());
                }
                _ => {
                    let text = e.render().to_string();
                    let text = text.trim_start_matches("error: ").to_string();
                    report(&Opts { json }, Err(Failure::Usage(text)));
                }
            }
            Step::Nothing
        }
    }
}

/// Runs the console against `endpoint`; returns the exit code (0 after `quit` or end of input).
/// It connects at the first command that needs the node (and again after a failed attempt):
/// `help` works with the node down, and an unreachable node is reported, not fatal.
pub(crate) async fn run(
    endpoint: &str,
    tls: &kairos_sdk::Tls,
    api_key: Option<String>,
    mut namespace: String,
    o: Opts,
) -> i32 {
    let mut client: Option<Client> = None;
    let config = Config::builder().auto_add_history(true).max_history_size(1_000);
    let mut rl: Editor<ConsoleHelper, DefaultHistory> =
        match config.map(|c| c.build()).and_then(Editor::with_config) {
            Ok(rl) => rl,
            Err(e) => return report(&o, Err(Failure::Other(format!("the line editor: {e}")))),
        };
    let seen = Seen::default();
    rl.set_helper(Some(ConsoleHelper { command: ConsoleLine::command(), seen: seen.clone() }));
    let terminal = std::io::stdin().is_terminal();
    let history = history_file().filter(|_| terminal);
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    if terminal {
        println!("kairosctl console on {endpoint}: `help` lists the commands, `quit` leaves");
    }
    loop {
        match rl.readline("kairos> ") {
            Ok(line) => match parse_line(&line, o.json) {
                Step::Nothing => {}
                Step::Quit => break,
                Step::Namespace(None) => println!("namespace {namespace}"),
                Step::Namespace(Some(ns)) => {
                    client = client.take().map(|c| c.with_namespace(ns.clone()));
                    println!("namespace {ns} (was {namespace})");
                    namespace = ns;
                }
                Step::Run(lo, cmd) => {
                    if client.is_none() {
                        let connected = Client::connect_tls(endpoint, tls)
                            .await
                            .and_then(|c| with_key(c, api_key.as_deref()));
                        match connected {
                            Ok(c) => client = Some(c.with_namespace(namespace.clone())),
                            Err(e) => {
                                report(&lo, Err(Failure::Client(e)));
                                continue;
                            }
                        }
                    }
                    let Some(c) = &client else { continue };
                    let r = run_command(c, &lo, cmd).await;
                    if let Ok(out) = &r {
                        remember_ids(&seen, out);
                    }
                    report(&lo, r);
                }
            },
            Err(ReadlineError::Interrupted) => {}
            Err(ReadlineError::Eof) => break,
            Err(e) => return report(&o, Err(Failure::Other(format!("reading a line: {e}")))),
        }
    }
    if let Some(h) = &history {
        let _ = rl.save_history(h);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn helper() -> ConsoleHelper {
        let seen = Seen::default();
        remember_ids(&seen, "01KBK0ZQ3J4T0Y6B1MS4R8DXVW SCHEDULED created");
        ConsoleHelper { command: ConsoleLine::command(), seen }
    }

    fn complete(line: &str) -> Vec<String> {
        let h = helper();
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        let (before, word) = if line.is_empty() || line.ends_with(' ') {
            (&words[..], "")
        } else {
            (&words[..words.len() - 1], words[words.len() - 1].as_str())
        };
        h.candidates(before, word)
    }

    #[test]
    fn tab_completes_commands_flags_and_ids() {
        assert_eq!(complete("su"), ["submit"]);
        assert!(complete("").contains(&"quit".to_string()));
        assert!(complete("").contains(&"help".to_string()));
        assert_eq!(complete("cron pa"), ["pause"]);
        assert!(complete("submit x 1 --a").contains(&"--after".to_string()));
        assert_eq!(complete("get "), ["01KBK0ZQ3J4T0Y6B1MS4R8DXVW"]);
        assert_eq!(complete("get 01K"), ["01KBK0ZQ3J4T0Y6B1MS4R8DXVW"]);
        assert!(complete("get X ").is_empty());
    }

    #[test]
    fn lines_are_split_like_a_shell() {
        match parse_line(r#"submit registry://jobs/echo 1 --inputs '{"name": "a b"}'"#, false) {
            Step::Run(_, Api::Submit(s)) => {
                assert_eq!(s.inputs, Some(serde_json::json!({"name": "a b"})));
            }
            _ => panic!("not a submit"),
        }
        assert!(matches!(parse_line("quit", false), Step::Quit));
        assert!(matches!(parse_line("exit", false), Step::Quit));
        assert!(matches!(parse_line("namespace", false), Step::Namespace(None)));
        assert!(
            matches!(parse_line("ns team-a", false), Step::Namespace(Some(n)) if n == "team-a")
        );
        assert!(matches!(parse_line("   ", false), Step::Nothing));
        assert!(matches!(parse_line("get 'unbalanced", false), Step::Nothing));
        assert!(matches!(parse_line("bench s1", false), Step::Nothing), "not a console command");
    }
}
