//! Reads: `get`, `attempts`, `list` (by status, definition or time range, paginated: the
//! status index for FAILED and CANCELLED, the time index for everything else).

use std::collections::BTreeMap;

use kairos_proto::storage::v1::{
    Attempt, Execution, ExecutionSpecName, ExecutionStatus, IdempotencyRecord, QuarantineRecord,
};

use super::Scheduler;
use super::error::{Error, Result, invalid};
use super::records::{
    decode, is_indexed, merge_spec, running_attempt, snapshot_execution, succeeded_attempt,
    with_spec,
};
use super::validate::{check_name, check_ref};
use crate::keys::Tag;
use crate::kv::limits::key_after;
use crate::kv::{KeyValue, RangeOption, Transaction};
use crate::limits::{ATTEMPTS_PAGE_MAX, LIST_PAGE_MAX, LIST_SCAN_MAX};

/// A page of an execution's attempts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AttemptsPage {
    /// First to last.
    pub attempts: Vec<Attempt>,
    /// The number of the last attempt on this page when there may be more (the cursor of the
    /// next page).
    pub next: Option<u32>,
}

/// A list query. Filters combine; the time range is on `execute_at`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListQuery {
    /// Namespace.
    pub namespace: String,
    /// Only this status.
    pub status: Option<ExecutionStatus>,
    /// Only this definition name.
    pub definition: Option<String>,
    /// `execute_at` at or after (ms).
    pub from_ms: Option<i64>,
    /// `execute_at` before (ms).
    pub to_ms: Option<i64>,
    /// Page size (1..=LIST_PAGE_MAX; 0 means 100).
    pub limit: usize,
    /// Where the previous page stopped (`ListPage::next_cursor`: opaque, sealed).
    pub cursor: Option<Vec<u8>>,
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListPage {
    /// Executions, ordered by `execute_at` then id.
    pub executions: Vec<Execution>,
    /// Pass back to get the next page (opaque: sealed against alteration and bound to the
    /// query); `None` at the end.
    pub next_cursor: Option<Vec<u8>>,
    /// What the page's range holds but could not be read (a damaged store): the ids whose
    /// record does not decode or is missing although indexed, and `index-entry:<hex key>` for
    /// an index entry that names no id. Skipped and reported here rather than failing every
    /// page that covers them — never left out silently.
    pub unreadable: Vec<String>,
}

impl Scheduler {
    /// Reads an execution.
    pub async fn get(&self, ns: &str, id: &str) -> Result<Execution> {
        check_ref(ns, id)?;
        let found = self
            .db
            .run(|tx| async move { snapshot_execution(&tx, &self.ks, ns, id).await })
            .await?;
        found.ok_or_else(|| Error::NotFound { what: "execution", id: id.to_string() })
    }

    /// Looks an execution up by the idempotency key it was submitted with (a client that lost
    /// the reply, or the cron service checking an occurrence).
    pub async fn get_by_idempotency_key(&self, ns: &str, key: &str) -> Result<Execution> {
        check_name("namespace", ns)?;
        super::validate::check_idempotency_key(key)?;
        let found = self
            .db
            .run(|tx| async move {
                let Some(v) = tx.snapshot_get(&self.ks.idempotency(ns, key)).await? else {
                    return Ok::<_, Error>(None);
                };
                let rec: IdempotencyRecord = decode("idempotency", &v)?;
                match snapshot_execution(&tx, &self.ks, ns, &rec.execution_id).await? {
                    Some(e) => Ok(Some(e)),
                    None => Err(Error::Corrupt(format!("idempotency key {key:?} dangles"))),
                }
            })
            .await?;
        found.ok_or_else(|| Error::NotFound { what: "idempotency key", id: key.to_string() })
    }

    /// The first page of an execution's attempts (see [`attempts_page`](Self::attempts_page)).
    pub async fn attempts(&self, ns: &str, id: &str) -> Result<Vec<Attempt>> {
        Ok(self.attempts_page(ns, id, None, ATTEMPTS_PAGE_MAX).await?.attempts)
    }

    /// The attempts of an execution numbered after `after`, first to last, at most `limit`
    /// (1 to [`ATTEMPTS_PAGE_MAX`]); the running (or succeeded) one last, on the last page.
    /// `next` is the cursor of the next page, if there is one.
    pub async fn attempts_page(
        &self,
        ns: &str,
        id: &str,
        after: Option<u32>,
        limit: usize,
    ) -> Result<AttemptsPage> {
        check_ref(ns, id)?;
        if limit == 0 || limit > ATTEMPTS_PAGE_MAX {
            return Err(invalid("limit", format!("must be 1 to {ATTEMPTS_PAGE_MAX}")));
        }
        let mut range = self.ks.attempts(ns, id).limit(limit);
        if let Some(a) = after {
            range.begin = key_after(&self.ks.attempt(ns, id, a));
        }
        let range = &range;
        self.db
            .run(|tx| async move {
                let (rows, e) = futures_util::future::try_join(
                    tx.get_range(range, true),
                    tx.snapshot_get(&self.ks.execution(ns, id)),
                )
                .await?;
                let mut out = rows
                    .iter()
                    .map(|kv| decode("attempt", &kv.value))
                    .collect::<Result<Vec<Attempt>>>()?;
                if out.len() == limit {
                    let next = out.last().map(|a| a.number);
                    return Ok(AttemptsPage { attempts: out, next });
                }
                if let Some(v) = e {
                    let e: Execution = decode("execution", &v)?;
                    let last = if e.status == ExecutionStatus::Running as i32 {
                        Some(running_attempt(&e))
                    } else if e.status == ExecutionStatus::Succeeded as i32 {
                        Some(succeeded_attempt(&e))
                    } else {
                        None
                    };
                    out.extend(last.filter(|a| after.is_none_or(|n| a.number > n)));
                }
                Ok(AttemptsPage { attempts: out, next: None })
            })
            .await
    }

