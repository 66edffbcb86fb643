//! Serializability: concurrent random transfers between accounts, retried through `run`
//! (with injected faults on memory). Afterwards the total is conserved and the committed
//! transfers, replayed one by one in commit (versionstamp) order, reproduce exactly the
//! balances each of them read and the final state — i.e. the outcome equals a serial order.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kairos_layer::env::{Rng, SharedClock, Timestamp, TokioClock};
use kairos_layer::kv::embedded::EmbeddedDatabase;
use kairos_layer::kv::memory::{FaultConfig, MemoryDatabase};
use kairos_layer::kv::{Database, Error, RangeOption, decode_i64};

const ACCOUNTS: u64 = 8;
const INITIAL: i64 = 100;

fn account(i: u64) -> Vec<u8> {
    format!("acct/{i}").into_bytes()
}

/// One committed transfer as logged: what it read and what it moved.
#[derive(Debug)]
struct Logged {
    from: u64,
    to: u64,
    amount: i64,
    from_before: i64,
    to_before: i64,
}

fn encode(l: &Logged) -> Vec<u8> {
    [l.from as i64, l.to as i64, l.amount, l.from_before, l.to_before]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect()
}

fn decode(b: &[u8]) -> Logged {
    let f = |i: usize| decode_i64(Some(&b[i * 8..i * 8 + 8]));
    Logged { from: f(0) as u64, to: f(1) as u64, amount: f(2), from_before: f(3), to_before: f(4) }
}

async fn setup(db: &Database) {
    db.run(|tx| async move {
        for i in 0..ACCOUNTS {
            tx.set(&account(i), &INITIAL.to_le_bytes())?;
        }
        Ok::<_, Error>(())
    })
    .await
    .unwrap();
}

async fn transfer_worker(db: Database, rng: Rng, transfers: usize, ids: Arc<AtomicU64>) {
    for _ in 0..transfers {
        // Chosen outside the retry loop: the closure may run again after an unknown result.
        let id = ids.fetch_add(1, Ordering::Relaxed);
        let from = rng.below(ACCOUNTS);
        let to = (from + 1 + rng.below(ACCOUNTS - 1)) % ACCOUNTS;
        let amount = rng.between(1, 60) as i64;
        db.run(|tx| async move {
            let done = format!("done/{id}").into_bytes();
            if tx.get(&done).await?.is_some() {
                return Ok(()); // applied by an earlier try whose commit reported unknown
            }
            let from_before = decode_i64(tx.get(&account(from)).await?.as_deref());
            tokio::task::yield_now().await; // let others interleave between read and write
            let to_before = decode_i64(tx.get(&account(to)).await?.as_deref());
            if from_before < amount {
                tx.set(&done, b"skipped")?;
                return Ok(());
            }
            tx.set(&account(from), &(from_before - amount).to_le_bytes())?;
            tx.set(&account(to), &(to_before + amount).to_le_bytes())?;
            tx.set(&done, b"applied")?;
            let mut key = b"log/".to_vec();
            key.extend_from_slice(&[0u8; 10]);
            let entry = Logged { from, to, amount, from_before, to_before };
            tx.set_versionstamped_key(&key, 4, &encode(&entry))?;
            Ok::<_, Error>(())
        })
        .await
        .expect("transfer commits eventually");
    }
}

async fn check(db: &Database) -> usize {
    // Read through `run`: the injected faults hit the checker's reads too.
    let (balances, log) = db
        .run(|tx| async move {
            let mut balances: Vec<i64> = Vec::new();
            for i in 0..ACCOUNTS {
                balances.push(decode_i64(tx.get(&account(i)).await?.as_deref()));
            }
            let log = tx.get_range(&RangeOption::prefix(b"log/"), false).await?;
            Ok::<_, Error>((balances, log))
        })
        .await
        .unwrap();
    assert_eq!(balances.iter().sum::<i64>(), INITIAL * ACCOUNTS as i64, "total conserved");
    let mut replay = vec![INITIAL; ACCOUNTS as usize];
    for kv in &log {
        let l = decode(&kv.value);
        assert_eq!(
            replay[l.from as usize], l.from_before,
            "read of {l:?} matches the serial order"
        );
        assert_eq!(replay[l.to as usize], l.to_before, "read of {l:?} matches the serial order");
        assert!(l.from_before >= l.amount);
        replay[l.from as usize] -= l.amount;
        replay[l.to as usize] += l.amount;
    }
    assert_eq!(replay, balances, "final state = the serial replay");
    log.len()
}

async fn run_workload(db: Database, seed: u64, workers: usize, transfers: usize) -> usize {
    run_on_nodes(&[db], seed, workers, transfers).await
}

/// The workload with its workers spread over several handles on one store (nodes).
async fn run_on_nodes(nodes: &[Database], seed: u64, workers: usize, transfers: usize) -> usize {
    let db = nodes[0].clone();
    setup(&db).await;
    let ids = Arc::new(AtomicU64::new(0));
    let rng = Rng::seeded(seed);
    let mut joins = Vec::new();
    for w in 0..workers {
        let node = nodes[w % nodes.len()].clone();
        joins.push(tokio::spawn(transfer_worker(node, rng.fork(), transfers, ids.clone())));
    }
    for j in joins {
        j.await.unwrap();
    }
    check(&db).await
}

#[test]
fn memory_with_faults_is_serializable() {
    for seed in 0..12u64 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let applied = rt.block_on(async {
            let clock: SharedClock = Arc::new(TokioClock::starting_at(Timestamp::from_millis(0)));
            let faults =
                if seed % 3 == 0 { FaultConfig::all(0.05) } else { FaultConfig::from_seed(seed) };
            let db = MemoryDatabase::open(clock, Rng::seeded(seed), faults);
            run_workload(db, seed, 16, 25).await
        });
        assert!(applied > 50, "seed {seed}: only {applied} transfers applied");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_is_serializable() {
    let dir = tempfile::tempdir().unwrap();
    let clock: SharedClock = Arc::new(kairos_layer::env::SystemClock::default());
    let db =
        EmbeddedDatabase::open_database(dir.path().join("kv.redb"), clock, Rng::seeded(9)).unwrap();
    let applied = run_workload(db, 9, 16, 25).await;
    assert!(applied > 50, "only {applied} transfers applied");
}

/// `nodes` handles on one fresh schema of the throwaway PostgreSQL cluster, as separate nodes
/// would have (each its own pool, committer and listener).
async fn postgres_nodes(nodes: usize) -> Vec<Database> {
    use kairos_layer::kv::postgres::{PostgresDatabase, PostgresOptions, testing};
    let url = testing::shared().unwrap_or_else(|e| panic!("{e}"));
    let schema = testing::fresh_schema("serial");
    let mut out = Vec::new();
    for n in 0..nodes {
        let clock: SharedClock = Arc::new(kairos_layer::env::SystemClock::default());
        let options = PostgresOptions { schema: schema.clone(), ..PostgresOptions::new(&url) };
        let db = PostgresDatabase::connect_database(options, clock, Rng::seeded(n as u64))
            .await
            .expect("connect to the throwaway PostgreSQL");
        out.push(db);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_is_serializable() {
    let applied = run_on_nodes(&postgres_nodes(1).await, 11, 16, 25).await;
    assert!(applied > 50, "only {applied} transfers applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_is_serializable_across_nodes() {
    let applied = run_on_nodes(&postgres_nodes(3).await, 12, 18, 25).await;
    assert!(applied > 50, "only {applied} transfers applied");
}
