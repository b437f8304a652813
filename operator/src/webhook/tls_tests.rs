use std::error::Error;
use std::net::{IpAddr, Ipv4Addr};
use std::time::SystemTime;

use axum::routing::get;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use super::*;
use crate::webhook::certs::{self, Authority, ServingCert};

type TestResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

fn new_pki() -> (Authority, ServingCert) {
    let now = SystemTime::now();
    let lifetimes = certs::Lifetimes::default();
    let authority = certs::new_authority(now, lifetimes.ca).unwrap();
    let serving = certs::issue_serving(&authority, &["127.0.0.1".to_owned()], now, lifetimes.serving).unwrap();
    (authority, serving)
}

/// Starts `serve_https` on an ephemeral port with a router answering "ok" on GET /.
async fn start_server(certs: Arc<ReloadableCert>) -> SocketAddr {
    let listener = TcpListener::bind((LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route("/", get(|| async { "ok" }));
    tokio::spawn(serve_https(listener, app, certs));
    addr
}

/// A client that trusts only `ca_pem`, verifying with rustls' WebPKI verifier.
fn client(ca_pem: &str, alpn: &[&[u8]]) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

async fn get_root(addr: SocketAddr, ca_pem: &str) -> TestResult<String> {
    let tcp = TcpStream::connect(addr).await?;
    let mut tls = client(ca_pem, &[]).connect(ServerName::IpAddress(LOCALHOST.into()), tcp).await?;
    tls.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").await?;
    let mut response = String::new();
    tls.read_to_string(&mut response).await?;
    Ok(response)
}

fn body(response: &str) -> &str {
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response.split_once("\r\n\r\n").map_or("", |(_, body)| body)
}

#[tokio::test]
async fn serves_https_and_reloads_a_new_authority_without_restart() {
    let (old_authority, old_serving) = new_pki();
    let certs = ReloadableCert::new(&old_serving.cert_pem, &old_serving.key_pem).unwrap();
    let addr = start_server(certs.clone()).await;

    assert_eq!(body(&get_root(addr, &old_authority.ca_cert_pem).await.unwrap()), "ok");

    let (new_authority, new_serving) = new_pki();
    certs.replace(&new_serving.cert_pem, &new_serving.key_pem).unwrap();

    let rejected = get_root(addr, &old_authority.ca_cert_pem).await.expect_err("the old CA still verifies the server");
    assert!(rejected.to_string().contains("invalid peer certificate"), "{rejected}");
    assert_eq!(body(&get_root(addr, &new_authority.ca_cert_pem).await.unwrap()), "ok");
    // During a CA rotation the caBundle holds both CAs, which share a subject name.
    let both = format!("{}{}", old_authority.ca_cert_pem, new_authority.ca_cert_pem);
    assert_eq!(body(&get_root(addr, &both).await.unwrap()), "ok");
}

#[tokio::test]
async fn a_stalled_handshake_does_not_block_others() {
    let (authority, serving) = new_pki();
    let addr = start_server(ReloadableCert::new(&serving.cert_pem, &serving.key_pem).unwrap()).await;
    let _silent = TcpStream::connect(addr).await.unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), get_root(addr, &authority.ca_cert_pem)).await;
    assert_eq!(body(&response.expect("blocked by the silent client").unwrap()), "ok");
}

#[tokio::test]
async fn offers_http2_by_alpn() {
    let (authority, serving) = new_pki();
    let addr = start_server(ReloadableCert::new(&serving.cert_pem, &serving.key_pem).unwrap()).await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let connector = client(&authority.ca_cert_pem, &[b"h2", b"http/1.1"]);
    let tls = connector.connect(ServerName::IpAddress(LOCALHOST.into()), tcp).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
}

#[test]
fn rejects_a_key_that_does_not_match_the_certificate() {
    let (_, serving) = new_pki();
    let (_, other) = new_pki();
    let error = ReloadableCert::new(&serving.cert_pem, &other.key_pem).unwrap_err();
    assert!(matches!(error, TlsError::Rejected(_)), "{error}");
}

#[test]
fn a_failed_replace_keeps_the_current_certificate() {
    let (_, serving) = new_pki();
    let certs = ReloadableCert::new(&serving.cert_pem, &serving.key_pem).unwrap();
    let before = certs.current();
    assert!(matches!(certs.replace("", &serving.key_pem), Err(TlsError::NoCertificate)));
    assert!(matches!(certs.replace(&serving.cert_pem, "garbage"), Err(TlsError::PrivateKey)));
    assert!(Arc::ptr_eq(&before, &certs.current()));
}
