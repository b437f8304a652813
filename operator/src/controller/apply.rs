//! Writes owned objects, and only those whose desired content changed: the
//! content hash in an annotation is compared with the watch cache, so a
//! steady-state reconcile makes no request but one read of its own auth
//! Secret (Secrets are read by name, never watched). The desired objects
//! themselves are rebuilt only when their inputs change, so it costs next to
//! no CPU either.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use serde_json::Value;

use super::Context;
use super::users::ClusterUsers;
use crate::api::RedisCluster;
use crate::api::catalog::CatalogEntry;
use crate::api::names::{ANNOTATION_SPEC_HASH, FIELD_MANAGER};
use crate::error::{Error, Result};
use crate::resources;
use crate::resources::ShardShape;

/// One owned object as it should be, with its content hash in an annotation.
struct Desired {
    kind: String,
    name: String,
    hash: String,
    object: Value,
    resource: ApiResource,
}

impl Desired {
    fn new(object: Value) -> Self {
        let (object, hash) = resources::with_hash(object);
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let kind = object["kind"].as_str().unwrap_or_default().to_owned();
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &kind));
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        Self { kind, name, hash, object, resource }
    }

    /// Configuration the workloads mount, applied before them.
    fn is_configuration(&self) -> bool {
        matches!(self.kind.as_str(), "Secret" | "ConfigMap" | "Service")
    }
}

/// Every object the cluster owns, as it should be.
fn desired(
    cluster: &RedisCluster,
    users: &ClusterUsers,
    shards: &BTreeMap<usize, ShardShape>,
    in_use: &[&CatalogEntry],
) -> Vec<Desired> {
    std::iter::once(resources::auth_secret(cluster, users))
        .chain(resources::desired_objects(cluster, shards, in_use))
        .map(Desired::new)
        .collect()
}

/// What the desired objects are built from: the cluster object's
/// resourceVersion (any change to it), the shard sizes and the users (their
/// revision digests every rule and password).
/// `None` without a resourceVersion (then nothing is remembered).
fn inputs_of(
    cluster: &RedisCluster,
    users: &str,
    shards: &BTreeMap<usize, ShardShape>,
    in_use: &[&CatalogEntry],
) -> Option<u64> {
    let version = cluster.metadata.resource_version.as_ref()?;
    let mut hasher = DefaultHasher::new();
    let releases: Vec<String> = in_use.iter().map(|e| e.release().to_string()).collect();
    (version, shards, users, releases).hash(&mut hasher);
    Some(hasher.finish())
}

/// Per cluster, the inputs of the last complete apply and the hashes it
/// wrote: while both still hold, a reconcile builds no object at all. Only
/// hashes are kept, not the objects (memory stays flat with many clusters).
#[derive(Default)]
pub struct Applied {
    clusters: Mutex<HashMap<String, Kept>>,
}

struct Kept {
    inputs: u64,
    hashes: Vec<(String, String, String)>,
}

impl Applied {
    /// The hashes written by the last complete apply, if it was made from `inputs`.
    fn kept(&self, key: &str, inputs: Option<u64>) -> Option<Vec<(String, String, String)>> {
        let clusters = self.clusters.lock().expect("applied lock");
        clusters.get(key).filter(|k| Some(k.inputs) == inputs).map(|k| k.hashes.clone())
    }

    fn remember(&self, key: &str, inputs: Option<u64>, objects: &[Desired]) {
        let mut clusters = self.clusters.lock().expect("applied lock");
        match inputs {
            Some(inputs) => {
                let hashes = objects.iter().map(|d| (d.kind.clone(), d.name.clone(), d.hash.clone())).collect();
                clusters.insert(key.to_owned(), Kept { inputs, hashes });
            }
            None => drop(clusters.remove(key)),
        }
    }

    pub fn forget_cluster(&self, key: &str) {
        self.clusters.lock().expect("applied lock").remove(key);
    }
}

/// Brings the cluster's owned objects to their desired content; returns
/// what it wrote. The Pods must exist before Redis can be asked, so this
/// runs every reconcile; configuration goes before the workloads that mount
/// it, each group at once.
pub async fn owned_objects(
    ctx: &Context,
    cluster: &RedisCluster,
    key: &str,
    users: &ClusterUsers,
    shards: &BTreeMap<usize, ShardShape>,
    in_use: &[&CatalogEntry],
) -> Result<Vec<String>> {
    let namespace = cluster.metadata.namespace.as_deref().unwrap_or_default();
    let inputs = inputs_of(cluster, &users.revision, shards, in_use);
    if let Some(kept) = ctx.applied.kept(key, inputs)
        && in_place(ctx, namespace, &kept).await?
    {
        return Ok(Vec::new());
    }
    let desired = desired(cluster, users, shards, in_use);
    let mut written = Vec::new();
    for configuration in [true, false] {
        let writes = desired.iter().filter(|d| d.is_configuration() == configuration).map(|d| async move {
            Ok::<_, Error>(apply_if_changed(ctx, namespace, d).await?.then(|| format!("{} {}", d.kind, d.name)))
        });
        written.extend(futures::future::try_join_all(writes).await?.into_iter().flatten());
    }
    ctx.applied.remember(key, inputs, &desired);
    Ok(written)
}

