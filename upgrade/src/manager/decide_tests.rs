//! The manager's decisions over fixtures: the previous release's CRDs, the
//! new ones at each stage, and the operator before and after its rollout.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, CustomResourceDefinitionStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use slotkeeper_api::self_upgrade::{SlotkeeperUpgrade, SlotkeeperUpgradeSpec, StepState};

use super::decide::{Action, decide, rollback_allowed};
use super::observe::{LeaderState, Observed, OperatorState};
use super::snapshot::Snapshot;
use crate::plan::InstalledCluster;
use crate::storage::{with_storage, without_deprecation};

const OLD: &str = "slotkeeper:0.1.0";
const NEW: &str = "slotkeeper:0.2.0";

fn stored(mut crd: CustomResourceDefinition, versions: &[&str]) -> CustomResourceDefinition {
    crd.status = Some(CustomResourceDefinitionStatus {
        stored_versions: Some(versions.iter().map(|v| v.to_string()).collect()),
        ..Default::default()
    });
    crd
}

fn previous_crds() -> Vec<CustomResourceDefinition> {
    slotkeeper_api::crds()
        .into_iter()
        .filter(|c| c.spec.versions.iter().any(|v| v.name == "v1alpha1"))
        .map(|mut c| {
            c.spec.versions.retain(|v| v.name == "v1alpha1");
            c.spec.versions[0].storage = true;
            c.spec.versions[0].deprecated = None;
            c.spec.versions[0].deprecation_warning = None;
            c.spec.conversion = None;
            stored(c, &["v1alpha1"])
        })
        .collect()
}

fn webhook(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    if crd.spec.versions.len() > 1 {
        crd.spec.conversion = Some(CustomResourceConversion { strategy: "Webhook".into(), webhook: None });
    }
    crd
}

/// The new CRDs at a stage: `interim` keeps v1alpha1 storage; `stored_at` is storedVersions.
fn new_crds(interim: bool, deprecated: bool, stored_at: &[&str]) -> Vec<CustomResourceDefinition> {
    slotkeeper_api::crds()
        .into_iter()
        .map(|c| {
            let two = c.spec.versions.len() > 1;
            let c = if deprecated { c } else { without_deprecation(c) };
            let c = if interim { with_storage(c, "v1alpha1") } else { c };
            stored(webhook(c), if two { stored_at } else { &["v1"] })
        })
        .collect()
}

fn snapshot() -> Snapshot {
    Snapshot {
        previous_crds: previous_crds(),
        previous_operator: Some(json!({"spec": {"template": {"spec": {"containers": [{"image": OLD}]}}}})),
        next_crds: slotkeeper_api::crds(),
        next_operator: vec![json!({"kind": "Deployment"})],
    }
}

fn operator(image: &str, rolled_out: bool) -> Option<OperatorState> {
    Some(OperatorState {
        image: Some(image.into()),
        rolled_out,
        pod_images: vec![image.into(); 2],
        summary: "2 of 2 replicas updated, 2 ready, 2 in all".into(),
    })
}

fn seen(crds: Vec<CustomResourceDefinition>) -> Observed {
    Observed {
        snapshot: Ok(snapshot()),
        crds,
        clusters: vec![InstalledCluster {
            namespace: "n".into(),
            name: "c".into(),
            engine: slotkeeper_api::catalog::Engine::Redis,
            version: "7.0.15".into(),
            config: Default::default(),
        }],
        operator: operator(OLD, true),
        leader: Some(LeaderState { holder: "slotkeeper-old".into(), release: None, reconciled: 0 }),
        next_served: false,
        manager_present: true,
    }
}

