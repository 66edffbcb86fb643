//! The store's health, watched for as long as the node lives: each change is logged once (a
//! warning when writes are refused, an error when the store failed, info when it recovers)
//! and shown in the `kairos_store_healthy` gauge.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kairos_layer::kv::StoreHealth;

use crate::runtime::context::Ctx;

/// How often the node looks at its store's health.
const HEALTH_PERIOD: Duration = Duration::from_millis(250);

/// Starts the watch; the receiver sees every change.
pub(crate) fn watch_store_health(ctx: &Ctx) -> tokio::sync::watch::Receiver<StoreHealth> {
    let db = ctx.sched.database().clone();
    let (tx, rx) = tokio::sync::watch::channel(db.health());
    let (clock, metrics) = (ctx.clock.clone(), ctx.metrics.clone());
    tokio::spawn(async move {
        loop {
            clock.sleep(HEALTH_PERIOD).await;
            if tx.is_closed() {
                return; // the node is gone
            }
            let now = db.health();
            if *tx.borrow() == now {
                continue;
            }
            metrics.store_health.store(gauge(&now), Ordering::Relaxed);
            let _ = tx.send(now);
        }
    });
    rx
}

/// The gauge's value for a health (1 healthy, 0 refusing writes, -1 failed, -2 unreachable), logging the change.
fn gauge(now: &StoreHealth) -> i64 {
    match now {
        StoreHealth::Healthy => {
            tracing::info!("the store takes writes again");
            1
        }
        StoreHealth::WritesRefused { reason } => {
            tracing::warn!(%reason, "the store refuses writes; reads go on");
            0
        }
        StoreHealth::Unavailable { reason } => {
            tracing::warn!(%reason, "the store cannot be reached; retrying");
            -2
        }
        StoreHealth::Failed { reason } => {
            tracing::error!(%reason, "the store failed");
            -1
        }
    }
}
