//! Keeps the conversion webhook's certificates: every replica serves the
//! certificate stored in one Secret and re-reads it; the leader renews it
//! well before expiry and keeps the CRDs' `caBundle` on the CAs that sign it.
//!
//! A CA is replaced in three checkpointed steps, each in the Secret or the
//! CRD, so that every handshake verifies throughout: (1) the new CA goes
//! into the Secret, the old one kept as `ca-previous.crt`; (2) the CRDs get
//! both in their `caBundle`; (3) only then a serving certificate from the new
//! CA. The CRDs are never changed while a storage migration of our group runs
//! (a CRD change then keeps `storedVersions` from being trimmed), nor pointed
//! at a webhook that has not answered a real `ConversionReview`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::storagemigration::v1::StorageVersionMigration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;
use slotkeeper_api::names::{FIELD_MANAGER, LABEL_MANAGED_BY};

use super::certs::{self, Authority, CertError, Renewal, ServingCert};
use super::endpoint::{Endpoint, WebhookConfig};
use super::probe::{ProbeError, probe};
use super::rotation::{self, Step};
use super::tls::{ReloadableCert, TlsError};
use crate::metrics::Metrics;

/// The CA a replaced CA's serving certificates chain to, kept in the bundle.
pub const PREVIOUS_CA_KEY: &str = "ca-previous.crt";
/// How long after a CRD's conversion settings changed before a serving
/// certificate from a new CA is presented: the apiserver takes a moment to
/// use the new caBundle (measured here: conversions failed for 0.9 s after
/// the first one was set).
const BUNDLE_SETTLE: Duration = Duration::from_secs(10);
/// How long a storage migration may take before a CA replacement it holds
/// back is late; a shorter CA lifetime than three times this is warned of.
const MIGRATION_HEADROOM: Duration = Duration::from_secs(30 * 60);
/// How often the leader looks at the CRDs even when no certificate is due.
const TEND_AT_LEAST_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("webhook Secret {namespace}/{name}: {source}")]
    Secret { namespace: String, name: String, source: kube::Error },
    #[error("webhook Secret {namespace}/{name} is unusable: {source}")]
    Certificates { namespace: String, name: String, source: CertError },
    #[error("webhook Secret {namespace}/{name} was deleted as it was created; retrying")]
    Vanished { namespace: String, name: String },
    #[error("cannot serve the webhook's certificate: {0}")]
    Tls(#[from] TlsError),
    #[error("CustomResourceDefinition {name}: {source}")]
    Crd { name: String, source: kube::Error },
    #[error("cannot list StorageVersionMigrations: {0}")]
    Migrations(kube::Error),
    #[error("the webhook did not answer a ConversionReview, so the CRDs are not pointed at it: {0}")]
    Probe(#[from] ProbeError),
}

type Result<T, E = WebhookError> = std::result::Result<T, E>;

/// What the Secret holds.
struct Stored {
    authority: Authority,
    serving: ServingCert,
    previous_ca: Option<String>,
    resource_version: Option<String>,
}

impl Stored {
    /// The CRDs' `caBundle`: the current CA, and the previous one while
    /// serving certificates it signed may still be served.
    fn bundle(&self) -> String {
        let mut bundle = self.authority.ca_cert_pem.clone();
        if let Some(previous) = &self.previous_ca {
            bundle.push_str(previous);
        }
        bundle
    }
}

pub struct Keeper {
    client: Client,
    config: WebhookConfig,
    certs: Arc<ReloadableCert>,
    /// The serving certificate this replica serves now (PEM).
    served: Mutex<String>,
}

impl Keeper {
    /// Reads the Secret, creating it the first time, and loads its serving
    /// certificate: after this the webhook can answer.
    pub async fn start(client: Client, config: WebhookConfig) -> Result<Arc<Keeper>> {
        let headroom = config.lifetimes.ca / 3;
        if headroom < MIGRATION_HEADROOM {
            tracing::warn!(
                headroom_seconds = headroom.as_secs(),
                "the webhook CA's last third of life is short: a CA replacement due during a storage migration waits for it, and conversions fail if the CA expires first"
            );
        }
        let stored = load_or_create(&client, &config).await?;
        let certs = ReloadableCert::new(&stored.serving.cert_pem, &stored.serving.key_pem)?;
        let served = Mutex::new(stored.serving.cert_pem);
        Ok(Arc::new(Keeper { client, config, certs, served }))
    }

    /// Serves `/convert` over HTTPS until the process stops. The port is
    /// shared (`SO_REUSEPORT`) so that replicas on one host, as in the local
    /// environment, all answer at the one URL the CRDs name.
    pub async fn serve(self: Arc<Self>, metrics: Arc<Metrics>) -> std::io::Result<()> {
        let socket = match self.config.listen {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.set_reuseport(true)?;
        socket.bind(self.config.listen)?;
        let listener = socket.listen(1024)?;
        tracing::info!(addr = %self.config.listen, "serving the conversion webhook over HTTPS");
        super::tls::serve_https(listener, super::review::router(metrics), self.certs.clone()).await
    }

    /// Every replica: serves the Secret's serving certificate within
    /// `reload_every` of a renewal.
    pub async fn follow(self: Arc<Self>) {
        loop {
            tokio::time::sleep(self.config.reload_every).await;
            match read(&self.client, &self.config).await {
                Ok(Some(stored)) => self.present(&stored.serving),
                Ok(None) => tracing::warn!("the webhook Secret is gone; the leader recreates it"),
                Err(error) => tracing::warn!(%error, "cannot re-read the webhook Secret"),
            }
        }
    }

    /// Presents `serving` to new handshakes, if it is not the one presented already.
    fn present(&self, serving: &ServingCert) {
        let mut served = self.served.lock().unwrap_or_else(PoisonError::into_inner);
        if *served == serving.cert_pem {
            return;
        }
        match self.certs.replace(&serving.cert_pem, &serving.key_pem) {
            Ok(()) => {
                tracing::info!("serving the webhook's renewed certificate");
                *served = serving.cert_pem.clone();
            }
            Err(error) => {
                tracing::warn!(%error, "the webhook Secret's certificate is unusable; keeping the current one")
            }
        }
    }

    /// The leader: renews certificates when due and keeps the CRDs' conversion
    /// settings on this webhook, until the process stops.
    pub async fn lead(self: Arc<Self>) {
        loop {
            let wait = match self.tend().await {
                Ok(wait) => wait.min(TEND_AT_LEAST_EVERY),
                Err(error) => {
                    tracing::warn!(%error, "conversion webhook upkeep failed; retrying");
                    Duration::from_secs(5)
                }
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// One round: the CRDs first (a renewal may wait for them), then at most
    /// one certificate step. Returns when to look again.
    async fn tend(&self) -> Result<Duration> {
        let stored = load_or_create(&self.client, &self.config).await?;
        self.present(&stored.serving);
        let crds = crd_state(&self.client).await?;
        let bundled = self.point_crds(&crds, &stored).await?;
        let now = SystemTime::now();
        let sans = self.config.endpoint.subject_alt_names();
        let renewal = certs::renewal(&stored.authority, &stored.serving, &sans, now);
        let migration = if renewal == Renewal::NewAuthority { migration_running(&self.client).await? } else { None };
        let serving_due = certs::serving_due(&stored.authority, &stored.serving, &sans, now);
        match rotation::step(renewal, serving_due, bundled, migration.is_some()) {
            Step::Keep => {}
            Step::ReplaceAuthority => self.replace_authority(&stored, now).await?,
            Step::ReplaceServing => self.replace_serving(&stored, now).await?,
            Step::WaitForBundle => {
                tracing::info!("a new serving certificate waits until the CRDs trust its CA");
                return Ok(Duration::from_secs(5));
            }
            Step::AuthorityWaitsForMigration => {
                let migration = migration.unwrap_or_default();
                tracing::info!(%migration, "the webhook's CA is due; its replacement waits for the storage migration");
                return Ok(Duration::from_secs(5));
            }
        }
        Ok(certs::next_check(&stored.authority, &stored.serving, now))
    }

    /// Points every two-version CRD of ours at this webhook with the
    /// Secret's bundle, when it is not already. Returns whether every CRD
    /// trusts the current CA.
    async fn point_crds(&self, crds: &[CustomResourceDefinition], stored: &Stored) -> Result<bool> {
        let bundle = stored.bundle();
        let wanted = self.config.endpoint.client_config(&bundle);
        let stale: Vec<&CustomResourceDefinition> =
            crds.iter().filter(|crd| serves_two_versions(crd) && client_config(crd) != Some(wanted.clone())).collect();
        let trusted = |crds: &[CustomResourceDefinition]| {
            crds.iter().all(|crd| trusts(crd, &stored.authority.ca_cert_pem) && settled(crd, SystemTime::now()))
        };
        if stale.is_empty() {
            return Ok(trusted(crds));
        }
        if let Some(migration) = migration_running(&self.client).await? {
            tracing::info!(%migration, "the CRDs' conversion settings wait for the storage migration");
            return Ok(trusted(crds));
        }
        let (address, server_name) = self.probe_target();
        probe(address, &server_name, &bundle).await?;
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        for crd in stale {
            let name = crd.name_any();
            let patch = json!({
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": { "name": name },
                "spec": { "conversion": conversion(&wanted) },
            });
            api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(patch))
                .await
                .map_err(|source| WebhookError::Crd { name: name.clone(), source })?;
            tracing::info!(crd = %name, "CRD conversion points at the webhook, with the current CA bundle");
        }
        // Trusted once the apiserver had time to use the new bundle.
        Ok(false)
    }

    /// The CRDs' `spec.conversion` for this webhook with the current CA
    /// bundle, once the webhook has answered a real review against it: what
    /// the upgrade plan installs new CRDs with, so they never point at a
    /// webhook that is not there.
    pub async fn ready_conversion(&self) -> Result<serde_json::Value> {
        let stored = load_or_create(&self.client, &self.config).await?;
        self.present(&stored.serving);
        let bundle = stored.bundle();
        let (address, server_name) = self.probe_target();
        probe(address, &server_name, &bundle).await?;
        Ok(conversion(&self.config.endpoint.client_config(&bundle)))
    }

    /// Where the leader sends its own probe: the URL's address, or this
    /// replica behind the Service.
    fn probe_target(&self) -> (SocketAddr, String) {
        let local = SocketAddr::from(([127, 0, 0, 1], self.config.listen.port()));
        match &self.config.endpoint {
            Endpoint::Url { host, port, .. } => {
                let address = host.parse().map(|ip| SocketAddr::new(ip, *port)).unwrap_or(local);
                (address, host.clone())
            }
            Endpoint::Service { .. } => (local, self.config.endpoint.server_name()),
        }
    }

    async fn replace_authority(&self, stored: &Stored, now: SystemTime) -> Result<()> {
        let authority = certs::new_authority(now, self.config.lifetimes.ca).map_err(|e| self.bad(e))?;
        let mut data = certs::to_secret_data(&authority, &stored.serving);
        data.insert(PREVIOUS_CA_KEY.into(), ByteString(stored.authority.ca_cert_pem.clone().into_bytes()));
        self.write(data, stored.resource_version.clone()).await?;
        tracing::info!("the webhook's CA is being replaced: new CA stored, the CRDs trust both next");
        Ok(())
    }

    async fn replace_serving(&self, stored: &Stored, now: SystemTime) -> Result<()> {
        let sans = self.config.endpoint.subject_alt_names();
        let serving = certs::issue_serving(&stored.authority, &sans, now, self.config.lifetimes.serving)
            .map_err(|e| self.bad(e))?;
        let mut data = certs::to_secret_data(&stored.authority, &serving);
        if let Some(previous) = &stored.previous_ca {
            data.insert(PREVIOUS_CA_KEY.into(), ByteString(previous.clone().into_bytes()));
        }
        self.write(data, stored.resource_version.clone()).await?;
        self.present(&serving);
        tracing::info!("the webhook's serving certificate was renewed");
        Ok(())
    }

    /// Replaces the Secret's data, if nobody changed it since it was read.
    async fn write(&self, data: BTreeMap<String, ByteString>, resource_version: Option<String>) -> Result<()> {
        let mut secret = secret_of(&self.config, data);
        secret.metadata.resource_version = resource_version;
        secrets(&self.client, &self.config)
            .replace(
                &self.config.secret_name,
                &PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() },
                &secret,
            )
            .await
            .map_err(|source| self.secret_error(source))?;
        Ok(())
    }

    fn bad(&self, source: CertError) -> WebhookError {
        WebhookError::Certificates {
            namespace: self.config.secret_namespace.clone(),
            name: self.config.secret_name.clone(),
            source,
        }
    }

    fn secret_error(&self, source: kube::Error) -> WebhookError {
        WebhookError::Secret {
            namespace: self.config.secret_namespace.clone(),
            name: self.config.secret_name.clone(),
            source,
        }
    }
}

fn secrets(client: &Client, config: &WebhookConfig) -> Api<Secret> {
    Api::namespaced(client.clone(), &config.secret_namespace)
}

fn secret_of(config: &WebhookConfig, data: BTreeMap<String, ByteString>) -> Secret {
    let mut secret = Secret { data: Some(data), ..Default::default() };
    secret.metadata.name = Some(config.secret_name.clone());
    secret.metadata.namespace = Some(config.secret_namespace.clone());
    secret.metadata.labels = Some(BTreeMap::from([(LABEL_MANAGED_BY.to_string(), "slotkeeper".to_string())]));
    secret
}

async fn read(client: &Client, config: &WebhookConfig) -> Result<Option<Stored>> {
    let secret = secrets(client, config).get_opt(&config.secret_name).await.map_err(|source| WebhookError::Secret {
        namespace: config.secret_namespace.clone(),
        name: config.secret_name.clone(),
        source,
    })?;
    secret.map(|secret| parse(config, &secret)).transpose()
}

fn parse(config: &WebhookConfig, secret: &Secret) -> Result<Stored> {
    let empty = BTreeMap::new();
    let data = secret.data.as_ref().unwrap_or(&empty);
    let (authority, serving) = certs::from_secret_data(data).map_err(|source| WebhookError::Certificates {
        namespace: config.secret_namespace.clone(),
        name: config.secret_name.clone(),
        source,
    })?;
    let previous_ca = data.get(PREVIOUS_CA_KEY).and_then(|pem| String::from_utf8(pem.0.clone()).ok());
    Ok(Stored { authority, serving, previous_ca, resource_version: secret.metadata.resource_version.clone() })
}

/// The Secret, created with a new CA and serving certificate if absent (two
/// replicas starting at once: the second reads what the first created).
async fn load_or_create(client: &Client, config: &WebhookConfig) -> Result<Stored> {
    if let Some(stored) = read(client, config).await? {
        return Ok(stored);
    }
    let bad = |source| WebhookError::Certificates {
        namespace: config.secret_namespace.clone(),
        name: config.secret_name.clone(),
        source,
    };
    let now = SystemTime::now();
    let authority = certs::new_authority(now, config.lifetimes.ca).map_err(bad)?;
    let serving = certs::issue_serving(&authority, &config.endpoint.subject_alt_names(), now, config.lifetimes.serving)
        .map_err(bad)?;
    let secret = secret_of(config, certs::to_secret_data(&authority, &serving));
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    match secrets(client, config).create(&params, &secret).await {
        Ok(_) => tracing::info!(secret = %config.secret_name, "created the webhook's CA and serving certificate"),
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(source) => {
            return Err(WebhookError::Secret {
                namespace: config.secret_namespace.clone(),
                name: config.secret_name.clone(),
                source,
            });
        }
    }
    read(client, config).await?.ok_or_else(|| WebhookError::Vanished {
        namespace: config.secret_namespace.clone(),
        name: config.secret_name.clone(),
    })
}

fn conversion(client_config: &serde_json::Value) -> serde_json::Value {
    json!({ "strategy": "Webhook", "webhook": { "conversionReviewVersions": ["v1"], "clientConfig": client_config } })
}

/// Our CRDs as installed (absent ones are skipped: the upgrade plan installs them).
async fn crd_state(client: &Client) -> Result<Vec<CustomResourceDefinition>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut installed = Vec::new();
    for crd in slotkeeper_api::crds() {
        let name = crd.name_any();
        if let Some(crd) = api.get_opt(&name).await.map_err(|source| WebhookError::Crd { name, source })? {
            installed.push(crd);
        }
    }
    Ok(installed)
}

/// A CRD still at one version (the previous release's) needs no conversion,
/// and changing it is the upgrade plan's step, not ours.
fn serves_two_versions(crd: &CustomResourceDefinition) -> bool {
    crd.spec.versions.iter().filter(|v| v.served).count() > 1
}

fn client_config(crd: &CustomResourceDefinition) -> Option<serde_json::Value> {
    let conversion = crd.spec.conversion.as_ref()?;
    if conversion.strategy != "Webhook" {
        return None;
    }
    serde_json::to_value(conversion.webhook.as_ref()?.client_config.as_ref()?).ok()
}

/// Whether our last change to the CRD is at least [`BUNDLE_SETTLE`] old (by
/// its managedFields entry; a CRD we never changed is settled).
fn settled(crd: &CustomResourceDefinition, now: SystemTime) -> bool {
    let ours = crd.metadata.managed_fields.iter().flatten().filter(|m| m.manager.as_deref() == Some(FIELD_MANAGER));
    let Some(changed) = ours.filter_map(|m| m.time.as_ref()).map(|t| SystemTime::from(t.0)).max() else {
        return true;
    };
    now.duration_since(changed).is_ok_and(|age| age >= BUNDLE_SETTLE)
}

fn trusts(crd: &CustomResourceDefinition, ca_cert_pem: &str) -> bool {
    let bundle = crd
        .spec
        .conversion
        .as_ref()
        .and_then(|c| c.webhook.as_ref())
        .and_then(|w| w.client_config.as_ref())
        .and_then(|c| c.ca_bundle.as_ref());
    !serves_two_versions(crd) || bundle.is_some_and(|b| String::from_utf8_lossy(&b.0).contains(ca_cert_pem.trim()))
}

/// A storage migration of our group that has not finished, by name.
pub async fn migration_running(client: &Client) -> Result<Option<String>> {
    let api: Api<StorageVersionMigration> = Api::all(client.clone());
    let migrations = api.list(&ListParams::default()).await.map_err(WebhookError::Migrations)?;
    let group = slotkeeper_api::GROUP;
    Ok(migrations.items.into_iter().find_map(|m| {
        let ours = m.spec.as_ref().is_some_and(|s| s.resource.group == group);
        let conditions = m.status.as_ref().and_then(|s| s.conditions.as_ref());
        let finished = conditions
            .is_some_and(|cs| cs.iter().any(|c| (c.type_ == "Succeeded" || c.type_ == "Failed") && c.status == "True"));
        (ours && !finished).then(|| m.name_any())
    }))
}
