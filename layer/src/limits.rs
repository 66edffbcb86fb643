//! Bounds of the scheduler's operations and of the cron computations, named in one place (unit
//! and qualifier last), related bounds checked against each other at compile time. The store's
//! own limits (FoundationDB's: key, value, transaction) are in [`crate::kv::limits`].

/// Largest input snapshot (JSON), in bytes.
pub const INPUT_BYTES_MAX: usize = 32 * 1024;
/// Largest inline output (JSON), in bytes.
pub const OUTPUT_BYTES_MAX: usize = 32 * 1024;
/// Longest error message kept, in bytes (longer ones are truncated, not rejected).
pub const ERROR_MESSAGE_BYTES_MAX: usize = 4 * 1024;
/// Longest idempotency key, in bytes.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 256;
/// Longest namespace, queue, worker id or node id, in bytes.
pub const NAME_BYTES_MAX: usize = 128;
/// Longest output reference (a URI), in bytes.
pub const OUTPUT_REFERENCE_BYTES_MAX: usize = 2 * 1024;
/// How far in the future `execute_at` may be: 10 years, in milliseconds.
pub const EXECUTE_AT_FUTURE_MAX_MS: i64 = 10 * 366 * 24 * 3600 * 1000;
/// How far in the past `execute_at` may be (it then runs at once): 1 day, in milliseconds.
pub const EXECUTE_AT_PAST_MAX_MS: i64 = 24 * 3600 * 1000;
/// Most executions one worker (one claim slot) gets from one claim: the API's `maxExecutions`.
pub const CLAIM_BATCH_MAX: usize = 256;
/// Ready entries a claim looks at to pick from (random pick among the head).
pub const CLAIM_SCAN_MAX: usize = 1024;
/// Most executions one claim takes over all its slots.
pub const CLAIM_EXECUTIONS_MAX: usize = CLAIM_SCAN_MAX;
/// Most timers one `fire_due` transaction processes.
pub const FIRE_BATCH_MAX: usize = 1_000;
/// Furthest ahead of its clock a pre-fire (`ops::prefire`) starts executions for waiting
/// workers.
pub const PREFIRE_AHEAD_MS_MAX: i64 = 1_000;
/// Longest a fire holds back a due execution for its node's busy workers (`ops::hold`): one
/// due longer ago is made READY, for any node's worker or poll to claim.
pub const HOLD_MS_MAX: i64 = 60_000;
/// Most buckets one `fire_due` walks past (empty ones) before returning.
pub const FIRE_BUCKETS_PER_CALL_MAX: i64 = 1_440;
/// Most bucket reads one `fire_due` issues at once (its waves grow from 1 to this).
pub const FIRE_BUCKET_READS_CONCURRENT_MAX: i64 = 64;
/// Most executions a list page returns.
pub const LIST_PAGE_MAX: usize = 1_000;
/// Shortest and longest attempt lease, in milliseconds.
pub const LEASE_MS_MIN: u64 = 1_000;
/// Longest attempt lease, in milliseconds.
pub const LEASE_MS_MAX: u64 = 3_600_000;
/// Most attempts a retry policy may allow.
pub const ATTEMPTS_MAX: u32 = 100;
/// Most attempts one read of an execution's attempts returns (`GET /executions/{id}` pages
/// them: an execution replayed many times has more).
pub const ATTEMPTS_PAGE_MAX: usize = 100;
/// Most shards a cluster may have.
pub const SHARD_COUNT_MAX: u32 = 65_536;

const _: () = assert!(CLAIM_BATCH_MAX <= CLAIM_EXECUTIONS_MAX);
const _: () = assert!(CLAIM_EXECUTIONS_MAX <= CLAIM_SCAN_MAX);
const _: () = assert!(LEASE_MS_MIN < LEASE_MS_MAX);
/// Room in an execution record for everything but input, output and error (ids, times, …).
const RECORD_FIXED_BYTES_MAX: usize = 8 * 1024;
// An execution record holds the input snapshot, the inline output and the last error.
const _: () = assert!(
    INPUT_BYTES_MAX
        + OUTPUT_BYTES_MAX
        + ERROR_MESSAGE_BYTES_MAX
        + OUTPUT_REFERENCE_BYTES_MAX
        + RECORD_FIXED_BYTES_MAX
        < crate::kv::limits::VALUE_BYTES_MAX
);

/// Longest cron expression, in bytes.
pub const CRON_EXPRESSION_BYTES_MAX: usize = 256;
/// Longest cron job notes, in bytes.
pub const CRON_NOTES_BYTES_MAX: usize = 4 * 1024;
/// Longest catch-up window for missed occurrences: 7 days, in milliseconds.
pub const CRON_CATCH_UP_WINDOW_MAX_MS: i64 = 7 * 24 * 3600 * 1000;
/// Largest jitter bound: 1 hour, in milliseconds.
pub const CRON_JITTER_MAX_MS: i64 = 3600 * 1000;
/// Longest lookahead (how early an occurrence is materialized): 1 hour, in milliseconds.
pub const CRON_LOOKAHEAD_MAX_MS: u64 = 3600 * 1000;
/// An occurrence counts as missed once its time is this far in the past when it is reached.
pub const CRON_MISSED_AFTER_MS: i64 = 1_000;
/// Most occurrences materialized by one round of one schedule (the rest follow at once).
pub const CRON_MATERIALIZE_PER_ROUND_MAX: usize = 200;
/// Most occurrences one round walks past (missed ones outside the window included).
pub const CRON_SCAN_PER_ROUND_MAX: usize = 100_000;
/// Most occurrences waiting for the previous execution (buffer-all) or queued by a backfill.
pub const CRON_QUEUE_MAX: usize = 1_000;
/// Most unfinished executions a schedule keeps track of (overlap, pause-on-failure).
pub const CRON_OUTSTANDING_MAX: usize = 64;
/// Most occurrences one backfill takes, and one preview returns.
pub const CRON_OCCURRENCES_PER_CALL_MAX: usize = 1_000;
/// How often a schedule waiting on an execution looks at it again, at first (milliseconds);
/// the interval grows with the wait, up to [`CRON_CHECK_INTERVAL_MAX_MS`].
pub const CRON_CHECK_INTERVAL_MIN_MS: i64 = 1_000;
/// The longest interval between two looks at an execution a schedule waits on (milliseconds).
pub const CRON_CHECK_INTERVAL_MAX_MS: i64 = 60_000;
/// When an owner retries a round whose submits did not go through (milliseconds).
pub const CRON_RECOVER_AFTER_MS: i64 = 10_000;
/// Most cron jobs a list page returns.
pub const CRON_LIST_PAGE_MAX: usize = 1_000;
/// Most cron timers one owner scan returns.
pub const CRON_TIMERS_PER_SCAN_MAX: usize = 1_000;

