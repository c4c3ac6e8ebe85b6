//! Certificates made at test time (rcgen): a CA, server and client
//! certificates signed by it, and rustls client configs trusting it.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};
use std::sync::Arc;

/// A certificate authority.
pub struct Ca {
    pub pem: String,
    pub der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key.
pub struct Leaf {
    pub pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca {
            pem: cert.pem(),
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate for `localhost` and 127.0.0.1, on a new key.
    pub fn server(&self, name: &str) -> Leaf {
        self.server_on(name, KeyPair::generate().unwrap())
    }

    /// A server certificate for `localhost` and 127.0.0.1, on `key`.
    pub fn server_on(&self, name: &str, key: KeyPair) -> Leaf {
        self.leaf(name, key, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate.
    pub fn client(&self, name: &str) -> Leaf {
        self.leaf(name, KeyPair::generate().unwrap(), ExtendedKeyUsagePurpose::ClientAuth)
    }

    pub fn leaf(&self, name: &str, key: KeyPair, usage: ExtendedKeyUsagePurpose) -> Leaf {
        self.leaf_for(name, key, vec![usage])
    }

    /// A certificate for both ends of a connection (server and client), as
    /// Envoy Gateway's certificate of its rate limit service is: it serves
    /// gRPC and is shown to the control plane.
    pub fn both(&self, name: &str) -> Leaf {
        let usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        self.leaf_for(name, KeyPair::generate().unwrap(), usages)
    }

    fn leaf_for(&self, name: &str, key: KeyPair, usages: Vec<ExtendedKeyUsagePurpose>) -> Leaf {
        let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = usages;
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }
}

/// A client trusting `ca`, presenting `me` if given, offering `alpn`.
pub fn client(ca: &Ca, me: Option<&Leaf>, alpn: &[u8]) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.der.clone()).unwrap();
    let builder = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match me {
        Some(leaf) => {
            let key = PrivateKeyDer::try_from(pem_der(&leaf.key_pem)).unwrap();
            builder.with_client_auth_cert(vec![leaf.der.clone()], key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

/// The DER inside a one-item PEM text.
pub fn pem_der(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .secret_der()
        .to_vec()
}
