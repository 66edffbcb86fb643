//! The storage engine's own integrity check of a stopped store (`kairos check`): redb verifies
//! its pages and checksums, and rebuilds its allocator state if that alone is wrong.

use std::path::Path;

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
/// reason other than damage (missing, in use, unreadable).
pub fn check_file(path: &Path) -> Result<EngineCheck, String> {
    if !path.exists() {
        return Err(format!("{} does not exist", path.display()));
    }
    let path = path.to_path_buf();
    let checked = std::panic::catch_unwind(move || {
        let mut db = match redb::Builder::new().open(&path) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(format!(
                    "{} is in use (a running node holds it): stop the node first",
                    path.display()
                ));
            }
            Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(why))) => {
                return Ok(EngineCheck::Damaged(format!("opening: {why}")));
            }
            Err(redb::DatabaseError::Storage(redb::StorageError::Io(e))) => {
                return Err(format!("cannot read {}: {e}", path.display()));
            }
            Err(e) => return Ok(EngineCheck::Damaged(format!("opening: {e}"))),
        };
        Ok(match db.check_integrity() {
            Ok(true) => EngineCheck::Clean,
            Ok(false) => EngineCheck::Repaired,
            Err(e) => EngineCheck::Damaged(e.to_string()),
        })
    });
    match checked {
        Ok(r) => r,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Ok(EngineCheck::Damaged(format!("the engine failed reading the file: {what}")))
        }
    }
}
