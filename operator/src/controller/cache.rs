//! Watch-fed caches of everything the operator owns, so a reconcile reads
//! Kubernetes from memory: a steady-state reconcile makes no API request.
//!
//! Owned objects are cached as metadata only (the content-hash annotation is
//! all the applier compares); Pods cut down to the fields observing reads.
//! Every watch is narrowed to objects carrying the cluster label, and every
//! change to one triggers the owning cluster's reconcile.
//!
//! Secrets are not watched: listing Secrets in every namespace would let the
//! operator read every application's credentials. The few it uses are read
//! by name when a reconcile needs them (see `apply.rs`).

use futures::Stream;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Container, ContainerStatus, Pod, PodSpec, PodStatus, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use slotkeeper_readmodel::scope::Namespaces;

use crate::api::names::{ANNOTATION_SPEC_HASH, LABEL_CLUSTER};
use crate::api::{OperationPhase, OperationType, RedisCluster, RedisOperation};
use crate::plan::intents::FailoverIntent;

type Trigger<K> = std::pin::Pin<Box<dyn Stream<Item = Result<K, watcher::Error>> + Send>>;

/// Read side: what the watches have seen so far.
#[derive(Clone)]
pub struct Caches {
    pub pods: Store<Pod>,
    stateful_sets: Store<PartialObjectMeta<StatefulSet>>,
    services: Store<PartialObjectMeta<Service>>,
    config_maps: Store<PartialObjectMeta<ConfigMap>>,
    disruption_budgets: Store<PartialObjectMeta<PodDisruptionBudget>>,
    network_policies: Store<PartialObjectMeta<NetworkPolicy>>,
    /// RedisOperations: a running one is an intent its cluster's planner acts on.
    pub operations: Store<RedisOperation>,
    /// True once every watch has listed once. A store's own readiness
    /// future wakes only its last waiter, so reconciles wait on this instead.
    synced: tokio::sync::watch::Receiver<bool>,
}

/// Write side: the watch streams that fill the caches, each also a trigger
/// for the controller. Nothing is cached until the controller polls them.
pub struct Triggers {
    pub pods: Trigger<Pod>,
    pub stateful_sets: Trigger<PartialObjectMeta<StatefulSet>>,
    pub services: Trigger<PartialObjectMeta<Service>>,
    pub config_maps: Trigger<PartialObjectMeta<ConfigMap>>,
    pub disruption_budgets: Trigger<PartialObjectMeta<PodDisruptionBudget>>,
    pub network_policies: Trigger<PartialObjectMeta<NetworkPolicy>>,
    pub operations: Trigger<RedisOperation>,
}

pub use slotkeeper_readmodel::slim;

/// A cached Pod keeps what `observe::pod_fact` and the store read: its
/// identity and labels, the redis container's image, its Node, phase, IP and
/// restart count. The rest of a Pod (volumes, env, probes, conditions) is
/// most of its size, times every Pod of every cluster.
pub fn slim_pod(pod: &mut Pod) {
    slim(pod);
    pod.metadata.annotations = None;
    if let Some(spec) = pod.spec.take() {
        let containers =
            spec.containers.into_iter().map(|c| Container { name: c.name, image: c.image, ..Container::default() });
        pod.spec = Some(PodSpec { node_name: spec.node_name, containers: containers.collect(), ..PodSpec::default() });
    }
    if let Some(status) = pod.status.take() {
        let containers = status.container_statuses.map(|all| {
            all.into_iter()
                .map(|c| ContainerStatus { name: c.name, restart_count: c.restart_count, ..ContainerStatus::default() })
                .collect()
        });
        pod.status = Some(PodStatus {
            phase: status.phase,
            pod_ip: status.pod_ip,
            container_statuses: containers,
            ..PodStatus::default()
        });
    }
}

fn labelled() -> watcher::Config {
    watcher::Config::default().labels(LABEL_CLUSTER)
}

/// A labelled watch feeding a store, each object cut down by `trim` first;
/// for `PartialObjectMeta<_>` it asks the apiserver for metadata only.
fn watch<K>(client: &Client, namespaces: &Namespaces, trim: fn(&mut K)) -> (Store<K>, Trigger<K>)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = namespaces.watch(client, labelled()).modify(trim).reflect(writer).touched_objects();
    (store, Box::pin(stream))
}

