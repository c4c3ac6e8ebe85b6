//! `slidegate serve` with TLS, mutual TLS and on Unix sockets, as a
//! process: certificates made at test time (rcgen), clients with rustls;
//! the certificate served is read back from each handshake. The tests wait
//! on log lines and on connections, never for a fixed time.

#![cfg(unix)]

mod common;

use common::certs::{Ca, Leaf, client};
use common::{listening_on, next_line, serve_fails, serve_logging, signal, spawn_logging, terminate};
use rcgen::KeyPair;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use slidegate_server::proto::descriptor::RateLimitDescriptor;
use slidegate_server::proto::descriptor::rate_limit_descriptor::Entry;
use slidegate_server::proto::rls::RateLimitRequest;
use slidegate_server::proto::rls::rate_limit_response::Code;
use slidegate_server::proto::rls::rate_limit_service_client::RateLimitServiceClient;
use std::future::Future;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// A folder of its own under the system's temporary one, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("slidegate-tls-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// Writes `text` to `name` in the folder; its path, as text.
    fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }

    /// Writes `text` to `name` at once (a rename), as tools that replace
    /// certificates do.
    fn replace(&self, name: &str, text: &str) -> String {
        let staged = self.write(&format!("{name}.new"), text);
        let path = self.0.join(name);
        std::fs::rename(staged, &path).unwrap();
        path.to_str().unwrap().to_owned()
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What an HTTPS `GET` got: the answer (as much as came), the error that
/// ended it, if any (the read's, else the write's), and the server's
/// certificate and ALPN protocol.
struct Answer {
    text: String,
    error: Option<std::io::Error>,
    peer: Option<CertificateDer<'static>>,
    alpn: Option<Vec<u8>>,
}

/// `GET path` over TLS on a connection of its own.
fn https_get(addr: &str, config: Arc<ClientConfig>, path: &str) -> Answer {
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = StreamOwned::new(ClientConnection::new(config, name).unwrap(), tcp);
    let written = write!(
        tls,
        "GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
    )
    .and_then(|()| tls.flush());
    // Read even after a failed write: a refusal's alert may be waiting.
    let mut bytes = Vec::new();
    let error = tls.read_to_end(&mut bytes).err().or(written.err());
    Answer {
        text: String::from_utf8_lossy(&bytes).into_owned(),
        error,
        peer: tls.conn.peer_certificates().and_then(|c| c.first()).cloned(),
        alpn: tls.conn.alpn_protocol().map(<[u8]>::to_vec),
    }
}

/// `ShouldRateLimit` for `d`/`k`=`v` on a connection that `connect`
/// opens; its overall code.
fn rate_limit<C, F, I>(connect: C) -> Result<Code, String>
where
    C: Fn() -> F + Clone + Send + 'static,
    F: Future<Output = std::io::Result<I>> + Send + 'static,
    I: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let channel = tonic::transport::Endpoint::from_static("http://localhost")
            .connect_with_connector(tower::service_fn(move |_: http::Uri| connect()))
            .await
            .map_err(|e| format!("{e:?}"))?;
        let request = RateLimitRequest {
            domain: "d".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "k".to_owned(),
                    value: "v".to_owned(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let answer = RateLimitServiceClient::new(channel)
            .should_rate_limit(request)
            .await
            .map_err(|e| e.to_string())?;
        Ok(answer.into_inner().overall_code())
    })
}

/// What ends a TLS connection to `addr` that sends nothing after its
/// handshake (as far as the client sees it: with TLS 1.3 the server checks
/// the client's certificate after the client is done): the error, or
/// `None` if the server answered nothing and closed without one.
fn refusal(addr: &str, config: Arc<ClientConfig>) -> Option<std::io::Error> {
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = ClientConnection::new(config, name).unwrap();
    while tls.is_handshaking() {
        if let Err(e) = tls.complete_io(&mut tcp) {
            return Some(e);
        }
    }
    let mut bytes = Vec::new();
    let read = StreamOwned::new(tls, tcp).read_to_end(&mut bytes);
    assert!(bytes.is_empty(), "an answer: {}", String::from_utf8_lossy(&bytes));
    read.err()
}

/// [`rate_limit`] over TLS to `addr`, checking that `h2` was negotiated.
fn rate_limit_tls(addr: &str, config: Arc<ClientConfig>) -> Result<Code, String> {
    let addr = addr.to_owned();
    rate_limit(move || {
        let (addr, config) = (addr.clone(), Arc::clone(&config));
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let name = ServerName::try_from("localhost").unwrap();
            let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
            assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
            Ok(hyper_util::rt::TokioIo::new(tls))
        }
    })
}

/// One limit: `d`/`k`, 1 an hour.
const CONFIG: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n";

