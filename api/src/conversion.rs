//! Conversion between `slotkeeper.io/v1alpha1` and `v1`: one pure function
//! per kind and direction, lossless both ways. A field only `v1` has rides
//! through `v1alpha1` in an annotation and comes back from it; every other
//! field has a place in both. The operator's conversion webhook calls
//! [`convert`] on each object the apiserver sends.

use std::collections::BTreeMap;

use kube::Resource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::balancing::BalanceSpec;
use crate::cluster::{PlacementSpec, RedisClusterSpec, RedisSpec};
use crate::names::ANNOTATION_V1_FIELDS;
use crate::operation::RedisOperationSpec;
use crate::rollout::{RolloutSpec, UpgradeSpec};
use crate::{RedisCluster, RedisOperation, v1alpha1};

pub mod wire;

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    balance: Option<BalanceSpec>,
}

pub fn cluster_to_v1(old: v1alpha1::RedisCluster) -> RedisCluster {
    let mut metadata = old.metadata;
    let carried: V1OnlyFields = take_annotation(&mut metadata.annotations);
    RedisCluster { metadata, spec: cluster_spec_to_v1(old.spec, carried), status: old.status }
}

pub fn cluster_to_v1alpha1(new: RedisCluster) -> v1alpha1::RedisCluster {
    let (spec, carried) = cluster_spec_to_v1alpha1(new.spec);
    let mut metadata = new.metadata;
    put_annotation(&mut metadata.annotations, &carried);
    v1alpha1::RedisCluster { metadata, spec, status: new.status }
}

/// A `v1alpha1` spec in `v1`'s shape, with the fields it carried for `v1`.
fn cluster_spec_to_v1(old: v1alpha1::RedisClusterSpec, carried: V1OnlyFields) -> RedisClusterSpec {
    let v1alpha1::RedisClusterSpec {
        masters,
        replicas_per_master,
        engine,
        version,
        image,
        resources,
        storage,
        auth,
        acl,
        config,
        upgrade,
        paused,
        scheduling,
    } = old;
    RedisClusterSpec {
        masters,
        replicas_per_master,
        redis: RedisSpec { engine, version, image, config },
        resources,
        storage,
        auth,
        acl,
        rollout: upgrade.map(|u| RolloutSpec {
            canary_bake_seconds: u.canary_bake_seconds,
            step_timeout_seconds: u.step_timeout_seconds,
        }),
        placement: carried.placement,
        balance: carried.balance,
        paused,
        scheduling,
    }
}

/// A `v1` spec in `v1alpha1`'s shape, and the fields `v1alpha1` cannot hold.
fn cluster_spec_to_v1alpha1(new: RedisClusterSpec) -> (v1alpha1::RedisClusterSpec, V1OnlyFields) {
    let RedisClusterSpec {
        masters,
        replicas_per_master,
        redis: RedisSpec { engine, version, image, config },
        resources,
        storage,
        auth,
        acl,
        rollout,
        placement,
        balance,
        paused,
        scheduling,
    } = new;
    let spec = v1alpha1::RedisClusterSpec {
        masters,
        replicas_per_master,
        engine,
        version,
        image,
        resources,
        storage,
        auth,
        acl,
        config,
        upgrade: rollout.map(|r| UpgradeSpec {
            canary_bake_seconds: r.canary_bake_seconds,
            step_timeout_seconds: r.step_timeout_seconds,
        }),
        paused,
        scheduling,
    };
    (spec, V1OnlyFields { placement, balance })
}

pub fn operation_to_v1(old: v1alpha1::RedisOperation) -> RedisOperation {
    RedisOperation { metadata: old.metadata, spec: operation_spec_to_v1(old.spec), status: old.status }
}

pub fn operation_to_v1alpha1(new: RedisOperation) -> v1alpha1::RedisOperation {
    v1alpha1::RedisOperation { metadata: new.metadata, spec: operation_spec_to_v1alpha1(new.spec), status: new.status }
}

fn operation_spec_to_v1(old: v1alpha1::RedisOperationSpec) -> RedisOperationSpec {
    let v1alpha1::RedisOperationSpec { cluster, type_, failover } = old;
    RedisOperationSpec { cluster_name: cluster, type_, failover }
}

fn operation_spec_to_v1alpha1(new: RedisOperationSpec) -> v1alpha1::RedisOperationSpec {
    let RedisOperationSpec { cluster_name, type_, failover } = new;
    v1alpha1::RedisOperationSpec { cluster: cluster_name, type_, failover }
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

/// Converts one object to `desired_api_version`: [`wire::convert`] on its JSON text.
pub fn convert(object: Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    let converted = wire::convert(&object.to_string(), desired_api_version)?;
    Ok(serde_json::from_str(converted.get()).expect("the converter writes JSON"))
}

/// Whether converting `kind` from `from` to `to` goes to the newer version
/// (`true`) or to the older one; an error for anything else.
fn upgrading(kind: &str, from: &str, to: &str) -> Result<bool, ConversionError> {
    let [old, new] = served(kind).ok_or_else(|| ConversionError::UnknownKind(kind.to_string()))?;
    match (from == old, to == new, from == new, to == old) {
        (true, true, _, _) => Ok(true),
        (_, _, true, true) => Ok(false),
        _ => Err(ConversionError::UnknownVersion {
            kind: kind.into(),
            from: from.into(),
            to: to.into(),
            known: format!("{old} and {new}"),
        }),
    }
}

#[cfg(test)]
#[path = "conversion_tests.rs"]
mod tests;
