//! Leader election with a `coordination.k8s.io` Lease, so only one replica
//! acts. The holder renews every [`RENEW_PERIOD`]; another replica takes over
//! once the holder has not renewed for the lease duration. Updates carry the
//! resourceVersion they read, so two candidates cannot both win.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;

pub const LEASE_NAME: &str = "slotkeeper-leader";
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
pub const RENEW_PERIOD: Duration = Duration::from_secs(5);

/// What the holder says about itself on the Lease, read at each renewal.
pub type Annotations = Box<dyn Fn() -> BTreeMap<String, String> + Send + Sync>;

pub struct LeaderElector {
    api: Api<Lease>,
    identity: String,
    lease: String,
    annotations: Option<Annotations>,
}

impl LeaderElector {
    pub fn new(client: Client, namespace: &str, identity: String) -> Self {
        Self { api: Api::namespaced(client, namespace), identity, lease: LEASE_NAME.into(), annotations: None }
    }

    /// Elects over another Lease (another role, held independently).
    pub fn lease(mut self, name: &str) -> Self {
        self.lease = name.into();
        self
    }

    /// Writes these annotations on the Lease whenever this replica renews it.
    pub fn annotate(mut self, annotations: Annotations) -> Self {
        self.annotations = Some(annotations);
        self
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(identity = %self.identity, lease = %self.lease, "became leader");
                    return;
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "leader election attempt failed"),
            }
            tokio::time::sleep(RENEW_PERIOD).await;
        }
    }

    /// Renews until a renewal fails for longer than the lease duration;
    /// returns when leadership is lost (the caller must stop acting).
    pub async fn hold(&self) {
        let mut last_renewed = std::time::Instant::now();
        loop {
            tokio::time::sleep(RENEW_PERIOD).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewed = std::time::Instant::now(),
                Ok(false) => return,
                Err(error) => {
                    tracing::warn!(%error, "lease renewal failed");
                    if last_renewed.elapsed() >= LEASE_DURATION {
                        return;
                    }
                }
            }
        }
    }

    /// One round: true when this replica holds the lease afterwards.
    async fn try_acquire_or_renew(&self) -> kube::Result<bool> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.lease).await? else {
            let lease: Lease = serde_json::from_value(json!({
                "metadata": { "name": self.lease, "annotations": self.annotations() },
                "spec": self.spec(now, now, 0),
            }))
            .expect("valid Lease");
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let renewed = spec.renew_time.map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH);
        let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
        let expired = now.duration_since(renewed) > duration;
        let transitions = spec.lease_transitions.unwrap_or(0);
        let (acquired_at, transitions) = if holder == self.identity {
            (spec.acquire_time.map(|t| t.0).unwrap_or(now), transitions)
        } else if expired || holder.is_empty() {
            (now, transitions + 1)
        } else {
            return Ok(false);
        };
        lease.spec = Some(serde_json::from_value(self.spec(acquired_at, now, transitions)).expect("valid LeaseSpec"));
        let annotations = lease.metadata.annotations.get_or_insert_default();
        annotations.extend(self.annotations());
        match self.api.replace(&self.lease, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false), // someone else moved first
            Err(e) => Err(e),
        }
    }

    fn annotations(&self) -> BTreeMap<String, String> {
        self.annotations.as_ref().map(|f| f()).unwrap_or_default()
    }

    fn spec(&self, acquired: Timestamp, renewed: Timestamp, transitions: i32) -> serde_json::Value {
        json!({
            "holderIdentity": self.identity,
            "leaseDurationSeconds": LEASE_DURATION.as_secs(),
            "acquireTime": MicroTime(acquired),
            "renewTime": MicroTime(renewed),
            "leaseTransitions": transitions,
        })
    }
}
