//! Before a scale-in: which masters leave, how many slots go where, and
//! whether the data fits in the staying masters (the same check the planner
//! refuses by), then a confirmation.

use std::collections::{BTreeMap, BTreeSet};

use leptos::prelude::*;
use slotkeeper_api::balance;
use slotkeeper_api::capacity::{MemoryFact, SCALE_IN_FILL_LIMIT, ScaleInCheck, mib};
use slotkeeper_api::topology::{count, expand};
use slotkeeper_readmodel::{ClusterKey, NodeView};

use super::paths;
use crate::access::Permission;
use crate::actions::Scale;

/// Slots one master gives another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    pub from: String,
    pub to: String,
    pub slots: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Preview {
    pub key: ClusterKey,
    pub from: usize,
    pub to: usize,
    pub replicas: i32,
    /// Leaving masters and the slots each holds.
    pub leaving: Vec<(String, usize)>,
    pub flows: Vec<Flow>,
    /// `None` when no master's memory has been observed yet.
    pub check: Option<ScaleInCheck>,
}

/// What scaling the cluster's masters (`nodes`) in to `to` would do.
pub fn preview(key: &ClusterKey, nodes: &[NodeView], current: usize, to: usize, replicas: i32) -> Preview {
    let masters: BTreeMap<usize, &NodeView> = nodes.iter().filter(|n| n.is_master()).map(|n| (n.shard, n)).collect();
    let owned: BTreeMap<usize, BTreeSet<u16>> = masters.iter().map(|(shard, n)| (*shard, expand(&n.slots))).collect();
    let pod = |shard: usize| masters.get(&shard).map(|n| n.pod.clone()).unwrap_or_else(|| format!("shard {shard}"));
    let mut flows: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    for m in balance::moves(&owned, to) {
        *flows.entry((m.from, m.to)).or_default() += 1;
    }
    let leaving = masters.range(to..).map(|(_, n)| (n.pod.clone(), count(&n.slots))).collect();
    let observed = masters.values().any(|n| n.memory.maxmemory > 0 || n.memory.used > 0);
    let memory: Vec<MemoryFact> = masters.values().map(|n| n.memory).collect();
    let staying: Vec<MemoryFact> = masters.range(..to).map(|(_, n)| n.memory).collect();
    Preview {
        key: key.clone(),
        from: current,
        to,
        replicas,
        leaving,
        flows: flows.into_iter().map(|((from, to), slots)| Flow { from: pod(from), to: pod(to), slots }).collect(),
        check: observed.then(|| ScaleInCheck::new(&memory, &staying)),
    }
}

