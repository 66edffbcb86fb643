//! When a store can be trusted without reading all of it.
//!
//! A store closed cleanly leaves a marker beside its file, `<file>.clean-shutdown`, holding the
//! file's fingerprint at that moment (length, inode, modification and change times — the change
//! time cannot be set back by a user, so copying the file, writing into it or resetting its
//! modification time all show). Opening takes the marker away before anything is written. The
//! next open verifies every page's checksum (redb's integrity check) when the marker is missing
//! (the last run did not close cleanly) or the file no longer matches it (it changed outside
//! the node); otherwise the store is trusted as it was left.

use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::kv::error::{Error, Result};

/// What the open knows of the store's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Integrity {
    /// A new, empty store.
    New,
    /// Closed cleanly and unchanged since: trusted without being re-read.
    Trusted,
    /// Opened after a run that did not close it cleanly, without verifying it: larger than
    /// [`EmbeddedOptions::verify_after_crash_bytes_max`](super::EmbeddedOptions) (a crash
    /// alone does not damage the file; `kairos check` verifies it when the node is stopped).
    Unverified {
        /// Why it was not verified.
        why: String,
    },
    /// Every page's checksum verified at this open (the reason it was checked).
    Verified {
        /// Why the open verified the store.
        why: String,
    },
    /// The engine found the store damaged; it is not served (its health is `Failed`).
    Damaged {
        /// What the engine found, and why the open checked.
        reason: String,
    },
}

/// Why the open must verify the store, or `None` when it can trust it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Doubt {
    /// The store file does not exist yet.
    New,
    /// Closed cleanly, unchanged since.
    None,
    /// The last run did not close it cleanly.
    Crashed,
    /// The file changed since its clean close (what changed).
    Changed(String),
}

/// Takes the marker and decides: the reason to verify the store at this open, or else what
/// the open knows without verifying (`None`: trusted).
pub(crate) fn decide(
    store: &Path,
    options: &super::EmbeddedOptions,
) -> Result<(Option<String>, Option<Integrity>)> {
    use super::VerifyAtOpen;
    let doubt = take_marker(store)?;
    let len = std::fs::metadata(store).map(|m| m.len()).unwrap_or(0);
    let crashed = "the last run did not close the store cleanly";
    Ok(match (options.verify_at_open, doubt) {
        (_, Doubt::New) => (None, Some(Integrity::New)),
        (VerifyAtOpen::Never, Doubt::None) => (None, None),
        (VerifyAtOpen::Never, Doubt::Crashed) => (
            None,
            Some(Integrity::Unverified { why: format!("{crashed} (verify_at_open: never)") }),
        ),
        (VerifyAtOpen::Never, Doubt::Changed(what)) => {
            (None, Some(Integrity::Unverified { why: format!("{what} (verify_at_open: never)") }))
        }
        (VerifyAtOpen::Always, Doubt::None) => (Some("verify_at_open: always".into()), None),
        (_, Doubt::None) => (None, None),
        (_, Doubt::Changed(what)) => (Some(what), None),
        (VerifyAtOpen::WhenInDoubt, Doubt::Crashed)
            if len > options.verify_after_crash_bytes_max =>
        {
            let why = format!(
                "{crashed}, and at {} MiB it is larger than the {} MiB verified at an open; run \
                 `kairos check` when the node can be stopped",
                len >> 20,
                options.verify_after_crash_bytes_max >> 20
            );
            (None, Some(Integrity::Unverified { why }))
        }
        (_, Doubt::Crashed) => (Some(crashed.into()), None),
    })
}

fn marker_path(store: &Path) -> PathBuf {
    let mut p = store.as_os_str().to_owned();
    p.push(".clean-shutdown");
    PathBuf::from(p)
}

fn fingerprint(store: &Path) -> std::io::Result<String> {
    let m = std::fs::metadata(store)?;
    Ok(format!(
        "len={} ino={} dev={} mtime={}.{:09} ctime={}.{:09}",
        m.len(),
        m.ino(),
        m.dev(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    ))
}

fn sync_dir(store: &Path) -> Result<()> {
    let dir = store.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::Storage(format!("cannot sync directory {}: {e}", dir.display())))
}

/// Reads and removes the clean-shutdown marker of `store` (durably, before the engine writes),
/// and says whether the store must be verified.
pub(crate) fn take_marker(store: &Path) -> Result<Doubt> {
    let marker = marker_path(store);
    let recorded = std::fs::read_to_string(&marker).ok();
    if recorded.is_some() {
        std::fs::remove_file(&marker)
            .map_err(|e| Error::Storage(format!("cannot remove {}: {e}", marker.display())))?;
        sync_dir(store)?;
    }
    let current = match fingerprint(store) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Doubt::New),
        Err(e) => return Err(Error::Storage(format!("cannot read {}: {e}", store.display()))),
    };
    Ok(match recorded {
        None => Doubt::Crashed,
        Some(r) if r.trim() == current => Doubt::None,
        Some(r) => Doubt::Changed(format!(
            "the file changed since it was closed (closed: {}; now: {current})",
            r.trim()
        )),
    })
}

/// Whether a clean close may record the store as trustworthy: only when this run's open knew
/// its bytes to be sound (an unverified store stays in doubt until it is verified).
pub(crate) fn may_record_clean_close(integrity: &Integrity) -> bool {
    matches!(integrity, Integrity::New | Integrity::Trusted | Integrity::Verified { .. })
}

/// Records that `store` was closed cleanly as it is now (call once the engine has let go of the
/// file). Written to a temporary file, synced, then renamed into place.
pub(crate) fn write_marker(store: &Path) -> Result<()> {
    let marker = marker_path(store);
    let print = fingerprint(store)
        .map_err(|e| Error::Storage(format!("cannot read {}: {e}", store.display())))?;
    let mut tmp = marker.clone().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        writeln!(f, "{print}")?;
        f.sync_all()?;
        std::fs::rename(&tmp, &marker)
    };
    write().map_err(|e| Error::Storage(format!("cannot write {}: {e}", marker.display())))?;
    sync_dir(store)
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // a real file's change time moves in real time
mod tests {
    use super::*;

    #[test]
    fn the_marker_trusts_only_an_unchanged_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("kv.redb");
        assert_eq!(take_marker(&store).unwrap(), Doubt::New);
        std::fs::write(&store, b"pages").unwrap();
        assert_eq!(take_marker(&store).unwrap(), Doubt::Crashed);
        write_marker(&store).unwrap();
        assert_eq!(take_marker(&store).unwrap(), Doubt::None);
        assert!(!marker_path(&store).exists(), "taken away by the open");
        assert_eq!(take_marker(&store).unwrap(), Doubt::Crashed, "one use only");
        // Written after the clean close, even to the same length: the change time moves.
        write_marker(&store).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&store, b"pagez").unwrap();
        assert!(
            matches!(take_marker(&store).unwrap(), Doubt::Changed(why) if why.contains("changed"))
        );
    }
}