const _: () = assert!(CRON_MATERIALIZE_PER_ROUND_MAX <= CRON_QUEUE_MAX);
const _: () = assert!(CRON_CHECK_INTERVAL_MIN_MS < CRON_CHECK_INTERVAL_MAX_MS);
const _: () = assert!(CRON_CATCH_UP_WINDOW_MAX_MS < EXECUTE_AT_FUTURE_MAX_MS);

// Batches: items one call (one transaction) takes. Every batch is also bounded by bytes: it
// takes items while its transaction stays within the budget below, and leaves the rest for the
// next transaction (a batch that would be too large is split, never retried whole).
/// The most one transaction of a batch writes (mutations and conflict ranges, as
/// [`crate::kv::limits::TRANSACTION_BYTES_MAX`] counts them): half of FoundationDB's limit, so a
/// batch never meets `transaction_too_large` whatever its items hold.
pub const TRANSACTION_BUDGET_BYTES: usize = 5_000_000;
/// What one item of a batch writes besides its execution record and its result (keys, index
/// entries, a timer, an attempt record without its error, conflict ranges), at most.
pub const ITEM_OVERHEAD_BYTES: usize = 4 * 1024;
/// The most one item of a batch writes: an execution record at its largest, rewritten with
/// its result, plus the overhead. Any single item fits a transaction, far inside the budget.
pub const ITEM_BYTES_MAX: usize =
    crate::kv::limits::VALUE_BYTES_MAX + ERROR_BYTES_MAX + ITEM_OVERHEAD_BYTES;
/// Longest error code a worker reports, in bytes (refused beyond: a code is an identifier).
pub const ERROR_CODE_BYTES_MAX: usize = 256;
/// What an error (message and code) takes at most once kept.
pub const ERROR_BYTES_MAX: usize = ERROR_MESSAGE_BYTES_MAX + ERROR_CODE_BYTES_MAX;

const _: () = assert!(TRANSACTION_BUDGET_BYTES * 2 <= crate::kv::limits::TRANSACTION_BYTES_MAX);
const _: () = assert!(ITEM_BYTES_MAX * 8 < TRANSACTION_BUDGET_BYTES);
/// Most requests one `submit_batch` call takes.
pub const SUBMIT_BATCH_MAX: usize = 1_000;
/// Most results one `report_many` takes.
pub const REPORT_BATCH_MAX: usize = 1_000;
/// Most heartbeats one `heartbeat_many` takes.
pub const HEARTBEAT_BATCH_MAX: usize = 1_000;
/// Most executions one sweep transaction deletes.
pub const SWEEP_BATCH_MAX: usize = 500;

// Attempts, scans and pages.
/// Releases that do not count against the retry budget, per execution (after that a release
/// counts): bounds the re-runs of a task that kills its worker before the worker reports.
pub const RELEASES_UNCOUNTED_MAX: u32 = 10;
/// Most index entries one list page scans (a page with sparse matches comes back short, with
/// a cursor), so a page is one short transaction whatever the filters.
pub const LIST_SCAN_MAX: usize = 5_000;
/// The most `fair_scan_rows` may be.
pub const FAIR_SCAN_ROWS_MAX: usize = 20_000;
/// Most audit records one read returns.
pub const AUDIT_PAGE_MAX: usize = 1_000;
/// Longest key name.
pub const KEY_NAME_BYTES_MAX: usize = 128;
/// Longest detail kept in an audit record.
pub const AUDIT_DETAIL_BYTES_MAX: usize = 512;

// The cron expression and zone computations.
/// Days a `date±N` placeholder may move (about ten years).
pub const CRON_DATE_SHIFT_DAYS_MAX: i64 = 3_660;
/// Wall times examined at most for one `next_after` (a per-second schedule across a one-hour
/// fold looks at 3,600).
pub const CRON_WALL_TIMES_PER_CALL_MAX: usize = 200_000;
/// How far ahead an occurrence is searched: an expression matching nothing within this many
/// years (e.g. `0 0 30 2 *`) is rejected.
pub const CRON_SEARCH_YEARS_MAX: u32 = 11;

/// Most READY entries counted per queue: past it, a queue's depth is reported as this bound
/// with `ReadyQueue::depth_capped` set.
pub const READY_QUEUE_COUNT_MAX: usize = 10_000;

/// Most `(namespace, queue, partition)` heads one call visits; past it the answer is marked
/// `ReadyQueues::truncated` (queues beyond are not reported).
pub const READY_QUEUES_PARTITIONS_MAX: usize = 4_096;
