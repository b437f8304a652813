//! Storage-version migration with Kubernetes' own migrator
//! (`storagemigration.k8s.io/v1`), decided by pure functions: which
//! `StorageVersionMigration` to create, when to wait, and when the CRD's
//! `status.storedVersions` proves it is done. The migrator rewrites every
//! object at the storage version and then trims `storedVersions`, but only
//! if the CRD's generation did not change meanwhile; so a migration is named
//! after the generation it was started for, and a CRD changed meanwhile gets
//! a new one.
//!
//! Also the CRD transforms the upgrade plan applies between steps: the new
//! release's CRDs with storage still on the old version, and without the
//! old version's deprecation until the end.

use k8s_openapi::api::storagemigration::v1::StorageVersionMigration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// The next thing to do for one CRD's storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// `storedVersions` is exactly the storage version.
    Done,
    /// Create this migration (none exists for the CRD's current generation).
    Create {
        name: String,
    },
    /// The migrator is working, or has not started yet.
    Wait {
        why: String,
    },
    Failed {
        why: String,
    },
}

/// The migration for the CRD as it is now: named after its storage
/// version and generation.
pub fn migration_name(crd: &CustomResourceDefinition) -> String {
    let name = crd.metadata.name.as_deref().unwrap_or_default();
    format!("{name}-to-{}-gen{}", storage_version(crd).unwrap_or("none"), crd.metadata.generation.unwrap_or(0))
}

pub fn storage_version(crd: &CustomResourceDefinition) -> Option<&str> {
    crd.spec.versions.iter().find(|v| v.storage).map(|v| v.name.as_str())
}

pub fn stored_versions(crd: &CustomResourceDefinition) -> Vec<String> {
    crd.status.as_ref().and_then(|s| s.stored_versions.clone()).unwrap_or_default()
}

/// What to do next, given the CRD and the migration named for its current
/// generation (if any).
pub fn next(crd: &CustomResourceDefinition, migration: Option<&StorageVersionMigration>) -> Next {
    let Some(storage) = storage_version(crd) else {
        return Next::Failed { why: "the CRD has no storage version".into() };
    };
    let stored = stored_versions(crd);
    if stored == [storage] {
        return Next::Done;
    }
    let Some(migration) = migration else {
        return Next::Create { name: migration_name(crd) };
    };
    let condition = |type_: &str| {
        migration
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
    };
    if let Some(failed) = condition("Failed").filter(|c| c.status == "True") {
        return Next::Failed { why: format!("{}: {}", failed.reason, failed.message) };
    }
    let succeeded = condition("Succeeded").is_some_and(|c| c.status == "True");
    let running = condition("Running");
    match (succeeded, running) {
        // The runner trims storedVersions before it sets Running=False; the
        // CRD read may simply predate that.
        (true, Some(r)) if r.status == "False" => {
            Next::Wait { why: format!("migration finished; storedVersions is {stored:?}, waiting for [{storage}]") }
        }
        (true, _) => Next::Wait { why: "objects rewritten; the migrator is updating storedVersions".into() },
        (false, Some(r)) if r.status == "True" => Next::Wait { why: format!("migrating: {}", r.message) },
        _ => Next::Wait { why: "waiting for the migrator to admit the migration".into() },
    }
}

/// A migration of the CRD's resource.
pub fn migration_for(crd: &CustomResourceDefinition) -> StorageVersionMigration {
    use k8s_openapi::api::storagemigration::v1::StorageVersionMigrationSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::GroupResource;
    let mut migration = StorageVersionMigration {
        spec: Some(StorageVersionMigrationSpec {
            resource: GroupResource { group: crd.spec.group.clone(), resource: crd.spec.names.plural.clone() },
        }),
        ..Default::default()
    };
    migration.metadata.name = Some(migration_name(crd));
    migration
}

