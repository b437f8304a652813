//! The webhook's conversion: an object's JSON text in, its converted JSON
//! text out, with the typed functions' result (a property test holds them
//! equal). Only `spec` is parsed, as the conversion is all there;
//! `metadata` is parsed only when the annotation of `v1`-only fields is
//! read or written, and `status` (the same in both versions) passes through
//! as the apiserver sent it. A 1,000-object list is one review, so this is
//! what keeps it within the webhook's latency budget.

use std::borrow::Cow;

use kube::api::ObjectMeta;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::{
    ConversionError, V1OnlyFields, cluster_spec_to_v1, cluster_spec_to_v1alpha1, operation_spec_to_v1,
    operation_spec_to_v1alpha1, put_annotation, take_annotation, upgrading,
};
use crate::cluster::RedisClusterSpec;
use crate::names::ANNOTATION_V1_FIELDS;
use crate::operation::RedisOperationSpec;
use crate::v1alpha1;

/// An object's parts, borrowed from the review's text.
#[derive(Deserialize)]
struct Parts<'a> {
    #[serde(rename = "apiVersion", borrow)]
    api_version: Option<Cow<'a, str>>,
    #[serde(borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    spec: Option<&'a RawValue>,
    #[serde(borrow)]
    status: Option<&'a RawValue>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Metadata<'a> {
    AsSent(&'a RawValue),
    Changed(Box<ObjectMeta>),
}

#[derive(Serialize)]
struct Converted<'a, S> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
    metadata: Metadata<'a>,
    spec: S,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a RawValue>,
}

/// Converts one object, as the apiserver sends it in a `ConversionReview`,
/// to `desired_api_version`.
pub fn convert(object: &str, desired_api_version: &str) -> Result<Box<RawValue>, ConversionError> {
    let parts: Parts = serde_json::from_str(object).map_err(|_| ConversionError::MissingTypeMeta)?;
    let (Some(api_version), Some(kind)) = (parts.api_version.as_deref(), parts.kind.as_deref()) else {
        return Err(ConversionError::MissingTypeMeta);
    };
    if api_version == desired_api_version {
        return Ok(RawValue::from_string(object.to_string()).expect("it parsed as JSON"));
    }
    let to_newer = upgrading(kind, api_version, desired_api_version)?;
    let object = Object { parts: &parts, kind, api_version, desired_api_version };
    match (kind, to_newer) {
        ("RedisCluster", true) => {
            let spec: v1alpha1::RedisClusterSpec = object.spec()?;
            // Only an object carrying the annotation needs its metadata parsed.
            let (metadata, carried) = match object.metadata_raw()? {
                raw if raw.get().contains(ANNOTATION_V1_FIELDS) => {
                    let mut metadata: ObjectMeta = object.parse(raw)?;
                    let carried = take_annotation(&mut metadata.annotations);
                    (Metadata::Changed(Box::new(metadata)), carried)
                }
                raw => (Metadata::AsSent(raw), V1OnlyFields::default()),
            };
            Ok(object.write(metadata, cluster_spec_to_v1(spec, carried)))
        }
        ("RedisCluster", false) => {
            let spec: RedisClusterSpec = object.spec()?;
            let (spec, carried) = cluster_spec_to_v1alpha1(spec);
            let raw = object.metadata_raw()?;
            let metadata = if carried == V1OnlyFields::default() {
                Metadata::AsSent(raw)
            } else {
                let mut metadata: ObjectMeta = object.parse(raw)?;
                put_annotation(&mut metadata.annotations, &carried);
                Metadata::Changed(Box::new(metadata))
            };
            Ok(object.write(metadata, spec))
        }
        ("RedisOperation", true) => {
            let spec: v1alpha1::RedisOperationSpec = object.spec()?;
            Ok(object.write(Metadata::AsSent(object.metadata_raw()?), operation_spec_to_v1(spec)))
        }
        _ => {
            let spec: RedisOperationSpec = object.spec()?;
            Ok(object.write(Metadata::AsSent(object.metadata_raw()?), operation_spec_to_v1alpha1(spec)))
        }
    }
}

/// One object being converted: its parts and what errors name.
struct Object<'a> {
    parts: &'a Parts<'a>,
    kind: &'a str,
    api_version: &'a str,
    desired_api_version: &'a str,
}

impl<'a> Object<'a> {
    fn spec<S: DeserializeOwned>(&self) -> Result<S, ConversionError> {
        let spec = self.parts.spec.ok_or_else(|| self.invalid(serde::de::Error::missing_field("spec")))?;
        self.parse(spec)
    }

    fn metadata_raw(&self) -> Result<&'a RawValue, ConversionError> {
        self.parts.metadata.ok_or_else(|| self.invalid(serde::de::Error::missing_field("metadata")))
    }

    fn parse<T: DeserializeOwned>(&self, raw: &RawValue) -> Result<T, ConversionError> {
        serde_json::from_str(raw.get()).map_err(|source| self.invalid(source))
    }

    fn invalid(&self, source: serde_json::Error) -> ConversionError {
        #[derive(Deserialize)]
        struct Named {
            name: Option<String>,
        }
        let named = self.parts.metadata.and_then(|raw| serde_json::from_str::<Named>(raw.get()).ok());
        ConversionError::Invalid {
            kind: self.kind.into(),
            name: named.and_then(|n| n.name).unwrap_or_else(|| "(unnamed)".into()),
            api_version: self.api_version.into(),
            source,
        }
    }

    fn write<S: Serialize>(&self, metadata: Metadata, spec: S) -> Box<RawValue> {
        let converted = Converted {
            api_version: self.desired_api_version,
            kind: self.kind,
            metadata,
            spec,
            status: self.parts.status,
        };
        serde_json::value::to_raw_value(&converted).expect("plain data serializes")
    }
}
