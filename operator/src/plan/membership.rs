//! Steps about who is in the cluster: a Pod stranded on a lost Node is
//! replaced, every member must answer, and every node must know every member
//! at its current address (MEET).

use super::{Action, Planning};

/// A Pod on a lost Node never answers again, and its StatefulSet waits for
/// the Pod object to go before it makes a new one: remove it.
pub fn replace_stranded_pod(p: &Planning) -> Option<Action> {
    let stranded = p.observed.pods.iter().find(|pod| pod.node_lost && !p.observed.redis.contains_key(&pod.name))?;
    let node = stranded.node_name.as_deref().unwrap_or("?");
    Some(Action::DeletePod {
        pod: stranded.name.clone(),
        reason: format!("its Node {node} is not Ready and it does not answer"),
    })
}

/// Nothing is planned until every expected member answers.
pub fn wait_for_members(p: &Planning) -> Option<Action> {
    let present = p.members.len().min(p.expected);
    (present < p.expected || p.reachable.len() < p.expected)
        .then(|| Action::Wait(format!("{} of {} Redis nodes reachable", p.reachable.len(), p.expected)))
}

/// MEET every node the seed (the node that already knows most of the
/// cluster; owning slots wins ties) does not know, or knows at an old
/// address (all Pods recreated with new IPs re-form this way).
pub fn meet_strangers(p: &Planning) -> Option<Action> {
    let observed = p.observed;
    let seed = p.reachable.iter().max_by_key(|pod| {
        let fact = &observed.redis[&pod.name];
        let owns = fact.myself().is_some_and(|n| !n.slots.is_empty());
        (fact.known_ids().len(), owns, std::cmp::Reverse(pod.name.clone()))
    })?;
    let seed_fact = &observed.redis[&seed.name];
    let strangers: Vec<String> = p
        .reachable
        .iter()
        .filter(|pod| pod.name != seed.name)
        .filter(|pod| {
            let Some(id) = observed.id_of(&pod.name) else { return false };
            // Unknown, or known at an address it no longer has (Pod recreated).
            seed_fact.nodes.iter().find(|n| n.id == id).is_none_or(|n| Some(&n.ip) != pod.ip.as_ref())
        })
        .filter_map(|pod| pod.ip.clone())
        .collect();
    (!strangers.is_empty()).then(|| Action::Meet { via: seed.name.clone(), targets: strangers })
}

/// Every node must reach every member at its current address: one that
/// still holds an old address (its peers were all recreated) and has no live
/// link to learn the new one from is told it directly.
pub fn meet_at_new_addresses(p: &Planning) -> Option<Action> {
    let observed = p.observed;
    p.reachable.iter().find_map(|pod| {
        let fact = &observed.redis[&pod.name];
        let stale: Vec<String> = p
            .reachable
            .iter()
            .filter(|other| other.name != pod.name)
            .filter_map(|other| {
                let (id, ip) = (observed.id_of(&other.name)?, other.ip.as_ref()?);
                fact.nodes.iter().find(|n| n.id == id).is_some_and(|n| &n.ip != ip).then(|| ip.clone())
            })
            .collect();
        (!stale.is_empty()).then(|| Action::Meet { via: pod.name.clone(), targets: stale })
    })
}