fn plan() -> SlotkeeperUpgrade {
    let mut plan = SlotkeeperUpgrade::new(
        "to-0-2-0",
        SlotkeeperUpgradeSpec {
            release: "0.2.0".into(),
            image: NEW.into(),
            approved_steps: vec![],
            gates: vec![],
            rollback: false,
            snapshot_digest: None,
        },
    );
    plan.metadata.generation = Some(1);
    plan
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// Runs decide and keeps its status, as the manager's write would.
fn step(plan: &mut SlotkeeperUpgrade, seen: &Observed) -> Option<Action> {
    let (status, action) = decide(plan, seen, now());
    plan.status = Some(status);
    action
}

fn state(plan: &SlotkeeperUpgrade, name: &str) -> StepState {
    plan.status.as_ref().unwrap().steps.iter().find(|s| s.name == name).unwrap().state
}

fn condition(plan: &SlotkeeperUpgrade, type_: &str) -> String {
    let c = plan.status.as_ref().unwrap().conditions.iter().find(|c| c.type_ == type_).unwrap();
    assert_eq!(c.observed_generation, plan.metadata.generation, "{type_} carries observedGeneration");
    c.status.clone()
}

/// A plan brought to just before `name` (every earlier step succeeded).
fn plan_at(name: &str) -> SlotkeeperUpgrade {
    let mut plan = plan();
    step(&mut plan, &seen(previous_crds()));
    for s in plan.status.as_mut().unwrap().steps.iter_mut() {
        if s.name == name {
            break;
        }
        s.state = StepState::Succeeded;
    }
    plan
}

#[test]
fn a_new_plan_gets_the_seeds_steps_and_passes_the_preflight() {
    let mut plan = plan();
    assert_eq!(step(&mut plan, &seen(previous_crds())), None);
    let status = plan.status.as_ref().unwrap();
    let names: Vec<&str> = status.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["Preflight", "InstallCRDs", "RollOperator", "SwitchStorage", "MigrateStorage", "Finalize"]);
    assert_eq!(state(&plan, "Preflight"), StepState::Succeeded);
    assert_eq!(status.from.as_deref(), Some("0.1.0"));
    assert_eq!(condition(&plan, "Planned"), "True");
    assert_eq!(condition(&plan, "Progressing"), "True");
    assert_eq!(condition(&plan, "Succeeded"), "False");
}

#[test]
fn without_the_snapshot_nothing_is_planned_or_done() {
    let mut seen = seen(previous_crds());
    seen.snapshot = Err("waiting for ConfigMap".into());
    let mut plan = plan();
    assert_eq!(step(&mut plan, &seen), None);
    assert!(plan.status.as_ref().unwrap().steps.is_empty());
    assert_eq!(condition(&plan, "Planned"), "False");
}

#[test]
fn operator_replicas_on_two_images_fail_the_preflight() {
    let mut seen = seen(previous_crds());
    seen.operator.as_mut().unwrap().pod_images = vec![OLD.into(), "slotkeeper:0.0.9".into()];
    let mut plan = plan();
    step(&mut plan, &seen);
    assert_eq!(state(&plan, "Preflight"), StepState::Failed);
    assert_eq!(condition(&plan, "Failed"), "True");
    assert_eq!(condition(&plan, "Progressing"), "False");
    assert_eq!(step(&mut plan, &seen), None, "a failed plan stays failed");
}

#[test]
fn the_crds_are_installed_then_awaited_until_the_new_version_is_served() {
    let mut plan = plan_at("InstallCRDs");
    assert_eq!(step(&mut plan, &seen(previous_crds())), Some(Action::InstallCrds));
    assert_eq!(state(&plan, "InstallCRDs"), StepState::Running);
    let mut after = seen(new_crds(true, false, &["v1alpha1"]));
    assert_eq!(step(&mut plan, &after), None, "applied, not yet served");
    assert_eq!(state(&plan, "InstallCRDs"), StepState::Running);
    after.next_served = true;
    assert_eq!(step(&mut plan, &after), None);
    assert_eq!(state(&plan, "InstallCRDs"), StepState::Succeeded);
}

#[test]
fn the_operator_rolls_and_the_step_waits_for_a_new_leader_that_reconciled_every_cluster() {
    let mut plan = plan_at("RollOperator");
    let mut seen = seen(new_crds(true, false, &["v1alpha1"]));
    assert_eq!(step(&mut plan, &seen), Some(Action::RollOperator));
    seen.operator = operator(NEW, false);
    assert_eq!(step(&mut plan, &seen), None);
    seen.operator = operator(NEW, true);
    seen.leader = Some(LeaderState { holder: "slotkeeper-new".into(), release: Some("0.2.0".into()), reconciled: 0 });
    step(&mut plan, &seen);
    assert_eq!(state(&plan, "RollOperator"), StepState::Running);
    assert!(plan.status.as_ref().unwrap().steps[2].message.as_deref().unwrap().contains("reconciled 0 of 1"));
    seen.leader.as_mut().unwrap().reconciled = 1;
    assert_eq!(step(&mut plan, &seen), None);
    assert_eq!(state(&plan, "RollOperator"), StepState::Succeeded);
}

#[test]
fn a_manager_killed_mid_step_resumes_by_looking_not_by_acting_again() {
    // The status says RollOperator is running; the rollout already happened.
    let mut plan = plan_at("RollOperator");
    let mut seen = seen(new_crds(true, false, &["v1alpha1"]));
    step(&mut plan, &seen);
    seen.operator = operator(NEW, true);
    seen.leader = Some(LeaderState { holder: "slotkeeper-new".into(), release: Some("0.2.0".into()), reconciled: 3 });
    assert_eq!(step(&mut plan, &seen), None, "nothing is applied twice");
    assert_eq!(state(&plan, "RollOperator"), StepState::Succeeded);
}

