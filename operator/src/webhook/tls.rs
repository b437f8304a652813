//! HTTPS for the webhook, with a certificate that can be replaced while serving.
//! Uses the ring provider explicitly, never the process-wide default, so that no
//! second crypto provider (aws-lc-rs) is needed or can make rustls panic.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// A client that connects but never finishes the handshake holds only its own task, and only this long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Back-off after an accept error that is not about one connection (e.g. out of file descriptors).
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_secs(1);

/// Errors never include the private key or parts of it.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("the certificate PEM holds no certificate")]
    NoCertificate,
    #[error("cannot parse the certificate PEM: {0}")]
    Certificate(#[source] rustls::pki_types::pem::Error),
    #[error("cannot parse the private key PEM")]
    PrivateKey,
    #[error("the certificate and key were rejected: {0}")]
    Rejected(#[source] rustls::Error),
}

/// The serving certificate, swappable at any time; handshakes that start afterwards
/// use the new one, established connections keep theirs.
#[derive(Debug)]
pub struct ReloadableCert {
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadableCert {
    /// `cert_pem` may hold a chain, leaf first.
    pub fn new(cert_pem: &str, key_pem: &str) -> Result<Arc<Self>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let current = certified_key(&provider, cert_pem, key_pem)?;
        Ok(Arc::new(ReloadableCert { provider, current: RwLock::new(Arc::new(current)) }))
    }

    /// Checks the new pair fully before swapping, so a bad pair leaves the old one serving.
    pub fn replace(&self, cert_pem: &str, key_pem: &str) -> Result<(), TlsError> {
        let next = Arc::new(certified_key(&self.provider, cert_pem, key_pem)?);
        // A poisoned lock still holds a complete Arc: nothing can be half-written.
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = next;
        Ok(())
    }

    fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn server_config(self: &Arc<Self>) -> Result<ServerConfig, rustls::Error> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

impl ResolvesServerCert for ReloadableCert {
    /// Ignores SNI: the apiserver sends none when the webhook URL is an IP address.
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Serves `app` over HTTPS (HTTP/1.1 and HTTP/2 by ALPN) on `listener` until the task is
/// dropped. Each connection's handshake runs in its own task, so a slow client delays no one.
pub async fn serve_https(listener: TcpListener, app: axum::Router, certs: Arc<ReloadableCert>) -> io::Result<()> {
    let acceptor = TlsAcceptor::from(Arc::new(certs.server_config().map_err(io::Error::other)?));
    loop {
        match listener.accept().await {
            Ok((tcp, peer)) => {
                tokio::spawn(serve_connection(acceptor.clone(), tcp, peer, app.clone()));
            }
            Err(error) if is_connection_error(&error) => {}
            Err(error) => {
                tracing::error!(%error, "webhook listener cannot accept connections");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
    }
}

async fn serve_connection(acceptor: TlsAcceptor, tcp: TcpStream, peer: SocketAddr, app: axum::Router) {
    // An answer is written in TLS records as it is produced: without this,
    // Nagle's algorithm holds the last one for the peer's delayed ACK (a
    // 1,000-object answer took 40-90 ms instead of 3).
    if let Err(error) = tcp.set_nodelay(true) {
        tracing::debug!(%peer, %error, "cannot set TCP_NODELAY on a webhook connection");
    }
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            log_handshake_error(peer, &error);
            return;
        }
        Err(_elapsed) => {
            tracing::debug!(%peer, "webhook TLS handshake timed out");
            return;
        }
    };
    let service = TowerToHyperService::new(app);
    let builder = auto::Builder::new(TokioExecutor::new());
    if let Err(error) = builder.serve_connection(TokioIo::new(tls), service).await {
        tracing::debug!(%peer, %error, "webhook connection ended with an error");
    }
}

/// A bad caBundle shows up here as the apiserver rejecting our certificate, so real
/// handshake failures are warnings; a bare TCP connect-and-close (a probe) is not.
fn log_handshake_error(peer: SocketAddr, error: &io::Error) {
    if error.kind() == io::ErrorKind::UnexpectedEof {
        tracing::debug!(%peer, %error, "webhook client closed before the TLS handshake finished");
    } else {
        tracing::warn!(%peer, %error, "webhook TLS handshake failed");
    }
}

/// Errors about one connection that went away before it was accepted.
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

fn certified_key(provider: &CryptoProvider, cert_pem: &str, key_pem: &str) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(TlsError::Certificate)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|_| TlsError::PrivateKey)?;
    // Also checks that the key belongs to the leaf certificate.
    CertifiedKey::from_der(chain, key, provider).map_err(TlsError::Rejected)
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
