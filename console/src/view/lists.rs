//! Conditions, events, operations and the spec, as tables and text.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use leptos::prelude::*;
use slotkeeper_api::self_upgrade::{CONDITION_AWAITING_APPROVAL, CONDITION_FAILED, CONDITION_ROLLED_BACK};
use slotkeeper_api::{OperationPhase, OperationType, RedisCluster, RedisOperation};
use slotkeeper_readmodel::EventView;

use super::format;

pub fn conditions(conditions: &[Condition], now: Timestamp) -> AnyView {
    if conditions.is_empty() {
        return view! { <p class="empty">"The operator has not reported any condition yet."</p> }.into_any();
    }
    let rows = conditions
        .iter()
        .map(|c| {
            let class = match (c.type_.as_str(), c.status.as_str()) {
                ("Degraded", "True") | ("Ready", "False") => "bad",
                // An upgrade plan's conditions share this table.
                (CONDITION_FAILED | CONDITION_ROLLED_BACK, "True") => "bad",
                ("Progressing" | CONDITION_AWAITING_APPROVAL, "True") => "busy",
                _ => "good",
            };
            view! {
                <tr class=class>
                    <th scope="row">{c.type_.clone()}</th>
                    <td>{c.status.clone()}</td>
                    <td>{c.reason.clone()}</td>
                    <td>{c.message.clone()}</td>
                    <td>{format::age(c.last_transition_time.0, now)}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <table class="conditions">
            <thead><tr>
                <th scope="col">"Condition"</th><th scope="col">"Status"</th><th scope="col">"Reason"</th>
                <th scope="col">"Message"</th><th scope="col">"Since"</th>
            </tr></thead>
            <tbody>{rows}</tbody>
        </table>
    }
    .into_any()
}

pub fn events(events: &[EventView], now: Timestamp) -> AnyView {
    if events.is_empty() {
        return view! { <p class="empty">"No events yet."</p> }.into_any();
    }
    let rows = events
        .iter()
        .map(|e| {
            let warning = e.type_ == "Warning";
            let age = e.last_seen.map(|t| format::age(t, now)).unwrap_or_else(|| "?".into());
            let count = (e.count > 1).then(|| format!(" (×{})", e.count));
            view! {
                <tr class=if warning { "warning" } else { "normal" }>
                    <td>{age}</td>
                    <td>{warning.then_some("⚠ ")}{e.type_.clone()}</td>
                    <td>{e.reason.clone()}</td>
                    <td>{format!("{}/{}", e.kind, e.name)}</td>
                    <td>{e.message.clone()}{count}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <table class="events">
            <thead><tr>
                <th scope="col">"Age"</th><th scope="col">"Type"</th><th scope="col">"Reason"</th>
                <th scope="col">"Object"</th><th scope="col">"Message"</th>
            </tr></thead>
            <tbody>{rows}</tbody>
        </table>
    }
    .into_any()
}

pub fn operation_phase(operation: &RedisOperation) -> &'static str {
    match operation.status.as_ref().and_then(|s| s.phase).unwrap_or_default() {
        OperationPhase::Pending => "Pending",
        OperationPhase::Running => "Running",
        OperationPhase::Succeeded => "Succeeded",
        OperationPhase::Failed => "Failed",
    }
}

pub fn operations(operations: &[std::sync::Arc<RedisOperation>], now: Timestamp) -> AnyView {
    if operations.is_empty() {
        return view! { <p class="empty">"No RedisOperation has been run on this cluster."</p> }.into_any();
    }
    let rows = operations
        .iter()
        .map(|o| {
            let status = o.status.clone().unwrap_or_default();
            let what = match o.spec.type_ {
                OperationType::Failover => {
                    let spec = o.spec.failover.as_ref();
                    let shard = spec.map(|f| f.shard.to_string()).unwrap_or_else(|| "?".into());
                    let target = spec.and_then(|f| f.target_pod.clone()).map(|p| format!(" to {p}")).unwrap_or_default();
                    format!("Failover of shard {shard}{target}")
                }
                OperationType::RollingRestart => "Rolling restart of every Pod".to_owned(),
                OperationType::Rebalance => match &status.progress {
                    Some(progress) => format!("Rebalance ({progress})"),
                    None => "Rebalance of slots over the masters".to_owned(),
                },
            };
            let phase = operation_phase(o);
            let (symbol, class) = match phase {
                "Succeeded" => ("✔", "good"),
                "Failed" => ("✖", "bad"),
                _ => ("◐", "busy"),
            };
            let created = o.metadata.creation_timestamp.as_ref().map(|t| format::age(t.0, now)).unwrap_or_default();
            let started = status.start_time.as_ref().map(|t| format::time(t.0)).unwrap_or_else(|| "—".into());
            let completed = status.completion_time.as_ref().map(|t| format::time(t.0)).unwrap_or_else(|| "—".into());
            view! {
                <tr class=class data-operation=o.metadata.name.clone().unwrap_or_default() data-phase=phase>
                    <th scope="row">{o.metadata.name.clone()}</th>
                    <td>{what}</td>
                    <td><span class=format!("phase {class}")><span aria-hidden="true">{symbol}" "</span>{phase}</span></td>
                    <td>{created}</td>
                    <td>{started}</td>
                    <td>{completed}</td>
                    <td>{status.message.clone().unwrap_or_default()}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <table class="operations">
            <thead><tr>
                <th scope="col">"RedisOperation"</th><th scope="col">"What"</th><th scope="col">"Phase"</th>
                <th scope="col">"Age"</th><th scope="col">"Started"</th><th scope="col">"Completed"</th>
                <th scope="col">"Message"</th>
            </tr></thead>
            <tbody>{rows}</tbody>
        </table>
    }
    .into_any()
}

/// The spec as YAML. It holds no secret: `auth` names a Secret, never its value.
pub fn spec_yaml(cluster: &RedisCluster) -> AnyView {
    let yaml = serde_norway::to_string(&cluster.spec).unwrap_or_else(|e| format!("# cannot show the spec: {e}"));
    view! { <pre class="yaml">{yaml}</pre> }.into_any()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_marked_in_words_and_repeats_counted() {
        let event = EventView {
            uid: "1".into(),
            namespace: "apps".into(),
            kind: "RedisCluster".into(),
            name: "cache".into(),
            type_: "Warning".into(),
            reason: "ScaleInRefused".into(),
            message: "does not fit".into(),
            count: 3,
            last_seen: Some(Timestamp::from_second(100).unwrap()),
            reporter: "slotkeeper".into(),
        };
        let html = Owner::new().with(|| events(&[event], Timestamp::from_second(130).unwrap()).to_html());
        assert!(
            html.contains("⚠ ") && html.contains("Warning") && html.contains("(×3)") && html.contains("30s"),
            "{html}"
        );
    }

    #[test]
    fn the_spec_names_a_secret_but_holds_no_value() {
        let spec = serde_json::json!({"masters": 3, "redis": {"version": "7.0.15"}, "auth": {"secretName": "pw"}});
        let cluster = RedisCluster::new("c", serde_json::from_value(spec).unwrap());
        let html = Owner::new().with(|| spec_yaml(&cluster).to_html());
        assert!(html.contains("secretName: pw") && html.contains("masters: 3"), "{html}");
    }
}
