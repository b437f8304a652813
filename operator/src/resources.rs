//! The Kubernetes objects a RedisCluster owns, built as data from the spec
//! (no client here). Each object carries the cluster's labels, an owner
//! reference, and a hash of itself so the applier writes only what changed.
//!
//! Pods are owned by one StatefulSet per shard (`<cluster>-shard-<i>`, the
//! master and its replicas): a shard is the unit that scale-in drains and
//! removes whole, replica counts change per shard without touching others,
//! and preferred anti-affinity inside a shard keeps a master and its
//! replicas in different failure domains (the planner re-spreads Pods the
//! scheduler crowded; the template is left as the previous release wrote it,
//! so an operator upgrade rewrites no StatefulSet). Roles are not tied to ordinals: the planner picks
//! and moves master roles so the masters stay apart too.

use std::collections::BTreeMap;

use kube::api::ObjectMeta;
use kube::{Resource as _, ResourceExt as _};
use serde_json::{Value, json};

use crate::api::RedisCluster;
use crate::api::catalog::{self, CatalogEntry};
use crate::api::names::*;
use crate::controller::users::ClusterUsers;
use crate::redis::client::REDIS_PORT;

pub const BUS_PORT: u16 = 16379;
pub const DATA_DIR: &str = "/data";
/// The volume claim template: each Pod's claim is `data-<pod>`.
pub const DATA_CLAIM: &str = "data";
const CONFIG_DIR: &str = "/etc/redis";
const AUTH_DIR: &str = "/etc/redis-auth";
/// Scratch space: the root file system is read-only.
const TMP_DIR: &str = "/tmp";
/// The user and group Redis runs as: the official redis and valkey images' `redis` (999).
pub const REDIS_UID: i64 = 999;
/// Milliseconds a node may be unreachable before its peers fail it over.
pub const CLUSTER_NODE_TIMEOUT_MS: u32 = 5000;

/// Names of everything derived from one cluster.
pub struct Names<'a>(pub &'a str);

impl Names<'_> {
    pub fn generated_password_secret(&self) -> String {
        format!("{}-password", self.0)
    }
    pub fn auth_config_secret(&self) -> String {
        format!("{}-auth-conf", self.0)
    }
    /// The operator's and replication's generated passwords.
    pub fn acl_secret(&self) -> String {
        format!("{}-acl", self.0)
    }
    pub fn config_map(&self) -> String {
        format!("{}-config", self.0)
    }
    pub fn headless_service(&self) -> String {
        format!("{}-nodes", self.0)
    }
    pub fn client_service(&self) -> String {
        self.0.to_owned()
    }
    pub fn shard(&self, shard: usize) -> String {
        format!("{}-shard-{shard}", self.0)
    }
    pub fn pod(&self, shard: usize, ordinal: usize) -> String {
        format!("{}-shard-{shard}-{ordinal}", self.0)
    }
}

pub fn labels(cluster: &RedisCluster) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_CLUSTER.into(), cluster.name_any()),
        (LABEL_MANAGED_BY.into(), "slotkeeper".into()),
        (LABEL_NAME.into(), "redis".into()),
    ])
}

/// Metadata every owned object shares: name, namespace, labels, owner.
pub fn meta(cluster: &RedisCluster, name: String, extra_labels: &[(&str, String)]) -> ObjectMeta {
    let mut labels = labels(cluster);
    labels.extend(extra_labels.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
    ObjectMeta {
        name: Some(name),
        namespace: cluster.metadata.namespace.clone(),
        labels: Some(labels),
        owner_references: cluster.controller_owner_ref(&()).map(|o| vec![o]),
        ..Default::default()
    }
}

/// The image `spec` asks for: `spec.redis.image`, else the catalog's.
pub fn image(cluster: &RedisCluster) -> String {
    cluster.spec.redis.image.clone().unwrap_or_else(|| {
        catalog::lookup(cluster.spec.redis.engine, &cluster.spec.redis.version)
            .map(|e| e.image.to_owned())
            .unwrap_or_else(|| format!("{}:{}", cluster.spec.redis.engine, cluster.spec.redis.version))
    })
}

/// What one shard's StatefulSet runs: how many Pods, on which image (a
/// rollout moves shards to a new image one at a time).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardShape {
    pub pods: usize,
    pub image: String,
    /// The configuration file its release reads.
    pub conf: String,
}

