//! The data directory is private (issue 24): it holds every tenant's inputs and outputs, the
//! API keys' hashes and the cursor-signing secret. The node creates it 0700 and every file in
//! it 0600 (a umask of 077 for the node's process), and at start it makes an existing one
//! private again — saying loudly what it changed — rather than serve from a store others can
//! read. It refuses to start when it cannot (the files belong to another user).

use std::path::Path;

use anyhow::{Context, bail};

/// Makes `dir` (created if missing) and the files directly in it private to this user; the
/// changes made, one line each (`path: 0644 → 0600`).
pub(super) fn private_data_dir(dir: &Path) -> anyhow::Result<Vec<String>> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        // Every file the node creates from here on: its owner's only.
        // SAFETY: umask only sets the process's file-creation mask.
        unsafe { libc::umask(0o077) };
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
        let mut changed = Vec::new();
        let mut tighten = |path: &Path, private: u32| -> anyhow::Result<()> {
            let meta = std::fs::symlink_metadata(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 == 0 || meta.file_type().is_symlink() {
                return Ok(());
            }
            let wanted = mode & private;
            if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(wanted))
            {
                bail!(
                    "{} is readable by other users (mode {mode:o}) and cannot be made private \
                     ({e}); run the node as its owner, or `chmod {wanted:o} {}`",
                    path.display(),
                    path.display()
                );
            }
            changed.push(format!("{}: {mode:o} → {wanted:o}", path.display()));
            Ok(())
        };
        tighten(dir, 0o700)?;
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            let private = if path.is_dir() { 0o700 } else { 0o600 };
            tighten(&path, private)?;
        }
        Ok(changed)
    }
    #[cfg(not(unix))]
    {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Vec::new())
    }
}
