//! Diagnose and plan: a pure function from a plan object and what was
//! observed to its next status (the checkpoint) and at most one action.
//! Each step's check says whether its effect is already there, so a manager
//! killed anywhere resumes by looking, not by remembering.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use slotkeeper_api::self_upgrade::{
    CONDITION_AWAITING_APPROVAL, CONDITION_FAILED, CONDITION_PLANNED, CONDITION_PROGRESSING, CONDITION_ROLLED_BACK,
    CONDITION_SUCCEEDED, SlotkeeperUpgrade, SlotkeeperUpgradeStatus, StepState,
};

use super::observe::Observed;
use super::snapshot::Snapshot;
use crate::plan::{self, Installed, Release};
use crate::storage::{storage_version, stored_versions};

/// One idempotent change; the act layer performs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The new CRDs, every version served, storage still where it was, conversion on the webhook.
    InstallCrds,
    /// The new release's operator objects (Deployment, Services, ...).
    RollOperator,
    /// The new CRDs with their own storage version, nothing deprecated yet.
    SwitchStorage,
    /// Kubernetes' storage-version migrator over every CRD not yet at `[storage]`.
    MigrateStorage,
    /// The new CRDs exactly as released (older versions marked deprecated).
    Finalize,
    /// Rollback: the operator Deployment as it was.
    RestoreOperator,
    /// Rollback: the CRDs as they were.
    RestoreCrds,
    /// The plan is over: the upgrade manager's own Deployment goes.
    RemoveManager,
}

/// What one step's check found.
enum Check {
    Done(String),
    Do(Action, String),
    Wait(String),
    Fail(String),
}

pub fn decide(plan: &SlotkeeperUpgrade, seen: &Observed, now: Time) -> (SlotkeeperUpgradeStatus, Option<Action>) {
    let before = plan.status.clone().unwrap_or_default();
    let mut status = before.clone();
    let action = match &seen.snapshot {
        Err(why) => {
            status.current_step = None;
            set_waiting_message(&mut status, why);
            None
        }
        Ok(snapshot) => {
            if status.steps.is_empty() {
                let planned = plan::plan(&installed(snapshot, seen), &release(plan, snapshot));
                status.from = Some(planned.from);
                status.steps = planned.steps;
                for step in status.steps.iter_mut().filter(|s| plan.spec.gates.contains(&s.name)) {
                    step.gated = true;
                }
                status.findings = planned.findings;
            }
            if plan.spec.rollback && rollback_allowed(&status, seen, Some(snapshot)).is_ok() {
                roll_back(&mut status, seen, snapshot, &now)
            } else {
                forward(plan, &mut status, seen, snapshot, &now)
            }
        }
    };
    let refused =
        if plan.spec.rollback { rollback_allowed(&status, seen, seen.snapshot.as_ref().ok()).err() } else { None };
    status.current_step = status.steps.iter().find(|s| s.state != StepState::Succeeded).map(|s| s.name.clone());
    status.observed_generation = plan.metadata.generation;
    status.conditions = conditions(&status, refused, plan.metadata.generation, &before.conditions, &now);
    (status, action)
}

fn set_waiting_message(status: &mut SlotkeeperUpgradeStatus, why: &str) {
    if let Some(step) = status.steps.iter_mut().find(|s| s.state != StepState::Succeeded) {
        step.message = Some(why.into());
    }
}

/// The installed state the plan was made from: what `upgrade apply` captured.
fn installed(snapshot: &Snapshot, seen: &Observed) -> Installed {
    Installed {
        crds: snapshot.previous_crds.clone(),
        operator_image: snapshot.previous_image().map(String::from),
        pod_images: Vec::new(),
        clusters: seen.clusters.clone(),
    }
}

fn release(plan: &SlotkeeperUpgrade, snapshot: &Snapshot) -> Release {
    Release { version: plan.spec.release.clone(), image: plan.spec.image.clone(), crds: snapshot.next_crds.clone() }
}

