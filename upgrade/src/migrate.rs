//! Drives one CRD's storage migration to the end with Kubernetes' migrator:
//! creates the `StorageVersionMigration` [`crate::storage::next`] names,
//! follows it, and returns once `status.storedVersions` is exactly the
//! storage version (re-running it if the CRD changed meanwhile).

use std::time::{Duration, Instant};

use k8s_openapi::api::storagemigration::v1::StorageVersionMigration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client};
use slotkeeper_api::names::FIELD_MANAGER;

use crate::storage::{self, Next};

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("reading CustomResourceDefinition {crd}: {source}")]
    Crd { crd: String, source: kube::Error },
    #[error("StorageVersionMigration {name}: {source}")]
    Migration { name: String, source: kube::Error },
    #[error("the storage migration of {crd} failed: {why}")]
    Failed { crd: String, why: String },
    #[error("the storage migration of {crd} did not finish within {timeout:?}: {why}")]
    Timeout { crd: String, timeout: Duration, why: String },
}

/// Migrates `crd`'s stored objects to its storage version; returns the
/// migrations created, in order.
pub async fn migrate_storage(
    client: &Client,
    crd: &str,
    poll: Duration,
    timeout: Duration,
) -> Result<Vec<String>, MigrateError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let migrations: Api<StorageVersionMigration> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    let mut created = Vec::new();
    loop {
        let current = crds.get(crd).await.map_err(|source| MigrateError::Crd { crd: crd.into(), source })?;
        let name = storage::migration_name(&current);
        let migration =
            migrations.get_opt(&name).await.map_err(|source| MigrateError::Migration { name: name.clone(), source })?;
        let why = match storage::next(&current, migration.as_ref()) {
            Next::Done => return Ok(created),
            Next::Failed { why } => return Err(MigrateError::Failed { crd: crd.into(), why }),
            Next::Create { name } => {
                let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
                match migrations.create(&params, &storage::migration_for(&current)).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 409 => {}
                    Err(source) => return Err(MigrateError::Migration { name, source }),
                }
                tracing::info!(%crd, migration = %name, "storage migration created");
                created.push(name.clone());
                format!("created {name}")
            }
            Next::Wait { why } => why,
        };
        if Instant::now() > deadline {
            return Err(MigrateError::Timeout { crd: crd.into(), timeout, why });
        }
        tokio::time::sleep(poll).await;
    }
}
