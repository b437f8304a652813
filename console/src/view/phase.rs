//! A cluster's phase and health as a badge: a symbol, a word and a colour,
//! so the phase never depends on colour alone.

use leptos::prelude::*;
use slotkeeper_api::names::{CONDITION_DEGRADED, CONDITION_READY};
use slotkeeper_api::{Phase, RedisCluster};

/// How urgently a person should look, most urgent first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    /// Recovering, failed or degraded.
    Unhealthy,
    /// Being created, scaled or upgraded.
    Working,
    /// Paused by its owner.
    Paused,
    Healthy,
}

pub fn phase_of(cluster: &RedisCluster) -> Phase {
    cluster.status.as_ref().and_then(|s| s.phase).unwrap_or_default()
}

fn condition(cluster: &RedisCluster, kind: &str) -> Option<bool> {
    let conditions = &cluster.status.as_ref()?.conditions;
    conditions.iter().find(|c| c.type_ == kind).map(|c| c.status == "True")
}

pub fn health(cluster: &RedisCluster) -> Health {
    let phase = phase_of(cluster);
    if matches!(phase, Phase::Recovering | Phase::Failed) || condition(cluster, CONDITION_DEGRADED) == Some(true) {
        return Health::Unhealthy;
    }
    if cluster.spec.paused {
        return Health::Paused;
    }
    match phase {
        Phase::Running if condition(cluster, CONDITION_READY) == Some(true) => Health::Healthy,
        Phase::Running => Health::Unhealthy,
        _ => Health::Working,
    }
}

pub fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Pending => "Pending",
        Phase::Creating => "Creating",
        Phase::Running => "Running",
        Phase::Scaling => "Scaling",
        Phase::Upgrading => "Upgrading",
        Phase::Recovering => "Recovering",
        Phase::Failed => "Failed",
    }
}

pub const PHASES: [Phase; 7] = [
    Phase::Pending,
    Phase::Creating,
    Phase::Running,
    Phase::Scaling,
    Phase::Upgrading,
    Phase::Recovering,
    Phase::Failed,
];

/// The badge for a cluster: `✔ Running`, `◐ Scaling`, `⚠ Recovering`, with
/// `(paused)` added when its owner paused it.
pub fn badge(cluster: &RedisCluster) -> AnyView {
    let phase = phase_of(cluster);
    let health = health(cluster);
    let (symbol, class) = match health {
        Health::Unhealthy => ("⚠", "bad"),
        Health::Working => ("◐", "busy"),
        Health::Paused => ("⏸", "paused"),
        Health::Healthy => ("✔", "good"),
    };
    let paused = cluster.spec.paused.then_some(" (paused)");
    view! {
        <span class=format!("phase {class}") data-phase=phase_name(phase)>
            <span aria-hidden="true">{symbol}" "</span>
            {phase_name(phase)}
            {paused}
        </span>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use slotkeeper_api::{RedisClusterSpec, RedisClusterStatus};

    pub fn cluster(phase: Phase, ready: bool, degraded: bool) -> RedisCluster {
        let spec: RedisClusterSpec =
            serde_json::from_value(serde_json::json!({"masters": 3, "redis": {"version": "7.0.15"}})).unwrap();
        let mut c = RedisCluster::new("c", spec);
        let condition = |kind: &str, status: bool| Condition {
            type_: kind.into(),
            status: if status { "True" } else { "False" }.into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        };
        c.status = Some(RedisClusterStatus {
            phase: Some(phase),
            conditions: vec![condition(CONDITION_READY, ready), condition(CONDITION_DEGRADED, degraded)],
            ..Default::default()
        });
        c
    }

    #[test]
    fn unhealthy_sorts_first_and_running_needs_ready() {
        assert_eq!(health(&cluster(Phase::Running, true, false)), Health::Healthy);
        assert_eq!(health(&cluster(Phase::Running, false, false)), Health::Unhealthy);
        assert_eq!(health(&cluster(Phase::Running, true, true)), Health::Unhealthy);
        assert_eq!(health(&cluster(Phase::Scaling, false, false)), Health::Working);
        assert_eq!(health(&cluster(Phase::Recovering, false, true)), Health::Unhealthy);
        assert!(Health::Unhealthy < Health::Working && Health::Working < Health::Healthy);
    }

    #[test]
    fn the_badge_says_the_phase_in_words() {
        let html = Owner::new().with(|| badge(&cluster(Phase::Recovering, false, true)).to_html());
        assert!(html.contains("Recovering") && html.contains("⚠") && html.contains("bad"), "{html}");
        let mut paused = cluster(Phase::Running, true, false);
        paused.spec.paused = true;
        let html = Owner::new().with(|| badge(&paused).to_html());
        assert!(html.contains("(paused)"), "{html}");
    }
}