/// The folder with the config, the server's certificate and key
/// (`cert.pem`, `key.pem`) and the flags serving them.
fn tls_files(name: &str, server: &Leaf) -> (TempDir, Vec<String>) {
    let dir = TempDir::new(name);
    let flags = vec![
        "--config".to_owned(),
        dir.write("d.yaml", CONFIG),
        "--tls-cert".to_owned(),
        dir.write("cert.pem", &server.pem),
        "--tls-key".to_owned(),
        dir.write("key.pem", &server.key_pem),
    ];
    (dir, flags)
}

/// A `slidegate serve` over TLS, listening.
struct Served {
    dir: TempDir,
    child: std::process::Child,
    lines: Receiver<String>,
    log: Vec<String>,
    http: String,
    grpc: String,
}

impl Served {
    /// Serves `server`'s certificate (with [`tls_files`]) and the flags
    /// `extra` makes in its folder.
    fn start(name: &str, server: &Leaf, extra: impl FnOnce(&TempDir) -> Vec<String>) -> Served {
        let (dir, mut flags) = tls_files(name, server);
        flags.extend(extra(&dir));
        let (child, lines) = serve_logging(&flags.iter().map(String::as_str).collect::<Vec<_>>());
        let mut log = Vec::new();
        let (http, grpc) = next_line(&lines, &mut log, listening_on);
        Served {
            dir,
            child,
            lines,
            log,
            http,
            grpc,
        }
    }

    /// The first log line from now on that contains `text`.
    fn wait_for(&mut self, text: &str) -> String {
        next_line(&self.lines, &mut self.log, |l| l.contains(text).then(|| l.to_owned()))
    }

    /// The certificate a new HTTPS connection sees, trusting `ca`.
    fn peer(&self, ca: &Ca) -> Option<CertificateDer<'static>> {
        https_get(&self.http, client(ca, None, b"http/1.1"), "/healthz").peer
    }
}

fn flags(flags: &[&str]) -> Vec<String> {
    flags.iter().map(|&f| f.to_owned()).collect()
}

/// Over TLS, gRPC negotiates `h2` and decides, HTTP negotiates `http/1.1`
/// and answers; a connection that never sends a ClientHello holds up no
/// other and is closed after the header timeout; plain text gets no answer.
#[test]
fn grpc_and_http_answer_over_tls() {
    let ca = Ca::new("test CA");
    let server = ca.server("server A");
    let served = Served::start("serve", &server, |_| flags(&["--header-timeout", "1s"]));
    let (http, grpc) = (&served.http, &served.grpc);

    // Silent connections, open before and during the others' handshakes.
    let mut silent: Vec<std::net::TcpStream> = [http, grpc]
        .iter()
        .map(|addr| std::net::TcpStream::connect(addr).unwrap())
        .collect();

    assert_eq!(rate_limit_tls(grpc, client(&ca, None, b"h2")), Ok(Code::Ok));
    assert_eq!(rate_limit_tls(grpc, client(&ca, None, b"h2")), Ok(Code::OverLimit));
    let answer = https_get(http, client(&ca, None, b"http/1.1"), "/healthz");
    assert!(answer.text.starts_with("HTTP/1.1 200 OK"), "{:?}", answer.error);
    assert_eq!(answer.peer.as_ref(), Some(&server.der));
    assert_eq!(answer.alpn.as_deref(), Some(&b"http/1.1"[..]));

    // Closed by the server after the header timeout: the read ends (the
    // 10 s read timeout would fail the test).
    for stream in &mut silent {
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut byte = [0; 1];
        match stream.read(&mut byte) {
            Ok(n) => assert_eq!(n, 0),
            Err(e) => assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "still open"),
        }
    }

    // Plain HTTP on the TLS port: no HTTP answer.
    let mut plain = std::net::TcpStream::connect(http).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut text = Vec::new();
    let _ = plain.read_to_end(&mut text);
    assert!(!text.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&text));
    terminate(served.child);
}

/// With `--tls-grpc-only`, as envoyproxy/ratelimit's `GRPC_SERVER_USE_TLS`
/// has it, gRPC is served over TLS and HTTP (the health probes) in the
/// clear.
#[test]
fn tls_grpc_only_leaves_http_in_the_clear() {
    let ca = Ca::new("test CA");
    let server = ca.server("server");
    let served = Served::start("grpc-only", &server, |_| flags(&["--tls-grpc-only"]));
    assert_eq!(rate_limit_tls(&served.grpc, client(&ca, None, b"h2")), Ok(Code::Ok));
    let answer = common::request(&served.http, "GET", "/healthcheck", "");
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(refusal(&served.http, client(&ca, None, b"http/1.1")).is_some());
    terminate(served.child);
}