fn forward(
    plan: &SlotkeeperUpgrade,
    status: &mut SlotkeeperUpgradeStatus,
    seen: &Observed,
    snapshot: &Snapshot,
    now: &Time,
) -> Option<Action> {
    let Some(index) = status.steps.iter().position(|s| s.state != StepState::Succeeded) else {
        return seen.manager_present.then_some(Action::RemoveManager);
    };
    let step = &mut status.steps[index];
    if step.state == StepState::Failed {
        return None;
    }
    if step.gated && !plan.spec.approved_steps.contains(&step.name) {
        step.state = StepState::AwaitingApproval;
        step.message = Some(format!(
            "approve it: slotkeeper upgrade approve {} (or add {:?} to spec.approvedSteps)",
            plan.metadata.name.as_deref().unwrap_or_default(),
            step.name
        ));
        return None;
    }
    if step.state != StepState::Running {
        step.state = StepState::Running;
        step.start_time = Some(now.clone());
        step.completion_time = None;
    }
    let check = match step.name.as_str() {
        "Preflight" => check_preflight(seen, snapshot),
        "InstallCRDs" => check_installed(seen, snapshot),
        "RollOperator" => check_rolled(plan, seen),
        "SwitchStorage" => check_switched(seen, snapshot),
        "MigrateStorage" => check_migrated(seen, snapshot),
        plan::FINALIZE => check_finalized(seen, snapshot),
        other => Check::Fail(format!("unknown step {other:?}: this release cannot run it")),
    };
    match check {
        Check::Done(message) => {
            step.state = StepState::Succeeded;
            step.completion_time = Some(now.clone());
            step.message = Some(message);
            None
        }
        Check::Do(action, message) => {
            step.message = Some(message);
            Some(action)
        }
        Check::Wait(message) => {
            step.message = Some(message);
            None
        }
        Check::Fail(message) => {
            step.state = StepState::Failed;
            step.completion_time = Some(now.clone());
            step.message = Some(message);
            None
        }
    }
}

fn check_preflight(seen: &Observed, snapshot: &Snapshot) -> Check {
    let mut findings = plan::preflight_findings(&seen.crds, &snapshot.next_crds, &seen.clusters);
    if let Some(operator) = &seen.operator {
        let mut images = operator.pod_images.clone();
        images.sort();
        images.dedup();
        if images.len() > 1 {
            findings.push(format!("operator replicas run different images ({})", images.join(", ")));
        }
    }
    if findings.is_empty() {
        Check::Done("no unsafe CRD change; the operator's replicas run one release".into())
    } else {
        Check::Fail(format!("refused: {}", findings.join("; ")))
    }
}

fn installed_crd<'a>(seen: &'a Observed, name: &str) -> Option<&'a CustomResourceDefinition> {
    seen.crds.iter().find(|c| c.metadata.name.as_deref() == Some(name))
}

fn served(crd: &CustomResourceDefinition) -> Vec<&str> {
    crd.spec.versions.iter().filter(|v| v.served).map(|v| v.name.as_str()).collect()
}

/// The storage version a CRD keeps until the switch: the previous one.
fn interim_storage<'a>(snapshot: &'a Snapshot, next: &'a CustomResourceDefinition) -> Option<&'a str> {
    let name = next.metadata.name.as_deref()?;
    snapshot.previous(name).and_then(storage_version).or_else(|| storage_version(next))
}

fn check_installed(seen: &Observed, snapshot: &Snapshot) -> Check {
    for next in &snapshot.next_crds {
        let name = next.metadata.name.as_deref().unwrap_or_default();
        let Some(crd) = installed_crd(seen, name) else {
            return Check::Do(Action::InstallCrds, format!("installing {name}"));
        };
        let wanted = served(next);
        let in_place = wanted.iter().all(|v| served(crd).contains(v))
            && storage_version(crd) == interim_storage(snapshot, next)
            && (wanted.len() < 2 || crd.spec.conversion.as_ref().is_some_and(|c| c.strategy == "Webhook"));
        if !in_place {
            return Check::Do(
                Action::InstallCrds,
                format!(
                    "applying {name}: serving {} with storage on {}",
                    wanted.join(", "),
                    interim_storage(snapshot, next).unwrap_or("?")
                ),
            );
        }
    }
    if !seen.next_served {
        return Check::Wait("the new CRDs are applied; waiting until the apiserver serves the new version".into());
    }
    Check::Done("the new CRDs are installed, every version served, storage unchanged, conversion by the webhook".into())
}

