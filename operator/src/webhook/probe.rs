//! A real `ConversionReview` sent to the webhook the way the apiserver sends
//! it: over HTTPS, trusting only the CA bundle the CRD will carry. The CRDs
//! are pointed at the webhook only after it answered one.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use kube::Resource as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use slotkeeper_api::{RedisCluster, v1alpha1};

use super::review::PATH;

const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("the CA bundle holds no usable certificate")]
    Bundle,
    #[error("{server_name:?} is not a valid TLS server name")]
    ServerName { server_name: String },
    #[error("cannot reach the webhook at {address}: {source}")]
    Connect { address: SocketAddr, source: std::io::Error },
    #[error("HTTP to the webhook at {address} failed: {reason}")]
    Http { address: SocketAddr, reason: String },
    #[error("the webhook at {address} answered {answer}")]
    Answer { address: SocketAddr, answer: String },
    #[error("the webhook at {address} did not answer within {PROBE_TIMEOUT:?}")]
    Timeout { address: SocketAddr },
}

/// Sends one review converting a `v1alpha1` RedisCluster to `v1` to
/// `address`, verifying the certificate against `ca_bundle` for `server_name`.
pub async fn probe(address: SocketAddr, server_name: &str, ca_bundle: &str) -> Result<(), ProbeError> {
    tokio::time::timeout(PROBE_TIMEOUT, exchange(address, server_name, ca_bundle))
        .await
        .map_err(|_| ProbeError::Timeout { address })?
}

async fn exchange(address: SocketAddr, server_name: &str, ca_bundle: &str) -> Result<(), ProbeError> {
    let http = |reason: String| ProbeError::Http { address, reason };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_bundle.as_bytes()) {
        roots.add(cert.map_err(|_| ProbeError::Bundle)?).map_err(|_| ProbeError::Bundle)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| http(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(server_name.to_string())
        .map_err(|_| ProbeError::ServerName { server_name: server_name.into() })?;
    let tcp =
        tokio::net::TcpStream::connect(address).await.map_err(|source| ProbeError::Connect { address, source })?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|source| ProbeError::Connect { address, source })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .map_err(|e| http(e.to_string()))?;
    tokio::spawn(connection);
    let request = hyper::Request::post(PATH)
        .header(hyper::header::HOST, server_name)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(sample_review().to_string())))
        .map_err(|e| http(e.to_string()))?;
    let response = sender.send_request(request).await.map_err(|e| http(e.to_string()))?;
    let status = response.status();
    let body = response.into_body().collect().await.map_err(|e| http(e.to_string()))?.to_bytes();
    let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if status.is_success() && answered_sample(&answer) {
        return Ok(());
    }
    Err(ProbeError::Answer { address, answer: format!("HTTP {status}: {}", String::from_utf8_lossy(&body)) })
}

const PROBE_UID: &str = "slotkeeper-webhook-probe";

fn sample_review() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {
            "uid": PROBE_UID,
            "desiredAPIVersion": RedisCluster::api_version(&()),
            "objects": [{
                "apiVersion": v1alpha1::RedisCluster::api_version(&()),
                "kind": "RedisCluster",
                "metadata": { "name": "probe", "namespace": "probe", "uid": PROBE_UID },
                "spec": { "masters": 3, "version": "7.0.15" },
            }],
        },
    })
}

fn answered_sample(answer: &Value) -> bool {
    let response = &answer["response"];
    response["uid"] == PROBE_UID
        && response["result"]["status"] == "Success"
        && response["convertedObjects"][0]["apiVersion"] == RedisCluster::api_version(&()).as_ref()
        && response["convertedObjects"][0]["spec"]["redis"]["version"] == "7.0.15"
}
