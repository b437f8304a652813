//! One cluster: its status and conditions, topology, slot map and reshard
//! progress, charts, operations, events and spec, each a live fragment; and
//! the actions the user may take, each a plain form.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use leptos::prelude::*;
use slotkeeper_api::topology::SLOTS;
use slotkeeper_api::{MIN_MASTERS, RedisCluster, RedisOperation, StepStatus};
use slotkeeper_readmodel::{ClusterKey, EventView, NodeView, Observation, ReadModel, Role, Sample, Source};

use super::{clusters, fragment};
use crate::access::{ClusterAccess, Permission};
use crate::actions::{FailOver, Pause, Scale};
use crate::view::{charts, format, lists, phase, slotmap, topology};

/// Events listed on the page, newest first.
const EVENTS_SHOWN: usize = 50;

/// Everything the page shows, read from the read model at one moment.
pub struct ClusterPage {
    pub key: ClusterKey,
    pub cluster: Arc<RedisCluster>,
    pub observation: Option<Arc<Observation>>,
    pub nodes: Vec<NodeView>,
    pub samples: Vec<Sample>,
    pub operations: Vec<Arc<RedisOperation>>,
    pub events: Vec<EventView>,
    pub access: ClusterAccess,
    pub now: Timestamp,
}

pub fn snapshot(readmodel: &ReadModel, key: &ClusterKey, access: ClusterAccess, now: Timestamp) -> Option<ClusterPage> {
    let cluster = readmodel.cluster(key)?;
    let observation = readmodel.observation(key);
    Some(ClusterPage {
        nodes: topology::nodes(&cluster, observation.as_deref()),
        samples: readmodel.samples(key),
        operations: if access.operations.allowed { readmodel.operations_of(key) } else { Vec::new() },
        events: if access.events.allowed { readmodel.events_of(key, EVENTS_SHOWN) } else { Vec::new() },
        key: key.clone(),
        cluster,
        observation,
        access,
        now,
    })
}

/// The live fragments, in page order.
pub const FRAGMENTS: [&str; 10] =
    ["summary", "conditions", "version", "reshard", "topology", "slots", "charts", "operations", "events", "spec"];

pub fn render_fragment(page: &ClusterPage, id: &str) -> AnyView {
    match id {
        "summary" => fragment("summary", "Status", summary(page)),
        "conditions" => fragment("conditions", "Conditions", {
            let conditions = page.cluster.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
            lists::conditions(&conditions, page.now)
        }),
        "version" => fragment("version", "Version", super::version::rollout(&page.cluster, page.now)),
        "reshard" => fragment("reshard", "Reshard", {
            slotmap::reshard(page.cluster.status.as_ref().and_then(|s| s.reshard.as_ref()))
        }),
        "topology" => fragment("topology", "Topology", topology::topology(&page.nodes)),
        "slots" => fragment("slots", "Slots", slotmap::slot_map(&page.nodes)),
        "charts" => fragment("charts", "Last 15 minutes", charts::charts(&page.samples, page.now)),
        "operations" => fragment(
            "operations",
            "Operations",
            denied_or(&page.access.operations, || lists::operations(&page.operations, page.now)),
        ),
        "events" => {
            fragment("events", "Events", denied_or(&page.access.events, || lists::events(&page.events, page.now)))
        }
        _ => fragment("spec", "Spec", lists::spec_yaml(&page.cluster)),
    }
}

fn denied_or(permission: &Permission, content: impl FnOnce() -> AnyView) -> AnyView {
    if permission.allowed {
        content()
    } else {
        view! { <p class="empty">{format!("Not shown: {}.", permission.why_not)}</p> }.into_any()
    }
}

