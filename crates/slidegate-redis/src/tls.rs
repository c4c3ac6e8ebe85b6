//! TLS to Redis: the files [`RedisTls`] names, read and checked before
//! any connection, each error naming its file, then handed to redis-rs's
//! own TLS (rustls on the `ring` provider).

use redis::{ClientTlsConfig, TlsCertificates};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};

/// How to talk TLS to Redis; TLS itself is on when the URLs are
/// `rediss://` (all of them, or none). Off by default: no file, the
/// system's roots, the host name checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// A PEM file of the certificate authorities that sign Redis's
    /// certificate, trusted in place of the system's roots; `None`: the
    /// system's roots.
    pub ca: Option<PathBuf>,
    /// A PEM file of the client certificate (and its chain) to present to
    /// a Redis that asks for one (`tls-auth-clients yes`); with
    /// [`RedisTls::client_key`], both or neither.
    pub client_cert: Option<PathBuf>,
    /// The PEM file of [`RedisTls::client_cert`]'s private key.
    pub client_key: Option<PathBuf>,
    /// Accept a certificate that does not name the host connected to (a
    /// Redis reached by an address its certificate does not list); its
    /// chain is still checked against the roots. Not for Sentinel.
    pub skip_hostname_verification: bool,
}

impl RedisTls {
    /// Whether any option is set (they need `rediss://` URLs).
    pub(crate) fn is_set(&self) -> bool {
        *self != RedisTls::default()
    }

    /// The files, read and checked: the certificates redis-rs takes.
    pub(crate) fn certificates(&self) -> Result<TlsCertificates, RedisTlsError> {
        let root_cert = match &self.ca {
            Some(path) => {
                let pem = read(path, "CA file")?;
                let mut roots = RootCertStore::empty();
                for cert in certs(path, "CA file", &pem)? {
                    roots.add(cert).map_err(|e| RedisTlsError::File {
                        what: "CA file",
                        path: path.clone(),
                        reason: format!("a certificate in it is no CA: {e}"),
                    })?;
                }
                Some(pem)
            }
            None => None,
        };
        let client_tls = match (&self.client_cert, &self.client_key) {
            (None, None) => None,
            (Some(_), None) => return Err(RedisTlsError::Options("a client certificate needs its key")),
            (None, Some(_)) => return Err(RedisTlsError::Options("a client key needs its certificate")),
            (Some(cert_path), Some(key_path)) => {
                let client_cert = read(cert_path, "client certificate")?;
                let chain = certs(cert_path, "client certificate", &client_cert)?;
                let client_key = read(key_path, "client key")?;
                let key = PrivateKeyDer::from_pem_slice(&client_key).map_err(|e| RedisTlsError::File {
                    what: "client key",
                    path: key_path.clone(),
                    reason: format!("no PEM private key in it: {e}"),
                })?;
                CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider()).map_err(|e| {
                    RedisTlsError::File {
                        what: "client key",
                        path: key_path.clone(),
                        reason: format!("it does not go with the certificate {}: {e}", cert_path.display()),
                    }
                })?;
                Some(ClientTlsConfig {
                    client_cert,
                    client_key,
                })
            }
        };
        // redis-rs builds its rustls configurations on the process's default
        // provider: make it `ring` unless the application chose one.
        if CryptoProvider::get_default().is_none() {
            // Losing a race to another installer is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        Ok(TlsCertificates { client_tls, root_cert })
    }
}

/// Why the TLS options cannot be used: a file cannot be read or is not
/// the PEM it should be, or the options contradict each other.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedisTlsError {
    /// A file cannot be read or holds no usable PEM.
    #[error("Redis TLS {what} {}: {reason}", path.display())]
    File {
        /// Which file: `CA file`, `client certificate`, `client key`.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Options that contradict each other.
    #[error("bad Redis TLS options: {0}")]
    Options(&'static str),
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, RedisTlsError> {
    std::fs::read(path).map_err(|e| RedisTlsError::File {
        what,
        path: path.to_owned(),
        reason: format!("cannot read it: {e}"),
    })
}

/// The certificates of a PEM text, at least one.
fn certs(path: &Path, what: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, RedisTlsError> {
    let bad = |reason: String| RedisTlsError::File {
        what,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".to_owned()));
    }
    Ok(certs)
}
