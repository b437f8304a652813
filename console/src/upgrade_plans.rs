//! Slotkeeper's own upgrade plans (`SlotkeeperUpgrade`, cluster-scoped), read
//! and approved with the signed-in user's token. The read model does not
//! hold them: the upgrade manager owns them, and a person looks at them
//! rarely, so the page lists them straight from the apiserver as the user.

use std::cmp::Reverse;

use kube::Resource as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use slotkeeper_api::self_upgrade::SlotkeeperUpgrade;

use crate::actions::server::{FIELD_MANAGER, client_as, explain, finish, ok, refused, request, signed_in};
use crate::pages::paths;

/// Every plan the user may list, newest first: one `list` call as the user.
pub async fn list(client: kube::Client) -> Result<Vec<SlotkeeperUpgrade>, kube::Error> {
    let plans: Api<SlotkeeperUpgrade> = Api::all(client);
    Ok(newest_first(plans.list(&ListParams::default()).await?.items))
}

pub fn newest_first(mut plans: Vec<SlotkeeperUpgrade>) -> Vec<SlotkeeperUpgrade> {
    plans.sort_by_key(|p| (Reverse(p.metadata.creation_timestamp.as_ref().map(|t| t.0)), p.metadata.name.clone()));
    plans
}

/// The steps approved when the page was shown, as the approve form carries them.
pub fn approved_field(plan: &SlotkeeperUpgrade) -> String {
    serde_json::to_string(&plan.spec.approved_steps).expect("a list of strings serializes")
}

/// The JSON merge patch approving `step`, as `slotkeeper upgrade approve`
/// makes it: a merge patch replaces a list whole, so the steps approved
/// already are kept (and `step` is not added twice). The resourceVersion
/// makes the apiserver refuse it (409) if the plan changed since `approved`
/// was read, so an approval made meanwhile by someone else is never dropped.
pub fn approval_patch(approved: &[String], step: &str, resource_version: &str) -> Value {
    let mut steps = approved.to_vec();
    if !steps.iter().any(|s| s == step) {
        steps.push(step.to_owned());
    }
    json!({ "metadata": { "resourceVersion": resource_version }, "spec": { "approvedSteps": steps } })
}

/// The approve form's post: one merge patch of `spec.approvedSteps` as the user.
pub async fn approve(plan: String, step: String, approved: String, resource_version: String) {
    let request = request();
    let Some(session) = signed_in(&request) else { return };
    let page = paths::UPGRADES;
    let kind = SlotkeeperUpgrade::kind(&());
    let Ok(approved) = serde_json::from_str::<Vec<String>>(&approved) else {
        return finish(
            &request,
            page,
            refused("The form's approved steps do not parse; reload the page. Nothing was changed."),
        );
    };
    if plan.is_empty() || step.is_empty() || resource_version.is_empty() {
        return finish(
            &request,
            page,
            refused("The form names no plan or step; reload the page. Nothing was changed."),
        );
    }
    let Some(client) = client_as(&request, &session, page) else { return };
    let plans: Api<SlotkeeperUpgrade> = Api::all(client);
    let params = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    let what = format!("approve step {step} of {kind} {plan}");
    match plans.patch(&plan, &params, &Patch::Merge(approval_patch(&approved, &step, &resource_version))).await {
        Ok(_) => {
            tracing::info!(user = %session.user, plan = %plan, step = %step, "console: approve upgrade step");
            let text = format!(
                "Approved step {step} of {kind} {plan} as {}: the upgrade manager runs it next. Reload to follow it.",
                session.user
            );
            finish(&request, page, ok(text));
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let text = format!(
                "{kind} {plan} changed since this page was shown, so Kubernetes refused to {what} (409 Conflict). \
                 Nothing was changed; look at it again below."
            );
            finish(&request, page, refused(text));
        }
        Err(e) => finish(&request, page, refused(explain(&e, &what))),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use slotkeeper_api::self_upgrade::SlotkeeperUpgradeSpec;

    use super::*;

    fn plan(name: &str, created: i64, approved: &[&str]) -> SlotkeeperUpgrade {
        let spec = SlotkeeperUpgradeSpec {
            release: "0.2.0".into(),
            image: "slotkeeper:0.2.0".into(),
            approved_steps: approved.iter().map(|s| s.to_string()).collect(),
            gates: vec![],
            rollback: false,
            snapshot_digest: None,
        };
        let mut plan = SlotkeeperUpgrade::new(name, spec);
        plan.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        plan
    }

    #[test]
    fn approving_keeps_the_steps_approved_already_and_adds_the_step_once() {
        let kept = vec!["SwitchStorage".to_owned()];
        let patch = approval_patch(&kept, "Finalize", "42");
        assert_eq!(
            patch,
            json!({ "metadata": { "resourceVersion": "42" }, "spec": { "approvedSteps": ["SwitchStorage", "Finalize"] } })
        );
        let again = approval_patch(&["SwitchStorage".into(), "Finalize".into()], "Finalize", "43");
        assert_eq!(again["spec"]["approvedSteps"], json!(["SwitchStorage", "Finalize"]), "no duplicate");
        assert_eq!(approval_patch(&[], "Finalize", "1")["spec"]["approvedSteps"], json!(["Finalize"]));
    }

    #[test]
    fn the_form_carries_the_approved_steps_back_unchanged() {
        let field = approved_field(&plan("a", 0, &["SwitchStorage", "Finalize"]));
        assert_eq!(serde_json::from_str::<Vec<String>>(&field).unwrap(), ["SwitchStorage", "Finalize"]);
        assert_eq!(approved_field(&plan("b", 0, &[])), "[]");
    }

    #[test]
    fn plans_are_listed_newest_first() {
        let names: Vec<String> =
            newest_first(vec![plan("old", 100, &[]), plan("new", 300, &[]), plan("mid", 200, &[])])
                .into_iter()
                .filter_map(|p| p.metadata.name)
                .collect();
        assert_eq!(names, ["new", "mid", "old"]);
    }
}
