//! The storage engine's own integrity check of a stopped store (`kairos check`): redb verifies
//! its pages and checksums, and rebuilds its allocator state if that alone is wrong; the
//! commit log's frames are read back (their checksums verified).

use std::path::Path;

use super::contain::contain;
use super::errors::is_read_past_end;
use super::integrity;
use super::log;

/// What the engine's check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineCheck {
    /// Every page verified.
    Clean,
    /// The pages verified, but the engine's free-space bookkeeping was wrong and has been
    /// rebuilt (no record was changed).
    Repaired,
    /// The file is damaged beyond what the engine can repair; the reason says where.
    Damaged(String),
}

/// Opens the store at `path` on its own (it must not be open elsewhere: a running node holds
/// its lock) and runs the engine's integrity check. `Err` when it cannot be opened for a
/// reason other than damage (missing, in use, unreadable). A panic of the engine on a damaged
/// file is reported as damage, without a backtrace. A store found clean is recorded as closed
/// cleanly, so the next open trusts it without verifying it again.
pub fn check_file(path: &Path) -> Result<EngineCheck, String> {
    if !path.exists() {
        return Err(format!("{} does not exist", path.display()));
    }
    // This open writes (the check commits): the store's clean-shutdown record no longer holds.
    integrity::take_marker(path).map_err(|e| e.to_string())?;
    let checked = contain(|| {
        let mut db = match redb::Builder::new().open(path) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(format!(
                    "{} is in use (a running node holds it): stop the node first",
                    path.display()
                ));
            }
            Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(why))) => {
                return Ok((EngineCheck::Damaged(format!("opening: {why}")), false));
            }
            Err(redb::DatabaseError::Storage(redb::StorageError::Io(e)))
                if is_read_past_end(&e) =>
            {
                let why = format!("opening: a read past the end of the file ({e})");
                return Ok((EngineCheck::Damaged(why), false));
            }
            Err(redb::DatabaseError::Storage(redb::StorageError::Io(e))) => {
                return Err(format!("cannot read {}: {e}", path.display()));
            }
            Err(e) => return Ok((EngineCheck::Damaged(format!("opening: {e}")), false)),
        };
        let found = match db.check_integrity() {
            Ok(true) => EngineCheck::Clean,
            Ok(false) => EngineCheck::Repaired,
            Err(e) => EngineCheck::Damaged(e.to_string()),
        };
        // The commit log (what a crash left to replay): its frames must read back whole.
        let durable = log::durable_version(&db).unwrap_or(0);
        let found = match log::read_file(path).map(|b| log::read_frames(&b, durable).map(|_| ())) {
            Ok(Ok(())) => found,
            Ok(Err(why)) => EngineCheck::Damaged(log::damaged_reason(path, &why)),
            Err(e) => return Err(e.to_string()),
        };
        let closed = db.close().is_ok();
        Ok((found, closed))
    });
    match checked {
        Ok(Ok((found, closed))) => {
            if closed && matches!(found, EngineCheck::Clean | EngineCheck::Repaired) {
                integrity::write_marker(path).map_err(|e| e.to_string())?;
            }
            Ok(found)
        }
        Ok(Err(e)) => Err(e),
        Err(panic) => {
            Ok(EngineCheck::Damaged(format!("the engine failed reading the file: {panic}")))
        }
    }
}