pub fn page(preview: &Preview, permission: &Permission) -> AnyView {
    let scale = ServerAction::<Scale>::new();
    let leaving = preview
        .leaving
        .iter()
        .map(|(pod, slots)| view! { <li>{format!("{pod}, which serves {slots} slots")}</li> })
        .collect_view();
    let flows = preview
        .flows
        .iter()
        .map(|f| view! { <tr><td>{f.from.clone()}</td><td>{f.to.clone()}</td><td>{f.slots}</td></tr> })
        .collect_view();
    let total: usize = preview.flows.iter().map(|f| f.slots).sum();
    let (verdict, fits) = match &preview.check {
        None => {
            ("Memory has not been observed yet; the operator checks it again before moving anything.".to_owned(), true)
        }
        Some(check) if check.fits() => (
            match check.room {
                Some(room) => format!(
                    "The data fits: {} of data, {} free within {:.0}% of the staying masters' maxmemory.",
                    mib(check.dataset),
                    mib(room),
                    SCALE_IN_FILL_LIMIT * 100.0
                ),
                None => format!(
                    "The data fits: {} of data, and a staying master has no maxmemory limit.",
                    mib(check.dataset)
                ),
            },
            true,
        ),
        Some(check) => (check.refusal(preview.from, preview.to).unwrap_or_default(), false),
    };
    let blocked = !fits || !permission.allowed;
    let why = if !permission.allowed {
        Some(format!("Disabled: {}.", permission.why_not))
    } else if !fits {
        Some("Disabled: the operator would refuse this scale-in; nothing would move.".to_owned())
    } else {
        None
    };
    let (namespace, name, to, replicas) =
        (preview.key.namespace.clone(), preview.key.name.clone(), preview.to, preview.replicas);
    let cancel = paths::cluster(&preview.key);
    view! {
        <nav class="crumbs" aria-label="Breadcrumb"><a href="/">"Clusters"</a>" / "<a href=paths::cluster(&preview.key)>{preview.key.to_string()}</a></nav>
        <h1>{format!("Scale {} in from {} to {} masters?", preview.key, preview.from, preview.to)}</h1>
        <section aria-labelledby="leaving-title">
            <h2 id="leaving-title">"Masters that leave"</h2>
            <ul class="leaving">{leaving}</ul>
        </section>
        <section aria-labelledby="moves-title">
            <h2 id="moves-title">{format!("Slots that move: {total}")}</h2>
            <table class="moves">
                <thead><tr><th scope="col">"From"</th><th scope="col">"To"</th><th scope="col">"Slots"</th></tr></thead>
                <tbody>{flows}</tbody>
            </table>
        </section>
        <section aria-labelledby="memory-title">
            <h2 id="memory-title">"Memory check"</h2>
            <p class=if fits { "verdict good" } else { "verdict bad" } id="memory-verdict">
                <span aria-hidden="true">{if fits { "✔ " } else { "✖ " }}</span>{verdict}
            </p>
        </section>
        <ActionForm action=scale>
            <input type="hidden" name="namespace" value=namespace/>
            <input type="hidden" name="name" value=name/>
            <input type="hidden" name="masters" value=to/>
            <input type="hidden" name="replicas" value=replicas/>
            <input type="hidden" name="confirmed" value="yes"/>
            <button type="submit" id="confirm-scale-in" disabled=blocked aria-describedby="confirm-why">{format!("Scale in to {to} masters")}</button>
            " "
            <a href=cancel>"Cancel"</a>
        </ActionForm>
        {why.map(|w| view! { <p class="why-not" id="confirm-why">{w}</p> })}
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotkeeper_api::topology::shard_range;
    use slotkeeper_readmodel::Role;

    fn masters(shards: usize, used_mib: u64, max_mib: u64) -> Vec<NodeView> {
        (0..shards)
            .map(|shard| NodeView {
                pod: format!("c-shard-{shard}-0"),
                shard,
                reachable: true,
                role: Some(Role::Master),
                slots: vec![shard_range(shard, shards)],
                memory: MemoryFact { used: used_mib << 20, dataset: (used_mib - 1) << 20, maxmemory: max_mib << 20 },
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn scale_in_shows_every_leaving_slot_going_to_a_staying_master() {
        let key = ClusterKey::new("apps", "c");
        let preview = preview(&key, &masters(4, 5, 100), 4, 3, 1);
        assert_eq!(preview.leaving, vec![("c-shard-3-0".to_owned(), 4096)]);
        assert_eq!(preview.flows.iter().map(|f| f.slots).sum::<usize>(), 4096);
        assert!(preview.flows.iter().all(|f| f.from == "c-shard-3-0"));
        assert!(preview.check.unwrap().fits());
        let html = Owner::new().with(|| page(&preview, &Permission::allowed()).to_html());
        assert!(html.contains("Slots that move: 4096") && html.contains("The data fits"), "{html}");
        assert!(html.contains("name=\"confirmed\" value=\"yes\""));
    }

    #[test]
    fn data_that_does_not_fit_blocks_the_confirmation_and_says_why() {
        let key = ClusterKey::new("apps", "c");
        let preview = preview(&key, &masters(4, 8, 10), 4, 3, 1);
        assert!(!preview.check.unwrap().fits());
        let html = Owner::new().with(|| page(&preview, &Permission::allowed()).to_html());
        assert!(html.contains("refused") && html.contains("the operator would refuse"), "{html}");
        assert!(html.contains("id=\"confirm-scale-in\" disabled"), "{html}");
    }
}
