//! The two engines behind one small interface, each used as the embedded backend uses it: one
//! durable commit per group-commit batch carrying the store's version, and snapshot reads that
//! read that version and the data from one consistent view.

use std::path::Path;
use std::sync::Arc;

use fjall::{KeyspaceCreateOptions, PersistMode, Readable};
use redb::{ReadableDatabase, TableDefinition};

const DATA: TableDefinition<'static, &'static [u8], &'static [u8]> = TableDefinition::new("kv");
const META: TableDefinition<'static, &'static str, u64> = TableDefinition::new("meta");
const CACHE_BYTES: u64 = 128 * 1024 * 1024;

/// One write of a batch: a value, or a delete.
pub type Write = (Vec<u8>, Option<Vec<u8>>);

pub trait Store: Send + Sync {
    /// Writes `writes` (sorted by key, one per key) and `version` in one durable commit.
    fn commit(&self, writes: &[Write], version: u64);
    /// A snapshot's version and one key's value in it.
    fn get(&self, key: &[u8]) -> (u64, Option<usize>);
    /// A snapshot's version and how many rows of `[begin, end)` it has, up to `limit`.
    fn scan(&self, begin: &[u8], end: &[u8], limit: usize, reverse: bool) -> (u64, usize);
}

pub fn open_store(engine: &str, dir: &Path) -> Arc<dyn Store> {
    match engine {
        "redb" => Arc::new(RedbStore::open(dir, Repair::Quick)),
        "redb-1sync" => Arc::new(RedbStore::open(dir, Repair::Full1Phase)),
        "redb-2pc" => Arc::new(RedbStore::open(dir, Repair::Full2Phase)),
        "fjall" => Arc::new(FjallStore::open(dir, false)),
        "fjall-small" => Arc::new(FjallStore::open(dir, true)),
        other => panic!("unknown engine {other}"),
    }
}

/// How a redb store commits, and so how it recovers from a crash.
#[derive(Clone, Copy)]
enum Repair {
    /// Quick repair (what the backend did): the allocator state written with every commit and
    /// 2-phase commit (two syncs); O(1) recovery after a crash.
    Quick,
    /// 1-phase commit (one sync), a full repair (every checksum verified) after a crash.
    Full1Phase,
    /// 2-phase commit without the allocator state: two syncs, a full repair after a crash.
    Full2Phase,
}

struct RedbStore {
    db: redb::Database,
    repair: Repair,
}

impl RedbStore {
    fn open(dir: &Path, repair: Repair) -> Self {
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES as usize)
            .create(dir.join("kv.redb"))
            .expect("open redb");
        let w = db.begin_write().unwrap();
        w.open_table(DATA).unwrap();
        w.open_table(META).unwrap();
        w.commit().unwrap();
        RedbStore { db, repair }
    }
}

impl Store for RedbStore {
    fn commit(&self, writes: &[Write], version: u64) {
        let mut w = self.db.begin_write().unwrap();
        match self.repair {
            Repair::Quick => w.set_quick_repair(true),
            Repair::Full1Phase => w.set_two_phase_commit(false),
            Repair::Full2Phase => w.set_two_phase_commit(true),
        }
        {
            let mut t = w.open_table(DATA).unwrap();
            for (k, v) in writes {
                match v {
                    Some(v) => {
                        t.insert(k.as_slice(), v.as_slice()).unwrap();
                    }
                    None => {
                        t.remove(k.as_slice()).unwrap();
                    }
                }
            }
            let mut m = w.open_table(META).unwrap();
            m.insert("version", version).unwrap();
        }
        w.commit().unwrap();
    }

    fn get(&self, key: &[u8]) -> (u64, Option<usize>) {
        let r = self.db.begin_read().unwrap();
        let v = r.open_table(META).unwrap().get("version").unwrap().map_or(0, |g| g.value());
        let t = r.open_table(DATA).unwrap();
        (v, t.get(key).unwrap().map(|g| g.value().len()))
    }

