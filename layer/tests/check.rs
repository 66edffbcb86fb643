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

/// A list never comes back short without saying so: an index entry whose execution record is
/// gone, and one whose key names no execution, are both named in the page's `unreadable`.
#[tokio::test]
async fn a_list_names_what_its_range_holds_but_cannot_read() {
    use kairos_layer::ops::query::ListQuery;
    let w = world(22, FaultConfig::none()).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(w.sched.submit(request(None, T0 + 60_000 * (i + 1))).await.unwrap().execution.id);
    }
    let gone = w.ks.execution(NS, &ids[1]);
    // An index key in the list's range, (namespace, time) followed by bytes that are no id.
    let mut junk = w.ks.by_time_range(NS, T0 + 90_000, T0 + 90_001).begin;
    junk.extend_from_slice(b"\xfe not a tuple");
    w.db.run(|tx| {
        let (gone, junk) = (gone.clone(), junk.clone());
        async move {
            tx.clear(&gone)?;
            tx.set(&junk, b"")
        }
    })
    .await
    .unwrap();
    let q = ListQuery { namespace: NS.into(), ..ListQuery::default() };
    let page = w.sched.list(&q).await.unwrap();
    let listed: Vec<&str> = page.executions.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(listed, [ids[0].as_str(), ids[2].as_str()]);
    assert!(
        page.unreadable.contains(&ids[1]),
        "the missing record is named: {:?}",
        page.unreadable
    );
    assert!(
        page.unreadable.iter().any(|u| u.starts_with("index-entry:")),
        "the entry naming nothing is named: {:?}",
        page.unreadable
    );
}
