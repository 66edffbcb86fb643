//! End-to-end tests that start real `kairos` processes; see `tests/tests/`. What they share:
//! a minimal HTTP/1.1 client for the node's HTTP API, a single `kairos dev` node ([`dev`]),
//! certificates for the TLS tests ([`pki`]), and a real cluster in network namespaces for the
//! cluster tests ([`cluster`]), and a WebDriver client for the console's browser tests
//! ([`webdriver`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub mod cluster;
pub mod dev;
pub mod webdriver;

/// One HTTP/1.1 request on its own connection to 127.0.0.1:`port`: `(status, body)`; a chunked
/// body is reduced to its JSON part.
pub fn http_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    http_request_at(SocketAddr::from(([127, 0, 0, 1], port)), method, path, headers, body)
}

/// [`http_request`] to any address (connecting for at most 2 s).
pub fn http_request_at(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    let body = match (body.find('{'), body.rfind('}')) {
        (Some(a), Some(b)) if b > a => body[a..=b].to_string(),
        _ => body,
    };
    Ok((status, body))
}

/// Certificates for the TLS tests, made on the spot.
pub mod pki {
    use std::path::{Path, PathBuf};

    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair,
    };

    /// A certificate authority.
    pub struct Ca {
        issuer: CertifiedIssuer<'static, KeyPair>,
    }

    /// A certificate and its key, PEM.
    pub struct Leaf {
        /// The certificate, PEM.
        pub cert_pem: String,
        /// Its private key, PEM (PKCS#8).
        pub key_pem: String,
        /// The certificate, DER (what a peer presents).
        pub der: Vec<u8>,
    }

    impl Ca {
        /// A new CA named `name`.
        pub fn new(name: &str) -> Ca {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, name);
            let issuer =
                CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
            Ca { issuer }
        }

        /// The CA certificate, PEM.
        pub fn pem(&self) -> String {
            self.issuer.pem()
        }

        /// Writes the CA certificate to `dir/name`; returns the path.
        pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
            let p = dir.join(name);
            std::fs::write(&p, self.pem()).unwrap();
            p
        }

        fn leaf(&self, cn: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
            let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
            let mut params = CertificateParams::new(sans).unwrap();
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &self.issuer).unwrap();
            Leaf { cert_pem: cert.pem(), key_pem: key.serialize_pem(), der: cert.der().to_vec() }
        }

        /// A server certificate for `localhost` and 127.0.0.1.
        pub fn server(&self, cn: &str) -> Leaf {
            self.leaf(cn, &["localhost", "127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth)
        }

        /// A client certificate.
        pub fn client(&self, cn: &str) -> Leaf {
            self.leaf(cn, &[], ExtendedKeyUsagePurpose::ClientAuth)
        }
    }

    impl Leaf {
        /// Writes `dir/{name}.pem` and `dir/{name}.key`; returns their paths.
        pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
            let (c, k) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.key")));
            std::fs::write(&c, &self.cert_pem).unwrap();
            std::fs::write(&k, &self.key_pem).unwrap();
            (c, k)
        }
    }
}