#[test]
fn storage_switches_then_migrates_then_waits_for_approval() {
    let mut plan = plan_at("SwitchStorage");
    let mut seen = seen(new_crds(true, false, &["v1alpha1"]));
    seen.operator = operator(NEW, true);
    assert_eq!(step(&mut plan, &seen), Some(Action::SwitchStorage));
    seen.crds = new_crds(false, false, &["v1alpha1", "v1"]);
    step(&mut plan, &seen);
    assert_eq!(state(&plan, "SwitchStorage"), StepState::Succeeded);
    assert_eq!(step(&mut plan, &seen), Some(Action::MigrateStorage));
    seen.crds = new_crds(false, false, &["v1"]);
    step(&mut plan, &seen);
    assert_eq!(state(&plan, "MigrateStorage"), StepState::Succeeded);
    assert_eq!(step(&mut plan, &seen), None);
    assert_eq!(state(&plan, "Finalize"), StepState::AwaitingApproval);
    assert_eq!(condition(&plan, "AwaitingApproval"), "True");
    plan.spec.approved_steps = vec!["Finalize".into()];
    plan.metadata.generation = Some(2);
    assert_eq!(step(&mut plan, &seen), Some(Action::Finalize));
    assert_eq!(condition(&plan, "AwaitingApproval"), "False");
    seen.crds = new_crds(false, true, &["v1"]);
    step(&mut plan, &seen);
    assert_eq!(condition(&plan, "Succeeded"), "True");
    assert_eq!(condition(&plan, "Progressing"), "False");
    assert_eq!(step(&mut plan, &seen), Some(Action::RemoveManager));
    seen.manager_present = false;
    assert_eq!(step(&mut plan, &seen), None);
}

#[test]
fn an_extra_gate_holds_its_step_until_approved_and_a_rollback_there_is_allowed() {
    let mut plan = plan();
    plan.spec.gates = vec!["SwitchStorage".into()];
    step(&mut plan, &seen(previous_crds()));
    let gated: Vec<&str> =
        plan.status.as_ref().unwrap().steps.iter().filter(|s| s.gated).map(|s| s.name.as_str()).collect();
    assert_eq!(gated, ["SwitchStorage", "Finalize"]);
    for s in plan.status.as_mut().unwrap().steps.iter_mut().take(3) {
        s.state = StepState::Succeeded;
    }
    let mut seen = seen(new_crds(true, false, &["v1alpha1"]));
    seen.operator = operator(NEW, true);
    assert_eq!(step(&mut plan, &seen), None, "held at the gate");
    assert_eq!(state(&plan, "SwitchStorage"), StepState::AwaitingApproval);
    let status = plan.status.clone().unwrap();
    assert_eq!(rollback_allowed(&status, &seen, seen.snapshot.as_ref().ok()), Ok(()));
    plan.spec.approved_steps = vec!["SwitchStorage".into()];
    assert_eq!(step(&mut plan, &seen), Some(Action::SwitchStorage));
}

#[test]
fn a_rollback_before_the_switch_restores_the_operator_then_the_crds() {
    let mut plan = plan_at("SwitchStorage");
    plan.spec.rollback = true;
    let mut seen = seen(new_crds(true, false, &["v1alpha1"]));
    seen.operator = operator(NEW, true);
    assert_eq!(step(&mut plan, &seen), Some(Action::RestoreOperator));
    seen.operator = operator(OLD, false);
    assert_eq!(step(&mut plan, &seen), None, "waits for the previous operator");
    seen.operator = operator(OLD, true);
    assert_eq!(step(&mut plan, &seen), Some(Action::RestoreCrds));
    seen.crds = previous_crds();
    assert_eq!(step(&mut plan, &seen), None);
    assert_eq!(condition(&plan, "RolledBack"), "True");
    assert_eq!(condition(&plan, "Progressing"), "False");
    assert_eq!(step(&mut plan, &seen), Some(Action::RemoveManager));
}

#[test]
fn a_rollback_after_the_switch_is_refused_with_the_reason_and_the_plan_goes_on() {
    let mut plan = plan_at("MigrateStorage");
    let status = plan.status.as_mut().unwrap();
    status.steps[3].start_time = Some(now());
    plan.spec.rollback = true;
    let mut seen = seen(new_crds(false, false, &["v1alpha1", "v1"]));
    seen.operator = operator(NEW, true);
    assert_eq!(step(&mut plan, &seen), Some(Action::MigrateStorage));
    assert_eq!(condition(&plan, "RolledBack"), "False");
    let refused = plan.status.as_ref().unwrap().conditions.iter().find(|c| c.type_ == "RolledBack").unwrap();
    assert_eq!(refused.reason, "RollbackRefused");
    assert!(refused.message.contains("roll forward"), "{}", refused.message);
}
