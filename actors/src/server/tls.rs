//! TLS on the node's two listeners (rustls with the ring provider: no OpenSSL).
//!
//! The certificate chain and private key come from PEM files (`tls_cert_file`,
//! `tls_key_file`); both listeners present them. With `tls_client_ca_file` the **gRPC**
//! listener also requires every client (workers, `kairosctl`, SDK clients) to present a
//! certificate signed by that CA (mutual TLS); the HTTP listener never asks for one (it
//! serves `/healthz` to probes and `/metrics` to scrapers, and its callers are authenticated
//! above TLS).
//!
//! The files are **reloaded** without a restart: [`ServerTls::watch`] re-reads them every
//! `tls_reload_ms` and at once on SIGHUP; when their contents changed and they still make a
//! valid certificate and key, new connections get the new ones (connections already open keep
//! theirs). A broken set (a key that does not match the certificate, a file half written) is
//! reported and the previous certificate stays in use until the files are fixed.
//!
//! Each accepted connection's handshake runs in its own task with a time-out, so a client
//! that never finishes its handshake holds up nobody else.

// Real sockets and files at the process's edge, on the wall clock (polling the files, backing
// off a failing accept); the simulation serves its API without TLS.
#![allow(clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;

use crate::server::config::{ConfigError, NodeConfig};
use crate::server::conns::Guarded;

/// Longest a client may take over its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The files TLS is configured from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain, the node's own certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificate(s) client certificates must be signed by (gRPC listener only).
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// The files `config` names; `None` when TLS is off (no `tls_cert_file`).
    pub fn from_config(config: &NodeConfig) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: config.tls_cert_file.clone()?,
            key: config.tls_key_file.clone()?,
            client_ca: config.tls_client_ca_file.clone(),
        })
    }

    fn read(&self) -> Result<Contents, ConfigError> {
        Ok(Contents {
            cert: read("tls_cert_file", &self.cert)?,
            key: read("tls_key_file", &self.key)?,
            client_ca: match &self.client_ca {
                Some(p) => Some(read("tls_client_ca_file", p)?),
                None => None,
            },
        })
    }
}

/// The files' bytes, as last read.
#[derive(Clone, PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

fn bad(setting: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError { setting: setting.into(), reason: reason.into() }
}

fn read(setting: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| bad(setting, format!("cannot read {}: {e}", path.display())))
}

/// The rustls configurations of both listeners, built from one read of the files.
struct Loaded {
    contents: Contents,
    grpc: Arc<ServerConfig>,
    http: Arc<ServerConfig>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

fn certificates(
    setting: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(setting, format!("{}: not PEM certificates: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(bad(setting, format!("{}: no CERTIFICATE block", path.display())));
    }
    Ok(certs)
}

fn build(files: &TlsFiles, contents: Contents) -> Result<Loaded, ConfigError> {
    let certs = certificates("tls_cert_file", &files.cert, &contents.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| {
        bad(
            "tls_key_file",
            format!("{}: no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}", files.key.display()),
        )
    })?;
    let provider = provider();
    let client_verifier = match (&files.client_ca, &contents.client_ca) {
        (Some(path), Some(pem)) => {
            let mut roots = RootCertStore::empty();
            for ca in certificates("tls_client_ca_file", path, pem)? {
                roots.add(ca).map_err(|e| {
                    bad("tls_client_ca_file", format!("{}: not a usable CA: {e}", path.display()))
                })?;
            }
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| bad("tls_client_ca_file", format!("{}: {e}", path.display())))?
        }
        _ => WebPkiClientVerifier::no_client_auth(),
    };
    let config = |verifier, alpn: &[u8]| {
        let mut c = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("tls_cert_file", e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| {
                bad(
                    "tls_key_file",
                    format!(
                        "{} with the certificate {}: {e}",
                        files.key.display(),
                        files.cert.display()
                    ),
                )
            })?;
        c.alpn_protocols = vec![alpn.to_vec()];
        Ok::<_, ConfigError>(Arc::new(c))
    };
    // gRPC is HTTP/2 (which TLS clients negotiate by ALPN); the HTTP API is HTTP/1.1.
    let grpc = config(client_verifier, b"h2")?;
    let http = config(WebPkiClientVerifier::no_client_auth(), b"http/1.1")?;
    Ok(Loaded { contents, grpc, http })
}

/// The node's TLS configuration, reloadable. Cheap to clone (clones share it).
#[derive(Clone)]
pub struct ServerTls {
    files: Arc<TlsFiles>,
    current: Arc<RwLock<Arc<Loaded>>>,
    /// The last reload failure, so a broken file is reported once, not at every poll.
    last_error: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("files", &self.files).finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads and checks the files: an error names the setting whose file is at fault.
    pub fn load(files: TlsFiles) -> Result<ServerTls, ConfigError> {
        let loaded = build(&files, files.read()?)?;
        Ok(ServerTls {
            files: Arc::new(files),
            current: Arc::new(RwLock::new(Arc::new(loaded))),
            last_error: Arc::new(Mutex::new(None)),
        })
    }

