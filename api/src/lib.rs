//! Slotkeeper's API: the custom resources (`RedisCluster`, `RedisOperation`),
//! every label, condition and reason name, the version catalog, and the pure
//! arithmetic over slots and memory that both the operator (which acts) and
//! the console (which previews) need. No IO and no controller here, so the
//! console can depend on it without pulling the reconcile in.
#![forbid(unsafe_code)]

pub mod acl;
pub mod admission;
pub mod balance;
pub mod balancing;
pub mod capacity;
pub mod catalog;
pub mod cluster;
pub mod conversion;
pub mod lag;
pub mod names;
pub mod operation;
pub mod redis_config;
pub mod rollout;
pub mod self_upgrade;
pub mod topology;
pub mod v1alpha1;

pub use balancing::{BalanceBy, BalancePlan, BalanceSpec, BalanceStatus, SlotTarget};
pub use cluster::*;
pub use operation::*;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, ServiceReference, WebhookClientConfig, WebhookConversion,
};
use kube::CustomResourceExt as _;

/// A server-side-apply patch setting the status of a `K`: its apiVersion
/// and kind come from the type, so a new API version changes one place.
pub fn status_patch<K: kube::Resource<DynamicType = ()>>(status: &impl serde::Serialize) -> serde_json::Value {
    serde_json::json!({ "apiVersion": K::api_version(&()), "kind": K::kind(&()), "status": status })
}

/// The API group of every kind Slotkeeper serves.
pub const GROUP: &str = "slotkeeper.io";
/// The API version the operator works in and stores (for manifests written
/// as text; a test keeps it equal to the derived types').
pub const API_VERSION: &str = "slotkeeper.io/v1";

/// Where the generated CRD lives in the repository.
pub const CRD_PATH: &str = "deploy/crds/slotkeeper.io.yaml";

/// Every CRD the operator serves, each with both versions: `v1` stored,
/// `v1alpha1` served and deprecated.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let both = |old: CustomResourceDefinition, new: CustomResourceDefinition| {
        let storage = new.spec.versions[0].name.clone();
        let mut crd = kube::core::crd::merge_crds(vec![old, new], &storage)
            .expect("both versions of a kind share group, names and scope");
        crd.spec.conversion = Some(webhook_conversion());
        crd
    };
    vec![
        both(v1alpha1::RedisCluster::crd(), RedisCluster::crd()),
        both(v1alpha1::RedisOperation::crd(), RedisOperation::crd()),
        self_upgrade::SlotkeeperUpgrade::crd(),
    ]
}

fn webhook_conversion() -> CustomResourceConversion {
    CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            conversion_review_versions: vec!["v1".into()],
            client_config: Some(WebhookClientConfig {
                service: Some(ServiceReference {
                    namespace: names::WEBHOOK_NAMESPACE.into(),
                    name: names::WEBHOOK_SERVICE.into(),
                    path: Some(names::WEBHOOK_PATH.into()),
                    port: Some(443),
                }),
                ..Default::default()
            }),
        }),
    }
}

/// Every CRD the operator serves, as the YAML committed in `deploy/crds/`.
pub fn crds_yaml() -> String {
    let header = "# Generated from the Rust types by `slotkeeper crd`; do not edit.\n";
    let crds = crds();
    let documents: Vec<String> = crds.iter().map(to_yaml).collect();
    format!("{header}{}", documents.join("---\n"))
}

/// A manifest as YAML, the way `deploy/` holds them.
pub fn to_yaml(object: &impl serde::Serialize) -> String {
    serde_norway::to_string(object).expect("a manifest serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_crd_matches_the_rust_types() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(CRD_PATH);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == crds_yaml(),
            "{CRD_PATH} is out of date with the Rust types: run `cargo run -- crd > {CRD_PATH}`"
        );
    }

    #[test]
    fn the_api_version_constants_are_the_types_own() {
        use kube::Resource as _;
        assert_eq!(API_VERSION, RedisCluster::api_version(&()));
        assert_eq!(API_VERSION, RedisOperation::api_version(&()));
        assert_eq!(v1alpha1::API_VERSION, v1alpha1::RedisCluster::api_version(&()));
        assert_eq!(GROUP, RedisCluster::group(&()));
    }

    #[test]
    fn status_patches_name_the_type_they_are_for() {
        let patch = status_patch::<RedisOperation>(&RedisOperationStatus::default());
        assert_eq!(patch["apiVersion"], "slotkeeper.io/v1");
        assert_eq!(patch["kind"], "RedisOperation");
        assert!(patch["status"].is_object());
    }

    #[test]
    fn the_masters_rule_says_min_masters() {
        let crd = serde_json::to_string(&RedisCluster::crd()).unwrap();
        assert!(
            crd.contains(&format!("self >= {MIN_MASTERS}")),
            "the CRD's rule on spec.masters must match MIN_MASTERS"
        );
    }

    #[test]
    fn version_rule_lists_exactly_the_catalog() {
        let crd = serde_json::to_string(&RedisCluster::crd()).unwrap();
        let rule = serde_json::to_string(&catalog::cel_rule()).unwrap();
        assert!(crd.contains(&rule), "the CRD's catalog rule (cluster.rs CATALOG_RULE) must be {rule}");
        assert!(crd.contains(&catalog::describe()), "the rule's message must list the catalog");
    }
}