    fn scan(&self, begin: &[u8], end: &[u8], limit: usize, reverse: bool) -> (u64, usize) {
        let r = self.db.begin_read().unwrap();
        let v = r.open_table(META).unwrap().get("version").unwrap().map_or(0, |g| g.value());
        let t = r.open_table(DATA).unwrap();
        let range = t.range::<&[u8]>(begin..end).unwrap();
        let n = if reverse {
            range
                .rev()
                .take(limit)
                .fold(0, |n, i| n + usize::from(!i.unwrap().1.value().is_empty()))
        } else {
            range.take(limit).fold(0, |n, i| n + usize::from(!i.unwrap().1.value().is_empty()))
        };
        (v, n)
    }
}

struct FjallStore {
    db: fjall::Database,
    data: fjall::Keyspace,
    meta: fjall::Keyspace,
}

impl FjallStore {
    /// `small`: journals bounded to 64 MiB (fjall's least; default 512 MiB) and memtables of
    /// 16 MiB (default 64 MiB), for a shorter journal replay at open.
    fn open(dir: &Path, small: bool) -> Self {
        let mut b = fjall::Database::builder(dir.join("kv.fjall")).cache_size(CACHE_BYTES);
        if small {
            b = b.max_journaling_size(64 * 1024 * 1024);
        }
        let db = b.open().expect("open fjall");
        let memtable = if small { 16 } else { 64 } * 1024 * 1024;
        let opts = move || KeyspaceCreateOptions::default().max_memtable_size(memtable);
        let data = db.keyspace("kv", opts).unwrap();
        let meta = db.keyspace("meta", opts).unwrap();
        FjallStore { db, data, meta }
    }

    fn version(&self, s: &fjall::Snapshot) -> u64 {
        s.get(&self.meta, b"version")
            .unwrap()
            .map_or(0, |v| u64::from_le_bytes(v.as_ref().try_into().unwrap()))
    }
}

impl Store for FjallStore {
    fn commit(&self, writes: &[Write], version: u64) {
        let mut b = self.db.batch().durability(Some(PersistMode::SyncAll));
        for (k, v) in writes {
            match v {
                Some(v) => b.insert(&self.data, k.as_slice(), v.as_slice()),
                None => b.remove(&self.data, k.as_slice()),
            }
        }
        b.insert(&self.meta, b"version", version.to_le_bytes());
        b.commit().unwrap();
    }

    fn get(&self, key: &[u8]) -> (u64, Option<usize>) {
        let s = self.db.snapshot();
        let v = self.version(&s);
        (v, s.get(&self.data, key).unwrap().map(|v| v.len()))
    }

    fn scan(&self, begin: &[u8], end: &[u8], limit: usize, reverse: bool) -> (u64, usize) {
        let s = self.db.snapshot();
        let v = self.version(&s);
        let it = s.range(&self.data, begin..end);
        let n = if reverse {
            it.rev()
                .take(limit)
                .fold(0, |n, g| n + usize::from(!g.into_inner().unwrap().1.is_empty()))
        } else {
            it.take(limit).fold(0, |n, g| n + usize::from(!g.into_inner().unwrap().1.is_empty()))
        };
        (v, n)
    }
}

/// Verifies every stored byte the engine can: redb's integrity check (every page's checksum),
/// or for fjall a fresh open and a read of every key (every block's checksum, read from disk).
pub fn verify_store(engine: &str, dir: &Path) -> std::time::Duration {
    let t = std::time::Instant::now();
    if engine.starts_with("redb") {
        let db = redb::Builder::new()
            .set_check_integrity_on_open(true)
            .create(dir.join("kv.redb"))
            .expect("integrity");
        drop(db);
    } else {
        let db = fjall::Database::builder(dir.join("kv.fjall"))
            .cache_size(16 * 1024 * 1024)
            .open()
            .expect("open fjall");
        for name in ["kv", "meta"] {
            let ks = db.keyspace(name, KeyspaceCreateOptions::default).unwrap();
            for g in ks.iter() {
                g.into_inner().expect("every block verifies");
            }
        }
    }
    t.elapsed()
}