    /// The files.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    fn current(&self) -> Arc<Loaded> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The gRPC listener's configuration now.
    pub fn grpc_config(&self) -> Arc<ServerConfig> {
        self.current().grpc.clone()
    }

    /// The HTTP listener's configuration now.
    pub fn http_config(&self) -> Arc<ServerConfig> {
        self.current().http.clone()
    }

    /// Re-reads the files: `Ok(true)` when they changed and are now in use, `Ok(false)` when
    /// unchanged, an error (the previous configuration staying in use) when they no longer
    /// make a valid certificate and key.
    pub fn reload(&self) -> Result<bool, ConfigError> {
        let contents = self.files.read()?;
        if contents == self.current().contents {
            return Ok(false);
        }
        let loaded = build(&self.files, contents)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(loaded);
        Ok(true)
    }

    /// [`reload`](Self::reload), logging the outcome (a failure once until it changes).
    fn reload_logged(&self, why: &str) {
        let outcome = self.reload();
        let mut last = self.last_error.lock().unwrap_or_else(|p| p.into_inner());
        match outcome {
            Ok(true) => {
                *last = None;
                tracing::info!(cert = %self.files.cert.display(), why, "TLS certificate reloaded");
            }
            Ok(false) => *last = None,
            Err(e) => {
                let msg = e.to_string();
                if last.as_deref() != Some(msg.as_str()) {
                    tracing::error!(error = %msg, why, "TLS files not reloaded; the previous certificate stays in use");
                    *last = Some(msg);
                }
            }
        }
    }

    /// Reloads the files every `every` (none: never by time) and on each SIGHUP, until the
    /// returned task is aborted.
    pub fn watch(&self, every: Option<Duration>) -> tokio::task::JoinHandle<()> {
        let tls = self.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            let mut hup =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
            loop {
                let tick = async {
                    match every {
                        Some(d) => tokio::time::sleep(d).await,
                        None => std::future::pending().await,
                    }
                };
                #[cfg(unix)]
                let hangup = async {
                    match hup.as_mut() {
                        Some(h) => {
                            h.recv().await;
                        }
                        None => std::future::pending().await,
                    }
                };
                #[cfg(not(unix))]
                let hangup = std::future::pending::<()>();
                let why = tokio::select! {
                    () = tick => "poll",
                    () = hangup => "SIGHUP",
                };
                // File reads and certificate parsing: off the runtime's threads.
                let t = tls.clone();
                let _ = tokio::task::spawn_blocking(move || t.reload_logged(why)).await;
            }
        })
    }
}

/// A connection a listener admitted ([`crate::server::conns`]).
type Admitted = Guarded<TcpStream>;

/// Connections accepted on a listener, their TLS handshakes done.
pub type Accepted = mpsc::Receiver<(TlsStream<Admitted>, SocketAddr)>;

/// Performs the TLS handshake of each connection a listener `admitted` in its own task, with
/// the configuration `config` gives at that moment (so a reload applies to the next
/// connection). Stops when the receiver is dropped.
pub fn accept(
    mut admitted: mpsc::Receiver<(Admitted, SocketAddr)>,
    config: impl Fn() -> Arc<ServerConfig> + Send + 'static,
) -> Accepted {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                c = admitted.recv() => match c {
                    Some(c) => c,
                    None => return,
                },
                () = tx.closed() => return,
            };
            let acceptor = TlsAcceptor::from(config());
            let tx = tx.clone();
            tokio::spawn(async move {
                let handshake = acceptor.accept(tcp).into_fallible();
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send((tls, peer)).await;
                    }
                    Ok(Err((e, tcp))) => {
                        tracing::info!(%peer, error = %e, "TLS handshake refused");
                        linger(tcp).await;
                    }
                    Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    rx
}

/// Closes a refused connection so that the client reads the alert saying why: a TLS 1.3
/// client has already sent its first request when its certificate is refused, and closing a
/// socket with unread data resets it, which may discard the alert before the client reads it.
/// So: end our side, then read what the client sent until it closes (at most a second).
async fn linger(mut tcp: Admitted) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let drain = async {
        let _ = tcp.shutdown().await;
        let mut buf = [0u8; 4096];
        while let Ok(n) = tcp.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}
