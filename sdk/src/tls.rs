//! TLS towards a node: an `https://` endpoint is verified against the webpki roots (Mozilla's
//! CA list, built in: no system store, no OpenSSL), or against a CA of your own
//! ([`Tls::ca_cert`]); a client certificate ([`Tls::client_cert`] and [`Tls::client_key`])
//! answers a node that requires mutual TLS.

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::error::Error;

/// How a client secures its connection to an `https://` endpoint. The default verifies the
/// node against the webpki roots and presents no certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// PEM CA certificate(s) to verify the node against, instead of the webpki roots.
    pub ca_cert: Option<PathBuf>,
    /// PEM client certificate (chain) to present, for a node requiring mutual TLS.
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `client_cert`.
    pub client_key: Option<PathBuf>,
}

impl Tls {
    /// Whether any option is set (they need an `https://` endpoint).
    pub fn is_set(&self) -> bool {
        self.ca_cert.is_some() || self.client_cert.is_some() || self.client_key.is_some()
    }

    /// The tonic configuration, its files read now.
    pub(crate) fn client_config(&self) -> Result<ClientTlsConfig, Error> {
        let mut config = ClientTlsConfig::new();
        config = match &self.ca_cert {
            Some(ca) => config.ca_certificate(Certificate::from_pem(read("CA certificate", ca)?)),
            None => config.with_webpki_roots(),
        };
        match (&self.client_cert, &self.client_key) {
            (Some(cert), Some(key)) => {
                let identity =
                    Identity::from_pem(read("client certificate", cert)?, read("client key", key)?);
                config = config.identity(identity);
            }
            (None, None) => {}
            _ => {
                return Err(Error::Invalid(
                    "a client certificate and its key go together: give both or neither".into(),
                ));
            }
        }
        Ok(config)
    }
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path)
        .map_err(|e| Error::Invalid(format!("cannot read the {what} {}: {e}", path.display())))
}

/// The TLS options of the command lines (`kairosctl`, `kairos worker`); with the `cli` feature.
#[cfg(feature = "cli")]
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// PEM CA certificate to verify an https:// node against, instead of the built-in
    /// (webpki) roots.
    #[arg(long, env = "KAIROS_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// PEM client certificate to present to a node requiring mutual TLS (with --client-key).
    #[arg(long, env = "KAIROS_CLIENT_CERT", value_name = "FILE", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(long, env = "KAIROS_CLIENT_KEY", value_name = "FILE", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

#[cfg(feature = "cli")]
impl TlsArgs {
    /// The options as the client takes them.
    pub fn tls(&self) -> Tls {
        Tls {
            ca_cert: self.ca_cert.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
        }
    }
}
