//! The `store-created` markers: a data directory that once held an embedded store keeps a
//! marker inside it, and another beside it (in its parent directory, named after it). A store
//! that is then missing or empty is refused rather than silently becoming a new, empty cluster
//! — and the marker beside the directory still says so when the directory itself is empty
//! because the volume that holds it is not mounted (the mount point is an empty directory).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::server::config::NodeConfig;

/// The marker a data directory keeps inside itself once it held a store.
const STORE_MARKER: &str = "store-created";

/// The marker beside the data directory (`<parent>/.<name>.store-created`): outside the
/// volume the directory may be the mount point of. `None` for a directory without a parent
/// or a name (`/`).
fn beside_marker(data_dir: &Path) -> Option<PathBuf> {
    let dir = std::path::absolute(data_dir).ok()?;
    let name = dir.file_name()?.to_string_lossy().into_owned();
    Some(dir.parent()?.join(format!(".{name}.{STORE_MARKER}")))
}

/// The first marker found, and what it says.
fn find_marker(data_dir: &Path) -> Option<(PathBuf, String)> {
    let inside = Some(data_dir.join(STORE_MARKER));
    [inside, beside_marker(data_dir)]
        .into_iter()
        .flatten()
        .find_map(|m| std::fs::read_to_string(&m).ok().map(|text| (m, text)))
}

/// Refuses to start on a data directory whose store existed and is now missing or empty
/// (deleted, truncated, a volume not mounted): that would silently be a new, empty cluster.
pub(super) fn check_store_exists(config: &NodeConfig, store: &Path) -> anyhow::Result<()> {
    let Some((marker, created)) = find_marker(&config.data_dir) else { return Ok(()) };
    let size = std::fs::metadata(store).map(|m| m.len()).ok();
    if size.is_some_and(|s| s > 0) || config.new_store {
        return Ok(());
    }
    let what = if size.is_none() { "is missing" } else { "is empty" };
    let mount = match std::fs::read_dir(&config.data_dir).map(|mut d| d.next().is_none()) {
        Ok(true) | Err(_) => " If the data directory is a volume, is it mounted?",
        Ok(false) => "",
    };
    bail!(
        "the store {} {what}, but this data directory held one ({}: {}).{mount}\n\
         Restore kv.redb from a backup, or start with --new-store to begin a new, empty cluster \
         here (what the old store held is lost).",
        store.display(),
        marker.display(),
        created.trim()
    )
}

/// Records that the data directory now holds a store: inside it, and beside it when its
/// parent directory lets us (a warning at each start says when it does not).
pub(super) fn mark_store_created(config: &NodeConfig) -> anyhow::Result<()> {
    let inside = config.data_dir.join(STORE_MARKER);
    let beside = beside_marker(&config.data_dir);
    let fresh = config.new_store || !inside.exists();
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let now = crate::api::json::rfc3339(ms).unwrap_or_default();
    let dir = std::path::absolute(&config.data_dir).unwrap_or_else(|_| config.data_dir.clone());
    let text = format!("store created {now} by kairos {} in {}\n", crate::VERSION, dir.display());
    if fresh {
        std::fs::write(&inside, &text).with_context(|| format!("writing {}", inside.display()))?;
    }
    let Some(beside) = beside else { return Ok(()) };
    if !fresh && beside.exists() {
        return Ok(());
    }
    // A store created before this marker existed gets it now, with what the inside one says.
    let text = std::fs::read_to_string(&inside).unwrap_or(text);
    if let Err(e) = std::fs::write(&beside, text) {
        let text = format!(
            "cannot write {} ({e}): only the marker inside the data directory guards against \
             starting a new, empty cluster when its volume is not mounted",
            beside.display()
        );
        super::warn(config, &text);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_beside_a_directory_is_named_after_it() {
        let m = beside_marker(Path::new("/var/lib/kairos")).unwrap();
        assert_eq!(m, Path::new("/var/lib/.kairos.store-created"));
        assert_eq!(beside_marker(Path::new("/")), None);
    }
}
