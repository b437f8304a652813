//! The landing page: every RedisCluster the user may list, unhealthy ones
//! first, filtered by namespace and phase.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use leptos::prelude::*;
use serde::Deserialize;
use slotkeeper_api::RedisCluster;
use slotkeeper_api::topology::SLOTS;
use slotkeeper_readmodel::{ClusterKey, Observation, ReadModel};

use super::{fragment, paths};
use crate::render::RenderedRow;
use crate::view::format;
use crate::view::phase::{self, Health};

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct Filter {
    /// Empty means every namespace.
    #[serde(default)]
    pub namespace: String,
    /// Empty means every phase.
    #[serde(default)]
    pub phase: String,
}

impl Filter {
    /// The filter as a query string (for the live stream).
    pub fn query(&self) -> String {
        let mut parts = Vec::new();
        if !self.namespace.is_empty() {
            parts.push(format!("namespace={}", paths::encode(&self.namespace)));
        }
        if !self.phase.is_empty() {
            parts.push(format!("phase={}", paths::encode(&self.phase)));
        }
        parts.join("&")
    }
}

/// One cluster's row, with the read model's latest figures.
pub struct Row {
    pub key: ClusterKey,
    pub cluster: Arc<RedisCluster>,
    pub observation: Option<Arc<Observation>>,
    pub health: Health,
}

pub struct Clusters {
    pub rows: Vec<Row>,
    /// Namespaces the user may list clusters in (the filter's choices).
    pub namespaces: Vec<String>,
    pub filter: Filter,
    pub now: Timestamp,
}

/// The rows the user may see, matching the filter, unhealthy first.
pub fn snapshot(readmodel: &ReadModel, visible: &BTreeSet<String>, filter: Filter, now: Timestamp) -> Clusters {
    let mut rows: Vec<Row> = readmodel
        .clusters()
        .into_iter()
        .filter_map(|cluster| {
            let key = ClusterKey::new(cluster.metadata.namespace.clone()?, cluster.metadata.name.clone()?);
            visible.contains(&key.namespace).then_some((key, cluster))
        })
        .filter(|(key, _)| filter.namespace.is_empty() || key.namespace == filter.namespace)
        .filter(|(_, cluster)| filter.phase.is_empty() || phase::phase_name(phase::phase_of(cluster)) == filter.phase)
        .map(|(key, cluster)| Row {
            observation: readmodel.observation(&key),
            health: phase::health(&cluster),
            key,
            cluster,
        })
        .collect();
    rows.sort_by(|a, b| a.health.cmp(&b.health).then_with(|| a.key.cmp(&b.key)));
    Clusters { rows, namespaces: visible.iter().cloned().collect(), filter, now }
}

/// The whole page, its live table already rendered (`table`: the same HTML
/// the live stream compares against).
pub fn page(clusters: &Clusters, table: &str) -> AnyView {
    let namespace_options = clusters
        .namespaces
        .iter()
        .map(|ns| {
            let selected = *ns == clusters.filter.namespace;
            view! { <option value=ns.clone() selected=selected>{ns.clone()}</option> }
        })
        .collect_view();
    let phase_options = phase::PHASES
        .iter()
        .map(|p| {
            let name = phase::phase_name(*p);
            view! { <option value=name selected=clusters.filter.phase == name>{name}</option> }
        })
        .collect_view();
    view! {
        <h1>"Redis clusters"</h1>
        <form class="filter" method="get" action=paths::CLUSTERS>
            <label for="filter-namespace">"Namespace"</label>
            <select id="filter-namespace" name="namespace">
                <option value="" selected=clusters.filter.namespace.is_empty()>"All namespaces"</option>
                {namespace_options}
            </select>
            <label for="filter-phase">"Phase"</label>
            <select id="filter-phase" name="phase">
                <option value="" selected=clusters.filter.phase.is_empty()>"Any phase"</option>
                {phase_options}
            </select>
            <button type="submit">"Filter"</button>
        </form>
        <div class="fragments" inner_html=table.to_owned()></div>
    }
    .into_any()
}

