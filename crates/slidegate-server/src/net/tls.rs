//! TLS with rustls (the `ring` provider): the certificate, key and client
//! CA files, loaded into one server config per front end (ALPN `h2` for
//! gRPC, `http/1.1` for HTTP) and loaded again when they change.
//!
//! # Concurrency
//!
//! The configs in force sit behind a read-write lock that a new
//! connection holds only to clone two `Arc`s; a reload parses the files
//! without it (on a blocking thread) and takes it to swap them whole, so a
//! handshake uses either the old files or the new ones, never a mix.
//! Handshakes under way keep the config they started with.

use parking_lot::{Mutex, RwLock};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls::{RootCertStore, ServerConfig};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// The files TLS serves with (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsOptions {
    /// The certificate chain, the server's own certificate first.
    pub cert: PathBuf,
    /// The private key of the certificate (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Mutual TLS: the CA certificates a client's certificate must be
    /// signed by; a client without one is refused at the handshake.
    /// `None` asks clients for no certificate.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: the DNS name a client certificate's subject
    /// alternative names must hold (envoyproxy/ratelimit's
    /// `GRPC_CLIENT_TLS_SAN`); a certificate of the CA without it is
    /// refused at the handshake.
    pub client_san: Option<String>,
    /// Whether the HTTP listener serves TLS too; the gRPC listener always
    /// does. Off, as envoyproxy/ratelimit's `GRPC_SERVER_USE_TLS`, the
    /// health probes and `/metrics` stay plain HTTP.
    pub http: bool,
}

/// Which of the [`TlsOptions`] files an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsFile {
    /// [`TlsOptions::cert`].
    Cert,
    /// [`TlsOptions::key`].
    Key,
    /// [`TlsOptions::client_ca`].
    ClientCa,
}

impl fmt::Display for TlsFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsFile::Cert => "TLS certificate",
            TlsFile::Key => "TLS key",
            TlsFile::ClientCa => "client CA",
        })
    }
}

/// A TLS file that cannot be read or used.
#[derive(Debug, thiserror::Error)]
#[error("cannot load the {file} {}: {reason}", path.display())]
pub struct TlsError {
    file: TlsFile,
    path: PathBuf,
    reason: String,
}

impl TlsError {
    fn new(file: TlsFile, path: &Path, reason: impl fmt::Display) -> Self {
        TlsError {
            file,
            path: path.to_owned(),
            reason: reason.to_string(),
        }
    }

    /// Which file.
    pub fn file(&self) -> TlsFile {
        self.file
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What is wrong with it.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// The front end a config is for, by its ALPN protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Alpn {
    /// gRPC: `h2`.
    H2,
    /// HTTP: `http/1.1`.
    Http1,
}

/// The configs in force, one per front end.
struct Configs {
    grpc: Arc<ServerConfig>,
    http: Arc<ServerConfig>,
}

/// TLS as the files say now, reloadable.
pub(crate) struct Tls {
    options: TlsOptions,
    configs: RwLock<Configs>,
    /// The files' fingerprint when last read.
    seen: Mutex<Vec<crate::net::watch::FileStamp>>,
}

/// The largest TLS file read, in bytes: a certificate chain is a few
/// kilobytes, a CA bundle a few hundred.
const MAX_FILE_BYTES: u64 = 4 << 20;

impl Tls {
    /// Loads the files (blocking: they are read here).
    pub(crate) fn load(options: TlsOptions) -> Result<Tls, TlsError> {
        let seen = fingerprint(&options);
        let configs = configs(&options)?;
        Ok(Tls {
            options,
            configs: RwLock::new(configs),
            seen: Mutex::new(seen),
        })
    }

    /// [`Tls::load`] on a blocking thread, off the async runtime's.
    pub(crate) async fn load_blocking(options: TlsOptions) -> Result<Tls, TlsError> {
        let cert = options.cert.clone();
        match tokio::task::spawn_blocking(move || Tls::load(options)).await {
            Ok(loaded) => loaded,
            Err(e) => Err(TlsError::new(
                TlsFile::Cert,
                &cert,
                format_args!("loading stopped: {e}"),
            )),
        }
    }

    /// An acceptor for one connection, with the files in force now.
    pub(crate) fn acceptor(&self, alpn: Alpn) -> TlsAcceptor {
        let configs = self.configs.read();
        TlsAcceptor::from(Arc::clone(match alpn {
            Alpn::H2 => &configs.grpc,
            Alpn::Http1 => &configs.http,
        }))
    }

