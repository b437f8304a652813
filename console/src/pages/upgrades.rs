//! Slotkeeper's own upgrades: every `SlotkeeperUpgrade` the user may list,
//! newest first, each with where it goes, its current step, conditions and
//! every step in order; a gated step awaiting approval gets its button.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource as _;
use leptos::prelude::*;
use slotkeeper_api::self_upgrade::{SlotkeeperUpgrade, StepState, UpgradeStep};

use crate::access::{Check, Permission};
use crate::actions::ApproveUpgradeStep;
use crate::upgrade_plans::approved_field;
use crate::view::{format, lists};

/// The roles `deploy/console-rbac.yaml` offers for this page.
const VIEWER_ROLE: &str = "slotkeeper-upgrade-viewer";
const APPROVER_ROLE: &str = "slotkeeper-upgrade-approver";

/// Whether a step is the one a person must approve now.
pub fn awaits_approval(step: &UpgradeStep) -> bool {
    step.gated && step.state == StepState::AwaitingApproval
}

/// Whether any plan has a step to approve (only then is the right to approve asked).
pub fn any_awaiting_approval(plans: &[SlotkeeperUpgrade]) -> bool {
    plans.iter().flat_map(|p| p.status.iter().flat_map(|s| &s.steps)).any(awaits_approval)
}

/// The page; `approve` is whether the user may patch plans.
pub fn page(plans: &[SlotkeeperUpgrade], approve: &Permission, now: Timestamp) -> AnyView {
    let content = if plans.is_empty() {
        view! { <p class="empty" id="no-upgrades">"No SlotkeeperUpgrade exists: Slotkeeper has not been upgraded here with `slotkeeper upgrade apply`."</p> }.into_any()
    } else {
        plans.iter().map(|p| plan(p, approve, now)).collect_view().into_any()
    };
    view! {
        <h1>"Slotkeeper upgrades"</h1>
        <p class="hint">"Slotkeeper's own upgrade plans, newest first, as Kubernetes listed them for you when this page loaded; reload to follow one."</p>
        {content}
    }
    .into_any()
}

/// The page when Kubernetes would not list the plans for the user: what it
/// said, and which permission (and role) is missing.
pub fn refused(user: &str, error: &kube::Error) -> AnyView {
    let list = Check::upgrades("list").describe();
    let text = match error {
        kube::Error::Api(e) if e.code == 403 => format!(
            "{user} may not {list}: Kubernetes answered 403 Forbidden ({}). Ask for the {VIEWER_ROLE} ClusterRole, bound with a ClusterRoleBinding.",
            e.message
        ),
        kube::Error::Api(e) if e.code == 404 => format!(
            "Kubernetes does not serve {} here ({}): this Slotkeeper release predates upgrade plans.",
            SlotkeeperUpgrade::plural(&()),
            e.message
        ),
        other => format!(
            "Kubernetes did not list {} for {user}: {other}. Try again in a moment.",
            SlotkeeperUpgrade::plural(&())
        ),
    };
    view! {
        <h1>"Slotkeeper upgrades"</h1>
        <p class="why-not" id="upgrades-refused" role="alert">{text}</p>
    }
    .into_any()
}

fn plan(plan: &SlotkeeperUpgrade, approve: &Permission, now: Timestamp) -> AnyView {
    let name = plan.metadata.name.clone().unwrap_or_default();
    let status = plan.status.clone().unwrap_or_default();
    let (id, title_id) = (format!("upgrade-{name}"), format!("upgrade-{name}-title"));
    let labelled_by = title_id.clone();
    let from = status.from.clone().unwrap_or_else(|| "the installed release".into());
    let title = format!("{name}: {from} → {}", plan.spec.release);
    let current = status.current_step.clone().unwrap_or_else(|| "none".into());
    let created = plan.metadata.creation_timestamp.as_ref().map(|t| format!("{} ago", format::age(t.0, now)));
    let approved =
        if plan.spec.approved_steps.is_empty() { "none".into() } else { plan.spec.approved_steps.join(", ") };
    let rollback = if plan.spec.rollback { "asked: the manager restores the previous release" } else { "not asked" };
    let findings = (!status.findings.is_empty()).then(|| {
        let items = status.findings.iter().map(|f| view! { <li>{f.clone()}</li> }).collect_view();
        view! { <h3>"Findings"</h3><ul class="findings">{items}</ul> }
    });
    let rows = status.steps.iter().enumerate().map(|(i, s)| step_row(plan, i, s, approve)).collect_view();
    view! {
        <section id=id aria-labelledby=labelled_by class="upgrade" data-plan=name>
            <h2 id=title_id>{title}</h2>
            <dl class="facts">
                <dt>"To"</dt><dd>{format!("{} ({})", plan.spec.release, plan.spec.image)}</dd>
                <dt>"Current step"</dt><dd class="current-step">{current}</dd>
                <dt>"Approved steps"</dt><dd>{approved}</dd>
                <dt>"Rollback"</dt><dd>{rollback}</dd>
                <dt>"Created"</dt><dd>{created.unwrap_or_else(|| "—".into())}</dd>
            </dl>
            {findings}
            <h3>"Conditions"</h3>
            {lists::conditions(&status.conditions, now)}
            <h3>"Steps"</h3>
            <table class="upgrade-steps">
                <thead><tr>
                    <th scope="col">"#"</th><th scope="col">"Step"</th><th scope="col">"State"</th>
                    <th scope="col">"Started"</th><th scope="col">"Completed"</th><th scope="col">"Message"</th>
                    <th scope="col">"Approval"</th>
                </tr></thead>
                <tbody>{rows}</tbody>
            </table>
        </section>
    }
    .into_any()
}

