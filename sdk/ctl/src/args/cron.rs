//! `kairosctl cron …`: the schedule commands and their policies.

use clap::{Args, Subcommand};

use super::values::{cursor, json_text, page_limit, rfc3339, rfc3339_or_empty, seconds_ms};

/// The policies of a schedule (create), each also settable by `cron update`.
#[derive(Debug, Args, Default)]
pub struct Policies {
    /// What a daily time inside a DST gap does.
    #[arg(long, value_parser = ["skip", "shift-to-gap-end", "shift-by-gap"])]
    pub dst_gap: Option<String>,
    /// What a time repeated by a DST fold does.
    #[arg(long, value_parser = ["first", "second", "both"])]
    pub dst_fold: Option<String>,
    /// Occurrences missed while down.
    #[arg(long, value_parser = ["skip", "latest", "all"])]
    pub missed: Option<String>,
    /// How far back missed occurrences are made up.
    #[arg(long, value_name = "SECONDS", value_parser = seconds_ms)]
    pub catch_up_window: Option<i64>,
    /// When an occurrence falls due while the previous run is still going.
    #[arg(long, value_parser = ["allow", "skip", "buffer-one", "buffer-all", "cancel-previous"])]
    pub overlap: Option<String>,
    /// Random delay of each run, up to this many seconds (at most 3600).
    #[arg(long, value_name = "SECONDS", value_parser = jitter_seconds)]
    pub jitter: Option<i64>,
    /// The inputs of every run, a JSON object (`{{occurrence}}` placeholders).
    #[arg(long, value_name = "JSON", value_parser = json_text)]
    pub inputs: Option<String>,
    /// Not before this time ("" for no start).
    #[arg(long, value_name = "RFC3339", value_parser = rfc3339_or_empty)]
    pub start: Option<i64>,
    /// Not after this time ("" for no end).
    #[arg(long, value_name = "RFC3339", value_parser = rfc3339_or_empty)]
    pub end: Option<i64>,
    /// Only this many runs.
    #[arg(long, value_name = "N")]
    pub runs: Option<u32>,
    /// Free text.
    #[arg(long, value_name = "TEXT")]
    pub notes: Option<String>,
}