/// `crd` with `version` as its storage version (unchanged if it has no such version).
pub fn with_storage(mut crd: CustomResourceDefinition, version: &str) -> CustomResourceDefinition {
    if !crd.spec.versions.iter().any(|v| v.name == version) {
        return crd;
    }
    for v in &mut crd.spec.versions {
        v.storage = v.name == version;
    }
    crd
}

/// `crd` with no version marked deprecated (until the plan's last step).
pub fn without_deprecation(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    for v in &mut crd.spec.versions {
        v.deprecated = None;
        v.deprecation_warning = None;
    }
    crd
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn crd(generation: i64, stored: &[&str]) -> CustomResourceDefinition {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "things.example.io", "generation": generation},
            "spec": {"group": "example.io", "scope": "Namespaced",
                "names": {"plural": "things", "kind": "Thing"},
                "versions": [
                    {"name": "v1alpha1", "served": true, "storage": false, "deprecated": true},
                    {"name": "v1", "served": true, "storage": true}]},
            "status": {"storedVersions": stored},
        }))
        .unwrap()
    }

    fn migration(conditions: &[(&str, &str)]) -> StorageVersionMigration {
        let mut m = migration_for(&crd(3, &["v1alpha1", "v1"]));
        let conditions = conditions
            .iter()
            .map(|(type_, status)| Condition {
                type_: (*type_).into(),
                status: (*status).into(),
                reason: "R".into(),
                message: "m".into(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
                observed_generation: None,
            })
            .collect();
        m.status = Some(k8s_openapi::api::storagemigration::v1::StorageVersionMigrationStatus {
            conditions: Some(conditions),
            ..Default::default()
        });
        m
    }

    #[test]
    fn only_the_storage_version_stored_is_done() {
        assert_eq!(next(&crd(3, &["v1"]), None), Next::Done);
        assert_ne!(next(&crd(3, &["v1", "v1alpha1"]), None), Next::Done);
    }

    #[test]
    fn a_migration_is_created_for_the_crds_current_generation() {
        let current = crd(3, &["v1alpha1", "v1"]);
        assert_eq!(next(&current, None), Next::Create { name: "things.example.io-to-v1-gen3".into() });
        let created = migration_for(&current);
        assert_eq!(created.spec.as_ref().unwrap().resource.resource, "things");
        assert_eq!(created.spec.as_ref().unwrap().resource.group, "example.io");
        // A CRD changed meanwhile: the old migration cannot trim storedVersions, a new one is named.
        assert_eq!(migration_name(&crd(4, &["v1alpha1", "v1"])), "things.example.io-to-v1-gen4");
    }

    #[test]
    fn running_succeeded_and_failed_migrations() {
        let stored = crd(3, &["v1alpha1", "v1"]);
        assert!(matches!(next(&stored, Some(&migration(&[]))), Next::Wait { .. }));
        let running = migration(&[("Running", "True")]);
        assert!(matches!(next(&stored, Some(&running)), Next::Wait { why } if why.starts_with("migrating")));
        let succeeded = migration(&[("Running", "False"), ("Succeeded", "True")]);
        assert!(matches!(next(&stored, Some(&succeeded)), Next::Wait { .. }), "done only when storedVersions says so");
        assert_eq!(next(&crd(3, &["v1"]), Some(&succeeded)), Next::Done);
        let failed = migration(&[("Running", "False"), ("Failed", "True")]);
        assert_eq!(next(&stored, Some(&failed)), Next::Failed { why: "R: m".into() });
    }

    #[test]
    fn storage_moves_and_deprecation_waits() {
        let old_storage = with_storage(crd(3, &["v1alpha1"]), "v1alpha1");
        assert_eq!(storage_version(&old_storage), Some("v1alpha1"));
        assert_eq!(old_storage.spec.versions.iter().filter(|v| v.storage).count(), 1);
        let plain = without_deprecation(old_storage);
        assert!(plain.spec.versions.iter().all(|v| v.deprecated.is_none()));
    }
}