    /// How many executions are in each status, over every namespace.
    pub async fn all_status_counts(&self) -> Result<Vec<(ExecutionStatus, i64)>> {
        let rows = self
            .db
            .run(|tx| async move {
                tx.get_range(&self.ks.subspace_range(Tag::StatusCount), true)
                    .await
                    .map_err(Error::from)
            })
            .await?;
        self.sum_counts(rows)
    }

    /// How many executions of `ns` are in each status (kept by atomic counters, so exact and
    /// cheap at any scale).
    pub async fn status_counts(&self, ns: &str) -> Result<Vec<(ExecutionStatus, i64)>> {
        let rows = self
            .db
            .run(|tx| async move {
                tx.get_range(&self.ks.status_counts(ns), true).await.map_err(Error::from)
            })
            .await?;
        self.sum_counts(rows)
    }

    /// Sums partitioned status counters by status.
    fn sum_counts(&self, rows: Vec<crate::kv::KeyValue>) -> Result<Vec<(ExecutionStatus, i64)>> {
        let mut sums: BTreeMap<i32, i64> = BTreeMap::new();
        for kv in rows {
            let (_, status, _) = self.ks.parse_status_count(&kv.key)?;
            *sums.entry(status).or_default() += crate::kv::decode_i64(Some(&kv.value));
        }
        sums.into_iter()
            .map(|(s, n)| {
                ExecutionStatus::try_from(s)
                    .map(|s| (s, n))
                    .map_err(|_| Error::Corrupt(format!("status count of status {s}")))
            })
            .collect()
    }

    /// Records put aside as unprocessable, oldest first, at most `limit`.
    pub async fn quarantined(&self, limit: usize) -> Result<Vec<QuarantineRecord>> {
        let limit = limit.clamp(1, LIST_PAGE_MAX);
        self.db
            .run(|tx| async move {
                let rows = tx.get_range(&self.ks.quarantined().limit(limit), true).await?;
                rows.iter().map(|kv| decode("quarantine", &kv.value)).collect::<Result<Vec<_>>>()
            })
            .await
    }

    /// Lists executions matching `q`, one page at a time. A page scans at most
    /// [`LIST_SCAN_MAX`] index entries in one short transaction; when filters skip many rows it
    /// may come back short (even empty) with a cursor: pass it back to go on.
    pub async fn list(&self, q: &ListQuery) -> Result<ListPage> {
        // The definition as every other call names it (`registry://jobs/NAME`), or its name.
        let named;
        let q = match q.definition.as_deref().and_then(|d| d.strip_prefix("registry://jobs/")) {
            Some(name) => {
                named = ListQuery { definition: Some(name.to_string()), ..q.clone() };
                &named
            }
            None => q,
        };
        let (tag, query_range, limit) = self.list_plan(q)?;
        let mut range = query_range.clone();
        if let Some(c) = &q.cursor {
            range.begin = super::cursor::open(&self.config.cursor_secret, &query_range, c)?;
        }
        let range = &range;
        let mut page = self
            .db
            .run(|tx| async move { self.list_page(&tx, tag, range, q, limit).await })
            .await?;
        page.next_cursor = page.next_cursor.map(|position| {
            super::cursor::seal(&self.config.cursor_secret, &query_range, &position)
        });
        Ok(page)
    }

    /// The index a query reads, its range and its page size.
    fn list_plan(&self, q: &ListQuery) -> Result<(Tag, RangeOption, usize)> {
        check_name("namespace", &q.namespace)?;
        let limit = match q.limit {
            0 => 100,
            n if n > LIST_PAGE_MAX => {
                return Err(invalid("limit", format!("must be at most {LIST_PAGE_MAX}")));
            }
            n => n,
        };
        let from = q.from_ms.unwrap_or(i64::MIN);
        let to = q.to_ms.unwrap_or(i64::MAX);
        if from > to {
            return Err(invalid("from", "must not be after `to`"));
        }
        let ns = q.namespace.as_str();
        // Only FAILED and CANCELLED are in the status index (`is_indexed`): filter the time
        // index for SCHEDULED, READY, RUNNING, RETRY_WAIT and SUCCEEDED, and for a definition
        // (its rows hold the specs, which name it: format 4 keeps no index by definition).
        Ok(match q.status.filter(|s| is_indexed(*s as i32)) {
            Some(s) => (Tag::ByStatus, self.ks.by_status_range(ns, s as i32, from, to), limit),
            None => (Tag::ByTime, self.ks.by_time_range(ns, from, to), limit),
        })
    }

