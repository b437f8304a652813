//! Conversion between `slotkeeper.io/v1alpha1` and `v1`: one pure function
//! per kind and direction, lossless both ways. A field only `v1` has rides
//! through `v1alpha1` in an annotation and comes back from it; every other
//! field has a place in both. The operator's conversion webhook calls
//! [`convert`] on each object the apiserver sends.

use std::collections::BTreeMap;

use kube::Resource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cluster::{PlacementSpec, RedisClusterSpec, RedisSpec};
use crate::names::ANNOTATION_V1_FIELDS;
use crate::operation::RedisOperationSpec;
use crate::rollout::{RolloutSpec, UpgradeSpec};
use crate::{RedisCluster, RedisOperation, v1alpha1};

#[derive(Debug, thiserror::Error)]
pub enum ConversionError {
    #[error("object has no apiVersion or kind")]
    MissingTypeMeta,
    #[error("cannot convert {kind} from {from} to {to}: Slotkeeper serves {known}")]
    UnknownVersion { kind: String, from: String, to: String, known: String },
    #[error("cannot convert kind {0}: Slotkeeper converts RedisCluster and RedisOperation")]
    UnknownKind(String),
    #[error("{kind} {name} is not a valid {api_version} object: {source}")]
    Invalid { kind: String, name: String, api_version: String, source: serde_json::Error },
}

/// The fields only `v1` has, carried by `v1alpha1` objects in [`ANNOTATION_V1_FIELDS`].
#[derive(Serialize, Deserialize, Default, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct V1OnlyFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    placement: Option<PlacementSpec>,
}

pub fn cluster_to_v1(old: v1alpha1::RedisCluster) -> RedisCluster {
    let v1alpha1::RedisClusterSpec {
        masters,
        replicas_per_master,
        engine,
        version,
        image,
        resources,
        storage,
        auth,
        config,
        upgrade,
        paused,
        scheduling,
    } = old.spec;
    let mut metadata = old.metadata;
    let carried: V1OnlyFields = take_annotation(&mut metadata.annotations);
    let spec = RedisClusterSpec {
        masters,
        replicas_per_master,
        redis: RedisSpec { engine, version, image, config },
        resources,
        storage,
        auth,
        rollout: upgrade.map(|u| RolloutSpec {
            canary_bake_seconds: u.canary_bake_seconds,
            step_timeout_seconds: u.step_timeout_seconds,
        }),
        placement: carried.placement,
        paused,
        scheduling,
    };
    RedisCluster { metadata, spec, status: old.status }
}

pub fn cluster_to_v1alpha1(new: RedisCluster) -> v1alpha1::RedisCluster {
    let RedisClusterSpec {
        masters,
        replicas_per_master,
        redis: RedisSpec { engine, version, image, config },
        resources,
        storage,
        auth,
        rollout,
        placement,
        paused,
        scheduling,
    } = new.spec;
    let mut metadata = new.metadata;
    put_annotation(&mut metadata.annotations, &V1OnlyFields { placement });
    let spec = v1alpha1::RedisClusterSpec {
        masters,
        replicas_per_master,
        engine,
        version,
        image,
        resources,
        storage,
        auth,
        config,
        upgrade: rollout.map(|r| UpgradeSpec {
            canary_bake_seconds: r.canary_bake_seconds,
            step_timeout_seconds: r.step_timeout_seconds,
        }),
        paused,
        scheduling,
    };
    v1alpha1::RedisCluster { metadata, spec, status: new.status }
}

pub fn operation_to_v1(old: v1alpha1::RedisOperation) -> RedisOperation {
    let v1alpha1::RedisOperationSpec { cluster, type_, failover } = old.spec;
    let spec = RedisOperationSpec { cluster_name: cluster, type_, failover };
    RedisOperation { metadata: old.metadata, spec, status: old.status }
}