/// With `--tls-client-ca`, a client with a certificate of that CA is
/// served; one without a certificate, or with one of another CA, is refused
/// at the handshake, on both listeners.
#[test]
fn mutual_tls_refuses_clients_without_a_certificate_of_the_ca() {
    let ca = Ca::new("test CA");
    let other = Ca::new("other CA");
    let server = ca.server("server");
    let served = Served::start("mtls", &server, |dir| {
        vec!["--tls-client-ca".to_owned(), dir.write("clients.pem", &ca.pem)]
    });
    let (http, grpc) = (&served.http, &served.grpc);
    let good = ca.client("good client");
    let foreign = other.client("foreign client");

    let answer = https_get(http, client(&ca, Some(&good), b"http/1.1"), "/healthz");
    assert!(answer.text.starts_with("HTTP/1.1 200 OK"), "{:?}", answer.error);
    assert_eq!(rate_limit_tls(grpc, client(&ca, Some(&good), b"h2")), Ok(Code::Ok));

    for (who, me, alert) in [
        ("no certificate", None, "CertificateRequired"),
        ("another CA's", Some(&foreign), "UnknownCA"),
    ] {
        let error = refusal(http, client(&ca, me, b"http/1.1")).map(|e| e.to_string());
        let error = error.unwrap_or_default();
        assert!(
            error.contains(&format!("received fatal alert: {alert}")),
            "{who}: {error}"
        );
        let refused = rate_limit_tls(grpc, client(&ca, me, b"h2"));
        assert!(refused.is_err(), "{who}: {refused:?}");
    }
    terminate(served.child);
}

/// With `--tls-client-san`, a certificate of the client CA must also
/// name that DNS name: one that names it is served, one that does not is
/// refused at the handshake.
#[test]
fn a_client_san_is_required_of_the_clients_certificate() {
    let ca = Ca::new("test CA");
    let server = ca.server("server");
    let good = ca.client("client"); // names localhost and 127.0.0.1
    for (san, served) in [("localhost", true), ("envoy.example", false)] {
        let served_by = Served::start("san", &server, |dir| {
            vec![
                "--tls-client-ca".to_owned(),
                dir.write("clients.pem", &ca.pem),
                "--tls-client-san".to_owned(),
                san.to_owned(),
            ]
        });
        let answer = rate_limit_tls(&served_by.grpc, client(&ca, Some(&good), b"h2"));
        assert_eq!(answer.is_ok(), served, "{san}: {answer:?}");
        terminate(served_by.child);
    }
}

/// SIGHUP reads the TLS files again: new connections get the new
/// certificate; a corrupt file is logged and the certificate in force
/// keeps serving.
#[test]
fn certificates_reload_on_sighup_and_a_bad_file_keeps_the_last_good_one() {
    let ca = Ca::new("test CA");
    let first = ca.server("server A");
    let mut served = Served::start("sighup", &first, |_| flags(&["--reload-every", "0s"]));
    assert_eq!(served.peer(&ca).as_ref(), Some(&first.der));

    let second = ca.server("server B");
    served.dir.write("cert.pem", &second.pem);
    served.dir.write("key.pem", &second.key_pem);
    signal("HUP", &served.child);
    served.wait_for("TLS certificates reloaded");
    assert_eq!(served.peer(&ca).as_ref(), Some(&second.der));

    let cert = served
        .dir
        .write("cert.pem", "-----BEGIN CERTIFICATE-----\nnot base64\n");
    signal("HUP", &served.child);
    let failed = served.wait_for("TLS reload failed");
    assert!(failed.contains(&cert), "{failed}");
    assert!(failed.contains("ERROR"), "{failed}");
    assert_eq!(served.peer(&ca).as_ref(), Some(&second.der));
    terminate(served.child);
    let rest: Vec<String> = served.lines.iter().collect();
    let log = served.log;
    assert!(
        !rest.iter().chain(&log).any(|l| l.contains("panicked")),
        "{log:#?}{rest:#?}"
    );
}

/// The TLS files are watched on `--reload-every`: a certificate replaced
/// (on the same key) is served to new connections without a signal.
#[test]
fn certificates_reload_when_their_files_change() {
    let ca = Ca::new("test CA");
    let key = KeyPair::generate().unwrap();
    let key_pem = key.serialize_pem();
    let first = ca.server_on("server A", key);
    let mut served = Served::start("watch", &first, |_| flags(&["--reload-every", "50ms"]));
    assert_eq!(served.peer(&ca).as_ref(), Some(&first.der));

    let second = ca.server_on("server A, renewed", KeyPair::from_pem(&key_pem).unwrap());
    served.dir.replace("cert.pem", &second.pem);
    served.wait_for("TLS certificates reloaded");
    assert_eq!(served.peer(&ca).as_ref(), Some(&second.der));
    assert!(
        !served.log.iter().any(|l| l.contains("TLS reload failed")),
        "{:#?}",
        served.log
    );
    terminate(served.child);
}