    /// One page: filters may skip rows, so the index is scanned in chunks until the page is
    /// full, the range ends, or the scan bound is reached.
    async fn list_page(
        &self,
        tx: &Transaction,
        tag: Tag,
        range: &RangeOption,
        q: &ListQuery,
        limit: usize,
    ) -> Result<ListPage> {
        let mut page = ListPage::default();
        let mut begin = range.begin.clone();
        let mut scanned = 0;
        loop {
            let want = (limit - page.executions.len() + 1).min(LIST_SCAN_MAX - scanned);
            let chunk = RangeOption::new(begin.clone(), range.end.clone()).limit(want);
            let rows = tx.get_range(&chunk, true).await?;
            let n = rows.len();
            scanned += n;
            let found = self.list_chunk(tx, tag, q, &rows).await?;
            for (kv, (id, e)) in rows.iter().zip(found) {
                if page.executions.len() == limit {
                    page.next_cursor = Some(kv.key.to_vec());
                    return Ok(page);
                }
                begin = key_after(&kv.key);
                let (id, e) = match (id, e) {
                    (Some(id), Row::Found(e)) => (id, *e),
                    (Some(_), Row::Passed) => continue,
                    (Some(id), Row::Gone) => {
                        page.unreadable.push(id); // indexed, but its record is gone
                        continue;
                    }
                    (None, _) => {
                        page.unreadable.push(unparsed_index_entry(&kv.key));
                        continue;
                    }
                };
                let Ok(e) = e else {
                    page.unreadable.push(id);
                    continue;
                };
                if q.definition.as_ref().is_none_or(|d| &e.definition_name == d)
                    && q.status.is_none_or(|s| e.status == s as i32)
                {
                    page.executions.push(e);
                }
            }
            if n == 0 || n < want {
                return Ok(page); // the range ended
            }
            if page.executions.len() == limit || scanned >= LIST_SCAN_MAX {
                page.next_cursor = Some(begin.clone());
                return Ok(page);
            }
        }
    }

    /// The executions a chunk of index rows names, read concurrently (snapshot reads); a
    /// record that does not decode, or lacks its spec, is an `Err` of its own. The time index's
    /// rows carry the specs themselves: a row whose spec names another definition than the
    /// query's is passed without reading its record. An index key that does not parse names no
    /// execution: reported in the page's `unreadable` (and by `kairos check`), not a failure of
    /// every page over it.
    async fn list_chunk(
        &self,
        tx: &Transaction,
        tag: Tag,
        q: &ListQuery,
        rows: &[KeyValue],
    ) -> Result<Vec<(Option<String>, Row)>> {
        let ns = q.namespace.as_str();
        let ids: Vec<Option<String>> =
            rows.iter().map(|kv| self.ks.index_execution_id(tag, &kv.key).ok()).collect();
        let loads = ids.iter().zip(rows).map(|(id, kv)| async move {
            let Some(id) = id else { return Ok(Row::Gone) };
            if tag == Tag::ByTime && other_definition(q, &kv.value) {
                return Ok(Row::Passed);
            }
            let Some(v) = tx.snapshot_get_owned(self.ks.execution(ns, id)).await? else {
                return Ok(Row::Gone);
            };
            let e = match decode::<Execution>("execution", &v) {
                Ok(e) if e.spec_apart && tag == Tag::ByTime => {
                    let mut e = e;
                    merge_spec(&mut e, Some(&kv.value)).map(|()| e)
                }
                Ok(e) => match with_spec(tx, &self.ks, e).await {
                    Err(Error::Kv(k)) => return Err(Error::Kv(k)),
                    r => r,
                },
                Err(e) => Err(e),
            };
            Ok::<_, Error>(Row::Found(Box::new(e)))
        });
        let found = crate::ops::join::join_in_order(loads).await?;
        Ok(ids.into_iter().zip(found).collect())
    }
}

/// What one index row of a page came to.
enum Row {
    /// Its execution, or why it could not be read.
    Found(Box<Result<Execution>>),
    /// Its spec names another definition than the query's: not read.
    Passed,
    /// Its execution is gone (or the key names none).
    Gone,
}

/// Whether a time index row's spec names another definition than the query's. Only the spec's
/// first field is decoded; a row without a spec (an execution of format 2 not written since) or
/// one that does not decode is read whole, and filtered (or reported) from its record.
fn other_definition(q: &ListQuery, spec: &[u8]) -> bool {
    let Some(d) = q.definition.as_deref() else { return false };
    if spec.is_empty() {
        return false;
    }
    use prost::Message;
    ExecutionSpecName::decode(spec).is_ok_and(|s| s.definition_name != d)
}

/// How a page names an index entry whose key names no execution (a damaged store).
fn unparsed_index_entry(key: &[u8]) -> String {
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    format!("index-entry:{hex}")
}
