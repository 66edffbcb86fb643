//! Bounds of the node — queues, caches, batches in flight, request sizes, pauses — named in
//! one place (unit and qualifier last). The layer's bounds are in `kairos_layer::limits`, the
//! store's in `kairos_layer::kv::limits`.

// The runtime.
/// Most executions one queue's dispatch buffer holds.
pub const DISPATCH_BUFFER_MAX: usize = 2_048;
/// How many executions a queue's dispatch buffer aims to hold per slot of its streams: a
/// result's credit is answered from the buffer while a refill (a claim and its commit) is under
/// way. One per slot left slots idle behind every refill (S2 100k: +15–25 % with 2, about +50 %
/// with 4). A node SIGKILLed holding a buffer gets its executions back at its restart
/// ([`ORPHAN_RELEASE_AFTER_MS`]); before that was built they waited for their lease (S5: last
/// start 31 s after due instead of 4 s) and this was 2. docs/benchmarks.md.
pub const DISPATCH_BUFFER_PER_SLOT: usize = 4;
/// How long after its start a node releases the attempts its previous run claimed and never
/// handed over (a SIGKILLed node's dispatch buffers; `Scheduler::release_orphaned_claims`), and
/// how long past `node_ttl_ms` the live nodes wait before releasing a dead node's: long enough
/// for the workers to reconnect (their back-off is at most 2 s) and be heard from — the SDK's
/// worker beats for every running task on reconnecting.
pub const ORPHAN_RELEASE_AFTER_MS: u64 = 5_000;
/// For how long, once a node is found dead (`node_ttl_ms` plus [`ORPHAN_RELEASE_AFTER_MS`]
/// after its last heartbeat), the live nodes still look for its unconfirmed claims: the claim
/// receipts naming them are kept 60 s.
pub const DEAD_NODE_CLAIMS_MS: i64 = 60_000;
/// Result (and heartbeat) transactions the batcher runs at once.
pub const BATCHES_IN_FLIGHT_MAX: usize = 4;
/// The most inputs one `SubmitBatch` call of a cron round carries (a round's occurrences are
/// split over calls of this size): inside the node's 4 MiB request limit.
pub const CRON_SUBMIT_CALL_BYTES_MAX: usize = 3 * 1024 * 1024;
/// Most ready-signal watches one node holds (a watched queue holds one per ready partition):
/// well inside FoundationDB's default client limit of 10,000. Queues past it are served by a
/// periodic claim instead ([`UNWATCHED_RECLAIM_MS`]).
pub const WATCHES_MAX: usize = 4_096;
/// How often a queue with waiting workers but no watch (past [`WATCHES_MAX`]) is claimed from.
pub const UNWATCHED_RECLAIM_MS: u64 = 500;
/// Cron rounds one cron shard owner runs at once.
pub const CRON_ROUNDS_IN_FLIGHT_MAX: usize = 16;