/// A step's state as a symbol, a word and a colour class.
fn state_badge(state: StepState) -> (&'static str, &'static str, &'static str) {
    match state {
        StepState::Pending => ("○", "Pending", "paused"),
        StepState::Running => ("◐", "Running", "busy"),
        StepState::AwaitingApproval => ("⏸", "AwaitingApproval", "busy"),
        StepState::Succeeded => ("✔", "Succeeded", "good"),
        StepState::Failed => ("✖", "Failed", "bad"),
    }
}

fn step_row(plan: &SlotkeeperUpgrade, index: usize, step: &UpgradeStep, approve: &Permission) -> impl IntoView + use<> {
    let (symbol, word, class) = state_badge(step.state);
    let time = |t: &Option<Time>| t.as_ref().map(|t| format::time(t.0)).unwrap_or_else(|| "—".into());
    let gated = step.gated.then_some(" (gated)");
    let description =
        (!step.description.is_empty()).then(|| view! { <div class="hint">{step.description.clone()}</div> });
    let approval = awaits_approval(step).then(|| approve_form(plan, &step.name, approve));
    view! {
        <tr class=class data-step=step.name.clone() data-state=word>
            <td>{index + 1}</td>
            <th scope="row">{step.name.clone()}{gated}{description}</th>
            <td><span class=format!("phase {class}")><span aria-hidden="true">{symbol}" "</span>{word}</span></td>
            <td>{time(&step.start_time)}</td>
            <td>{time(&step.completion_time)}</td>
            <td>{step.message.clone().unwrap_or_default()}</td>
            <td>{approval}</td>
        </tr>
    }
}