/// The Secret and key holding the password.
pub fn password_source(cluster: &RedisCluster) -> (String, String) {
    match &cluster.spec.auth {
        Some(auth) => (auth.secret_name.clone(), auth.key.clone()),
        None => (Names(&cluster.name_any()).generated_password_secret(), "password".into()),
    }
}

/// `maxmemory` for a memory limit: 75% of it, leaving room for replication
/// buffers, fork copy-on-write and fragmentation.
fn maxmemory_for_limit(cluster: &RedisCluster) -> Option<u64> {
    let limit = cluster.spec.resources.as_ref()?.limits.as_ref()?.get("memory")?;
    parse_bytes(&limit.0).map(|bytes| bytes / 4 * 3)
}

fn parse_bytes(quantity: &str) -> Option<u64> {
    let suffixes: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, factor) in suffixes {
        if let Some(number) = quantity.strip_suffix(suffix) {
            return number.parse::<u64>().ok().map(|n| n * factor);
        }
    }
    quantity.parse().ok()
}

/// redis.conf for nodes running `entry`: what the operator needs, then the
/// user's allowed overrides as `entry` understands them, given every release
/// in use (see [`crate::config`]).
pub fn redis_conf(cluster: &RedisCluster, entry: &CatalogEntry, in_use: &[&CatalogEntry]) -> String {
    let mut conf = format!(
        "# Managed by slotkeeper for RedisCluster {name}\n\
         port {REDIS_PORT}\n\
         cluster-enabled yes\n\
         cluster-config-file {DATA_DIR}/nodes.conf\n\
         cluster-node-timeout {CLUSTER_NODE_TIMEOUT_MS}\n\
         dir {DATA_DIR}\n\
         appendonly yes\n\
         protected-mode no\n\
         include {AUTH_DIR}/auth.conf\n",
        name = cluster.name_any()
    );
    if !cluster.spec.redis.config.contains_key("maxmemory")
        && let Some(bytes) = maxmemory_for_limit(cluster)
    {
        conf += &format!("maxmemory {bytes}\n");
    }
    match crate::config::user_lines(&cluster.spec.redis.config, entry, in_use) {
        Ok(lines) => lines.iter().for_each(|line| conf += &format!("{line}\n")),
        // The reconcile refuses such a spec before applying; never a broken file.
        Err(reason) => conf += &format!("# spec.redis.config not applied: {reason}\n"),
    }
    conf
}

/// auth.conf, kept in a Secret: every user (passwords as sha256 hashes) and
/// how replicas sign in to their master, the one password kept in the clear.
pub fn auth_conf(users: &ClusterUsers) -> String {
    // Every token quoted and escaped: no byte of a user's input ends a directive.
    let quote = slotkeeper_api::redis_config::quote_token;
    let mut conf = String::new();
    for user in &users.users {
        let rules: Vec<String> = user.rules.iter().map(|r| quote(r)).collect();
        conf += &format!("user {} {}\n", quote(&user.name), rules.join(" "));
    }
    conf += &format!("masteruser {}\n", slotkeeper_api::acl::REPLICATION_USER);
    conf += &format!("masterauth {}\n", quote(&users.replication_password));
    conf
}

