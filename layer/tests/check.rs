//! The record check finds what strands an execution: a READY one missing from its ready
//! queue, a timer missing from the index. A healthy store has no findings.

mod common;

use common::*;
use kairos_layer::keys::Tag;
use kairos_layer::kv::memory::FaultConfig;
use kairos_layer::ops::check::check_records;

#[tokio::test]
async fn a_stranded_execution_is_found() {
    let w = world(21, FaultConfig::none()).await;
    let ready = w.sched.submit(request(None, T0)).await.unwrap().execution.id;
    let waiting = w.sched.submit(request(None, T0 + 3_600_000)).await.unwrap().execution.id;
    w.fire_all().await;
    let clean = check_records(&w.db, &w.ks, |_| {}).await.unwrap();
    assert!(clean.is_clean(), "{:#?}", clean.findings);
    // Damage: the ready queue and the timer index lose their entries.
    for tag in [Tag::Ready, Tag::Timer] {
        let r = w.ks.subspace_range(tag);
        let (b, e) = (r.begin.clone(), r.end.clone());
        w.db.run(|tx| {
            let (b, e) = (b.clone(), e.clone());
            async move { tx.clear_range(&b, &e) }
        })
        .await
        .unwrap();
    }
    let r = check_records(&w.db, &w.ks, |_| {}).await.unwrap();
    let text: Vec<&str> = r.findings.iter().map(|f| f.problem.as_str()).collect();
    assert!(
        text.iter().any(|p| p.contains(&ready) && p.contains("not on its ready queue")),
        "{text:?}"
    );
    assert!(
        text.iter().any(|p| p.contains(&waiting) && p.contains("not in the timer index")),
        "{text:?}"
    );
}
