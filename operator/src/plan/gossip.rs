//! Steps that wait for Redis's own view to settle: gossip reaching every
//! node, departed nodes forgotten, every slot assigned, no member failing
//! and every node reporting `cluster_state:ok`.

use std::collections::{BTreeMap, BTreeSet};

use super::{Action, Planning};
use crate::redis::topology::SLOTS;

/// Every member knows every other member.
pub fn wait_for_gossip(p: &Planning) -> Option<Action> {
    let still =
        p.reachable.iter().filter(|pod| !p.member_ids.is_subset(&p.observed.redis[&pod.name].known_ids())).count();
    (still > 0).then(|| Action::Wait(format!("cluster handshake in progress on {still} nodes")))
}

/// Ids that reachable nodes still list but no member has any more: failed,
/// owning no slots, and not the master the listing node follows. Only when
/// every Pod that exists answered, so a Pod on its way back is not forgotten.
pub fn forget_departed(p: &Planning) -> Option<Action> {
    let observed = p.observed;
    if observed.pods.iter().any(|pod| !observed.redis.contains_key(&pod.name)) {
        return None;
    }
    let mut ids_by_pod = BTreeMap::new();
    for pod in &p.reachable {
        let fact = &observed.redis[&pod.name];
        let me = fact.myself()?;
        let gone: Vec<String> = fact
            .nodes
            .iter()
            .filter(|n| !p.live_ids.contains(n.id.as_str()) && !n.in_handshake())
            .filter(|n| n.flags.iter().any(|f| f == "fail" || f == "noaddr") && n.slots.is_empty())
            .filter(|n| me.master_id.as_deref() != Some(n.id.as_str()))
            .map(|n| n.id.clone())
            .collect();
        if !gone.is_empty() {
            ids_by_pod.insert(pod.name.clone(), gone);
        }
    }
    (!ids_by_pod.is_empty()).then_some(Action::Forget { ids_by_pod })
}

/// Departed nodes the cluster has not marked failed yet cannot be forgotten.
pub fn wait_for_departed(p: &Planning) -> Option<Action> {
    let departed: BTreeSet<&str> = p
        .observed
        .redis
        .values()
        .flat_map(|f| f.nodes.iter())
        .filter(|n| !p.live_ids.contains(n.id.as_str()) && !n.in_handshake())
        .map(|n| n.id.as_str())
        .collect();
    (!departed.is_empty())
        .then(|| Action::Wait(format!("{} departed node(s) not yet marked failed by the cluster", departed.len())))
}

/// All slots assigned, nobody failing, `cluster_state:ok` everywhere. A node
/// that still marks a member failing has not heard from it yet: its
/// `cluster_state` may say ok while it is cut off from its peers.
pub fn wait_for_health(p: &Planning) -> Option<Action> {
    let observed = p.observed;
    if p.owned_count < SLOTS as usize {
        return Some(Action::Wait(format!("{} of {SLOTS} slots assigned", p.owned_count)));
    }
    for pod in &p.reachable {
        let fact = &observed.redis[&pod.name];
        if let Some(n) = fact.nodes.iter().find(|n| p.member_ids.contains(n.id.as_str()) && !n.myself && n.failing()) {
            return Some(Action::Wait(format!("{} still sees node {} as failing", pod.name, n.id)));
        }
    }
    let not_ok = p.reachable.iter().find(|pod| observed.redis[&pod.name].cluster_state != "ok")?;
    Some(Action::Wait(format!("{} reports cluster_state {}", not_ok.name, observed.redis[&not_ok.name].cluster_state)))
}
