//! Turns a Pod's spec into what a process needs: resolved environment
//! variables and materialized volumes. Values come from the API (Secrets,
//! ConfigMaps, PVCs and their PVs, service-account tokens).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, EnvVar, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
    Volume,
};
use kube::api::PostParams;
use kube::{Api, Client};

use super::container::RootFs;
use super::expand::expand;
use super::oci::OciImage;

/// Why a Pod's containers cannot be created yet (kept as the waiting message).
pub type PrepareError = String;

/// A directory or file bind-mounted into a container's mount namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

/// Writes every volume of the Pod under `pod_dir/volumes/<name>` (PVCs point at
/// their PV's directory instead) and returns the source path per volume name.
pub async fn materialize_volumes(
    client: &Client,
    pod: &Pod,
    pod_dir: &Path,
) -> Result<HashMap<String, PathBuf>, PrepareError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut sources = HashMap::new();
    for volume in pod.spec.as_ref().and_then(|s| s.volumes.as_ref()).into_iter().flatten() {
        let dir = pod_dir.join("volumes").join(&volume.name);
        let source = materialize(client, namespace, pod, volume, &dir)
            .await
            .map_err(|e| format!("volume {:?}: {e}", volume.name))?;
        sources.insert(volume.name.clone(), source);
    }
    Ok(sources)
}

async fn materialize(client: &Client, ns: &str, pod: &Pod, volume: &Volume, dir: &Path) -> Result<PathBuf, String> {
    if volume.empty_dir.is_some() {
        create_dir(dir)?;
        return Ok(dir.to_owned());
    }
    if let Some(source) = &volume.config_map {
        let optional = source.optional.unwrap_or(false);
        let data = config_map_data(client, ns, &source.name, optional).await?;
        write_projection(dir, &data, source.items.as_deref())?;
        return Ok(dir.to_owned());
    }
    if let Some(source) = &volume.secret {
        let name = source.secret_name.clone().unwrap_or_default();
        let data = secret_data(client, ns, &name, source.optional.unwrap_or(false)).await?;
        write_projection(dir, &data, source.items.as_deref())?;
        return Ok(dir.to_owned());
    }
    if let Some(source) = &volume.persistent_volume_claim {
        return claim_directory(client, ns, &source.claim_name).await;
    }
    if let Some(projected) = &volume.projected {
        create_dir(dir)?;
        for source in projected.sources.iter().flatten() {
            let (data, items) = if let Some(cm) = &source.config_map {
                (config_map_data(client, ns, &cm.name, cm.optional.unwrap_or(false)).await?, cm.items.as_deref())
            } else if let Some(secret) = &source.secret {
                (
                    secret_data(client, ns, &secret.name, secret.optional.unwrap_or(false)).await?,
                    secret.items.as_deref(),
                )
            } else if let Some(token) = &source.service_account_token {
                let value =
                    service_account_token(client, ns, pod, token.audience.clone(), token.expiration_seconds).await?;
                (BTreeMap::from([(token.path.clone(), value)]), None)
            } else if let Some(downward) = &source.downward_api {
                let mut data = BTreeMap::new();
                for item in downward.items.iter().flatten() {
                    let field = item.field_ref.as_ref().map(|f| f.field_path.as_str()).unwrap_or_default();
                    let value = field_value(pod, field)
                        .ok_or_else(|| format!("downward API field {field:?} is not supported"))?;
                    data.insert(item.path.clone(), value.into_bytes());
                }
                (data, None)
            } else {
                return Err("this projected source is not supported by the node agent".into());
            };
            write_projection(dir, &data, items)?;
        }
        return Ok(dir.to_owned());
    }
    Err("only emptyDir, configMap, secret, persistentVolumeClaim and projected volumes are supported".into())
}

fn create_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

