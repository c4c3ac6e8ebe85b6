//! Redis over TLS as [`RedisOptions`] builds it: one server and a cluster
//! that take TLS only and only from clients with a certificate of their
//! CA (certificates made at test time with rcgen), and the errors that
//! stop a start, each naming its file or option.

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use slidegate_conformance::redis::{KEY_PREFIX, RedisServer, free_port};
use slidegate_core::{Algorithm, Policy};
use slidegate_redis::{RedisConnectError, RedisOptions, RedisTls};
use slidegate_store::{Decisions, FailurePolicy, Quota, Store};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A folder of its own, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("slidegate-redis-tls-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA of the test's own.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

/// A certificate's and its key's files.
struct Leaf {
    cert: PathBuf,
    key: PathBuf,
}

impl Ca {
    fn new() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "redis test CA");
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            issuer: Issuer::new(params, key),
            pem,
        }
    }

    /// A certificate for 127.0.0.1, written in `dir` as `name.pem` and
    /// `name.key`.
    fn leaf(&self, dir: &TempDir, name: &str, usage: ExtendedKeyUsagePurpose) -> Leaf {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: dir.write(&format!("{name}.pem"), &cert.pem()),
            key: dir.write(&format!("{name}.key"), &key.serialize_pem()),
        }
    }
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// What the tests share: a folder, a CA, its file, a client certificate.
struct Setup {
    dir: TempDir,
    ca: Ca,
    ca_file: PathBuf,
    client: Leaf,
}

impl Setup {
    fn new(name: &str) -> Setup {
        let dir = TempDir::new(name);
        let ca = Ca::new();
        let ca_file = dir.write("ca.pem", &ca.pem);
        let client = ca.leaf(&dir, "client", ExtendedKeyUsagePurpose::ClientAuth);
        Setup {
            dir,
            ca,
            ca_file,
            client,
        }
    }

    /// A `redis-server` taking TLS at the port answered (and plain TCP at
    /// its own port, for the checks), requiring a client certificate of
    /// the CA; `extra` arguments after.
    fn server(&self, extra: &[&str]) -> (RedisServer, u16) {
        let server = self.ca.leaf(&self.dir, "server", ExtendedKeyUsagePurpose::ServerAuth);
        let mut last = String::new();
        for _ in 0..5 {
            let tls_port = free_port().to_string();
            let mut args = vec![
                "--tls-port",
                &tls_port,
                "--tls-cert-file",
                text(&server.cert),
                "--tls-key-file",
                text(&server.key),
                "--tls-ca-cert-file",
                text(&self.ca_file),
                "--tls-auth-clients",
                "yes",
            ];
            args.extend_from_slice(extra);
            match RedisServer::start_on(free_port(), &args) {
                Ok(server) => return (server, tls_port.parse().unwrap()),
                Err(e) => last = e,
            }
        }
        panic!("no TLS redis-server: {last}");
    }

    /// The CA, the client certificate and its key.
    fn tls(&self) -> RedisTls {
        RedisTls {
            ca: Some(self.ca_file.clone()),
            client_cert: Some(self.client.cert.clone()),
            client_key: Some(self.client.key.clone()),
            skip_hostname_verification: false,
        }
    }
}

/// Options for `urls` with `tls`; a failure refuses, so that an allowed
/// decision comes from Redis.
fn options(urls: Vec<String>, tls: RedisTls) -> RedisOptions {
    RedisOptions {
        urls,
        failure: FailurePolicy::Closed,
        timeout: Duration::from_secs(2),
        prefix: format!("{KEY_PREFIX}tls:"),
        tls,
        ..RedisOptions::default()
    }
}

/// Builds the store of `options`, decides once on `key` (allowed) and
/// checks that its key is in `server`.
async fn decides_in(options: RedisOptions, server: &RedisServer, key: &str) {
    let (store, probe) = options.connect_probed().await.unwrap();
    assert!(probe.answers().await);
    let quota = Quota::new(Policy::new(5, Duration::from_secs(60), Algorithm::FixedWindow).unwrap());
    let mut out = Decisions::new();
    store
        .decide(key, std::slice::from_ref(&quota), 1, &mut out)
        .await
        .unwrap();
    assert!(out[0].allowed());
    let keys = server.keys_and_ttls();
    assert!(keys.iter().any(|(k, _)| k.contains(key)), "{key} in {keys:?}");
}