fn check_rolled(plan: &SlotkeeperUpgrade, seen: &Observed) -> Check {
    let image = &plan.spec.image;
    let Some(operator) = &seen.operator else {
        return Check::Do(Action::RollOperator, "creating the operator's Deployment".into());
    };
    if operator.image.as_ref() != Some(image) {
        return Check::Do(Action::RollOperator, format!("rolling the operator to {image}"));
    }
    if !operator.rolled_out || operator.pod_images.iter().any(|i| i != image) {
        return Check::Wait(format!("rolling the operator to {image}: {}", operator.summary));
    }
    let clusters = seen.clusters.len();
    match &seen.leader {
        Some(leader)
            if leader.release.as_deref() == Some(plan.spec.release.as_str()) && leader.reconciled >= clusters =>
        {
            Check::Done(format!(
                "every replica runs {image}; leader {} has reconciled all {clusters} cluster(s)",
                leader.holder
            ))
        }
        Some(leader) if leader.release.as_deref() == Some(plan.spec.release.as_str()) => Check::Wait(format!(
            "leader {} has reconciled {} of {clusters} cluster(s)",
            leader.holder, leader.reconciled
        )),
        _ => Check::Wait(format!("waiting for a leader of release {}", plan.spec.release)),
    }
}

fn check_switched(seen: &Observed, snapshot: &Snapshot) -> Check {
    for next in &snapshot.next_crds {
        let name = next.metadata.name.as_deref().unwrap_or_default();
        let installed = installed_crd(seen, name).and_then(storage_version);
        if installed != storage_version(next) {
            return Check::Do(
                Action::SwitchStorage,
                format!("making {} the storage version of {name}", storage_version(next).unwrap_or("?")),
            );
        }
    }
    Check::Done("every CRD stores its new storage version".into())
}

fn migrated(seen: &Observed, snapshot: &Snapshot) -> Option<String> {
    snapshot.next_crds.iter().find_map(|next| {
        let name = next.metadata.name.as_deref().unwrap_or_default();
        let storage = storage_version(next)?;
        let stored = installed_crd(seen, name).map(stored_versions).unwrap_or_default();
        (stored != [storage]).then(|| format!("{name} has storedVersions {stored:?}, not [{storage:?}]"))
    })
}

fn check_migrated(seen: &Observed, snapshot: &Snapshot) -> Check {
    match migrated(seen, snapshot) {
        Some(why) => Check::Do(Action::MigrateStorage, format!("migrating: {why}")),
        None => Check::Done("every object is stored at the new version; storedVersions lists it alone".into()),
    }
}

fn check_finalized(seen: &Observed, snapshot: &Snapshot) -> Check {
    if let Some(why) = migrated(seen, snapshot) {
        return Check::Fail(format!("storedVersions changed after the migration: {why}"));
    }
    let deprecation = |crd: &CustomResourceDefinition| -> Vec<(String, bool)> {
        crd.spec.versions.iter().map(|v| (v.name.clone(), v.deprecated.unwrap_or(false))).collect()
    };
    for next in &snapshot.next_crds {
        let name = next.metadata.name.as_deref().unwrap_or_default();
        if installed_crd(seen, name).map(deprecation) != Some(deprecation(next)) {
            return Check::Do(Action::Finalize, format!("applying {name} as released"));
        }
    }
    Check::Done("storedVersions confirmed; older versions are marked deprecated".into())
}

/// Whether a rollback can still restore the previous release, or why not.
pub fn rollback_allowed(
    status: &SlotkeeperUpgradeStatus,
    seen: &Observed,
    snapshot: Option<&Snapshot>,
) -> Result<(), String> {
    if let Some(switch) = status.steps.iter().find(|s| s.name == "SwitchStorage")
        && switch.state != StepState::Pending
        && switch.start_time.is_some()
    {
        return Err(format!(
            "the storage version switched at step 4 (SwitchStorage, started {}): objects are stored in the new version, which the previous release cannot read; roll forward instead",
            switch.start_time.as_ref().map(|t| t.0.to_string()).unwrap_or_default()
        ));
    }
    for crd in &seen.crds {
        let name = crd.metadata.name.as_deref().unwrap_or_default();
        let Some(previous) = snapshot.and_then(|s| s.previous(name)) else { continue };
        let previously_served = served(previous);
        if let Some(version) = stored_versions(crd).iter().find(|v| !previously_served.contains(&v.as_str())) {
            return Err(format!(
                "{name} has objects stored at {version}, which the previous release does not serve; roll forward instead"
            ));
        }
    }
    Ok(())
}