impl Caches {
    pub fn new(client: &Client, namespaces: &Namespaces) -> (Self, Triggers) {
        let (pods, pod_trigger) = watch(client, namespaces, slim_pod);
        let (stateful_sets, set_trigger) = watch(client, namespaces, slim);
        let (services, service_trigger) = watch(client, namespaces, slim);
        let (config_maps, config_map_trigger) = watch(client, namespaces, slim);
        let (disruption_budgets, budget_trigger) = watch(client, namespaces, slim);
        let (network_policies, policy_trigger) = watch(client, namespaces, slim);
        let (operations, operation_writer) = reflector::store();
        let operation_trigger = Box::pin(
            namespaces
                .watch::<RedisOperation>(client, watcher::Config::default())
                .modify(slim)
                .reflect(operation_writer)
                .touched_objects(),
        );
        let (synced_tx, synced) = tokio::sync::watch::channel(false);
        let caches = Self {
            pods,
            stateful_sets,
            services,
            config_maps,
            disruption_budgets,
            network_policies,
            operations,
            synced,
        };
        let stores = caches.clone();
        tokio::spawn(async move {
            stores.wait_for_every_store().await;
            synced_tx.send_replace(true);
        });
        let triggers = Triggers {
            pods: pod_trigger,
            stateful_sets: set_trigger,
            services: service_trigger,
            config_maps: config_map_trigger,
            disruption_budgets: budget_trigger,
            network_policies: policy_trigger,
            operations: operation_trigger,
        };
        (caches, triggers)
    }

    /// Waits until every watch has listed once, so "absent" means absent.
    pub async fn synced(&self) {
        let mut synced = self.synced.clone();
        // An error means the process is stopping; nothing to wait for.
        let _ = synced.wait_for(|ready| *ready).await;
    }

    /// The one waiter on the stores' readiness.
    async fn wait_for_every_store(&self) {
        // A dropped writer means the process is stopping; nothing to wait for.
        let _ = futures::join!(
            self.pods.wait_until_ready(),
            self.stateful_sets.wait_until_ready(),
            self.services.wait_until_ready(),
            self.config_maps.wait_until_ready(),
            self.disruption_budgets.wait_until_ready(),
            self.network_policies.wait_until_ready(),
            self.operations.wait_until_ready(),
        );
    }

    /// The content hash stored on an owned object: `None` when the object is
    /// absent, `Some(None)` when it carries no hash (made by someone else).
    pub fn stored_hash(&self, kind: &str, namespace: &str, name: &str) -> Option<Option<String>> {
        fn hash_of<K: Resource>(object: &K) -> Option<String> {
            object.meta().annotations.as_ref()?.get(ANNOTATION_SPEC_HASH).cloned()
        }
        fn lookup<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<Option<String>>
        where
            K: Resource + Clone + 'static,
            K::DynamicType: Default + Eq + std::hash::Hash + Clone,
        {
            store.get(&ObjectRef::new(name).within(namespace)).map(|o| hash_of(o.as_ref()))
        }
        match kind {
            "StatefulSet" => lookup(&self.stateful_sets, namespace, name),
            "Service" => lookup(&self.services, namespace, name),
            "ConfigMap" => lookup(&self.config_maps, namespace, name),
            "PodDisruptionBudget" => lookup(&self.disruption_budgets, namespace, name),
            "NetworkPolicy" => lookup(&self.network_policies, namespace, name),
            _ => None,
        }
    }

    /// The cluster's Pods that are not being deleted.
    /// The running failover of a cluster, if a RedisOperation asks for one.
    pub fn failover_intent(&self, namespace: &str, cluster: &str) -> Option<FailoverIntent> {
        self.operations.state().iter().find_map(|op| {
            let status = op.status.as_ref()?;
            let running = status.phase == Some(OperationPhase::Running) && op.spec.type_ == OperationType::Failover;
            (running && op.metadata.namespace.as_deref() == Some(namespace) && op.spec.cluster_name == cluster).then(
                || FailoverIntent {
                    operation: op.metadata.name.clone().unwrap_or_default(),
                    shard: op.spec.failover.as_ref().map_or(0, |f| f.shard.max(0) as usize),
                    from: status.from_pod.clone().unwrap_or_default(),
                    to: status.to_pod.clone().unwrap_or_default(),
                    sent: status.failover_sent_time.is_some(),
                },
            )
        })
    }