// The API.
/// Minutes the console's last-hour charts keep, one bucket each (`server::recent`).
pub const RECENT_MINUTES: usize = 60;
/// API keys the node caches at most (then the cache starts over).
pub const AUTH_CACHE_KEYS_MAX: usize = 10_000;
/// Definition versions the gRPC API caches at most (versions are immutable, so the cache is never stale).
pub const DEFINITION_CACHE_MAX: usize = 1_024;
/// Largest message the node sends a worker on a `Work` stream: the tasks it hands out are
/// chunked to it (a task alone may pass it). A quarter of gRPC's default 4 MiB decode limit, so
/// any client takes them, whatever their inputs.
pub const WORK_MESSAGE_BYTES_MAX: usize = 1024 * 1024;
/// Most tasks one `Poll` reply carries (asked for more, it hands out this many): 64 tasks with
/// 32 KiB inputs stay inside gRPC's default 4 MiB decode limit.
pub const POLL_TASKS_MAX: usize = 64;
/// Heartbeats, and results, one `Work` stream message or one `Report` call may carry: more is
/// refused with INVALID_ARGUMENT naming the field before any is applied, so one message cannot
/// hold the node's result batcher for long (100,000 heartbeats in one message took over 30 s).
/// The SDK's worker sends at most `kairos_sdk::limits::MESSAGE_ITEMS_MAX` (the same number).
pub const WORK_MESSAGE_ITEMS_MAX: usize = 1_000;
// One message's items fit one batch of the layer's (a unary `Report` is applied as one).
const _: () = assert!(WORK_MESSAGE_ITEMS_MAX <= kairos_layer::limits::REPORT_BATCH_MAX);
const _: () = assert!(WORK_MESSAGE_ITEMS_MAX <= kairos_layer::limits::HEARTBEAT_BATCH_MAX);
/// Result and heartbeat messages of one `Work` stream being applied at once: the stream's next
/// message is read only when one of them is done, so a worker cannot queue unbounded work on the
/// node (HTTP/2 flow control then holds it back).
pub const WORK_STREAM_IN_FLIGHT_MAX: usize = 8;
/// Largest HTTP request body accepted.
pub const HTTP_BODY_BYTES_MAX: usize = 256 * 1024;
/// Longest error message sent (whatever a client sent, its error stays small enough for any
/// client's metadata limits).
pub const ERROR_MESSAGE_BYTES_MAX: usize = 512;
/// Longest pause between retries of a failing fire or load of a shard owner.
pub const RETRY_PAUSE_MAX_MS: i64 = 10_000;

// Connections (issue 24; the settings' defaults are in `server::config`).
/// Descriptors kept for the store, the runtime and outgoing connections: the listeners share
/// the rest of `RLIMIT_NOFILE`, half each.
pub const DESCRIPTORS_RESERVED: u64 = 64;
/// Below this many descriptors the node warns at start-up (`LimitNOFILE`).
pub const DESCRIPTORS_WANTED: u64 = 4_096;
/// Keep-alive pings on a gRPC connection not answered within this close it.
pub const GRPC_KEEPALIVE_TIMEOUT_MS: u64 = 20_000;

// Settings.
/// The largest clock-skew bound a node accepts (`max_clock_skew_ms`): a quarter of the
/// shortest attempt lease (1 s), so a worker heartbeating at a third of its lease is never
/// timed out by a node whose clock runs ahead.
pub const CLOCK_SKEW_MAX_MS: u64 = kairos_layer::limits::LEASE_MS_MIN / 4;

// The web console (`api::console`).
/// Largest API reply the console reads (an execution's output is capped far below this).
pub const CONSOLE_API_REPLY_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Most executions one bulk cancel / replay takes: the first this many the search matches
/// (one API list page; the confirmation states it). Each is its own audited API call.
pub const CONSOLE_BULK_MAX: usize = 1_000;
/// Most rows of a schedule's last runs (runs and occurrences without one), and the
/// occurrences read to find those.
pub const CONSOLE_RUNS_MAX: usize = 20;
/// A run is marked late when its first attempt started (or it is still waiting) more than this
/// after it was due.
pub const CONSOLE_RUN_LATE_MS: i64 = 60_000;

// The HTTP API.
/// How long `/healthz` waits for the store's list of nodes and leases before answering with
/// this node's line alone (a probe must not hang on a database that is cut off).
pub const HEALTHZ_CLUSTER_WAIT_MS: u64 = 1_000;

// Metrics (label cardinality, docs/node.md#metrics).
/// Most `(namespace, queue)` pairs the per-queue gauges export, in `(namespace, queue)` order;
/// the rest are summed into one series labelled `namespace="_other", queue="_other"`.
pub const METRICS_QUEUES_MAX: usize = 200;
/// Most gRPC methods and HTTP routes the request metrics keep apart (each a route template,
/// never a raw path); calls of any other are counted as `_other` (a client may name any gRPC
/// method path, and unknown ones are answered `Unimplemented`).
pub const METRICS_ROUTES_MAX: usize = 128;