fn approve_form(plan: &SlotkeeperUpgrade, step: &str, approve: &Permission) -> AnyView {
    let action = ServerAction::<ApproveUpgradeStep>::new();
    let name = plan.metadata.name.clone().unwrap_or_default();
    let resource_version = plan.metadata.resource_version.clone().unwrap_or_default();
    let (button_id, why_id) = (format!("approve-{name}-{step}"), format!("approve-{name}-{step}-why"));
    let (step, approved, blocked) = (step.to_owned(), approved_field(plan), !approve.allowed);
    let label = format!("Approve {step}");
    let why = blocked.then(|| {
        let text = format!("Disabled: {}; the {APPROVER_ROLE} ClusterRole allows it.", approve.why_not);
        view! { <p class="why-not" id=why_id.clone()>{text}</p> }
    });
    view! {
        <ActionForm action=action>
            <input type="hidden" name="plan" value=name/>
            <input type="hidden" name="step" value=step/>
            <input type="hidden" name="approved" value=approved/>
            <input type="hidden" name="resource_version" value=resource_version/>
            <button type="submit" id=button_id disabled=blocked aria-describedby=why_id>{label}</button>
        </ActionForm>
        {why}
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use slotkeeper_api::self_upgrade::{CONDITION_AWAITING_APPROVAL, SlotkeeperUpgradeSpec, SlotkeeperUpgradeStatus};

    use super::*;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap())
    }

    fn step(name: &str, state: StepState, gated: bool) -> UpgradeStep {
        UpgradeStep {
            name: name.into(),
            description: format!("{name} does its part"),
            state,
            gated,
            ..Default::default()
        }
    }

    /// A plan from 0.1.0 to 0.2.0 waiting at its gated `SwitchStorage`;
    /// `Finalize`, gated too, is still pending.
    fn fixture() -> SlotkeeperUpgrade {
        let spec = SlotkeeperUpgradeSpec {
            release: "0.2.0".into(),
            image: "slotkeeper:0.2.0".into(),
            approved_steps: vec!["Preflight".into()],
            gates: vec!["SwitchStorage".into()],
            rollback: false,
            snapshot_digest: None,
        };
        let mut plan = SlotkeeperUpgrade::new("to-0-2-0", spec);
        plan.metadata.resource_version = Some("4711".into());
        plan.metadata.creation_timestamp = Some(at(1_000));
        let done = UpgradeStep {
            start_time: Some(at(1_010)),
            completion_time: Some(at(1_070)),
            message: Some("CRDs installed".into()),
            ..step("InstallCRDs", StepState::Succeeded, false)
        };
        let waiting = UpgradeStep {
            message: Some("approve to switch the storage version".into()),
            ..step("SwitchStorage", StepState::AwaitingApproval, true)
        };
        plan.status = Some(SlotkeeperUpgradeStatus {
            from: Some("0.1.0".into()),
            current_step: Some("SwitchStorage".into()),
            steps: vec![done, waiting, step("Finalize", StepState::Pending, true)],
            conditions: vec![Condition {
                type_: CONDITION_AWAITING_APPROVAL.into(),
                status: "True".into(),
                reason: "StepGated".into(),
                message: "SwitchStorage waits for approval".into(),
                observed_generation: None,
                last_transition_time: at(1_080),
            }],
            findings: vec!["cluster apps/old runs redis 6.2.14".into()],
            ..Default::default()
        });
        plan
    }

    fn render(plans: &[SlotkeeperUpgrade], approve: &Permission) -> String {
        Owner::new().with(|| page(plans, approve, Timestamp::from_second(1_100).unwrap()).to_html())
    }

    #[test]
    fn a_plan_shows_where_it_goes_its_conditions_and_every_step_in_order() {
        let html = render(&[fixture()], &Permission::allowed());
        assert!(html.contains("to-0-2-0: 0.1.0 → 0.2.0") && html.contains("slotkeeper:0.2.0"), "{html}");
        assert!(html.contains("<dd class=\"current-step\">SwitchStorage</dd>"), "{html}");
        assert!(html.contains("<tr class=\"busy\"><th scope=\"row\">AwaitingApproval</th>"), "{html}");
        assert!(html.contains("SwitchStorage waits for approval"), "{html}");
        assert!(html.contains("cluster apps/old runs redis 6.2.14"), "findings: {html}");
        let install = html.find("data-step=\"InstallCRDs\"").expect("InstallCRDs listed");
        let switch = html.find("data-step=\"SwitchStorage\"").expect("SwitchStorage listed");
        let finalize = html.find("data-step=\"Finalize\"").expect("Finalize listed");
        assert!(install < switch && switch < finalize, "steps in plan order");
        assert!(html.contains("data-step=\"InstallCRDs\" data-state=\"Succeeded\""), "{html}");
        assert!(html.contains("1970-01-01 00:16:50Z") && html.contains("1970-01-01 00:17:50Z"), "times: {html}");
        assert!(html.contains("CRDs installed") && html.contains("InstallCRDs does its part"), "{html}");
    }

    #[test]
    fn only_a_gated_step_awaiting_approval_gets_the_button() {
        let html = render(&[fixture()], &Permission::allowed());
        assert_eq!(html.matches("action=\"/actions/approve-upgrade-step\"").count(), 1, "{html}");
        assert!(html.contains("Approve SwitchStorage") && !html.contains("Approve Finalize"), "{html}");
        assert!(html.contains("name=\"step\" value=\"SwitchStorage\""), "{html}");
        assert!(html.contains("name=\"resource_version\" value=\"4711\""), "{html}");
        assert!(!html.contains("id=\"approve-to-0-2-0-SwitchStorage\" disabled"), "{html}");

        // Awaiting approval but not gated (a status no manager writes): no button.
        let mut ungated = fixture();
        ungated.status.as_mut().unwrap().steps[1].gated = false;
        let html = render(&[ungated], &Permission::allowed());
        assert!(!html.contains("Approve SwitchStorage"), "{html}");
    }

    #[test]
    fn without_the_right_to_patch_the_button_is_disabled_and_says_why() {
        let denied = Permission::denied("bob may not patch slotkeeperupgrades (cluster-scoped)");
        let html = render(&[fixture()], &denied);
        assert!(html.contains("id=\"approve-to-0-2-0-SwitchStorage\" disabled"), "{html}");
        assert!(html.contains("bob may not patch slotkeeperupgrades") && html.contains(APPROVER_ROLE), "{html}");
    }

    #[test]
    fn no_plan_and_a_refused_list_say_so_in_words() {
        assert!(render(&[], &Permission::allowed()).contains("No SlotkeeperUpgrade exists"));
        let forbidden = kube::Error::Api(Box::new(kube::core::Status {
            message: "slotkeeperupgrades.slotkeeper.io is forbidden".into(),
            reason: "Forbidden".into(),
            code: 403,
            ..Default::default()
        }));
        let html = Owner::new().with(|| refused("bob", &forbidden).to_html());
        assert!(html.contains("bob may not list slotkeeperupgrades (cluster-scoped)"), "{html}");
        assert!(html.contains("403 Forbidden") && html.contains(VIEWER_ROLE), "{html}");
    }

    #[test]
    fn only_plans_with_a_gated_step_waiting_ask_for_the_right_to_approve() {
        assert!(any_awaiting_approval(&[fixture()]));
        let mut done = fixture();
        done.status.as_mut().unwrap().steps[1].state = StepState::Succeeded;
        assert!(!any_awaiting_approval(&[done]));
    }
}
