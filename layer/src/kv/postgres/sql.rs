//! The tables of the postgres backend, their creation and format check, and every statement
//! the backend runs (built once per schema).
//!
//! ```text
//! meta    (id = 1, format, version, gc_version)   one row: the commit lock and counter
//! kv      (key PRIMARY KEY, version, value)       latest version of each key; value NULL =
//!                                                 cleared at `version` (kept until GC)
//! history (key, version, value, until)            replaced versions: `value` was current
//!                                                 from `version` until `until` (exclusive)
//! ```
//! Keys and values are `bytea`, which compares bytewise (`memcmp`, then length) — the
//! unsigned lexicographic order of FoundationDB keys; collations do not apply to `bytea`.

use super::SCHEMA_FORMAT;
use crate::kv::error::{Error, Result};

/// The statements of one schema.
pub(crate) struct Sql {
    pub schema: String,
    /// The `LISTEN`/`NOTIFY` channel of the schema.
    pub channel: String,
    /// `$1` → (version, gc_version).
    pub read_version: String,
    /// `$1` keys, `$2` read versions (one each) → rows (ordinal from 1, gc_version, version,
    /// the key's row version (NULL: no row), value as of its read version), one per key.
    pub get_many: String,
    /// `$1` begin, `$2` end, `$3` read version, `$4` limit (NULL: none) → rows (key, value,
    /// version, gc_version): one header row with a NULL key carrying the meta columns, then the
    /// pairs (unordered: sort them).
    pub range_asc: String,
    pub range_desc: String,
    /// `$1` keys → (key, value) of those with a value now.
    pub current: String,
    /// The commit lock → (format, version, gc_version).
    pub lock: String,
    /// `$1` txn index[], `$2` begin[], `$3` end[], `$4` read version[] → indexes of
    /// transactions with a key in a read range written after their read version.
    pub conflicts: String,
    /// `$1` begin[], `$2` end[], `$3` keys the batch sets, `$4` version: clears the ranges.
    pub clear_ranges: String,
    /// `$1` key[], `$2` value[] (NULL: clear), `$3` version.
    pub put: String,
    /// `$1` version, `$2` channel, `$3` payload.
    pub publish: String,
    /// `$1` gc version.
    pub gc_mark: String,
    pub gc_history: String,
    pub gc_cleared: String,
}

impl Sql {
    pub(crate) fn new(schema: &str) -> Self {
        let s = schema;
        let as_of = |rv: &str| {
            format!(
                "CASE WHEN c.version <= {rv} THEN c.value ELSE (SELECT h.value FROM {s}.history h \
                 WHERE h.key = c.key AND h.version <= {rv} AND h.until > {rv}) END"
            )
        };
        let range = |dir: &str| {
            format!(
                "WITH m AS (SELECT version, gc_version FROM {s}.meta WHERE id = 1) \
                 SELECT NULL::bytea AS key, NULL::bytea AS value, m.version, m.gc_version FROM m \
                 UNION ALL \
                 (SELECT x.key, x.value, NULL::int8, NULL::int8 FROM \
                   (SELECT c.key, {} AS value FROM {s}.kv c \
                    WHERE c.key >= $1 AND c.key < $2 ORDER BY c.key {dir}) x \
                  WHERE x.value IS NOT NULL LIMIT $4)",
                as_of("$3")
            )
        };
        Sql {
            schema: s.to_string(),
            channel: format!("kairos_kv_{s}"),
            read_version: format!("SELECT version, gc_version FROM {s}.meta WHERE id = 1"),
            // LIMIT 1 (the key is unique) keeps the subquery a per-key index probe: the planner
            // cannot flatten it into a join that might scan all of `kv`.
            get_many: format!(
                "SELECT r.i, m.gc_version, m.version, x.version, x.value FROM {s}.meta m \
                 CROSS JOIN unnest($1::bytea[], $2::int8[]) WITH ORDINALITY AS r(k, rv, i) \
                 LEFT JOIN LATERAL (SELECT c.version, {} AS value FROM {s}.kv c \
                 WHERE c.key = r.k LIMIT 1) x ON true WHERE m.id = 1",
                as_of("r.rv")
            ),
            range_asc: range("ASC"),
            range_desc: range("DESC"),
            current: format!(
                "SELECT key, value FROM {s}.kv WHERE key = ANY($1) AND value IS NOT NULL"
            ),
            lock: format!(
                "SELECT format, version, gc_version FROM {s}.meta WHERE id = 1 FOR UPDATE"
            ),
            conflicts: format!(
                "SELECT DISTINCT r.i FROM unnest($1::int4[], $2::bytea[], $3::bytea[], $4::int8[]) \
                 AS r(i, b, e, rv) WHERE EXISTS (SELECT 1 FROM {s}.kv c \
                 WHERE c.key >= r.b AND c.key < r.e AND c.version > r.rv)"
            ),
            clear_ranges: clear_ranges(s),
            put: put(s),
            publish: format!(
                "WITH u AS (UPDATE {s}.meta SET version = $1 WHERE id = 1 RETURNING 1) \
                 SELECT pg_notify($2, $3) FROM u"
            ),
            gc_mark: format!(
                "UPDATE {s}.meta SET gc_version = GREATEST(gc_version, $1) WHERE id = 1"
            ),
            gc_history: format!(
                "DELETE FROM {s}.history WHERE ctid = ANY(ARRAY(SELECT ctid FROM {s}.history \
                 WHERE until <= $1 LIMIT 10000))"
            ),
            gc_cleared: format!(
                "DELETE FROM {s}.kv WHERE ctid = ANY(ARRAY(SELECT ctid FROM {s}.kv \
                 WHERE value IS NULL AND version <= $1 LIMIT 10000))"
            ),
        }
    }
}

