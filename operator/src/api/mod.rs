//! The custom resources and their constants.

pub mod catalog;
pub mod cluster;
pub mod names;

pub use cluster::*;

use kube::CustomResourceExt as _;

/// Where the generated CRD lives in the repository.
pub const CRD_PATH: &str = "deploy/crds/redisclusters.slotkeeper.io.yaml";

/// Every CRD the operator serves, as the YAML committed in `deploy/crds/`.
pub fn crds_yaml() -> String {
    let header = "# Generated from the Rust types by `slotkeeper crd`; do not edit.\n";
    format!("{header}{}", serde_yaml::to_string(&RedisCluster::crd()).expect("a CRD serializes"))
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
    fn version_rule_lists_exactly_the_catalog() {
        let crd = serde_json::to_string(&RedisCluster::crd()).unwrap();
        let rule = format!("self in {}", catalog::cel_version_list());
        assert!(crd.contains(&rule), "the CRD's version rule must be `{rule}`");
    }
}