/// Whether every object written from the same inputs is still as written.
async fn in_place(ctx: &Context, namespace: &str, kept: &[(String, String, String)]) -> Result<bool> {
    for (kind, name, hash) in kept {
        if stored_hash(ctx, kind, namespace, name).await?.flatten().as_ref() != Some(hash) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The content hash on an owned object (see [`super::cache::Caches::stored_hash`]): from
/// the caches, or for a Secret, read by name.
async fn stored_hash(ctx: &Context, kind: &str, namespace: &str, name: &str) -> Result<Option<Option<String>>> {
    if kind != "Secret" {
        return Ok(ctx.caches.stored_hash(kind, namespace, name));
    }
    let secrets: Api<PartialObjectMeta<Secret>> = Api::namespaced(ctx.client.clone(), namespace);
    let found = secrets.get_metadata_opt(name).await.map_err(Error::kube(format!("read Secret {namespace}/{name}")))?;
    Ok(found.map(|s| s.metadata.annotations.and_then(|mut a| a.remove(ANNOTATION_SPEC_HASH))))
}

/// Applies `desired` if it is missing or its hash differs; returns whether it wrote.
async fn apply_if_changed(ctx: &Context, namespace: &str, desired: &Desired) -> Result<bool> {
    let Desired { kind, name, hash, object, resource } = desired;
    if stored_hash(ctx, kind, namespace, name).await?.flatten().as_deref() == Some(hash.as_str()) {
        return Ok(false);
    }
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, resource);
    let what = format!("{kind} {namespace}/{name}");
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(name, &params, &Patch::Apply(object)).await.map_err(Error::kube(format!("apply {what}")))?;
    tracing::info!(namespace, object = %what, "applied");
    Ok(true)
}

/// The cluster's password: from the user's Secret, or generated once into
/// `<name>-password` and never rotated by the operator.
pub async fn password(client: &kube::Client, cluster: &RedisCluster, namespace: &str) -> Result<String> {
    if let Some(password) = existing_password(client, cluster, namespace).await? {
        return Ok(password);
    }
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let (secret_name, key) = resources::password_source(cluster);
    if cluster.spec.auth.is_some() {
        return Err(Error::InvalidSpec(format!(
            "spec.auth.secretName: Secret {namespace}/{secret_name} does not exist; create it with key {key:?}"
        )));
    }
    let generated = random_password();
    let object: Secret =
        serde_json::from_value(resources::generated_password_secret(cluster, &generated)).expect("valid Secret");
    match secrets.create(&PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &object).await
    {
        Ok(_) => {
            tracing::info!(namespace, secret = %secret_name, "generated password Secret");
            Ok(generated)
        }
        // Created by a previous attempt the cache has not seen yet: read what won.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let secret = secrets
                .get(&secret_name)
                .await
                .map_err(Error::kube(format!("read Secret {namespace}/{secret_name}")))?;
            password_in(&secret, namespace, &secret_name, &key)
        }
        Err(e) => Err(Error::kube(format!("create Secret {namespace}/{secret_name}"))(e)),
    }
}

/// The cluster's password if its Secret exists; creates nothing (readers
/// on any replica use it).
pub async fn existing_password(
    client: &kube::Client,
    cluster: &RedisCluster,
    namespace: &str,
) -> Result<Option<String>> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let (secret_name, key) = resources::password_source(cluster);
    // Read by name each time (a user's rotation is seen); the admission
    // policy made sure the cluster's author may read it too.
    let existing =
        secrets.get_opt(&secret_name).await.map_err(Error::kube(format!("read Secret {namespace}/{secret_name}")))?;
    existing.map(|secret| password_in(&secret, namespace, &secret_name, &key)).transpose()
}

fn password_in(secret: &Secret, namespace: &str, secret_name: &str, key: &str) -> Result<String> {
    let value = secret.data.as_ref().and_then(|d| d.get(key)).map(|v| String::from_utf8_lossy(&v.0).into_owned());
    value.filter(|v| !v.is_empty()).ok_or_else(|| {
        Error::InvalidSpec(format!("Secret {namespace}/{secret_name} has no non-empty key {key:?} (spec.auth.key)"))
    })
}

