//! `kairosctl man --out DIR`: the manual pages, generated from the command line's definitions
//! (clap): `kairosctl.1`, and one page per subcommand (`kairosctl-submit.1`,
//! `kairosctl-cron-create.1`, …) naming its flags. The same rendering as `kairos man`.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// Writes a page for `cmd` and each of its subcommands (recursively) into `out` (created if
/// missing); the files written.
pub fn write_pages(mut cmd: clap::Command, out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).with_context(|| format!("--out: creating {}", out.display()))?;
    cmd.build();
    let mut written = Vec::new();
    page(&cmd, cmd.get_name().to_string(), out, &mut written)?;
    Ok(written)
}

fn page(
    cmd: &clap::Command,
    name: String,
    out: &Path,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let mut text = Vec::new();
    // clap names are `&'static str` without its `string` feature: a few bytes per page, once.
    let static_name: &'static str = name.clone().leak();
    clap_mangen::Man::new(cmd.clone().name(static_name))
        .render(&mut text)
        .with_context(|| format!("rendering the page of {name}"))?;
    let path = out.join(format!("{name}.1"));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        page(sub, format!("{name}-{}", sub.get_name()), out, written)?;
    }
    Ok(())
}