pub fn operation_to_v1alpha1(new: RedisOperation) -> v1alpha1::RedisOperation {
    let RedisOperationSpec { cluster_name, type_, failover } = new.spec;
    let spec = v1alpha1::RedisOperationSpec { cluster: cluster_name, type_, failover };
    v1alpha1::RedisOperation { metadata: new.metadata, spec, status: new.status }
}

/// Moves the fields `v1alpha1` cannot hold out of its annotation. An
/// annotation that does not parse is left where it is (nothing is lost, and
/// the object stays readable).
fn take_annotation(annotations: &mut Option<BTreeMap<String, String>>) -> V1OnlyFields {
    let Some(map) = annotations.as_mut() else { return V1OnlyFields::default() };
    let Some(parsed) = map.get(ANNOTATION_V1_FIELDS).and_then(|text| serde_json::from_str(text).ok()) else {
        return V1OnlyFields::default();
    };
    map.remove(ANNOTATION_V1_FIELDS);
    if map.is_empty() {
        *annotations = None;
    }
    parsed
}

fn put_annotation(annotations: &mut Option<BTreeMap<String, String>>, fields: &V1OnlyFields) {
    if *fields == V1OnlyFields::default() {
        return;
    }
    let text = serde_json::to_string(fields).expect("plain data serializes");
    annotations.get_or_insert_with(BTreeMap::new).insert(ANNOTATION_V1_FIELDS.into(), text);
}

/// The API versions of a kind, oldest first.
fn served(kind: &str) -> Option<[String; 2]> {
    match kind {
        "RedisCluster" => {
            Some([v1alpha1::RedisCluster::api_version(&()).into(), RedisCluster::api_version(&()).into()])
        }
        "RedisOperation" => {
            Some([v1alpha1::RedisOperation::api_version(&()).into(), RedisOperation::api_version(&()).into()])
        }
        _ => None,
    }
}

/// Converts one object, as the apiserver sends it in a `ConversionReview`,
/// to `desired_api_version`.
pub fn convert(object: Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    let api_version = object.get("apiVersion").and_then(Value::as_str).ok_or(ConversionError::MissingTypeMeta)?;
    let kind = object.get("kind").and_then(Value::as_str).ok_or(ConversionError::MissingTypeMeta)?.to_string();
    if api_version == desired_api_version {
        return Ok(object);
    }
    let [old, new] = served(&kind).ok_or_else(|| ConversionError::UnknownKind(kind.clone()))?;
    let upgrading = api_version == old && desired_api_version == new;
    let downgrading = api_version == new && desired_api_version == old;
    if !upgrading && !downgrading {
        return Err(ConversionError::UnknownVersion {
            kind,
            from: api_version.into(),
            to: desired_api_version.into(),
            known: format!("{old} and {new}"),
        });
    }
    let from = api_version.to_string();
    match (kind.as_str(), upgrading) {
        ("RedisCluster", true) => Ok(to_value(cluster_to_v1(parse(object, &kind, &from)?))),
        ("RedisCluster", false) => Ok(to_value(cluster_to_v1alpha1(parse(object, &kind, &from)?))),
        ("RedisOperation", true) => Ok(to_value(operation_to_v1(parse(object, &kind, &from)?))),
        _ => Ok(to_value(operation_to_v1alpha1(parse(object, &kind, &from)?))),
    }
}

fn parse<K: serde::de::DeserializeOwned>(object: Value, kind: &str, api_version: &str) -> Result<K, ConversionError> {
    let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("(unnamed)").to_string();
    serde_json::from_value(object).map_err(|source| ConversionError::Invalid {
        kind: kind.into(),
        name,
        api_version: api_version.into(),
        source,
    })
}

/// The typed object as JSON, its `apiVersion` and `kind` included.
fn to_value<K: Resource<DynamicType = ()> + Serialize>(object: K) -> Value {
    let mut value = serde_json::to_value(&object).expect("plain data serializes");
    value["apiVersion"] = K::api_version(&()).into();
    value["kind"] = K::kind(&()).into();
    value
}

#[cfg(test)]
#[path = "conversion_tests.rs"]
mod tests;
