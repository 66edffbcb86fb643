//! Reads: `get`, `attempts`, `list` (by status, definition or time range, paginated).

use kairos_proto::storage::v1::{Attempt, Execution, ExecutionStatus};

use super::Scheduler;
use super::error::{Error, Result, invalid};
use super::limits::LIST_PAGE_MAX;
use super::records::decode;
use crate::keys::Tag;
use crate::kv::limits::key_after;

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
    /// Where the previous page stopped (`ListPage::next_cursor`).
    pub cursor: Option<Vec<u8>>,
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListPage {
    /// Executions, ordered by `execute_at` then id.
    pub executions: Vec<Execution>,
    /// Pass back to get the next page; `None` at the end.
    pub next_cursor: Option<Vec<u8>>,
}

impl Scheduler {
    /// Reads an execution.
    pub async fn get(&self, ns: &str, id: &str) -> Result<Execution> {
        let found = self
            .db
            .run(|tx| async move {
                match tx.snapshot_get(&self.ks.execution(ns, id)).await? {
                    Some(v) => Ok::<_, Error>(Some(decode::<Execution>("execution", &v)?)),
                    None => Ok(None),
                }
            })
            .await?;
        found.ok_or_else(|| Error::NotFound { what: "execution", id: id.to_string() })
    }

    /// The attempts of an execution, first to last.
    pub async fn attempts(&self, ns: &str, id: &str) -> Result<Vec<Attempt>> {
        self.db
            .run(|tx| async move {
                let rows = tx.get_range(&self.ks.attempts(ns, id), true).await?;
                rows.iter().map(|kv| decode("attempt", &kv.value)).collect::<Result<Vec<Attempt>>>()
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
        let mut sums: std::collections::BTreeMap<i32, i64> = std::collections::BTreeMap::new();
        for kv in rows {
            let (_, status) = self.ks.parse_status_count(&kv.key)?;
            *sums.entry(status).or_default() += crate::kv::decode_i64(Some(&kv.value));
        }
        Ok(sums
            .into_iter()
            .filter_map(|(s, n)| ExecutionStatus::try_from(s).ok().map(|s| (s, n)))
            .collect())
    }

    /// How many executions of `ns` are in each status (kept by atomic counters, so exact and
    /// cheap at any scale).
    pub async fn status_counts(&self, ns: &str) -> Result<Vec<(ExecutionStatus, i64)>> {
        self.db
            .run(|tx| async move {
                let rows = tx.get_range(&self.ks.status_counts(ns), true).await?;
                let mut out = Vec::new();
                for kv in rows {
                    let (_, status) = self.ks.parse_status_count(&kv.key)?;
                    let status = ExecutionStatus::try_from(status)
                        .map_err(|_| Error::Corrupt(format!("status count of status {status}")))?;
                    out.push((status, crate::kv::decode_i64(Some(&kv.value))));
                }
                Ok(out)
            })
            .await
    }

    /// Lists executions matching `q`, one page at a time.
    pub async fn list(&self, q: &ListQuery) -> Result<ListPage> {
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
        let (tag, mut range) = match (&q.status, &q.definition) {
            (Some(s), _) => (Tag::ByStatus, self.ks.by_status_range(ns, *s as i32, from, to)),
            (None, Some(d)) => (Tag::ByDefinition, self.ks.by_definition_range(ns, d, from, to)),
            (None, None) => (Tag::ByTime, self.ks.by_time_range(ns, from, to)),
        };
        if let Some(c) = &q.cursor {
            if c < &range.begin || c > &range.end {
                return Err(invalid("cursor", "does not belong to this query"));
            }
            range.begin = c.clone();
        }
        self.db
            .run(|tx| {
                let range = range.clone();
                async move {
                    let mut page = ListPage::default();
                    let mut begin = range.begin.clone();
                    // Filtering by definition on the status index may skip rows: scan in
                    // chunks until the page is full or the range ends.
                    loop {
                        let chunk = crate::kv::RangeOption::new(begin.clone(), range.end.clone())
                            .limit(limit - page.executions.len() + 1);
                        let rows = tx.get_range(&chunk, true).await?;
                        let n = rows.len();
                        for kv in rows {
                            if page.executions.len() == limit {
                                page.next_cursor = Some(kv.key.to_vec());
                                return Ok(page);
                            }
                            let id = self.ks.index_execution_id(tag, &kv.key)?;
                            begin = key_after(&kv.key);
                            let Some(v) = tx.snapshot_get(&self.ks.execution(ns, &id)).await?
                            else {
                                continue;
                            };
                            let e: Execution = decode("execution", &v)?;
                            if q.definition.as_ref().is_none_or(|d| &e.definition_name == d) {
                                page.executions.push(e);
                            }
                        }
                        if n == 0 || page.executions.len() == limit {
                            return Ok(page);
                        }
                    }
                }
            })
            .await
    }
}
