//! The upgrade manager: a controller over `SlotkeeperUpgrade` plans, run by
//! whichever process of a release holds the upgrade-manager Lease. Each
//! round is the house pipeline: observe → decide (pure) → write the status
//! checkpoint → act once. It advances only plans to its own release.

mod act;
pub mod decide;
#[cfg(test)]
mod decide_tests;
pub mod observe;
pub mod snapshot;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt as _};
use serde_json::json;
use slotkeeper_api::names::FIELD_MANAGER;
use slotkeeper_api::self_upgrade::SlotkeeperUpgrade;

pub use act::{UPGRADE_FIELD_MANAGER, plural};
pub use decide::{Action, decide, rollback_allowed};

/// The CRDs' `spec.conversion`, once the webhook has answered a real
/// review (its CA bundle included); the error says why it is not ready.
pub type ConversionSource =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<serde_json::Value, String>> + Send>> + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("{what}: {source}")]
    Kube { what: String, source: kube::Error },
    #[error("the snapshot: {0}")]
    Snapshot(String),
    #[error("the conversion webhook is not ready: {0}")]
    Webhook(String),
    #[error(transparent)]
    Migrate(#[from] crate::migrate::MigrateError),
    #[error(transparent)]
    Read(#[from] crate::installed::ReadError),
}

impl ManagerError {
    pub fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ManagerError {
        let what = what.into();
        move |source| ManagerError::Kube { what, source }
    }
}

const ROUND_EVERY: Duration = Duration::from_secs(2);

pub struct Manager {
    pub client: Client,
    /// This process's release: only plans to it are advanced here.
    pub release: String,
    pub conversion: ConversionSource,
}

impl Manager {
    /// Advances plans until the process stops.
    pub async fn run(self) {
        loop {
            if let Err(error) = self.round().await {
                tracing::warn!(%error, "upgrade manager round failed; retrying");
            }
            tokio::time::sleep(ROUND_EVERY).await;
        }
    }

    async fn round(&self) -> Result<(), ManagerError> {
        let api: Api<SlotkeeperUpgrade> = Api::all(self.client.clone());
        let plans = match api.list(&ListParams::default()).await {
            Ok(list) => list.items,
            // No plan kind installed: nothing was ever planned.
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(source) => return Err(ManagerError::Kube { what: "listing SlotkeeperUpgrades".into(), source }),
        };
        for plan in plans.iter().filter(|p| p.spec.release == self.release) {
            self.advance(&api, plan).await?;
        }
        Ok(())
    }

    async fn advance(&self, api: &Api<SlotkeeperUpgrade>, plan: &SlotkeeperUpgrade) -> Result<(), ManagerError> {
        let name = plan.name_any();
        let seen = observe::observe(&self.client, plan).await?;
        let (status, action) = decide(plan, &seen, Time(Timestamp::now()));
        if plan.status.as_ref() != Some(&status) {
            write_status(api, &name, &status).await?;
        }
        let (Some(action), Ok(snapshot)) = (action, &seen.snapshot) else { return Ok(()) };
        tracing::info!(plan = %name, ?action, step = status.current_step.as_deref().unwrap_or_default(), "upgrade step acts");
        if let Err(error) = act::act(&self.client, action, snapshot, &self.conversion).await {
            // Recorded on the step; the next round looks again and retries.
            let mut status = status;
            if let Some(step) = status.steps.iter_mut().find(|s| Some(&s.name) == status.current_step.as_ref()) {
                step.message = Some(format!("{action:?} failed, retrying: {error}"));
            }
            write_status(api, &name, &status).await?;
            return Err(error);
        }
        Ok(())
    }
}

async fn write_status(
    api: &Api<SlotkeeperUpgrade>,
    name: &str,
    status: &slotkeeper_api::self_upgrade::SlotkeeperUpgradeStatus,
) -> Result<(), ManagerError> {
    let patch = json!({
        "apiVersion": slotkeeper_api::API_VERSION,
        "kind": "SlotkeeperUpgrade",
        "status": status,
    });
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(patch))
        .await
        .map_err(ManagerError::kube(format!("SlotkeeperUpgrade {name} status")))?;
    Ok(())
}
