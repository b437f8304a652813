//! The topology: each shard with its master and replicas, drawn as SVG on
//! the server and listed as a table (the table is what a screen reader and
//! a `curl` read), coloured by health and labelled in words.

use std::collections::BTreeMap;

use leptos::prelude::*;
use slotkeeper_api::RedisCluster;
use slotkeeper_api::lag::ReplicationLag;
use slotkeeper_api::topology::{SlotRange, count};
use slotkeeper_readmodel::{NodeView, Observation, Role};

use super::format;

/// Nodes to draw: the last observation, or what status says when nothing
/// was observed yet (a replica that just started).
pub fn nodes(cluster: &RedisCluster, observation: Option<&Observation>) -> Vec<NodeView> {
    if let Some(observation) = observation {
        return observation.nodes.clone();
    }
    let Some(status) = cluster.status.as_ref() else { return Vec::new() };
    let pod_of_id: BTreeMap<&str, &str> =
        status.nodes.iter().filter_map(|n| Some((n.node_id.as_deref()?, n.pod.as_str()))).collect();
    status
        .nodes
        .iter()
        .map(|n| {
            let (shard, ordinal) = shard_and_ordinal(&n.pod).unwrap_or((0, 0));
            NodeView {
                pod: n.pod.clone(),
                shard,
                ordinal,
                node: n.node.clone(),
                domain: n.domain.clone(),
                ip: n.ip.clone(),
                reachable: n.role.is_some(),
                id: n.node_id.clone(),
                role: n.role.as_deref().map(|r| if r == "master" { Role::Master } else { Role::Replica }),
                master_pod: n.master_id.as_deref().and_then(|id| pod_of_id.get(id)).map(|p| (*p).to_owned()),
                slots: n.slots.iter().filter_map(|r| parse_range(r)).collect(),
                version: n.version.clone(),
                // Status carries a replica's lag as a bucket; one without counts as linked.
                link_up: n.master_id.is_some() && n.replication_lag != Some(ReplicationLag::LinkDown),
                ..Default::default()
            }
        })
        .collect()
}

fn shard_and_ordinal(pod: &str) -> Option<(usize, usize)> {
    let (rest, ordinal) = pod.rsplit_once('-')?;
    let (_, shard) = rest.rsplit_once('-')?;
    Some((shard.parse().ok()?, ordinal.parse().ok()?))
}

/// `0-5460` or `7`, as status writes slot ranges.
pub fn parse_range(text: &str) -> Option<SlotRange> {
    let (start, end) = text.split_once('-').unwrap_or((text, text));
    Some(SlotRange { start: start.parse().ok()?, end: end.parse().ok()? })
}

/// Each shard's nodes, master first.
pub fn shards(nodes: &[NodeView]) -> BTreeMap<usize, Vec<&NodeView>> {
    let mut shards: BTreeMap<usize, Vec<&NodeView>> = BTreeMap::new();
    for node in nodes {
        shards.entry(node.shard).or_default().push(node);
    }
    for members in shards.values_mut() {
        members.sort_by_key(|n| (n.role() != Role::Master, n.ordinal));
    }
    shards
}

pub fn health_class(node: &NodeView) -> &'static str {
    if !node.reachable || node.failing {
        "bad"
    } else if node.healthy() {
        "good"
    } else {
        "warn"
    }
}

fn health_words(node: &NodeView) -> String {
    if !node.reachable {
        return "not answering".into();
    }
    if node.failing {
        return "marked failing by its peers".into();
    }
    match node.role() {
        Role::Master => "serving".into(),
        Role::Replica if node.link_up => "in sync".into(),
        Role::Replica => "link to master down".into(),
        Role::Unknown => "no cluster view yet".into(),
    }
}

fn link_words(node: &NodeView) -> String {
    match node.role() {
        Role::Replica => match (node.link_up, node.lag_bytes) {
            (true, Some(lag)) => format!("up, {} behind", format::bytes(lag)),
            (true, None) => "up".into(),
            (false, _) => "down".into(),
        },
        Role::Master => format!("{} slots", count(&node.slots)),
        Role::Unknown => "—".into(),
    }
}

const COLUMN: i32 = 250;
const NODE_HEIGHT: i32 = 96;
const PER_ROW: usize = 4;

