//! A dynamic volume provisioner for the `standard` StorageClass (the default):
//! each PersistentVolumeClaim gets a PersistentVolume backed by a directory of
//! its own, which outlives the Pods that use it. The PV is pre-bound to its
//! claim and the real PV controller completes the binding. When a claim is
//! deleted the controller releases the PV and, under the Delete policy, we
//! remove the directory and the PV.
//!
//! Binding is Immediate and PVs carry no node affinity: every "node" is this
//! machine, so the storage behaves like network-attached volumes and a Pod
//! can be rescheduled to another Node with its data.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;

use super::FIELD_MANAGER;

pub const STORAGE_CLASS: &str = "standard";
pub const PROVISIONER: &str = "slotkeeper.io/local-dir";
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

pub async fn ensure_storage_class(client: &Client) -> kube::Result<()> {
    let api: Api<StorageClass> = Api::all(client.clone());
    let class = json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": { "storageclass.kubernetes.io/is-default-class": "true" },
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": false,
    });
    api.patch(STORAGE_CLASS, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(class)).await.map(|_| ())
}

/// Provisions and reclaims volumes until the watches end.
pub async fn run(client: Client, root: PathBuf) {
    let claims = provision_loop(client.clone(), root.clone());
    let volumes = reclaim_loop(client, root);
    tokio::join!(claims, volumes);
}

async fn provision_loop(client: Client, root: PathBuf) {
    let api: Api<PersistentVolumeClaim> = Api::all(client.clone());
    let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
    while let Some(event) = events.next().await {
        let claim = match event {
            Ok(Event::Apply(claim) | Event::InitApply(claim)) => claim,
            Ok(_) => continue,
            Err(error) => {
                tracing::warn!(%error, "claim watch error");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(error) = provision(&client, &root, &claim).await {
            tracing::warn!(namespace = claim.namespace().unwrap_or_default(), claim = claim.name_any(), %error, "provisioning failed");
        }
    }
}

async fn provision(client: &Client, root: &Path, claim: &PersistentVolumeClaim) -> anyhow::Result<()> {
    let Some(spec) = &claim.spec else {
        return Ok(());
    };
    let ours = spec.storage_class_name.as_deref() == Some(STORAGE_CLASS);
    let unbound = spec.volume_name.as_deref().unwrap_or_default().is_empty();
    if !ours || !unbound || claim.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let uid = claim.uid().unwrap_or_default();
    let name = format!("pvc-{uid}");
    let dir = root.join(&name);
    std::fs::create_dir_all(&dir)?;
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "1Gi".into());
    let volume: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": { "name": name, "annotations": { PROVISIONED_BY: PROVISIONER } },
        "spec": {
            "capacity": { "storage": size },
            "accessModes": spec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "volumeMode": "Filesystem",
            "hostPath": { "path": dir.display().to_string(), "type": "Directory" },
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": claim.namespace(),
                "name": claim.name_any(),
                "uid": uid,
            },
        },
    }))?;
    let api: Api<PersistentVolume> = Api::all(client.clone());
    match api.create(&PostParams::default(), &volume).await {
        Ok(_) => {
            tracing::info!(namespace = claim.namespace().unwrap_or_default(), claim = claim.name_any(), volume = %name, "provisioned");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn reclaim_loop(client: Client, root: PathBuf) {
    let api: Api<PersistentVolume> = Api::all(client.clone());
    let mut events = std::pin::pin!(watcher::watcher(api.clone(), watcher::Config::default()));
    while let Some(event) = events.next().await {
        let volume = match event {
            Ok(Event::Apply(v) | Event::InitApply(v)) => v,
            Ok(_) => continue,
            Err(error) => {
                tracing::warn!(%error, "volume watch error");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let ours = volume.annotations().get(PROVISIONED_BY).map(String::as_str) == Some(PROVISIONER);
        let released = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        let delete = volume.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Delete");
        if ours && released && delete {
            let name = volume.name_any();
            let _ = std::fs::remove_dir_all(root.join(&name));
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => tracing::info!(volume = %name, "reclaimed"),
                Err(error) => tracing::warn!(volume = %name, %error, "reclaim failed"),
            }
        }
    }
}