fn write_projection(dir: &Path, data: &BTreeMap<String, Vec<u8>>, items: Option<&[KeyToPath]>) -> Result<(), String> {
    create_dir(dir)?;
    let files: Vec<(&str, &[u8])> = match items {
        Some(items) => {
            items.iter().filter_map(|item| data.get(&item.key).map(|v| (item.path.as_str(), v.as_slice()))).collect()
        }
        None => data.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect(),
    };
    for (relative, contents) in files {
        if relative.split('/').any(|part| part == "..") {
            return Err(format!("path {relative:?} escapes the volume"));
        }
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            create_dir(parent)?;
        }
        std::fs::write(&path, contents).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

async fn config_map_data(
    client: &Client,
    ns: &str,
    name: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    match api.get_opt(name).await.map_err(|e| format!("cannot read ConfigMap {ns}/{name}: {e}"))? {
        Some(cm) => {
            let mut data: BTreeMap<String, Vec<u8>> =
                cm.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes())).collect();
            data.extend(cm.binary_data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)));
            Ok(data)
        }
        None if optional => Ok(BTreeMap::new()),
        None => Err(format!("ConfigMap {ns}/{name} not found")),
    }
}

async fn secret_data(
    client: &Client,
    ns: &str,
    name: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    match api.get_opt(name).await.map_err(|e| format!("cannot read Secret {ns}/{name}: {e}"))? {
        Some(secret) => {
            let mut data: BTreeMap<String, Vec<u8>> =
                secret.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
            data.extend(secret.string_data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.into_bytes())));
            Ok(data)
        }
        None if optional => Ok(BTreeMap::new()),
        None => Err(format!("Secret {ns}/{name} not found")),
    }
}

/// The directory behind a bound claim (its PV's `hostPath`).
async fn claim_directory(client: &Client, ns: &str, claim: &str) -> Result<PathBuf, String> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc = claims
        .get_opt(claim)
        .await
        .map_err(|e| format!("cannot read PersistentVolumeClaim {ns}/{claim}: {e}"))?
        .ok_or_else(|| format!("PersistentVolumeClaim {ns}/{claim} not found"))?;
    let volume_name = pvc
        .spec
        .and_then(|s| s.volume_name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("PersistentVolumeClaim {ns}/{claim} is not bound yet"))?;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let pv = volumes.get(&volume_name).await.map_err(|e| format!("cannot read PersistentVolume {volume_name}: {e}"))?;
    let path = pv
        .spec
        .and_then(|s| s.host_path.map(|h| h.path).or(s.local.map(|l| l.path)))
        .ok_or_else(|| format!("PersistentVolume {volume_name} has no hostPath or local path"))?;
    create_dir(Path::new(&path))?;
    Ok(PathBuf::from(path))
}

async fn service_account_token(
    client: &Client,
    ns: &str,
    pod: &Pod,
    audience: Option<String>,
    expiration_seconds: Option<i64>,
) -> Result<Vec<u8>, String> {
    let account = pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into());
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let request: TokenRequest = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": audience.into_iter().collect::<Vec<_>>(),
            "expirationSeconds": expiration_seconds.unwrap_or(3607),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid},
        }
    }))
    .expect("static TokenRequest");
    let response = api
        .create_token_request(&account, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("cannot request a token for ServiceAccount {ns}/{account}: {e}"))?;
    let token = response.status.and_then(|s| s.token).ok_or("the token request returned no token")?;
    Ok(token.into_bytes())
}

/// The downward-API fields a kubelet resolves from the Pod object.
pub fn field_value(pod: &Pod, field: &str) -> Option<String> {
    let meta = &pod.metadata;
    Some(match field {
        "metadata.name" => meta.name.clone()?,
        "metadata.namespace" => meta.namespace.clone()?,
        "metadata.uid" => meta.uid.clone()?,
        "spec.nodeName" => pod.spec.as_ref()?.node_name.clone()?,
        "spec.serviceAccountName" => pod.spec.as_ref()?.service_account_name.clone()?,
        "status.podIP" => pod.status.as_ref()?.pod_ip.clone()?,
        "status.hostIP" => pod.status.as_ref()?.host_ip.clone()?,
        other => {
            let (map, key) = if let Some(rest) = other.strip_prefix("metadata.labels['") {
                (meta.labels.as_ref()?, rest.strip_suffix("']")?)
            } else if let Some(rest) = other.strip_prefix("metadata.annotations['") {
                (meta.annotations.as_ref()?, rest.strip_suffix("']")?)
            } else {
                return None;
            };
            map.get(key)?.clone()
        }
    })
}