/// The SVG picture and the table of nodes.
pub fn topology(nodes: &[NodeView]) -> AnyView {
    if nodes.is_empty() {
        return view! { <p class="empty">"No Redis node has been observed yet."</p> }.into_any();
    }
    let shards = shards(nodes);
    let tallest = shards.values().map(Vec::len).max().unwrap_or(1) as i32;
    let row_height = 34 + tallest * (NODE_HEIGHT + 8);
    let rows = shards.len().div_ceil(PER_ROW) as i32;
    let columns = shards.len().min(PER_ROW) as i32;
    let (width, height) = (columns * COLUMN + 10, rows * row_height + 10);
    let groups = shards
        .iter()
        .enumerate()
        .map(|(i, (shard, members))| {
            let x = 10 + (i % PER_ROW) as i32 * COLUMN;
            let y = 10 + (i / PER_ROW) as i32 * row_height;
            shard_group(*shard, members, x, y)
        })
        .collect_view();
    let label = format!("Topology: {} shards, {} nodes", shards.len(), nodes.len());
    let rows = shards.values().flatten().map(|n| node_row(n)).collect_view();
    view! {
        <svg class="topology" viewBox=format!("0 0 {width} {height}") width=width height=height role="img" aria-label=label>
            {groups}
        </svg>
        {failure_domains(nodes)}
        <table class="nodes">
            <caption>"Redis nodes"</caption>
            <thead><tr>
                <th scope="col">"Pod"</th><th scope="col">"Shard"</th><th scope="col">"Role"</th>
                <th scope="col">"Health"</th><th scope="col">"Node"</th><th scope="col">"IP"</th>
                <th scope="col">"Link / slots"</th><th scope="col">"Version"</th><th scope="col">"Memory"</th>
                <th scope="col">"Ops/s"</th>
            </tr></thead>
            <tbody>{rows}</tbody>
        </table>
    }
    .into_any()
}

/// The nodes grouped by failure domain: where a domain holds a majority
/// of the masters, losing it stops writes until Pods are recreated, so the
/// row says so.
fn failure_domains(nodes: &[NodeView]) -> impl IntoView + use<> {
    let mut domains: BTreeMap<String, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for node in nodes {
        let domain = node.domain.clone().unwrap_or_else(|| "unknown".into());
        let entry = domains.entry(domain).or_default();
        match node.role() {
            Role::Master => entry.0.push(node.pod.clone()),
            _ => entry.1.push(node.pod.clone()),
        }
    }
    let masters: usize = domains.values().map(|d| d.0.len()).sum();
    let rows = domains
        .into_iter()
        .map(|(domain, (held, replicas))| {
            let at_risk = masters >= 3 && held.len() * 2 > masters;
            let note = if at_risk { "holds a majority of masters: losing it stops writes" } else { "" };
            let class = if at_risk { "bad" } else { "good" };
            let held = if held.is_empty() { "0".into() } else { format!("{} ({})", held.len(), held.join(", ")) };
            let name = domain.clone();
            view! {
                <tr class=class data-domain=domain>
                    <th scope="row">{name}</th>
                    <td>{held}</td>
                    <td>{replicas.join(", ")}</td>
                    <td>{note}</td>
                </tr>
            }
        })
        .collect_view();
    view! {
        <table class="domains">
            <caption>"Failure domains"</caption>
            <thead><tr>
                <th scope="col">"Domain"</th><th scope="col">"Masters"</th>
                <th scope="col">"Replicas"</th><th scope="col">"Risk"</th>
            </tr></thead>
            <tbody>{rows}</tbody>
        </table>
    }
}

fn shard_group(shard: usize, members: &[&NodeView], x: i32, y: i32) -> impl IntoView + use<> {
    let boxes = members
        .iter()
        .enumerate()
        .map(|(i, node)| node_box(node, x, y + 28 + i as i32 * (NODE_HEIGHT + 8)))
        .collect_view();
    view! {
        <g class="shard">
            <text x=x y=y + 16 class="shard-title">{format!("shard {shard}")}</text>
            {boxes}
        </g>
    }
}

fn node_box(node: &NodeView, x: i32, y: i32) -> impl IntoView + use<> {
    let class = format!("node {} {}", health_class(node), node.role().as_str());
    let role = match node.role() {
        Role::Master => "MASTER".to_owned(),
        Role::Replica => format!("replica of {}", node.master_pod.as_deref().unwrap_or("?")),
        Role::Unknown => "unknown role".to_owned(),
    };
    let lines = [
        node.pod.clone(),
        role,
        format!("{} · {}", node.node.as_deref().unwrap_or("no Node"), node.ip.as_deref().unwrap_or("no IP")),
        format!("{} · {}", health_words(node), link_words(node)),
        node.version.clone().unwrap_or_else(|| "version unknown".into()),
    ];
    let title = lines.join("\n");
    let texts = lines
        .into_iter()
        .enumerate()
        .map(|(i, line)| {
            let class = if i == 0 { "pod" } else { "fact" };
            view! { <text x=x + 10 y=y + 18 + i as i32 * 16 class=class>{line}</text> }
        })
        .collect_view();
    view! {
        <g class=class>
            <title>{title}</title>
            <rect x=x y=y width=COLUMN - 12 height=NODE_HEIGHT rx=6></rect>
            {texts}
        </g>
    }
}

