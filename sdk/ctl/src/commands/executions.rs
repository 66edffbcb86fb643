//! `submit`, `get`, `cancel`, `replay`, `wait`, `list`.

use std::time::Duration;

use kairos_proto::v1::{Attempt, ExecutionStatus, ListExecutionsRequest};
use kairos_sdk::Client;
use serde_json::json;

use crate::args::Submit;
use crate::output::{
    Failure, Opts, execution_json, execution_out, executions_table, page_footer, page_json,
    status_name, time,
};

/// `submit`.
pub(super) async fn submit(client: &Client, o: &Opts, s: Submit) -> Result<String, Failure> {
    let mut b = client.submit(&s.definition_uri, s.version).return_execution(o.json);
    if let Some(v) = s.inputs {
        b = b.inputs(v);
    }
    if let Some(at) = s.at {
        b = b.at(at);
    }
    if let Some(after) = s.after {
        // A delay counted by the node's clock: retrying with the same key and delay
        // is the same request (a time computed here would differ on each retry).
        b = b.after(after);
    }
    if let Some(k) = s.key {
        b = b.idempotency_key(k);
    }
    let s = b.send().await?;
    let e = s.execution.clone().unwrap_or_default();
    Ok(if o.json {
        json!({"created": s.created, "execution": execution_json(&e)}).to_string()
    } else {
        format!(
            "{} {} {}",
            s.execution_id,
            status_name(s.status()),
            if s.created { "created" } else { "existing" }
        )
    })
}

/// `ATTEMPT_STATUS_FAILED` → `FAILED`.
fn attempt_status(a: &Attempt) -> &'static str {
    a.status().as_str_name().trim_start_matches("ATTEMPT_STATUS_")
}

/// `get`: an execution and its attempts, by id or by idempotency key.
pub(super) async fn get(
    client: &Client,
    o: &Opts,
    execution_id: Option<String>,
    key: Option<String>,
) -> Result<String, Failure> {
    let (e, attempts) = match (key, execution_id) {
        (Some(key), _) => client.get_by_idempotency_key(&key).await?,
        (None, Some(id)) => client.get(&id).await?,
        (None, None) => return Err(Failure::Usage("get: an execution id or --key".into())),
    };
    if o.json {
        return Ok(kairos_sdk::views::execution(&e, Some(&attempts)).to_string());
    }
    let mut out = executions_table(std::slice::from_ref(&e));
    for a in &attempts {
        out.push_str(&format!(
            "\n  attempt {} {} by {} {} → {}{}",
            a.number,
            attempt_status(a),
            a.worker_id,
            time(a.started_at_ms),
            time(a.ended_at_ms),
            a.error.as_ref().map(|x| format!(" ({})", x.message)).unwrap_or_default()
        ));
    }
    if !e.output_json.is_empty() {
        out.push_str(&format!("\n  output {}", e.output_json));
    }
    Ok(out)
}

/// `cancel`.
pub(super) async fn cancel(client: &Client, o: &Opts, id: &str) -> Result<String, Failure> {
    let r = client.cancel(id).await?;
    let e = r.execution.unwrap_or_default();
    if o.json {
        return Ok(json!({"cancelled": r.cancelled, "execution": execution_json(&e)}).to_string());
    }
    let mut out = executions_table(std::slice::from_ref(&e));
    if !r.cancelled {
        out.push_str(
            "\n  running: its worker was asked to stop; it ends CANCELLED when the attempt ends",
        );
    }
    Ok(out)
}

/// `replay`.
pub(super) async fn replay(client: &Client, o: &Opts, id: &str) -> Result<String, Failure> {
    Ok(execution_out(o, &client.replay(id).await?))
}

/// `wait`.
pub(super) async fn wait(
    client: &Client,
    o: &Opts,
    id: &str,
    timeout: Duration,
) -> Result<String, Failure> {
    Ok(execution_out(o, &client.wait(id, timeout).await?))
}

/// `list`: one page, and the cursor of the next.
pub(super) async fn list(
    client: &Client,
    o: &Opts,
    status: Option<String>,
    definition: String,
    limit: u32,
    cursor: Option<Vec<u8>>,
) -> Result<String, Failure> {
    let status = match status {
        None => ExecutionStatus::Unspecified,
        Some(s) => {
            ExecutionStatus::from_str_name(&format!("EXECUTION_STATUS_{}", s.to_ascii_uppercase()))
                .ok_or_else(|| Failure::Usage(format!("--status: unknown status {s:?}")))?
        }
    };
    let request = ListExecutionsRequest {
        status: status as i32,
        definition,
        limit,
        cursor: cursor.unwrap_or_default(),
        ..Default::default()
    };
    let page = client.list(request).await?;
    if o.json {
        return Ok(page_json(&page.executions, &page.next_cursor, &page.unreadable_ids).to_string());
    }
    let mut out = executions_table(&page.executions);
    out.push_str(&page_footer(&page.next_cursor, &page.unreadable_ids));
    Ok(out)
}
