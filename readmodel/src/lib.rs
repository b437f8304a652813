//! The read model: what the console shows, kept apart from the controller.
//!
//! ```text
//! watches (every replica) ──┐
//!   RedisClusters, RedisOperations, Events
//!                           ├─▶ ReadModel ──▶ readers (the console), notified per cluster
//! Publisher ────────────────┘
//!   observations of Redis: every reconcile on the leader, the sampler on a standby
//! ```
//!
//! Readers get a read-only [`ReadModel`]; only the operator holds a
//! [`Publisher`]. Every change names the cluster it touched, so a live page
//! re-renders what changed and nothing else.
#![forbid(unsafe_code)]

pub mod events;
pub mod observation;
pub mod samples;
pub mod scope;
mod watches;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use kube::runtime::reflector::{ObjectRef, Store};
use slotkeeper_api::{RedisCluster, RedisOperation};
use tokio::sync::broadcast;

pub use events::{EventLog, EventView};
pub use observation::{NodeView, Observation, Role, Source, StatsFact};
pub use samples::{Sample, SampleRing};
pub use watches::slim;

/// A cluster by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterKey {
    pub namespace: String,
    pub name: String,
}

impl ClusterKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }
}

impl std::fmt::Display for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What changed in the read model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Cluster(ClusterKey),
    /// A watch re-listed: anything may have changed.
    Everything,
}

impl Change {
    pub fn touches(&self, key: &ClusterKey) -> bool {
        match self {
            Change::Cluster(changed) => changed == key,
            Change::Everything => true,
        }
    }
}

/// Changes a slow reader may fall behind by before it is told to re-read everything.
const CHANGES_BUFFERED: usize = 1024;

struct Inner {
    clusters: Store<RedisCluster>,
    operations: Store<RedisOperation>,
    events: EventLog,
    observations: RwLock<HashMap<ClusterKey, Arc<Observation>>>,
    samples: Mutex<HashMap<ClusterKey, SampleRing>>,
    changes: broadcast::Sender<Change>,
    /// Counts changes: everything (a re-list), and per cluster; a reader's
    /// render of a cluster stays valid while both counts stay.
    relists: std::sync::atomic::AtomicU64,
    versions: Mutex<HashMap<ClusterKey, u64>>,
    synced: tokio::sync::watch::Receiver<bool>,
}

impl Inner {
    fn notify(&self, change: Change) {
        match &change {
            Change::Cluster(key) => *self.versions.lock().expect("versions lock").entry(key.clone()).or_default() += 1,
            Change::Everything => {
                self.relists.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        // No receiver is fine: nobody is looking.
        let _ = self.changes.send(change);
    }

    fn forget(&self, key: &ClusterKey) {
        self.observations.write().expect("observations lock").remove(key);
        self.samples.lock().expect("samples lock").remove(key);
        // Versions stay: a cluster created again under the same name must
        // not match a render of the one deleted.
    }
}

/// The read side, cheap to clone.
#[derive(Clone)]
pub struct ReadModel {
    inner: Arc<Inner>,
}

/// The write side for observations, held by the operator.
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

/// Starts the watches (in `namespaces`) and returns both handles.
/// Must be called inside a Tokio runtime; the watches run until it stops.
pub fn start(client: kube::Client, namespaces: &scope::Namespaces) -> (ReadModel, Publisher) {
    let (changes, _) = broadcast::channel(CHANGES_BUFFERED);
    let (synced_tx, synced) = tokio::sync::watch::channel(false);
    let (clusters, cluster_writer) = kube::runtime::reflector::store();
    let (operations, operation_writer) = kube::runtime::reflector::store();
    let inner = Arc::new(Inner {
        clusters,
        operations,
        events: EventLog::default(),
        observations: Default::default(),
        samples: Default::default(),
        changes,
        relists: Default::default(),
        versions: Default::default(),
        synced,
    });
    watches::spawn(&client, namespaces, &inner, cluster_writer, operation_writer, synced_tx);
    (ReadModel { inner: inner.clone() }, Publisher { inner })
}

impl Publisher {
    /// Records what was observed of `key` now.
    pub fn publish(&self, key: &ClusterKey, observation: Observation) {
        let sample = Sample::of(&observation);
        self.inner.samples.lock().expect("samples lock").entry(key.clone()).or_default().push(sample);
        self.inner.observations.write().expect("observations lock").insert(key.clone(), Arc::new(observation));
        self.inner.notify(Change::Cluster(key.clone()));
    }

    /// Drops what is kept of a deleted cluster.
    pub fn forget(&self, key: &ClusterKey) {
        self.inner.forget(key);
        self.inner.notify(Change::Cluster(key.clone()));
    }

    /// The last observation of `key`, to decide whether a new one is due.
    pub fn last(&self, key: &ClusterKey) -> Option<Arc<Observation>> {
        self.inner.observations.read().expect("observations lock").get(key).cloned()
    }
}

impl ReadModel {
    /// Every RedisCluster this replica watches.
    pub fn clusters(&self) -> Vec<Arc<RedisCluster>> {
        self.inner.clusters.state()
    }

    pub fn cluster(&self, key: &ClusterKey) -> Option<Arc<RedisCluster>> {
        self.inner.clusters.get(&ObjectRef::new(&key.name).within(&key.namespace))
    }

    /// The RedisOperations of one cluster, newest first.
    pub fn operations_of(&self, key: &ClusterKey) -> Vec<Arc<RedisOperation>> {
        let mut operations = self.inner.operations.state_filter(|o| {
            o.metadata.namespace.as_deref() == Some(key.namespace.as_str()) && o.spec.cluster_name == key.name
        });
        operations.sort_by(|a, b| {
            b.metadata
                .creation_timestamp
                .cmp(&a.metadata.creation_timestamp)
                .then(a.metadata.name.cmp(&b.metadata.name))
        });
        operations
    }

    /// The events of a cluster, its Pods and its operations, newest first.
    pub fn events_of(&self, key: &ClusterKey, limit: usize) -> Vec<EventView> {
        let operations: Vec<String> = self.operations_of(key).iter().filter_map(|o| o.metadata.name.clone()).collect();
        self.inner.events.for_cluster(&key.namespace, &key.name, &operations, limit)
    }

    pub fn observation(&self, key: &ClusterKey) -> Option<Arc<Observation>> {
        self.inner.observations.read().expect("observations lock").get(key).cloned()
    }

    /// The cluster's samples over the last 15 minutes, oldest first.
    pub fn samples(&self, key: &ClusterKey) -> Vec<Sample> {
        self.inner
            .samples
            .lock()
            .expect("samples lock")
            .get(key)
            .map(|r| r.samples().copied().collect())
            .unwrap_or_default()
    }

    /// A number that changes whenever anything about `key` may have changed.
    pub fn version(&self, key: &ClusterKey) -> (u64, u64) {
        let relists = self.inner.relists.load(std::sync::atomic::Ordering::Relaxed);
        (relists, self.inner.versions.lock().expect("versions lock").get(key).copied().unwrap_or(0))
    }

    /// Changes from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.inner.changes.subscribe()
    }

    /// Waits until the cluster and operation watches have listed once.
    pub async fn synced(&self) {
        let mut synced = self.inner.synced.clone();
        // An error means the process is stopping; nothing to wait for.
        let _ = synced.wait_for(|ready| *ready).await;
    }
}
