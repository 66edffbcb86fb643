//! The commit the binary is built from, for `kairos_build_info{commit}`: `git rev-parse` of
//! the source tree, or `KAIROS_BUILD_COMMIT` when set (a build from a tarball or in a
//! container without `.git`), else `unknown`.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=KAIROS_BUILD_COMMIT");
    let commit =
        std::env::var("KAIROS_BUILD_COMMIT").ok().filter(|c| !c.is_empty()).or_else(|| {
            let out =
                Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
            let c = String::from_utf8(out.stdout).ok()?.trim().to_string();
            (out.status.success() && !c.is_empty()).then_some(c)
        });
    // Rebuilt when HEAD moves (a worktree's .git is a file naming the real directory).
    if let Ok(dir) = Command::new("git").args(["rev-parse", "--git-dir"]).output()
        && dir.status.success()
    {
        let dir = String::from_utf8_lossy(&dir.stdout).trim().to_string();
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/logs/HEAD");
    }
    println!("cargo:rustc-env=KAIROS_BUILD_COMMIT={}", commit.as_deref().unwrap_or("unknown"));
}