pub(super) fn random_password() -> String {
    use std::io::Read as _;
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).expect("/dev/urandom is readable");
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    bytes.iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RedisClusterSpec;

    fn cluster(resource_version: Option<&str>, masters: i32) -> RedisCluster {
        let spec = serde_json::json!({"masters": masters, "replicasPerMaster": 1, "redis": {"version": "7.0.15"}});
        let mut c = RedisCluster::new("cache", serde_json::from_value::<RedisClusterSpec>(spec).unwrap());
        c.metadata.namespace = Some("apps".into());
        c.metadata.uid = Some("uid-1".into());
        c.metadata.resource_version = resource_version.map(Into::into);
        c
    }

    #[test]
    fn inputs_change_with_the_cluster_object_the_shard_sizes_and_the_users() {
        let sizes = shapes(&[2, 2, 2]);
        let base = inputs_of(&cluster(Some("7"), 3), "secret", &sizes, &in_use());
        assert!(base.is_some());
        assert_eq!(base, inputs_of(&cluster(Some("7"), 3), "secret", &sizes, &in_use()));
        assert_ne!(base, inputs_of(&cluster(Some("8"), 3), "secret", &sizes, &in_use()));
        assert_ne!(base, inputs_of(&cluster(Some("7"), 3), "secret", &shapes(&[3]), &in_use()));
        let mut upgraded = sizes.clone();
        upgraded.get_mut(&0).unwrap().image = "redis:7.0.15".into();
        assert_ne!(
            base,
            inputs_of(&cluster(Some("7"), 3), "secret", &upgraded, &in_use()),
            "a shard's image is an input"
        );
        assert_ne!(base, inputs_of(&cluster(Some("7"), 3), "rotated", &sizes, &in_use()));
        assert_eq!(inputs_of(&cluster(None, 3), "secret", &sizes, &in_use()), None, "nothing to key on");
    }

    fn users(password: &str) -> ClusterUsers {
        super::super::users::build(&Default::default(), password, "operator", "replication", &[])
    }

    fn shapes(pods: &[usize]) -> BTreeMap<usize, ShardShape> {
        let shape = |pods| ShardShape { pods, image: "redis:6.2.14".into(), conf: "redis-6.2.14.conf".into() };
        pods.iter().enumerate().map(|(s, &pods)| (s, shape(pods))).collect()
    }

    fn in_use() -> Vec<&'static CatalogEntry> {
        vec![crate::api::catalog::lookup(crate::api::Engine::Redis, "6.2.14").unwrap()]
    }

    #[test]
    fn desired_objects_carry_their_hash_and_configuration_goes_first() {
        let objects = desired(&cluster(Some("1"), 3), &users("secret"), &shapes(&[2, 2, 2]), &in_use());
        assert_eq!(objects.iter().filter(|d| d.kind == "StatefulSet").count(), 3);
        assert!(
            objects
                .iter()
                .all(|d| d.object["metadata"]["annotations"][crate::api::names::ANNOTATION_SPEC_HASH] == d.hash)
        );
        let configuration: Vec<&str> =
            objects.iter().filter(|d| d.is_configuration()).map(|d| d.kind.as_str()).collect();
        assert!(configuration.contains(&"Secret") && configuration.contains(&"ConfigMap"));
        assert!(configuration.contains(&"Service"));
        let rotated = desired(&cluster(Some("1"), 3), &users("rotated"), &BTreeMap::new(), &in_use());
        let secret = |objects: &[Desired]| objects.iter().find(|d| d.kind == "Secret").map(|d| d.hash.clone());
        assert_ne!(secret(&objects), secret(&rotated), "the include Secret follows the password");
    }

    #[test]
    fn remembered_hashes_follow_the_inputs() {
        let applied = Applied::default();
        let objects = desired(&cluster(Some("1"), 3), &users("secret"), &BTreeMap::new(), &in_use());
        applied.remember("apps/cache", Some(1), &objects);
        assert_eq!(applied.clusters.lock().unwrap()["apps/cache"].hashes.len(), objects.len());
        applied.remember("apps/cache", None, &objects);
        assert!(applied.clusters.lock().unwrap().is_empty(), "unkeyed inputs forget");
        applied.remember("apps/cache", Some(2), &objects);
        applied.forget_cluster("apps/cache");
        assert!(applied.clusters.lock().unwrap().is_empty());
    }
}