/// One file per release the nodes may run now (`redis-7.0.15.conf`, ...).
pub fn config_map(cluster: &RedisCluster, in_use: &[&CatalogEntry]) -> Value {
    let names = Names(&cluster.name_any()).config_map();
    let mut files: serde_json::Map<String, Value> = in_use
        .iter()
        .map(|entry| (crate::config::file_name(entry), json!(redis_conf(cluster, entry, in_use))))
        .collect();
    // Pods made by an operator before per-release files read `redis.conf`:
    // it stays, for the release they run, until they are recreated.
    if let Some(current) = in_use.first() {
        files.insert("redis.conf".into(), json!(redis_conf(cluster, current, in_use)));
    }
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": meta(cluster, names, &[]),
        "data": files,
    })
}

pub fn auth_secret(cluster: &RedisCluster, users: &ClusterUsers) -> Value {
    let name = Names(&cluster.name_any()).auth_config_secret();
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": meta(cluster, name, &[]),
        "type": "Opaque",
        "stringData": { "auth.conf": auth_conf(users) },
    })
}

pub fn generated_password_secret(cluster: &RedisCluster, password: &str) -> Value {
    let name = Names(&cluster.name_any()).generated_password_secret();
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": meta(cluster, name, &[]),
        "type": "Opaque",
        "stringData": { "password": password },
    })
}

/// `<cluster>-acl`: the operator's and replication's passwords, made once.
pub fn acl_secret(cluster: &RedisCluster, operator: &str, replication: &str) -> Value {
    use crate::controller::users::{OPERATOR_KEY, REPLICATION_KEY};
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": meta(cluster, Names(&cluster.name_any()).acl_secret(), &[]),
        "type": "Opaque",
        "stringData": { OPERATOR_KEY: operator, REPLICATION_KEY: replication },
    })
}

pub fn services(cluster: &RedisCluster) -> Vec<Value> {
    let names = Names(&cluster.name_any());
    let selector = json!({ LABEL_CLUSTER: cluster.name_any() });
    vec![
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": meta(cluster, names.headless_service(), &[]),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": true,
                "selector": selector,
                "ports": [
                    { "name": "redis", "port": REDIS_PORT, "targetPort": REDIS_PORT },
                    { "name": "bus", "port": BUS_PORT, "targetPort": BUS_PORT },
                ],
            },
        }),
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": meta(cluster, names.client_service(), &[]),
            "spec": { "selector": selector, "ports": [{ "name": "redis", "port": REDIS_PORT, "targetPort": REDIS_PORT }] },
        }),
    ]
}

