//! `kairos backup --to FILE`: an online backup of a running node's embedded store, taken by the
//! node (one consistent snapshot while it serves) and streamed over its gRPC API — TLS and
//! mutual TLS as every other client call, an admin key of namespace `*`. The file is written
//! whole or not at all: a temporary file beside it, synced, then renamed into place.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;

/// `kairos backup`.
#[derive(Debug, Args)]
pub(super) struct BackupArgs {
    /// The backup file to write (refused when it exists).
    #[arg(long, value_name = "FILE")]
    to: PathBuf,
    /// The node's gRPC endpoint (https://… for TLS).
    #[arg(
        long,
        env = "KAIROS_ENDPOINT",
        hide_env_values = true,
        default_value = "http://127.0.0.1:7071",
        value_name = "URL"
    )]
    endpoint: String,
    #[command(flatten)]
    tls: kairos_sdk::TlsArgs,
    /// An admin key of namespace `*` (`kai_…`).
    #[arg(long, env = "KAIROS_API_KEY", hide_env_values = true, value_name = "KEY")]
    api_key: Option<String>,
    /// No progress lines on stderr.
    #[arg(long, short)]
    quiet: bool,
}

/// Runs `kairos backup`.
pub(super) async fn run(a: BackupArgs) -> anyhow::Result<()> {
    if a.to.exists() {
        bail!("--to: {} exists already (a backup never overwrites a file)", a.to.display());
    }
    let mut client = kairos_sdk::Client::connect_tls(&a.endpoint, &a.tls.tls()).await?;
    if let Some(k) = a.api_key.as_deref().filter(|k| !k.is_empty()) {
        client = client.with_api_key(k)?;
    }
    let began = Instant::now();
    if !a.quiet {
        eprintln!("kairos backup: {} is taking a snapshot of its store…", a.endpoint);
    }
    let mut stream = client.backup().await.context("starting the backup")?;
    let tmp = temp_path(&a.to);
    let written = receive(&mut stream, &tmp, a.quiet).await;
    let (first, bytes) = match written {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    finish(&tmp, &a.to)?;
    let secs = began.elapsed().as_secs_f64();
    eprintln!(
        "kairos backup: wrote {} — {} in {secs:.1} s; snapshot version {}, {} keys ({} of \
         records); check it with `kairos restore {} --data-dir DIR`",
        a.to.display(),
        mib(bytes),
        first.version,
        first.keys,
        mib(first.record_bytes),
        a.to.display()
    );
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// `DIR/.NAME.partial-PID`: beside the target, so the rename stays on one file system.
fn temp_path(to: &Path) -> PathBuf {
    let name = to.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    to.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

/// Writes every chunk into `tmp` (synced): the first chunk's figures and the bytes written.
async fn receive(
    stream: &mut tonic::Streaming<kairos_proto::v1::BackupChunk>,
    tmp: &Path,
    quiet: bool,
) -> anyhow::Result<(kairos_proto::v1::BackupChunk, u64)> {
    let mut file = create_private(tmp)?;
    let mut first = None;
    let mut written = 0u64;
    let mut shown = Instant::now();
    loop {
        let chunk = match stream.message().await {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(s) => bail!("the node stopped the backup: {}", s.message()),
        };
        file.write_all(&chunk.data).with_context(|| format!("writing {}", tmp.display()))?;
        written += chunk.data.len() as u64;
        let total = first.get_or_insert_with(|| chunk.clone()).file_bytes;
        if !quiet && (shown.elapsed().as_secs() >= 1 || written == total) {
            shown = Instant::now();
            let pct = if total == 0 { 100.0 } else { written as f64 * 100.0 / total as f64 };
            eprintln!("kairos backup: {} of {} ({pct:.0}%)", mib(written), mib(total));
        }
    }
    let Some(first) = first else { bail!("the node ended the backup without sending it") };
    let first = kairos_proto::v1::BackupChunk { data: Vec::new(), ..first };
    if written != first.file_bytes {
        bail!("the backup stream ended early: {written} of {} bytes", first.file_bytes);
    }
    file.sync_all().with_context(|| format!("syncing {}", tmp.display()))?;
    Ok((first, written))
}

fn create_private(path: &Path) -> anyhow::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).with_context(|| format!("creating {}", path.display()))
}

/// Renames `tmp` to `to` and syncs the directory: the file is there whole, or not at all.
fn finish(tmp: &Path, to: &Path) -> anyhow::Result<()> {
    if let Err(e) = std::fs::rename(tmp, to) {
        let _ = std::fs::remove_file(tmp);
        return Err(e).with_context(|| format!("renaming {} to {}", tmp.display(), to.display()));
    }
    sync_parent(to)
}

/// Syncs the directory holding `path` (a rename or a new name is durable after it).
pub(super) fn sync_parent(path: &Path) -> anyhow::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing the directory {}", dir.display()))
}