/// The container's environment in declaration order, with `$(VAR)` references
/// to earlier variables expanded. `pod` must already carry its IP in status.
pub async fn resolve_env(
    client: &Client,
    pod: &Pod,
    container: &Container,
) -> Result<Vec<(String, String)>, PrepareError> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut resolved: Vec<(String, String)> = Vec::new();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let data = if let Some(cm) = &from.config_map_ref {
            config_map_data(client, ns, &cm.name, cm.optional.unwrap_or(false)).await?
        } else if let Some(secret) = &from.secret_ref {
            secret_data(client, ns, &secret.name, secret.optional.unwrap_or(false)).await?
        } else {
            BTreeMap::new()
        };
        for (key, value) in data {
            set(&mut resolved, format!("{prefix}{key}"), String::from_utf8_lossy(&value).into_owned());
        }
    }
    for var in container.env.iter().flatten() {
        let vars: HashMap<String, String> = resolved.iter().cloned().collect();
        if let Some(value) = env_value(client, ns, pod, var, &vars).await? {
            set(&mut resolved, var.name.clone(), value);
        }
    }
    Ok(resolved)
}

fn set(vars: &mut Vec<(String, String)>, name: String, value: String) {
    match vars.iter_mut().find(|(n, _)| *n == name) {
        Some(slot) => slot.1 = value,
        None => vars.push((name, value)),
    }
}

async fn env_value(
    client: &Client,
    ns: &str,
    pod: &Pod,
    var: &EnvVar,
    vars: &HashMap<String, String>,
) -> Result<Option<String>, String> {
    let Some(source) = &var.value_from else {
        return Ok(Some(expand(var.value.as_deref().unwrap_or_default(), vars)));
    };
    let lookup =
        |data: BTreeMap<String, Vec<u8>>, key: &str| data.get(key).map(|v| String::from_utf8_lossy(v).into_owned());
    if let Some(field) = &source.field_ref {
        return field_value(pod, &field.field_path)
            .map(Some)
            .ok_or_else(|| format!("env {}: field {:?} is not available", var.name, field.field_path));
    }
    if let Some(key_ref) = &source.secret_key_ref {
        let optional = key_ref.optional.unwrap_or(false);
        let value = lookup(secret_data(client, ns, &key_ref.name, optional).await?, &key_ref.key);
        return match value {
            None if !optional => {
                Err(format!("env {}: key {:?} not found in Secret {ns}/{}", var.name, key_ref.key, key_ref.name))
            }
            v => Ok(v),
        };
    }
    if let Some(key_ref) = &source.config_map_key_ref {
        let optional = key_ref.optional.unwrap_or(false);
        let value = lookup(config_map_data(client, ns, &key_ref.name, optional).await?, &key_ref.key);
        return match value {
            None if !optional => {
                Err(format!("env {}: key {:?} not found in ConfigMap {ns}/{}", var.name, key_ref.key, key_ref.name))
            }
            v => Ok(v),
        };
    }
    Err(format!("env {}: only value, fieldRef, secretKeyRef and configMapKeyRef are supported", var.name))
}

/// The container's mounts from its volumeMounts and the materialized volumes.
pub fn container_mounts(container: &Container, sources: &HashMap<String, PathBuf>) -> Result<Vec<Mount>, PrepareError> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .map(|vm| {
            let source =
                sources.get(&vm.name).ok_or_else(|| format!("volumeMount {:?} names no volume of the Pod", vm.name))?;
            let source = match vm.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) if sub.split('/').any(|p| p == "..") => {
                    return Err(format!("subPath {sub:?} escapes the volume"));
                }
                Some(sub) => source.join(sub),
                None => source.clone(),
            };
            Ok(Mount { source, target: PathBuf::from(&vm.mount_path), read_only: vm.read_only.unwrap_or(false) })
        })
        .collect()
}

