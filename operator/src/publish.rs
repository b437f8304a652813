//! From what the operator observed to what the read model shows: each Pod's
//! node as it reported itself, roles resolved to Pods, replication lag from
//! offsets taken in the same round trip. Pure; reconciles and the standby's
//! sampler both publish through it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use slotkeeper_api::topology::Direction;
use slotkeeper_readmodel::{NodeView, Observation, Role, Source};

use crate::plan::{PodFact, RedisFact};

pub fn observation(
    pods: &[PodFact],
    redis: &BTreeMap<String, RedisFact>,
    step: Option<String>,
    source: Source,
    at: Timestamp,
) -> Observation {
    let pod_of_id: BTreeMap<&str, &str> =
        redis.iter().filter_map(|(pod, fact)| Some((fact.myself()?.id.as_str(), pod.as_str()))).collect();
    // A node is failing when anyone who answered marks it so.
    let failing: BTreeSet<&str> = redis
        .values()
        .flat_map(|f| f.nodes.iter())
        .filter(|n| !n.myself && n.failing())
        .map(|n| n.id.as_str())
        .collect();
    let nodes = pods
        .iter()
        .map(|pod| {
            let fact = redis.get(&pod.name);
            let me = fact.and_then(|f| f.myself());
            let master_pod = me.and_then(|n| n.master_id.as_deref()).and_then(|id| pod_of_id.get(id).copied());
            let lag_bytes = match (fact, master_pod.and_then(|m| redis.get(m))) {
                (Some(replica), Some(master)) if me.is_some_and(|n| !n.master) => {
                    let (m, r) = (master.replication_offset.unwrap_or(0), replica.replication_offset.unwrap_or(0));
                    Some(m.saturating_sub(r).max(0) as u64)
                }
                _ => None,
            };
            let open = |direction| -> Vec<u16> {
                me.map(|n| n.open_slots.iter().filter(|o| o.direction == direction).map(|o| o.slot).collect())
                    .unwrap_or_default()
            };
            NodeView {
                pod: pod.name.clone(),
                shard: pod.shard,
                ordinal: pod.ordinal,
                node: pod.node_name.clone(),
                domain: pod.domain.clone(),
                ip: pod.ip.clone(),
                reachable: fact.is_some(),
                id: me.map(|n| n.id.clone()),
                role: me.map(|n| if n.master { Role::Master } else { Role::Replica }),
                master_pod: master_pod.map(str::to_owned),
                slots: me.map(|n| n.slots.clone()).unwrap_or_default(),
                importing: open(Direction::Importing),
                migrating: open(Direction::Migrating),
                link_up: fact.is_some_and(|f| f.link_up),
                lag_bytes,
                failing: me.is_some_and(|n| failing.contains(n.id.as_str())),
                version: fact.map(|f| format!("{} {}", f.engine, f.version)),
                memory: fact.map(|f| f.memory).unwrap_or_default(),
                stats: fact.map(|f| f.stats).unwrap_or_default(),
            }
        })
        .collect();
    Observation { at, nodes, step, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Observed, sim};

    fn converged(shards: usize, replicas: usize) -> Observed {
        let mut o = sim::fresh(shards, replicas);
        sim::converge(&mut o);
        o
    }

    #[test]
    fn roles_masters_and_lag_come_from_the_same_observation() {
        let mut o = converged(3, 1);
        let master = "c-shard-0-0";
        let replica = "c-shard-0-1";
        o.redis.get_mut(master).unwrap().replication_offset = Some(5000);
        o.redis.get_mut(replica).unwrap().replication_offset = Some(4200);
        o.redis.get_mut(replica).unwrap().link_up = true;
        let published = observation(&o.pods, &o.redis, None, Source::Reconcile, Timestamp::UNIX_EPOCH);
        assert_eq!(published.nodes.len(), 6);
        let view = |pod: &str| published.nodes.iter().find(|n| n.pod == pod).unwrap();
        assert_eq!(view(master).role, Some(Role::Master));
        assert!(!view(master).slots.is_empty() && view(master).lag_bytes.is_none());
        assert_eq!(view(replica).role, Some(Role::Replica));
        assert_eq!(view(replica).master_pod.as_deref(), Some(master));
        assert_eq!(view(replica).lag_bytes, Some(800));
        assert!(view(replica).healthy());
    }

    #[test]
    fn an_unanswering_pod_is_shown_unreachable_and_marked_failing_by_its_peers() {
        let mut o = converged(3, 0);
        let gone = "c-shard-1-0";
        let id = o.redis[gone].myself().unwrap().id.clone();
        o.redis.remove(gone);
        for fact in o.redis.values_mut() {
            for node in fact.nodes.iter_mut().filter(|n| n.id == id) {
                node.flags.push("fail".into());
            }
        }
        let published = observation(&o.pods, &o.redis, Some("Wait: …".into()), Source::Sampler, Timestamp::UNIX_EPOCH);
        let view = published.nodes.iter().find(|n| n.pod == gone).unwrap();
        assert!(!view.reachable && view.role.is_none() && !view.healthy());
        assert_eq!(published.step.as_deref(), Some("Wait: …"));
    }
}