/// `--grpc unix:PATH` and `--http unix:PATH` serve on Unix sockets (a stale
/// socket file replaced), print their paths, and remove them on exit; a
/// path that holds a file or a live socket is refused.
#[test]
fn unix_sockets_serve_and_are_removed_on_exit() {
    let dir = TempDir::new("unix");
    let config = dir.write("d.yaml", CONFIG);
    let (http_path, grpc_path) = (dir.path("http.sock"), dir.path("grpc.sock"));
    // A socket file nothing accepts on, as a killed process leaves it.
    drop(std::os::unix::net::UnixListener::bind(&grpc_path).unwrap());
    assert!(Path::new(&grpc_path).exists());

    // The addresses from the environment.
    let mut command = common::slidegate();
    command
        .args(["serve", "--drain-delay", "0s", "--config", &config])
        .env("SLIDEGATE_HTTP", format!("unix:{http_path}"))
        .env("SLIDEGATE_GRPC", format!("unix:{grpc_path}"));
    let (child, lines) = spawn_logging(&mut command);
    let (http, grpc) = next_line(&lines, &mut Vec::new(), listening_on);
    assert_eq!(http, format!("unix:{http_path}"));
    assert_eq!(grpc, format!("unix:{grpc_path}"));

    let connect = {
        let path = grpc_path.clone();
        move || {
            let path = path.clone();
            async move {
                Ok(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }
    };
    assert_eq!(rate_limit(connect.clone()), Ok(Code::Ok));
    assert_eq!(rate_limit(connect), Ok(Code::OverLimit));
    let mut stream = std::os::unix::net::UnixStream::connect(&http_path).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");

    // Taken paths: a second server on the live socket, one on a file.
    let plain_file = dir.write("file.sock", "not a socket");
    for (path, reason) in [
        (&http_path, "another process accepts on this socket"),
        (&plain_file, "the path exists and is not a socket"),
    ] {
        let out = common::slidegate()
            .args(["serve", "--grpc", "127.0.0.1:0", "--http"])
            .arg(format!("unix:{path}"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("cannot listen on unix:{path}")), "{stderr}");
        assert!(stderr.contains(reason), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    }
    assert!(
        Path::new(&plain_file).exists(),
        "a file that is not a socket is left alone"
    );

    terminate(child);
    assert!(!Path::new(&http_path).exists(), "the HTTP socket is removed");
    assert!(!Path::new(&grpc_path).exists(), "the gRPC socket is removed");
}

/// Half the TLS flags, a missing file, a key of another certificate or a CA
/// file without a certificate: status 1 and one line naming the flag and
/// the file.
#[test]
fn bad_tls_flags_and_files_stop_it_with_one_line() {
    let ca = Ca::new("test CA");
    let server = ca.server("server");
    let other = ca.server("other");
    let (dir, _) = tls_files("bad", &server);
    let (cert, key) = (dir.path("cert.pem"), dir.path("key.pem"));
    let other_key = dir.write("other-key.pem", &other.key_pem);
    let empty = dir.write("empty.pem", "");
    let missing = dir.path("missing.pem");
    for (flags, expected) in [
        (vec!["--tls-cert", &cert], "--tls-cert needs --tls-key".to_owned()),
        (vec!["--tls-key", &key], "--tls-key needs --tls-cert".to_owned()),
        (
            vec!["--tls-client-ca", &cert],
            "--tls-client-ca needs --tls-cert".to_owned(),
        ),
        (
            vec!["--tls-cert", &missing, "--tls-key", &key],
            format!("--tls-cert {missing}: No such file"),
        ),
        (
            vec!["--tls-cert", &cert, "--tls-key", &other_key],
            format!("--tls-key {other_key}: it does not match the certificate {cert}"),
        ),
        (
            vec!["--tls-cert", &cert, "--tls-key", &empty],
            format!("--tls-key {empty}: no PEM private key in it"),
        ),
        (
            vec!["--tls-cert", &cert, "--tls-key", &key, "--tls-client-ca", &empty],
            format!("--tls-client-ca {empty}: no PEM certificate in it"),
        ),
    ] {
        let (code, stderr) = serve_fails(&flags);
        assert_eq!(code, Some(1), "{flags:?}: {stderr}");
        assert_eq!(stderr.matches(&expected).count(), 1, "{flags:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{flags:?}: {stderr}");
    }
}