    /// Pods a succeeded Failover operation made master: while the operation
    /// exists, the spread over failure domains leaves its shard where the
    /// user put it (delete the operation to hand the shard back).
    pub fn user_placed_masters(&self, namespace: &str, cluster: &str) -> std::collections::BTreeSet<String> {
        self.operations
            .state()
            .iter()
            .filter(|op| op.metadata.namespace.as_deref() == Some(namespace) && op.spec.cluster_name == cluster)
            .filter(|op| op.spec.type_ == OperationType::Failover)
            .filter_map(|op| {
                let status = op.status.as_ref()?;
                (status.phase == Some(OperationPhase::Succeeded)).then(|| status.to_pod.clone())?
            })
            .collect()
    }

    /// A running RollingRestart of a cluster: the operation's name.
    pub fn restart_intent(&self, namespace: &str, cluster: &str) -> Option<String> {
        self.operations.state().iter().find_map(|op| {
            let running = op.status.as_ref()?.phase == Some(OperationPhase::Running)
                && op.spec.type_ == OperationType::RollingRestart;
            (running && op.metadata.namespace.as_deref() == Some(namespace) && op.spec.cluster_name == cluster)
                .then(|| op.metadata.name.clone().unwrap_or_default())
        })
    }

    /// A running Rebalance of a cluster: the operation's name.
    pub fn rebalance_intent(&self, namespace: &str, cluster: &str) -> Option<String> {
        self.operations.state().iter().find_map(|op| {
            let running =
                op.status.as_ref()?.phase == Some(OperationPhase::Running) && op.spec.type_ == OperationType::Rebalance;
            (running && op.metadata.namespace.as_deref() == Some(namespace) && op.spec.cluster_name == cluster)
                .then(|| op.metadata.name.clone().unwrap_or_default())
        })
    }

    /// The cluster's Pods: labelled as its own and controlled by one of the
    /// StatefulSets the cluster controls (by uid). A look-alike Pod with the
    /// labels alone, which anyone who may create Pods can make, is never
    /// observed, so it is never sent the password.
    pub fn pods_of(&self, namespace: &str, cluster: &str) -> Vec<std::sync::Arc<Pod>> {
        let sets: std::collections::HashSet<String> = self
            .stateful_sets
            .state()
            .iter()
            .filter(|set| {
                set.metadata.namespace.as_deref() == Some(namespace)
                    && controlled_by(&set.metadata, RedisCluster::kind(&()).as_ref(), cluster)
            })
            .filter_map(|set| set.metadata.uid.clone())
            .collect();
        self.pods.state_filter(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.deletion_timestamp.is_none()
                && p.metadata.labels.as_ref().and_then(|l| l.get(LABEL_CLUSTER)).map(String::as_str) == Some(cluster)
                && controller_uid(&p.metadata).is_some_and(|uid| sets.contains(uid))
        })
    }
}

/// The uid of the object's controller, if it has one.
fn controller_uid(meta: &kube::api::ObjectMeta) -> Option<&str> {
    let owners = meta.owner_references.as_deref()?;
    owners.iter().find(|o| o.controller == Some(true)).map(|o| o.uid.as_str())
}

/// Whether the object's controller is the `kind` named `name`.
fn controlled_by(meta: &kube::api::ObjectMeta, kind: &str, name: &str) -> bool {
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    owners.iter().any(|o| o.controller == Some(true) && o.kind == kind && o.name == name)
}

/// The cluster an object belongs to, by its cluster label.
pub fn cluster_of<K: Resource>(object: &K) -> Option<ObjectRef<RedisCluster>> {
    let name = object.meta().labels.as_ref()?.get(LABEL_CLUSTER)?;
    Some(ObjectRef::new(name).within(object.meta().namespace.as_deref()?))
}
