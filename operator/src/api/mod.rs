//! The custom resources and their constants.

pub mod catalog;
pub mod cluster;
pub mod names;
pub mod operation;

pub use cluster::*;
pub use operation::*;

use kube::CustomResourceExt as _;

/// Where the generated CRD lives in the repository.
pub const CRD_PATH: &str = "deploy/crds/slotkeeper.io.yaml";

/// Every CRD the operator serves, as the YAML committed in `deploy/crds/`.
pub fn crds_yaml() -> String {
    let header = "# Generated from the Rust types by `slotkeeper crd`; do not edit.\n";
    let crds = [RedisCluster::crd(), RedisOperation::crd()];
    let documents: Vec<String> = crds.iter().map(|crd| serde_yaml::to_string(crd).expect("a CRD serializes")).collect();
    format!("{header}{}", documents.join("---\n"))
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