#[tokio::test]
async fn one_server_over_tls_with_a_client_certificate() {
    let setup = Setup::new("one");
    let (server, tls_port) = setup.server(&[]);
    let url = format!("rediss://127.0.0.1:{tls_port}/");
    decides_in(options(vec![url.clone()], setup.tls()), &server, "alice").await;

    // Without the client certificate, Redis refuses the handshake.
    let anonymous = RedisTls {
        ca: Some(setup.ca_file.clone()),
        ..RedisTls::default()
    };
    match options(vec![url.clone()], anonymous).connect().await {
        Err(RedisConnectError::Connect { urls, .. }) => assert_eq!(urls, url),
        other => panic!("{:?}", other.err()),
    }
    // Without the CA, the system's roots do not know the server's.
    let untrusted = RedisTls {
        ca: None,
        ..setup.tls()
    };
    let e = options(vec![url], untrusted).connect().await.err().unwrap();
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");
}

/// A one-node cluster (every slot on it) that announces its TLS port to
/// TLS clients (`tls-cluster yes`).
#[tokio::test]
async fn a_cluster_over_tls_with_a_client_certificate() {
    let setup = Setup::new("cluster");
    let nodes = setup.dir.0.join("nodes.conf");
    let (server, tls_port) = setup.server(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        text(&nodes),
        "--tls-cluster",
        "yes",
        "--tls-replication",
        "yes",
    ]);
    assert_eq!(server.cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]), "OK");
    let up = server.wait_answer(&["CLUSTER", "INFO"], "cluster_state:ok", Duration::from_secs(10));
    assert!(up, "the cluster never came up");
    let options = RedisOptions {
        cluster: true,
        ..options(vec![format!("rediss://127.0.0.1:{tls_port}/")], setup.tls())
    };
    decides_in(options, &server, "bob").await;
}

/// Every file that cannot be used is named, before any connection (no
/// Redis runs here); options that contradict each other are refused.
#[tokio::test]
async fn bad_files_and_options_are_named() {
    let setup = Setup::new("bad");
    let url = || vec!["rediss://127.0.0.1:1/".to_owned()];
    let error = |options: RedisOptions| async move { options.connect().await.err().unwrap().to_string() };
    let missing = setup.dir.0.join("missing.pem");
    let not_pem = setup.dir.write("not.pem", "hello\n");
    let other = setup.ca.leaf(&setup.dir, "other", ExtendedKeyUsagePurpose::ClientAuth);
    let with = |tls: RedisTls| options(url(), tls);
    let e = error(with(RedisTls {
        ca: Some(missing.clone()),
        ..setup.tls()
    }))
    .await;
    assert!(
        e.starts_with(&format!("Redis TLS CA file {}: cannot read it: ", missing.display())),
        "{e}"
    );
    let e = error(with(RedisTls {
        ca: Some(not_pem.clone()),
        ..setup.tls()
    }))
    .await;
    assert_eq!(
        e,
        format!("Redis TLS CA file {}: no PEM certificate in it", not_pem.display())
    );
    let e = error(with(RedisTls {
        client_cert: Some(not_pem.clone()),
        ..setup.tls()
    }))
    .await;
    assert_eq!(
        e,
        format!(
            "Redis TLS client certificate {}: no PEM certificate in it",
            not_pem.display()
        )
    );
    let e = error(with(RedisTls {
        client_key: Some(setup.client.cert.clone()),
        ..setup.tls()
    }))
    .await;
    assert!(
        e.starts_with(&format!(
            "Redis TLS client key {}: no PEM private key in it",
            setup.client.cert.display()
        )),
        "{e}"
    );
    let e = error(with(RedisTls {
        client_key: Some(other.key.clone()),
        ..setup.tls()
    }))
    .await;
    assert!(
        e.starts_with(&format!(
            "Redis TLS client key {}: it does not go with the certificate {}",
            other.key.display(),
            setup.client.cert.display()
        )),
        "{e}"
    );
    let e = error(with(RedisTls {
        client_key: None,
        ..setup.tls()
    }))
    .await;
    assert_eq!(e, "bad Redis TLS options: a client certificate needs its key");

    for (options, says) in [
        (
            options(vec!["redis://127.0.0.1:1/".to_owned()], setup.tls()),
            "bad Redis options: TLS files or options are set but the URLs are not `rediss://`",
        ),
        (
            options(
                vec!["rediss://127.0.0.1:1/".to_owned(), "redis://127.0.0.1:2/".to_owned()],
                RedisTls::default(),
            ),
            "bad Redis options: some URLs are `rediss://` (TLS) and some are not: all or none",
        ),
        (
            RedisOptions {
                sentinel: Some("mymaster".to_owned()),
                ..options(url(), setup.tls())
            },
            "bad Redis options: slidegate does not reach Redis Sentinel over TLS (`rediss://`) yet",
        ),
        (
            options(vec!["rediss://127.0.0.1:1/#insecure".to_owned()], RedisTls::default()),
            "bad Redis URL `rediss://127.0.0.1:1/#insecure`: `#insecure` would check no certificate; skip only \
             the host name check instead",
        ),
    ] {
        let e = error(options).await;
        assert!(e.starts_with(says), "{e}");
    }
}