fn node_row(node: &NodeView) -> impl IntoView + use<> {
    let memory = if node.reachable { format::memory(node.memory.used, node.memory.maxmemory) } else { "—".into() };
    let role = match node.role() {
        Role::Replica => format!("replica of {}", node.master_pod.as_deref().unwrap_or("?")),
        other => other.as_str().to_owned(),
    };
    view! {
        <tr class=health_class(node) data-pod=node.pod.clone() data-role=node.role().as_str()>
            <th scope="row">{node.pod.clone()}</th>
            <td>{node.shard}</td>
            <td>{role}</td>
            <td>{health_words(node)}</td>
            <td>{node.node.clone().unwrap_or_else(|| "—".into())}</td>
            <td>{node.ip.clone().unwrap_or_else(|| "—".into())}</td>
            <td>{link_words(node)}</td>
            <td>{node.version.clone().unwrap_or_else(|| "—".into())}</td>
            <td>{memory}</td>
            <td>{if node.reachable { node.stats.ops_per_sec.to_string() } else { "—".into() }}</td>
        </tr>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(pod: &str, shard: usize, ordinal: usize, role: Role) -> NodeView {
        NodeView {
            pod: pod.into(),
            shard,
            ordinal,
            node: Some("node-1".into()),
            ip: Some("127.1.0.1".into()),
            reachable: true,
            role: Some(role),
            master_pod: (role == Role::Replica).then(|| format!("c-shard-{shard}-0")),
            link_up: true,
            lag_bytes: (role == Role::Replica).then_some(2048),
            slots: if role == Role::Master { vec![SlotRange { start: 0, end: 99 }] } else { vec![] },
            version: Some("7.0.15".into()),
            ..Default::default()
        }
    }

    #[test]
    fn masters_come_first_and_every_node_is_drawn_and_listed() {
        let nodes = vec![
            node("c-shard-0-1", 0, 1, Role::Master),
            node("c-shard-0-0", 0, 0, Role::Replica),
            node("c-shard-1-0", 1, 0, Role::Master),
        ];
        let grouped = shards(&nodes);
        assert_eq!(grouped[&0][0].pod, "c-shard-0-1", "a promoted replica is drawn as the master");
        let html = Owner::new().with(|| topology(&nodes).to_html());
        assert_eq!(html.matches("<g class=\"node").count(), 3);
        assert_eq!(html.matches("data-role=\"master\"").count(), 2);
        assert!(html.contains("up, 2.0 KiB behind") && html.contains("100 slots"), "{html}");
        assert!(html.contains("node-1 · 127.1.0.1"));
    }

    #[test]
    fn nodes_are_grouped_by_failure_domain_and_a_majority_of_masters_is_flagged() {
        let mut nodes = vec![
            node("c-shard-0-0", 0, 0, Role::Master),
            node("c-shard-1-0", 1, 0, Role::Master),
            node("c-shard-2-0", 2, 0, Role::Master),
            node("c-shard-2-1", 2, 1, Role::Replica),
        ];
        for (node, domain) in nodes.iter_mut().zip(["node-1", "node-1", "node-2", "node-3"]) {
            node.domain = Some(domain.into());
        }
        let html = Owner::new().with(|| topology(&nodes).to_html());
        assert!(html.contains("Failure domains"), "{html}");
        assert!(html.contains(r#"<tr data-domain="node-1" class="bad">"#), "{html}");
        assert!(html.contains("2 (c-shard-0-0, c-shard-1-0)"), "{html}");
        assert!(html.contains(r#"<tr data-domain="node-3" class="good">"#), "{html}");
    }

    #[test]
    fn unreachable_nodes_are_red_and_say_so() {
        let mut gone = node("c-shard-1-0", 1, 0, Role::Master);
        gone.reachable = false;
        assert_eq!(health_class(&gone), "bad");
        assert_eq!(health_words(&gone), "not answering");
        let mut lagging = node("c-shard-1-1", 1, 1, Role::Replica);
        lagging.link_up = false;
        assert_eq!(health_class(&lagging), "warn");
    }

    #[test]
    fn status_ranges_parse() {
        assert_eq!(parse_range("0-5460"), Some(SlotRange { start: 0, end: 5460 }));
        assert_eq!(parse_range("7"), Some(SlotRange { start: 7, end: 7 }));
        assert_eq!(parse_range("x"), None);
    }
}