/// How a container of the machine's own binaries (no image root) is confined,
/// as a kubelet would from its securityContext and the Pod's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Confinement {
    /// uid, gid and supplementary groups (`fsGroup`, `supplementalGroups`);
    /// `None` runs as the agent's user, as an image without USER runs as root.
    pub user: Option<(u32, u32, Vec<u32>)>,
    /// The machine's root file system is read-only to the process (its volumes are not).
    pub read_only_root: bool,
}

pub fn host_confinement(pod: &Pod, container: &Container) -> Result<Confinement, PrepareError> {
    let own = container.security_context.as_ref();
    let pod_level = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let uid = own.and_then(|c| c.run_as_user).or(pod_level.and_then(|p| p.run_as_user));
    let gid = own.and_then(|c| c.run_as_group).or(pod_level.and_then(|p| p.run_as_group));
    let non_root = own.and_then(|c| c.run_as_non_root).or(pod_level.and_then(|p| p.run_as_non_root));
    if non_root == Some(true) && uid.unwrap_or(0) == 0 {
        return Err(format!(
            "container {} has runAsNonRoot and will run as root (set securityContext.runAsUser)",
            container.name
        ));
    }
    let id = |n: i64| u32::try_from(n).map_err(|_| format!("container {}: id {n} is out of range", container.name));
    let user = match uid {
        Some(uid) => {
            let mut groups: Vec<u32> =
                pod_level.and_then(|p| p.fs_group).into_iter().map(id).collect::<Result<_, _>>()?;
            for group in pod_level.and_then(|p| p.supplemental_groups.clone()).unwrap_or_default() {
                groups.push(id(group)?);
            }
            Some((id(uid)?, gid.map(id).transpose()?.unwrap_or(0), groups))
        }
        None => None,
    };
    let read_only_root = own.and_then(|c| c.read_only_root_filesystem).unwrap_or(false);
    Ok(Confinement { user, read_only_root })
}

/// Gives every volume of the Pod to its `fsGroup`, as a kubelet does: group
/// ownership, group read and write, and directories that keep the group.
pub fn give_volumes_to_fs_group(pod: &Pod, sources: &HashMap<String, PathBuf>) -> Result<(), PrepareError> {
    let Some(group) = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|c| c.fs_group) else {
        return Ok(());
    };
    let group = u32::try_from(group).map_err(|_| format!("fsGroup {group} is out of range"))?;
    for source in sources.values() {
        give_to_group(source, group).map_err(|e| format!("fsGroup {group} on {}: {e}", source.display()))?;
    }
    Ok(())
}

fn give_to_group(path: &Path, group: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let meta = std::fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, None, Some(group))?;
    let mode = meta.permissions().mode();
    let wanted = if meta.is_dir() { mode | 0o2070 } else { mode | 0o060 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(wanted))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            give_to_group(&entry?.path(), group)?;
        }
    }
    Ok(())
}

/// Unpacks an OCI image's root filesystem for `container` and decides its
/// user (the container's securityContext, then the Pod's, then the image's)
/// and whether the root is read-only, as a kubelet would.
pub fn image_root(pod: &Pod, container: &Container, image: &OciImage, dir: &Path) -> Result<RootFs, PrepareError> {
    image.unpack(dir)?;
    let own = container.security_context.as_ref();
    let pod_level = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let (image_uid, image_gid) = super::oci::resolve_user(&image.user, dir)?;
    let uid = own.and_then(|c| c.run_as_user).or(pod_level.and_then(|p| p.run_as_user));
    let gid = own.and_then(|c| c.run_as_group).or(pod_level.and_then(|p| p.run_as_group));
    let (uid, gid) = (uid.map_or(image_uid, |u| u as u32), gid.map_or(image_gid, |g| g as u32));
    let non_root = own.and_then(|c| c.run_as_non_root).or(pod_level.and_then(|p| p.run_as_non_root));
    if non_root == Some(true) && uid == 0 {
        return Err(format!(
            "container {} has runAsNonRoot and its image will run as root (set securityContext.runAsUser, or a USER in the image)",
            container.name
        ));
    }
    let read_only = own.and_then(|c| c.read_only_root_filesystem).unwrap_or(false);
    Ok(RootFs { dir: dir.to_owned(), uid, gid, read_only })
}
