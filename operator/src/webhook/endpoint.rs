//! Where the apiserver reaches the conversion webhook, and what that means
//! for the serving certificate's names and the CRD's `clientConfig`.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};

use super::certs::Lifetimes;
use super::review::PATH;

/// How the CRDs address the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A Service in front of every replica (the `deploy/` manifests).
    Service { namespace: String, name: String, port: u16 },
    /// An HTTPS URL (the local environment: the apiserver cannot route to a
    /// Service there, so every replica listens on one loopback port).
    Url { url: String, host: String, port: u16 },
}

impl Endpoint {
    /// An `https://host:port/convert` URL; refuses anything else by name.
    pub fn url(url: &str) -> Result<Endpoint, String> {
        let rest =
            url.strip_prefix("https://").ok_or_else(|| format!("--webhook-url {url:?} must start with https://"))?;
        let authority = rest.split('/').next().unwrap_or_default();
        let (host, port) = match authority.rsplit_once(':').map(|(host, port)| (host, port.parse::<u16>())) {
            Some((host, Ok(port))) => (host, port),
            _ => (authority, 443),
        };
        if host.is_empty() || authority.contains('@') || rest.contains(['?', '#']) {
            return Err(format!(
                "--webhook-url {url:?} must be https://HOST[:PORT]{PATH} without user, query or fragment"
            ));
        }
        Ok(Endpoint::Url { url: url.to_string(), host: host.trim_matches(['[', ']']).to_string(), port })
    }

    /// The names the serving certificate must carry.
    pub fn subject_alt_names(&self) -> Vec<String> {
        match self {
            Endpoint::Service { namespace, name, .. } => {
                vec![format!("{name}.{namespace}.svc"), format!("{name}.{namespace}.svc.cluster.local")]
            }
            Endpoint::Url { host, .. } => vec![host.clone()],
        }
    }

    /// The name a client verifies: the first subject alternative name.
    pub fn server_name(&self) -> String {
        self.subject_alt_names().remove(0)
    }

    /// The CRD's `spec.conversion.webhook.clientConfig` with `ca_bundle` (PEM).
    pub fn client_config(&self, ca_bundle: &str) -> Value {
        let ca_bundle = base64_of(ca_bundle.as_bytes());
        match self {
            Endpoint::Service { namespace, name, port } => json!({
                "service": { "namespace": namespace, "name": name, "port": port, "path": PATH },
                "caBundle": ca_bundle,
            }),
            Endpoint::Url { url, .. } => json!({ "url": url, "caBundle": ca_bundle }),
        }
    }
}

/// The webhook's settings, from the command line.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// Where this replica serves HTTPS.
    pub listen: SocketAddr,
    pub endpoint: Endpoint,
    /// The Secret holding the CA and the serving certificate.
    pub secret_namespace: String,
    pub secret_name: String,
    pub lifetimes: Lifetimes,
    /// How often each replica re-reads the Secret (a renewed certificate is
    /// served within this).
    pub reload_every: Duration,
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_endpoint_names_its_host_and_refuses_what_the_apiserver_would() {
        let endpoint = Endpoint::url("https://127.0.0.1:9443/convert").unwrap();
        assert_eq!(endpoint.subject_alt_names(), ["127.0.0.1"]);
        assert_eq!(endpoint.client_config("PEM")["url"], "https://127.0.0.1:9443/convert");
        assert!(matches!(endpoint, Endpoint::Url { port: 9443, .. }));
        assert!(matches!(Endpoint::url("https://hook.example/convert").unwrap(), Endpoint::Url { port: 443, .. }));
        assert!(Endpoint::url("http://127.0.0.1/convert").unwrap_err().contains("https://"));
        assert!(Endpoint::url("https://u@h/convert").is_err());
        assert!(Endpoint::url("https://h/convert?x=1").is_err());
    }

    #[test]
    fn a_service_endpoint_names_the_service_and_its_path() {
        let endpoint = Endpoint::Service { namespace: "ns".into(), name: "hook".into(), port: 443 };
        assert_eq!(endpoint.server_name(), "hook.ns.svc");
        let config = endpoint.client_config("abc");
        assert_eq!(config["service"]["path"], PATH);
        assert_eq!(config["caBundle"], "YWJj");
    }
}