    /// Reads the files again (blocking) and, if they are good, serves new
    /// handshakes with them; if not, the old ones stay in force. Logs the
    /// outcome.
    pub(crate) fn reload(&self) -> Result<(), TlsError> {
        *self.seen.lock() = fingerprint(&self.options);
        match configs(&self.options) {
            Ok(configs) => {
                *self.configs.write() = configs;
                tracing::info!(cert = %self.options.cert.display(), "TLS certificates reloaded");
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, "TLS reload failed; the previous certificates stay in force");
                Err(e)
            }
        }
    }

    /// [`Tls::reload`] if a file changed (its length or modification
    /// time) since it was last read (blocking).
    pub(crate) fn reload_if_changed(&self) {
        let now = fingerprint(&self.options);
        if *self.seen.lock() != now {
            let _ = self.reload();
        }
    }
}

fn fingerprint(options: &TlsOptions) -> Vec<crate::net::watch::FileStamp> {
    let mut files = vec![options.cert.clone(), options.key.clone()];
    files.extend(options.client_ca.clone());
    crate::net::watch::fingerprint(&files)
}

/// Reads one file, bounded.
fn read(file: TlsFile, path: &Path) -> Result<Vec<u8>, TlsError> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| TlsError::new(file, path, e))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(TlsError::new(
            file,
            path,
            format_args!("larger than {MAX_FILE_BYTES} bytes"),
        ));
    }
    Ok(bytes)
}

fn certificates(file: TlsFile, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(&read(file, path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new(file, path, e))?;
    if certs.is_empty() {
        return Err(TlsError::new(file, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// Both front ends' configs from the files.
fn configs(options: &TlsOptions) -> Result<Configs, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(TlsFile::Cert, &options.cert)?;
    let key = PrivateKeyDer::from_pem_slice(&read(TlsFile::Key, &options.key)?).map_err(|e| {
        let reason = match e {
            rustls::pki_types::pem::Error::NoItemsFound => "no PEM private key in it".to_owned(),
            e => e.to_string(),
        };
        TlsError::new(TlsFile::Key, &options.key, reason)
    })?;
    let certified = CertifiedKey::from_der(chain, key, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => TlsError::new(
            TlsFile::Key,
            &options.key,
            format_args!("it does not match the certificate {}", options.cert.display()),
        ),
        rustls::Error::InvalidCertificate(e) => TlsError::new(TlsFile::Cert, &options.cert, e),
        e => TlsError::new(TlsFile::Key, &options.key, e),
    })?;
    let certified = Arc::new(certified);
    let verifier = match &options.client_ca {
        None => None,
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(TlsFile::ClientCa, path)? {
                roots.add(cert).map_err(|e| TlsError::new(TlsFile::ClientCa, path, e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                .build()
                .map_err(|e| TlsError::new(TlsFile::ClientCa, path, e))?;
            Some(match &options.client_san {
                None => verifier,
                Some(name) => {
                    Arc::new(SanVerifier::new(verifier, name).map_err(|e| TlsError::new(TlsFile::ClientCa, path, e))?)
                }
            })
        }
    };
    let config = |alpn: &[u8]| {
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::new(TlsFile::Cert, &options.cert, e))?;
        let builder = match &verifier {
            Some(verifier) => builder.with_client_cert_verifier(Arc::clone(verifier)),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::clone(&certified))));
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok::<_, TlsError>(Arc::new(config))
    };
    Ok(Configs {
        grpc: config(b"h2")?,
        http: config(b"http/1.1")?,
    })
}

/// A client certificate verifier that also wants `name` among the
/// certificate's DNS subject alternative names.
#[derive(Debug)]
struct SanVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    name: ServerName<'static>,
}

impl SanVerifier {
    fn new(inner: Arc<dyn ClientCertVerifier>, name: &str) -> Result<SanVerifier, String> {
        let name = ServerName::try_from(name.to_owned())
            .map_err(|_| format!("the client SAN `{name}` is not a DNS name or an IP address"))?;
        Ok(SanVerifier { inner, name })
    }
}

impl ClientCertVerifier for SanVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        let cert = webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        cert.verify_is_valid_for_subject_name(&self.name)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::NotValidForName))?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