/// The live fragment: the table of clusters, its rows already rendered
/// (see [`row_html`]), in the order of `clusters.rows`.
pub fn table(clusters: &Clusters, rows: &[RenderedRow]) -> AnyView {
    let content = if clusters.rows.is_empty() {
        let text = if clusters.namespaces.is_empty() {
            "No RedisCluster you may list. Ask for the slotkeeper-redis-viewer role in a namespace, or create a RedisCluster."
        } else {
            "No RedisCluster matches the filter."
        };
        view! { <p class="empty">{text}</p> }.into_any()
    } else {
        let rows: String = rows.iter().map(|r| r.html.as_ref()).collect();
        view! {
            <table class="clusters">
                <thead><tr>
                    <th scope="col">"Name"</th><th scope="col">"Namespace"</th><th scope="col">"Phase"</th>
                    <th scope="col">"Masters"</th><th scope="col">"Replicas"</th><th scope="col">"Version"</th>
                    <th scope="col">"Slots"</th><th scope="col">"Memory"</th><th scope="col">"Ops/s"</th>
                    <th scope="col">"Age"</th>
                </tr></thead>
                <tbody inner_html=rows></tbody>
            </table>
        }
        .into_any()
    };
    fragment("clusters", "Clusters", content)
}

/// `7.0.15`, or every version when nodes disagree (a rollout in progress).
pub fn version(cluster: &RedisCluster, observation: Option<&Observation>) -> String {
    let observed = observation.map(|o| o.versions()).unwrap_or_default();
    match observed.len() {
        0 => cluster
            .status
            .as_ref()
            .and_then(|s| s.current_version.clone())
            .unwrap_or_else(|| cluster.spec.redis.version.clone()),
        1 => observed[0].clone(),
        _ => format!("mixed: {}", observed.join(" + ")),
    }
}

/// `12.0 MiB of 96.0 MiB`, or `—` before the first observation.
pub fn memory(observation: Option<&Observation>) -> String {
    let Some(observation) = observation else { return "—".into() };
    let (used, max) = observation.memory();
    format::memory(used, max)
}

/// The element id of a cluster's row, which the live stream replaces alone
/// when only that cluster changed.
pub fn row_id(key: &ClusterKey) -> String {
    format!("row:{key}")
}

/// One row as HTML, rendered on its own so it can be cached and sent alone.
pub fn row_html(row: &Row, now: Timestamp) -> String {
    Owner::new().with(|| row_view(row, now).to_html())
}

fn row_view(row: &Row, now: Timestamp) -> impl IntoView + use<> {
    let cluster = &row.cluster;
    let status = cluster.status.clone().unwrap_or_default();
    let observation = row.observation.as_deref();
    let desired_replicas = cluster.spec.masters * cluster.spec.replicas_per_master;
    let age = cluster.metadata.creation_timestamp.as_ref().map(|t| format::age(t.0, now)).unwrap_or_default();
    let ops = observation.map(|o| o.ops_per_sec().to_string()).unwrap_or_else(|| "—".into());
    let slots_class = if status.slots_assigned == i32::from(SLOTS) { "" } else { "short" };
    view! {
        <tr id=row_id(&row.key) data-cluster=row.key.to_string()>
            <th scope="row"><a href=paths::cluster(&row.key)>{row.key.name.clone()}</a></th>
            <td>{row.key.namespace.clone()}</td>
            <td>{phase::badge(cluster)}</td>
            <td>{format!("{} / {}", status.ready_masters, cluster.spec.masters)}</td>
            <td>{format!("{} / {}", status.ready_replicas, desired_replicas)}</td>
            <td>{version(cluster, observation)}</td>
            <td class=slots_class>{format!("{} / {SLOTS}", status.slots_assigned)}</td>
            <td>{memory(observation)}</td>
            <td>{ops}</td>
            <td>{age}</td>
        </tr>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_round_trip_as_queries() {
        assert_eq!(Filter::default().query(), "");
        let filter = Filter { namespace: "apps".into(), phase: "Running".into() };
        assert_eq!(filter.query(), "namespace=apps&phase=Running");
    }

    #[test]
    fn an_empty_list_says_why() {
        let clusters =
            Clusters { rows: vec![], namespaces: vec![], filter: Filter::default(), now: Timestamp::UNIX_EPOCH };
        let html = Owner::new().with(|| table(&clusters, &[]).to_html());
        assert!(html.contains("No RedisCluster you may list"), "{html}");
        let clusters = Clusters { namespaces: vec!["apps".into()], ..clusters };
        assert!(Owner::new().with(|| table(&clusters, &[]).to_html()).contains("matches the filter"));
    }
}
