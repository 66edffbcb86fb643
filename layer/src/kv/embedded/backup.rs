//! An online backup of the embedded store: every key of one consistent snapshot (redb's read
//! transaction and the commit log's writes since the last checkpoint, at one version) copied
//! into a new store file while this one keeps serving. Writers are never blocked: the snapshot
//! pins the pages and log entries it reads until the copy ends.

use std::path::Path;

use super::{EmbeddedDatabase, EmbeddedOptions};
use crate::kv::KvDatabase as _;
use crate::kv::error::{Error, Result};
use crate::kv::limits::key_after;

/// Bytes of pairs one transaction of the copy writes (within the transaction budget).
const BACKUP_CHUNK_BYTES: usize = 4 << 20;

pub use crate::kv::BackupReport;

impl EmbeddedDatabase {
    /// Copies every key of one snapshot of this store into a new store file at `to` (refused
    /// when it exists), while this store serves. The copy is a store like any other: open it
    /// in place of `kv.redb` to restore.
    pub async fn backup_to(&self, to: &Path) -> Result<BackupReport> {
        if to.exists() {
            return Err(Error::Storage(format!("backup: {} exists already", to.display())));
        }
        // Registered first, as a transaction is: the history the snapshot reads is kept (in
        // memory, for the commit log's part) until the copy ends.
        let registered = self.store.published_version();
        self.store.active().enter(registered);
        let copied = self.copy_snapshot(to).await;
        self.store.active().exit(registered);
        copied
    }

    async fn copy_snapshot(&self, to: &Path) -> Result<BackupReport> {
        let snapshot = self.store.snapshot()?;
        let options = EmbeddedOptions { commit_log: false, ..Default::default() };
        let target = EmbeddedDatabase::open_with(to, self.shared.clock.clone(), options)?;
        let mut report = BackupReport { version: snapshot.version(), keys: 0, bytes: 0 };
        let end = [0xffu8];
        let mut begin = Vec::new();
        let result = loop {
            let mut chunk: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            let mut size = 0;
            snapshot.scan(&begin, &end, false, &mut |k, v| {
                chunk.push((k.to_vec(), v.to_vec()));
                size += k.len() + v.len();
                size < BACKUP_CHUNK_BYTES
            })?;
            let Some((last, _)) = chunk.last() else { break Ok(()) };
            begin = key_after(last);
            let tx = target.begin()?;
            for (k, v) in &chunk {
                tx.set(k, v)?;
            }
            if let Err(e) = tx.commit().await {
                break Err(e);
            }
            report.keys += chunk.len() as u64;
            report.bytes += size as u64;
        };
        target.close().await;
        drop(target);
        result.map(|()| report)
    }
}