/// Shard `shard`'s StatefulSet with `shape.pods` Pods (the master and its
/// replicas; more while a master on a higher ordinal is failed over first)
/// on `shape.image`. `OnDelete`: a changed image recreates no Pod by itself;
/// the operator recreates them one at a time when its plan says so.
pub fn stateful_set(cluster: &RedisCluster, shard: usize, shape: &ShardShape) -> Value {
    let names = Names(&cluster.name_any());
    let shard_labels = [(LABEL_SHARD, shard.to_string())];
    let mut pod_labels = labels(cluster);
    pod_labels.insert(LABEL_SHARD.into(), shard.to_string());
    let selector = json!({ LABEL_CLUSTER: cluster.name_any(), LABEL_SHARD: shard.to_string() });
    let scheduling = cluster.spec.scheduling.clone().unwrap_or_default();
    // A shard's Pods apart first; then the cluster's Pods spread, so a Pod
    // recreated to even out the failure domains lands in the emptiest one
    // (without it the scheduler saw no reason to, and put it back).
    let affinity = scheduling.affinity.map(|a| serde_json::to_value(a).expect("serializable")).unwrap_or_else(|| {
        let topology = cluster.spec.topology_key();
        json!({ "podAntiAffinity": { "preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": { "topologyKey": topology, "labelSelector": { "matchLabels": selector } },
        }, {
            "weight": 10,
            "podAffinityTerm": { "topologyKey": topology, "labelSelector": { "matchLabels": { LABEL_CLUSTER: cluster.name_any() } } },
        }]}})
    });
    let mut volumes = vec![
        json!({ "name": "config", "configMap": { "name": names.config_map() } }),
        json!({ "name": "auth", "secret": { "secretName": names.auth_config_secret() } }),
    ];
    if cluster.spec.storage.is_none() {
        volumes.push(json!({ "name": "data", "emptyDir": {} }));
    }
    volumes.push(json!({ "name": "tmp", "emptyDir": { "sizeLimit": "64Mi" } }));
    let container = json!({
        "name": "redis",
        "image": shape.image,
        "command": ["redis-server", format!("{CONFIG_DIR}/{}", shape.conf),
                    "--bind", "$(POD_IP)", "--cluster-announce-ip", "$(POD_IP)", "--replica-announce-ip", "$(POD_IP)"],
        "env": [{ "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }],
        "ports": [{ "name": "redis", "containerPort": REDIS_PORT }, { "name": "bus", "containerPort": BUS_PORT }],
        "readinessProbe": { "tcpSocket": { "port": "redis" }, "periodSeconds": 2 },
        "livenessProbe": { "tcpSocket": { "port": "redis" }, "periodSeconds": 5, "failureThreshold": 6 },
        "resources": cluster.spec.resources.clone().map(|r| serde_json::to_value(r).expect("serializable")).unwrap_or(json!({})),
        "volumeMounts": [
            { "name": "config", "mountPath": CONFIG_DIR, "readOnly": true },
            { "name": "auth", "mountPath": AUTH_DIR, "readOnly": true },
            { "name": "data", "mountPath": DATA_DIR },
            { "name": "tmp", "mountPath": TMP_DIR },
        ],
        // Pod Security `restricted`, and a read-only root: Redis writes only its data and scratch volumes.
        "securityContext": {
            "runAsNonRoot": true,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": { "drop": ["ALL"] },
        },
    });
    let mut pod_spec = json!({
        "containers": [container],
        "volumes": volumes,
        "affinity": affinity,
        "terminationGracePeriodSeconds": 30,
        "automountServiceAccountToken": false,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": REDIS_UID,
            "runAsGroup": REDIS_UID,
            "fsGroup": REDIS_UID,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
    });
    if !scheduling.tolerations.is_empty() {
        pod_spec["tolerations"] = serde_json::to_value(&scheduling.tolerations).expect("serializable");
    }
    if !scheduling.topology_spread_constraints.is_empty() {
        pod_spec["topologySpreadConstraints"] =
            serde_json::to_value(&scheduling.topology_spread_constraints).expect("serializable");
    }
    if let Some(class) = &scheduling.priority_class_name {
        pod_spec["priorityClassName"] = json!(class);
    }
    if !scheduling.node_selector.is_empty() {
        pod_spec["nodeSelector"] = json!(scheduling.node_selector);
    }
    let mut spec = json!({
        "serviceName": names.headless_service(),
        "replicas": shape.pods,
        "podManagementPolicy": "Parallel",
        "updateStrategy": { "type": "OnDelete" },
        "selector": { "matchLabels": selector },
        "template": { "metadata": { "labels": pod_labels }, "spec": pod_spec },
    });
    if let Some(storage) = &cluster.spec.storage {
        let mut claim_spec =
            json!({ "accessModes": ["ReadWriteOnce"], "resources": { "requests": { "storage": storage.size } } });
        if let Some(class) = &storage.storage_class_name {
            claim_spec["storageClassName"] = json!(class);
        }
        spec["volumeClaimTemplates"] =
            json!([{ "metadata": { "name": DATA_CLAIM, "labels": labels(cluster) }, "spec": claim_spec }]);
        // A replica removed by scaling leaves its data behind only with keepOnDelete.
        let policy = if storage.keep_on_delete { "Retain" } else { "Delete" };
        spec["persistentVolumeClaimRetentionPolicy"] = json!({ "whenDeleted": policy, "whenScaled": policy });
    }
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": meta(cluster, names.shard(shard), &shard_labels),
        "spec": spec,
    })
}