/// The whole page, its live fragments already rendered (`fragments`, in
/// [`FRAGMENTS`] order: the same HTML the live stream compares against).
pub fn page(page: &ClusterPage, fragments: &[(&'static str, String)]) -> AnyView {
    let title = format!("{} in {}", page.key.name, page.key.namespace);
    let html = |range: std::ops::Range<usize>| -> String { fragments[range].iter().map(|(_, h)| h.as_str()).collect() };
    // The status first (what a person opens the page for), then the actions, then the rest.
    let (status, rest) = (html(0..1), html(1..fragments.len()));
    view! {
        <nav class="crumbs" aria-label="Breadcrumb">
            <a href="/">"Clusters"</a>" / "
            <a href=format!("/?namespace={}", super::paths::encode(&page.key.namespace))>{page.key.namespace.clone()}</a>
            " / "{page.key.name.clone()}
        </nav>
        <h1>{title}</h1>
        <div class="fragments" inner_html=status></div>
        {actions(page)}
        <div class="fragments" inner_html=rest></div>
    }
    .into_any()
}

fn summary(page: &ClusterPage) -> AnyView {
    let cluster = &page.cluster;
    let status = cluster.status.clone().unwrap_or_default();
    let observation = page.observation.as_deref();
    let observed = match observation {
        Some(o) => {
            let who = match o.source {
                Source::Reconcile => "by the leader's reconcile",
                Source::Sampler => "by this replica's sampler (it is not the leader)",
            };
            format!("{} ago {who}", format::age(o.at, page.now))
        }
        None => "not yet: figures below come from the cluster's status".into(),
    };
    let step = observation.and_then(|o| o.step.clone()).or_else(|| status.step.as_ref().map(StepStatus::summary));
    let generation = match (status.observed_generation, cluster.metadata.generation) {
        (Some(seen), Some(current)) if seen < current => format!("{seen} (spec generation {current} not yet acted on)"),
        (Some(seen), _) => seen.to_string(),
        (None, _) => "—".into(),
    };
    view! {
        <p class="badge-line">{phase::badge(cluster)}</p>
        {cluster.spec.paused.then(|| view! { <p class="paused-note">"Paused: the operator takes no action on this cluster until it is resumed."</p> })}
        <dl class="facts">
            <dt>"Masters ready"</dt><dd>{format!("{} of {}", status.ready_masters, cluster.spec.masters)}</dd>
            <dt>"Replicas ready"</dt><dd>{format!("{} of {} ({} per master)", status.ready_replicas, cluster.spec.masters * cluster.spec.replicas_per_master, cluster.spec.replicas_per_master)}</dd>
            <dt>"Version"</dt><dd>{clusters::version(cluster, observation)}</dd>
            <dt>"Slots assigned"</dt><dd>{format!("{} of {SLOTS}", status.slots_assigned)}</dd>
            <dt>"Cluster state"</dt><dd>{status.cluster_state.clone().unwrap_or_else(|| "—".into())}</dd>
            <dt>"Memory (masters)"</dt><dd>{clusters::memory(observation)}</dd>
            <dt>"Ops/s"</dt><dd>{observation.map(|o| o.ops_per_sec().to_string()).unwrap_or_else(|| "—".into())}</dd>
            <dt>"Step in progress"</dt><dd>{step.unwrap_or_else(|| "none: converged".into())}</dd>
            <dt>"Observed generation"</dt><dd>{generation}</dd>
            <dt>"Observed"</dt><dd>{observed}</dd>
        </dl>
    }
    .into_any()
}

fn why_not(id: &'static str, permission: &Permission) -> Option<impl IntoView + use<>> {
    (!permission.allowed).then(|| view! { <p class="why-not" id=id>{format!("Disabled: {}.", permission.why_not)}</p> })
}

/// Replicas that can be promoted, per shard: `(shard:pod, words)`.
pub fn failover_choices(nodes: &[NodeView]) -> Vec<(String, String)> {
    let mut choices = Vec::new();
    for (shard, members) in topology::shards(nodes) {
        let Some(master) = members.iter().find(|n| n.role() == Role::Master) else { continue };
        for replica in
            members.iter().filter(|n| n.role() == Role::Replica && n.master_pod.as_deref() == Some(master.pod.as_str()))
        {
            let state = match (replica.link_up, replica.lag_bytes) {
                (true, Some(lag)) => format!("in sync, {} behind", format::bytes(lag)),
                (true, None) => "in sync".into(),
                (false, _) => "link down: it will not be promoted until it catches up".into(),
            };
            choices.push((format!("{shard}:{}", replica.pod), format!("{} ({state})", replica.pod)));
        }
    }
    choices
}

fn actions(page: &ClusterPage) -> AnyView {
    let access = page.access.clone();
    let spec = &page.cluster.spec;
    let (masters, replicas, paused) = (spec.masters, spec.replicas_per_master, spec.paused);
    let hidden = |ns: &str, name: &str| {
        let (ns, name) = (ns.to_owned(), name.to_owned());
        view! {
            <input type="hidden" name="namespace" value=ns/>
            <input type="hidden" name="name" value=name/>
        }
    };
    let (ns, name) = (page.key.namespace.as_str(), page.key.name.as_str());
    let (scale_key, fail_over_key, pause_key) = (hidden(ns, name), hidden(ns, name), hidden(ns, name));
    let releases = super::version::choices(&page.cluster);
    let no_release = releases.is_empty();
    let can_change_version = !no_release && access.patch.allowed;
    let release_options = releases
        .iter()
        .map(
            |e| view! { <option value=super::version::value_of(e)>{format!("{} ({})", e.release(), e.image)}</option> },
        )
        .collect_view();
    let version_preview = format!("{}/version", super::paths::cluster(&page.key));
    let scale = ServerAction::<Scale>::new();
    let pause = ServerAction::<Pause>::new();
    let fail_over = ServerAction::<FailOver>::new();
    let can_scale = access.scale.allowed || access.patch.allowed;
    let (can_masters, can_replicas, can_patch) = (access.scale.allowed, access.patch.allowed, access.patch.allowed);
    let choices = failover_choices(&page.nodes);
    let no_replica = choices.is_empty();
    let can_fail_over = !no_replica && access.fail_over.allowed;
    let options = choices.into_iter().map(|(value, text)| view! { <option value=value>{text}</option> }).collect_view();
    let (pause_value, pause_label) = if paused { ("false", "Resume") } else { ("true", "Pause") };
    view! {
        <section id="actions" aria-labelledby="actions-title">
            <h2 id="actions-title">"Actions"</h2>
            <div class="actions">
                <div class="action">
                    <h3>"Scale"</h3>
                    <ActionForm action=scale>
                        {scale_key}
                        <label for="scale-masters">{format!("Masters (at least {MIN_MASTERS})")}</label>
                        <input id="scale-masters" type="number" name="masters" min=MIN_MASTERS value=masters disabled=!can_masters aria-describedby="scale-masters-why"/>
                        <label for="scale-replicas">"Replicas per master (0–5)"</label>
                        <input id="scale-replicas" type="number" name="replicas" min="0" max="5" value=replicas disabled=!can_replicas aria-describedby="scale-replicas-why"/>
                        <button type="submit" id="scale-submit" disabled=!can_scale>"Scale"</button>
                    </ActionForm>
                    <p class="hint">"Scaling in first shows which slots move and whether the data fits."</p>
                    {why_not("scale-masters-why", &access.scale)}
                    {why_not("scale-replicas-why", &access.patch)}
                </div>
                <div class="action">
                    <h3>"Fail over a shard"</h3>
                    <ActionForm action=fail_over>
                        {fail_over_key}
                        <label for="failover-target">"Replica to promote"</label>
                        <select id="failover-target" name="target" disabled=!can_fail_over aria-describedby="failover-why">
                            {options}
                        </select>
                        <button type="submit" id="failover-submit" disabled=!can_fail_over>"Fail over"</button>
                    </ActionForm>
                    <p class="hint">"Creates a RedisOperation: the replica takes over once it has caught up, so no acknowledged write is lost."</p>
                    {no_replica.then(|| view! { <p class="why-not" id="failover-why">"Disabled: no shard has a replica attached to its master."</p> })}
                    {why_not("failover-why", &access.fail_over)}
                </div>
                <div class="action">
                    <h3>"Change version"</h3>
                    <form method="get" action=version_preview>
                        <label for="version-target">"Roll out to"</label>
                        <select id="version-target" name="to" disabled=!can_change_version aria-describedby="version-choice-why">
                            {release_options}
                        </select>
                        <button type="submit" id="version-submit" disabled=!can_change_version>"Show the plan"</button>
                    </form>
                    <p class="hint">"Only releases reachable from what the nodes run; the planned steps are shown before anything changes."</p>
                    {no_release.then(|| view! { <p class="why-not" id="version-choice-why">"Disabled: no newer release is reachable from what the nodes run."</p> })}
                    {why_not("version-choice-why", &access.patch)}
                </div>
                <div class="action">
                    <h3>{if paused { "Resume" } else { "Pause" }}</h3>
                    <p class="hint">{if paused { "The operator takes no action on this cluster until it is resumed." } else { "Stops every action of the operator on this cluster; Redis keeps serving." }}</p>
                    <ActionForm action=pause>
                        {pause_key}
                        <input type="hidden" name="paused" value=pause_value/>
                        <button type="submit" id="pause-submit" class="secondary" disabled=!can_patch aria-describedby="pause-why">{format!("{pause_label} the operator on this cluster")}</button>
                    </ActionForm>
                    {why_not("pause-why", &access.patch)}
                </div>
            </div>
        </section>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotkeeper_api::topology::SlotRange;

    fn node(pod: &str, shard: usize, role: Role, master: Option<&str>, link_up: bool) -> NodeView {
        NodeView {
            pod: pod.into(),
            shard,
            reachable: true,
            role: Some(role),
            master_pod: master.map(Into::into),
            link_up,
            lag_bytes: master.map(|_| 0),
            slots: if role == Role::Master { vec![SlotRange { start: 0, end: 10 }] } else { vec![] },
            ..Default::default()
        }
    }

    #[test]
    fn only_replicas_of_the_current_master_are_offered_with_their_lag() {
        let nodes = vec![
            node("c-shard-0-0", 0, Role::Master, None, false),
            node("c-shard-0-1", 0, Role::Replica, Some("c-shard-0-0"), true),
            node("c-shard-1-0", 1, Role::Master, None, false),
            node("c-shard-1-1", 1, Role::Replica, Some("elsewhere"), true),
            node("c-shard-2-0", 2, Role::Replica, Some("c-shard-2-1"), false),
            node("c-shard-2-1", 2, Role::Master, None, false),
        ];
        let choices = failover_choices(&nodes);
        assert_eq!(choices.len(), 2, "{choices:?}");
        assert_eq!(choices[0].0, "0:c-shard-0-1");
        assert!(choices[0].1.contains("in sync, 0 B behind"));
        assert!(choices[1].1.contains("link down"));
    }
}