/// Clears the ranges `$1`/`$2` (except the keys `$3` the same batch writes) at version `$4`,
/// moving the cleared values to `history`.
fn clear_ranges(s: &str) -> String {
    format!(
        "WITH r AS (SELECT * FROM unnest($1::bytea[], $2::bytea[]) AS r(b, e)), \
         p AS (SELECT unnest($3::bytea[]) AS key), \
         dead AS (SELECT DISTINCT c.key FROM {s}.kv c JOIN r ON c.key >= r.b AND c.key < r.e \
           WHERE c.value IS NOT NULL AND NOT EXISTS (SELECT 1 FROM p WHERE p.key = c.key)), \
         moved AS (INSERT INTO {s}.history (key, version, value, until) \
           SELECT c.key, c.version, c.value, $4 FROM {s}.kv c JOIN dead d ON d.key = c.key) \
         UPDATE {s}.kv c SET version = $4, value = NULL FROM dead d WHERE c.key = d.key"
    )
}

/// Writes the keys `$1` with values `$2` (NULL = cleared) at version `$3`, moving replaced
/// values to `history`. Each key's row is looked up once (`p`), for both.
fn put(s: &str) -> String {
    format!(
        "WITH p AS (SELECT n.key, n.value, c.version AS old_version, c.value AS old_value \
           FROM unnest($1::bytea[], $2::bytea[]) AS n(key, value) \
           LEFT JOIN {s}.kv c ON c.key = n.key), \
         moved AS (INSERT INTO {s}.history (key, version, value, until) \
           SELECT key, old_version, old_value, $3 FROM p WHERE old_value IS NOT NULL) \
         INSERT INTO {s}.kv (key, version, value) \
           SELECT key, $3, value FROM p WHERE value IS NOT NULL OR old_value IS NOT NULL \
         ON CONFLICT (key) DO UPDATE SET version = EXCLUDED.version, value = EXCLUDED.value"
    )
}

/// FNV-1a, 64 bits: a hash that is the same in every build (advisory lock ids, watch keys in
/// notifications).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Creates the schema's tables when absent (one node at a time, under an advisory lock) and
/// checks their format. Returns the latest commit version.
pub(crate) async fn ensure_schema(client: &mut tokio_postgres::Client, sql: &Sql) -> Result<u64> {
    let s = &sql.schema;
    let storage = |what: &str, e: tokio_postgres::Error| match e.as_db_error() {
        Some(db) => {
            Error::Storage(format!("PostgreSQL: cannot {what} schema {s}: {}", db.message()))
        }
        None => super::unavailable(&e),
    };
    let tx = client.transaction().await.map_err(|e| storage("open", e))?;
    let lock_id = fnv1a(format!("kairos_kv:{s}").as_bytes()) as i64;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_id])
        .await
        .map_err(|e| storage("lock", e))?;
    let exists: bool = tx
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&format!("{s}.meta")])
        .await
        .map_err(|e| storage("inspect", e))?
        .get(0);
    if !exists {
        let ddl = format!(
            "CREATE SCHEMA IF NOT EXISTS {s};
             CREATE TABLE {s}.meta (
               id int PRIMARY KEY CHECK (id = 1),
               format int NOT NULL,
               version bigint NOT NULL,
               gc_version bigint NOT NULL);
             CREATE TABLE {s}.kv (
               key bytea PRIMARY KEY,
               version bigint NOT NULL,
               value bytea);
             CREATE INDEX kv_cleared ON {s}.kv (version) WHERE value IS NULL;
             CREATE TABLE {s}.history (
               key bytea NOT NULL,
               version bigint NOT NULL,
               value bytea,
               until bigint NOT NULL,
               PRIMARY KEY (key, version));
             CREATE INDEX history_until ON {s}.history (until);
             INSERT INTO {s}.meta VALUES (1, {SCHEMA_FORMAT}, 0, 0);"
        );
        tx.batch_execute(&ddl).await.map_err(|e| storage("create", e))?;
    }
    let row = tx
        .query_opt(&format!("SELECT format, version FROM {s}.meta WHERE id = 1"), &[])
        .await
        .map_err(|e| storage("read", e))?
        .ok_or_else(|| Error::Storage(format!("schema {s}: table meta has no row")))?;
    let format: i32 = row.get(0);
    let version: i64 = row.get(1);
    if format != SCHEMA_FORMAT {
        return Err(Error::Storage(format!(
            "schema {s} holds a Kairos store of format {format}; this build reads format \
             {SCHEMA_FORMAT}"
        )));
    }
    tx.commit().await.map_err(|e| storage("commit", e))?;
    Ok(u64::try_from(version).unwrap_or(0))
}