/// One budget for the whole cluster. With replicas, one Pod at a time may go
/// (its shard fails over); without, any voluntary disruption would take slots
/// offline, so none is allowed.
pub fn disruption_budget(cluster: &RedisCluster) -> Value {
    let max_unavailable = if cluster.spec.replicas_per_master > 0 { 1 } else { 0 };
    json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": meta(cluster, cluster.name_any(), &[]),
        "spec": { "maxUnavailable": max_unavailable, "selector": { "matchLabels": { LABEL_CLUSTER: cluster.name_any() } } },
    })
}

/// Clients from the namespace and the operator's Pods may reach the client port; the
/// cluster bus is open only between this cluster's own Pods.
pub fn network_policy(cluster: &RedisCluster) -> Value {
    let own = json!({ "podSelector": { "matchLabels": { LABEL_CLUSTER: cluster.name_any() } } });
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": meta(cluster, cluster.name_any(), &[]),
        "spec": {
            "podSelector": { "matchLabels": { LABEL_CLUSTER: cluster.name_any() } },
            "policyTypes": ["Ingress"],
            "ingress": [
                { "ports": [{ "port": REDIS_PORT }], "from": [
                    { "podSelector": {} },
                    // The operator's own Pods, by a label only the apiserver sets on a
                    // namespace: any tenant could put a label of ours on theirs.
                    {
                        "namespaceSelector": { "matchLabels": { LABEL_NAMESPACE_NAME: OPERATOR_NAMESPACE } },
                        "podSelector": { "matchLabels": { LABEL_NAME: OPERATOR_APP } },
                    },
                ]},
                { "ports": [{ "port": BUS_PORT }], "from": [own] },
            ],
        },
    })
}

/// Every object but the Secrets, in apply order; `shards` gives the Pods
/// and image per staying shard (leaving shards are not applied, only removed).
pub fn desired_objects(
    cluster: &RedisCluster,
    shards: &BTreeMap<usize, ShardShape>,
    in_use: &[&CatalogEntry],
) -> Vec<Value> {
    let mut objects = vec![config_map(cluster, in_use)];
    objects.extend(services(cluster));
    objects.extend(shards.iter().map(|(&shard, shape)| stateful_set(cluster, shard, shape)));
    objects.push(disruption_budget(cluster));
    objects.push(network_policy(cluster));
    objects
}

/// A stable hash of an object's desired content (FNV-1a over its JSON).
/// Owner references are hashed at the API version the first release wrote
/// them with: the owner is the same object at any version (its uid), and a
/// new served version must not make an upgraded operator rewrite every
/// object it owns (nor change a StatefulSet's template) when nothing else
/// changed. The live reference moves to the new version with the next real
/// change; a release that stops serving that version must rewrite them first.
pub fn content_hash(object: &Value) -> String {
    let mut object = object.clone();
    if let Some(owners) = object["metadata"]["ownerReferences"].as_array_mut() {
        for owner in owners.iter_mut().filter(|o| is_our_api_version(&o["apiVersion"])) {
            owner["apiVersion"] = json!(crate::api::v1alpha1::API_VERSION);
        }
    }
    let text = serde_json::to_string(&object).expect("serializable");
    let mut hash: u64 = 0xcbf29ce484222325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x100000001b3);
    }
    format!("{hash:016x}")
}

fn is_our_api_version(api_version: &Value) -> bool {
    api_version.as_str().and_then(|v| v.split_once('/')).is_some_and(|(group, _)| group == crate::api::GROUP)
}

/// The object with its content hash in an annotation.
pub fn with_hash(mut object: Value) -> (Value, String) {
    let hash = content_hash(&object);
    object["metadata"]["annotations"][ANNOTATION_SPEC_HASH] = json!(hash);
    (object, hash)
}

#[cfg(test)]
#[path = "resources_tests.rs"]
mod tests;