/// `cron …`.
#[derive(Debug, Subcommand)]
pub enum Cron {
    /// Creates a schedule.
    Create(CronCreate),
    /// Changes a schedule; only the flags given change.
    Update(CronUpdate),
    /// A schedule.
    Get {
        /// The schedule's id.
        id: String,
    },
    /// The schedules, a page at a time.
    List {
        /// At most this many in the page (1 to 1000).
        #[arg(long, value_name = "N", default_value_t = 100, value_parser = page_limit)]
        limit: u32,
        /// The page after the one that printed this cursor.
        #[arg(long, value_name = "CURSOR")]
        cursor: Option<String>,
    },
    /// Deletes a schedule (its executions stay).
    Delete {
        /// The schedule's id.
        id: String,
    },
    /// Pauses a schedule.
    Pause {
        /// The schedule's id.
        id: String,
    },
    /// Resumes a paused schedule.
    Resume {
        /// The schedule's id.
        id: String,
        /// Make up the occurrences missed while paused (per its missed policy).
        #[arg(long)]
        catch_up: bool,
    },
    /// When an expression fires (no stored schedule needed).
    Preview {
        /// The cron expression, quoted.
        expression: String,
        /// The IANA time zone.
        #[arg(long, value_name = "ZONE", default_value = "UTC")]
        tz: String,
        /// From this time (default now).
        #[arg(long, value_name = "RFC3339", value_parser = rfc3339)]
        from: Option<i64>,
        /// Until this time.
        #[arg(long, value_name = "RFC3339", value_parser = rfc3339)]
        until: Option<i64>,
        /// What a time inside a DST gap does.
        #[arg(long, value_parser = ["skip", "shift-to-gap-end", "shift-by-gap"])]
        dst_gap: Option<String>,
        /// What a time repeated by a DST fold does.
        #[arg(long, value_parser = ["first", "second", "both"])]
        dst_fold: Option<String>,
        /// At most this many occurrences.
        #[arg(long, value_name = "N", default_value_t = 0)]
        limit: u32,
    },
    /// Queues the occurrences of a past interval; what runs of them follows the overlap policy
    /// (the schedule's, or --overlap): see docs/cron.md "Backfill".
    Backfill {
        /// The schedule's id.
        id: String,
        /// From this time.
        #[arg(long, value_name = "RFC3339", value_parser = rfc3339)]
        from: i64,
        /// Until this time.
        #[arg(long, value_name = "RFC3339", value_parser = rfc3339)]
        until: i64,
        /// The overlap policy for these runs.
        #[arg(long, value_parser = ["allow", "skip", "buffer-one", "buffer-all", "cancel-previous"])]
        overlap: Option<String>,
        /// How long to wait for the schedule to take them up before saying what was made
        /// (0: say only what was queued).
        #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = super::values::seconds)]
        wait: std::time::Duration,
    },
    /// Runs a schedule now, outside its timetable (as `kubectl create job --from=cronjob/…`):
    /// one occurrence at this instant, with the schedule's definition and inputs, under its
    /// overlap policy (or --overlap). Its next runs stay as they were.
    Trigger {
        /// The schedule's id.
        id: String,
        /// The overlap policy for this run (`allow`: run even if the previous is still going).
        #[arg(long, value_parser = ["allow", "skip", "buffer-one", "buffer-all", "cancel-previous"])]
        overlap: Option<String>,
        /// How long to wait for its execution before printing (0: print the occurrence only).
        #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = super::values::seconds)]
        wait: std::time::Duration,
    },
    /// A schedule's executions, oldest occurrence first, with the occurrence each one is for.
    Runs {
        /// The schedule's id.
        id: String,
        /// At most this many in the page (1 to 1000).
        #[arg(long, value_name = "N", default_value_t = 100, value_parser = page_limit)]
        limit: u32,
        /// The page after the one that printed this cursor.
        #[arg(long, value_name = "CURSOR", value_parser = cursor)]
        cursor: Option<super::values::Cursor>,
    },
}

/// `--jitter` seconds → ms, at most an hour (the node's bound on `jitterMs`).
fn jitter_seconds(v: &str) -> Result<i64, String> {
    match seconds_ms(v)? {
        ms if ms <= 3_600_000 => Ok(ms),
        _ => Err("at most 3600 seconds (an hour)".into()),
    }
}

// The flags of `cron create` (the variant's doc comment is its help).
#[derive(Debug, Args)]
pub struct CronCreate {
    /// registry://jobs/NAME
    pub definition_uri: String,
    /// The definition's version.
    pub version: u32,
    /// The cron expression (5 or 6 fields, or @daily…), quoted.
    pub expression: String,
    /// The IANA time zone.
    #[arg(long, value_name = "ZONE", default_value = "UTC")]
    pub tz: String,
    /// The schedule's id (made up when not given).
    #[arg(long, default_value = "")]
    pub id: String,
    /// Pause the schedule when a run fails.
    #[arg(long)]
    pub pause_on_failure: bool,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
    #[command(flatten)]
    pub policies: Policies,
}

// The flags of `cron update` (the variant's doc comment is its help).
#[derive(Debug, Args)]
pub struct CronUpdate {
    /// The schedule's id.
    pub id: String,
    /// A new expression.
    #[arg(long, value_name = "EXPR")]
    pub expression: Option<String>,
    /// A new time zone.
    #[arg(long, value_name = "ZONE")]
    pub tz: Option<String>,
    /// Another definition.
    #[arg(long, value_name = "URI")]
    pub definition: Option<String>,
    /// Another definition version.
    #[arg(long, value_name = "N")]
    pub version: Option<u32>,
    /// Pause the schedule when a run fails.
    #[arg(long, value_name = "BOOL")]
    pub pause_on_failure: Option<bool>,
    #[command(flatten)]
    pub policies: Policies,
}
