//! Writes owned objects, and only those whose desired content changed: the
//! content hash in an annotation is compared with the watch cache, so a
//! steady-state reconcile makes no request at all.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::Value;

use super::Context;
use crate::api::RedisCluster;
use crate::api::names::FIELD_MANAGER;
use crate::error::{Error, Result};
use crate::resources;

/// Applies `object` if it is missing or its hash differs; returns whether it wrote.
pub async fn apply_if_changed(ctx: &Context, namespace: &str, object: Value) -> Result<bool> {
    let (object, hash) = resources::with_hash(object);
    let (group, version) = match object["apiVersion"].as_str().unwrap_or_default().split_once('/') {
        Some((g, v)) => (g.to_owned(), v.to_owned()),
        None => (String::new(), object["apiVersion"].as_str().unwrap_or_default().to_owned()),
    };
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    if ctx.caches.stored_hash(&kind, namespace, &name).flatten().as_deref() == Some(hash.as_str()) {
        return Ok(false);
    }
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(&group, &version, &kind));
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, &resource);
    let what = format!("{kind} {namespace}/{name}");
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&name, &params, &Patch::Apply(&object)).await.map_err(Error::kube(format!("apply {what}")))?;
    tracing::info!(namespace, object = %what, "applied");
    Ok(true)
}

/// The cluster's password: from the user's Secret, or generated once into
/// `<name>-password` and never rotated by the operator.
pub async fn password(ctx: &Context, cluster: &RedisCluster, namespace: &str) -> Result<String> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let (secret_name, key) = resources::password_source(cluster);
    // The generated Secret is ours and cached; a user's Secret is not
    // labelled for our watch, so it is read each time (rotation is seen).
    let existing = match &cluster.spec.auth {
        None => ctx.caches.owned_secret(namespace, &secret_name).map(|s| s.as_ref().clone()),
        Some(_) => secrets
            .get_opt(&secret_name)
            .await
            .map_err(Error::kube(format!("read Secret {namespace}/{secret_name}")))?,
    };
    if let Some(secret) = existing {
        return password_in(&secret, namespace, &secret_name, &key);
    }
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

fn password_in(secret: &Secret, namespace: &str, secret_name: &str, key: &str) -> Result<String> {
    let value = secret.data.as_ref().and_then(|d| d.get(key)).map(|v| String::from_utf8_lossy(&v.0).into_owned());
    value.filter(|v| !v.is_empty()).ok_or_else(|| {
        Error::InvalidSpec(format!("Secret {namespace}/{secret_name} has no non-empty key {key:?} (spec.auth.key)"))
    })
}

fn random_password() -> String {
    use std::io::Read as _;
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).expect("/dev/urandom is readable");
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    bytes.iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}