fn roll_back(status: &mut SlotkeeperUpgradeStatus, seen: &Observed, snapshot: &Snapshot, now: &Time) -> Option<Action> {
    if is_true(&status.conditions, CONDITION_ROLLED_BACK) {
        return seen.manager_present.then_some(Action::RemoveManager);
    }
    let note = |status: &mut SlotkeeperUpgradeStatus, message: String| {
        if let Some(step) = status.steps.iter_mut().find(|s| s.state != StepState::Succeeded) {
            step.message = Some(message);
        }
    };
    let previous = snapshot.previous_image().unwrap_or_default().to_string();
    if let Some(operator) = &seen.operator {
        if operator.image.as_deref() != Some(previous.as_str()) {
            note(status, format!("rolling back: restoring the operator to {previous}"));
            return Some(Action::RestoreOperator);
        }
        if !operator.rolled_out || operator.pod_images.iter().any(|i| *i != previous) {
            note(status, format!("rolling back: the operator returns to {previous}: {}", operator.summary));
            return None;
        }
    }
    let restored = snapshot.previous_crds.iter().all(|previous| {
        let name = previous.metadata.name.as_deref().unwrap_or_default();
        installed_crd(seen, name)
            .is_some_and(|crd| served(crd) == served(previous) && storage_version(crd) == storage_version(previous))
    });
    if !restored {
        note(status, "rolling back: restoring the previous CRDs".into());
        return Some(Action::RestoreCrds);
    }
    for step in status.steps.iter_mut().filter(|s| s.state != StepState::Succeeded) {
        step.state = StepState::Pending;
        step.message = Some("rolled back before this step".into());
    }
    let _ = now;
    status.conditions.push(Condition {
        type_: CONDITION_ROLLED_BACK.into(),
        status: "True".into(),
        reason: "RolledBack".into(),
        message: format!("the previous CRDs and operator ({previous}) are back; the clusters were not touched"),
        last_transition_time: now.clone(),
        observed_generation: None,
    });
    None
}

fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

/// Every condition, from the steps; a transition time moves only when the status does.
fn conditions(
    status: &SlotkeeperUpgradeStatus,
    rollback_refused: Option<String>,
    generation: Option<i64>,
    before: &[Condition],
    now: &Time,
) -> Vec<Condition> {
    let steps = &status.steps;
    let rolled_back = status.conditions.iter().find(|c| c.type_ == CONDITION_ROLLED_BACK && c.status == "True");
    let failed = steps.iter().find(|s| s.state == StepState::Failed);
    let awaiting = steps.iter().find(|s| s.state == StepState::AwaitingApproval);
    let succeeded = !steps.is_empty() && steps.iter().all(|s| s.state == StepState::Succeeded);
    let current = steps.iter().find(|s| s.state != StepState::Succeeded);
    let message_of = |s: Option<&slotkeeper_api::self_upgrade::UpgradeStep>| {
        s.map(|s| format!("{}: {}", s.name, s.message.clone().unwrap_or_default())).unwrap_or_default()
    };
    let finished = succeeded || failed.is_some() || rolled_back.is_some();
    let wanted = [
        (
            CONDITION_PLANNED,
            !steps.is_empty(),
            if steps.is_empty() { "WaitingForSnapshot" } else { "Planned" },
            format!("{} step(s) from {} to the new release", steps.len(), status.from.clone().unwrap_or_default()),
        ),
        (CONDITION_AWAITING_APPROVAL, awaiting.is_some(), "Approval", message_of(awaiting)),
        (CONDITION_PROGRESSING, !finished, if finished { "Finished" } else { "StepRunning" }, message_of(current)),
        (CONDITION_SUCCEEDED, succeeded, if succeeded { "Upgraded" } else { "NotYet" }, String::new()),
        (
            CONDITION_FAILED,
            failed.is_some(),
            if failed.is_some() { "StepFailed" } else { "NoFailure" },
            message_of(failed),
        ),
        match (rolled_back, rollback_refused) {
            (Some(c), _) => (CONDITION_ROLLED_BACK, true, "RolledBack", c.message.clone()),
            (None, Some(why)) => (CONDITION_ROLLED_BACK, false, "RollbackRefused", why),
            (None, None) => (CONDITION_ROLLED_BACK, false, "NotRequested", String::new()),
        },
    ];
    wanted
        .into_iter()
        .map(|(type_, on, reason, message)| {
            let state = if on { "True" } else { "False" };
            let since = before
                .iter()
                .find(|c| c.type_ == type_ && c.status == state)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: type_.into(),
                status: state.into(),
                reason: reason.into(),
                message,
                last_transition_time: since,
                observed_generation: generation,
            }
        })
        .collect()
}
