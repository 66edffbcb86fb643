//! `AdminService.Backup`: an online backup of the node's embedded store. The node copies one
//! consistent snapshot into a new store file under `DATA_DIR/backups/` (writers keep
//! committing: `KvDatabase::backup_to`), streams that file to the caller in chunks, then
//! removes it. Other backends are refused, naming their own tools.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use kairos_layer::kv::Database;
use kairos_proto::v1::BackupChunk;
use tokio::sync::mpsc;
use tonic::Status;

/// Bytes of the store file per streamed chunk (well within gRPC's 4 MiB message default).
const BACKUP_STREAM_CHUNK_BYTES: usize = 1 << 20;

/// Chunks read ahead of the caller.
const BACKUP_STREAM_AHEAD: usize = 4;

/// The stream of a backup.
pub type BackupStream = std::pin::Pin<
    Box<dyn tonic::codegen::tokio_stream::Stream<Item = Result<BackupChunk, Status>> + Send>,
>;

/// Why a backend cannot be backed up through the node, if it cannot.
pub(super) fn refused(backend: &str) -> Option<Status> {
    let why = match backend {
        "embedded" => return None,
        "postgres" => {
            "backup: this node's backend is postgres: back up the PostgreSQL schema with \
             PostgreSQL's own tools while the nodes run — pg_dump --schema=<postgres_schema> (a \
             consistent logical snapshot) or pg_basebackup with WAL archiving (docs/operations.md, \
             \"Back up\")"
        }
        "fdb" => "backup: this node's backend is fdb: use FoundationDB's fdbbackup",
        _ => {
            "backup: this node's backend (memory) keeps nothing durable: there is nothing to back up"
        }
    };
    Some(Status::failed_precondition(why))
}

/// Starts the backup: the snapshot is copied, then streamed, by a task of its own.
pub(super) fn start(db: Database, data_dir: &Path) -> BackupStream {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let ms = db.clock().now().as_millis();
    let name = format!(".online-{ms}-{}.redb", SEQ.fetch_add(1, Ordering::Relaxed));
    let path = data_dir.join("backups").join(name);
    let (tx, rx) = mpsc::channel(BACKUP_STREAM_AHEAD);
    tokio::spawn(async move {
        run(&db, &path, tx).await;
        remove(&path);
    });
    Box::pin(tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx))
}

async fn run(db: &Database, path: &Path, tx: mpsc::Sender<Result<BackupChunk, Status>>) {
    let began = db.clock().now();
    let report = match db.backup_to(path).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "online backup failed");
            let _ =
                tx.send(Err(Status::internal(format!("backup: copying the snapshot: {e}")))).await;
            return;
        }
    };
    tracing::info!(
        version = report.version,
        keys = report.keys,
        bytes = report.bytes,
        ms = db.clock().now().since(began).as_millis() as u64,
        "online backup: snapshot copied, streaming it"
    );
    let first = BackupChunk {
        version: report.version,
        keys: report.keys,
        record_bytes: report.bytes,
        ..Default::default()
    };
    let path = path.to_path_buf();
    let sent = tokio::task::spawn_blocking(move || send_file(&path, first, &tx)).await;
    if let Ok(Err(e)) = sent {
        tracing::warn!(error = %e, "online backup: streaming stopped");
    }
}

/// Sends the file in chunks (the first carrying `first`'s figures); stops when the caller
/// left.
fn send_file(
    path: &Path,
    mut first: BackupChunk,
    tx: &mpsc::Sender<Result<BackupChunk, Status>>,
) -> Result<(), String> {
    let fail = |e: std::io::Error| {
        let text = format!("backup: reading {}: {e}", path.display());
        let _ = tx.blocking_send(Err(Status::internal(text.clone())));
        text
    };
    let mut file = std::fs::File::open(path).map_err(fail)?;
    first.file_bytes = file.metadata().map_err(fail)?.len();
    let mut chunk = Some(first);
    loop {
        let mut data = vec![0u8; BACKUP_STREAM_CHUNK_BYTES];
        let mut filled = 0;
        while filled < data.len() {
            match file.read(&mut data[filled..]).map_err(fail)? {
                0 => break,
                n => filled += n,
            }
        }
        data.truncate(filled);
        // Past the end: done, once the first chunk (with the figures) went out.
        let next = match chunk.take() {
            Some(first) => first,
            None if filled == 0 => return Ok(()),
            None => BackupChunk::default(),
        };
        if tx.blocking_send(Ok(BackupChunk { data, ..next })).is_err() {
            return Err("the caller left".into());
        }
        if filled < BACKUP_STREAM_CHUNK_BYTES {
            return Ok(());
        }
    }
}

/// Removes the copy and what its close left beside it.
fn remove(path: &Path) {
    for suffix in ["", ".clean-shutdown", ".log"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_backends_are_refused_naming_their_own_tools() {
        assert!(refused("embedded").is_none());
        let pg = refused("postgres").unwrap();
        assert_eq!(pg.code(), tonic::Code::FailedPrecondition);
        assert!(pg.message().contains("pg_dump") && pg.message().contains("pg_basebackup"));
        assert!(refused("memory").unwrap().message().contains("nothing to back up"));
    }
}
