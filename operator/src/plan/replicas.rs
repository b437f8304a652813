//! Steps about each shard's replicas: they follow their shard's master, and
//! a shard shrinking its replicas first hands the master role to a Pod that
//! stays.

use super::{Action, Planning, PodFact, owns_slots};

/// REPLICATE: each staying shard's other Pods follow its master (never while
/// a replica still follows an unreachable master: Redis must fail over
/// first). Leaving shards only drain: once a master gives its last slot
/// away Redis turns it (and its replicas) into replicas of the receiving master.
pub fn attach(p: &Planning) -> Option<Action> {
    let observed = p.observed;
    for (&shard, master) in p.masters.range(..observed.shards) {
        let Some(master) = master else {
            return Some(Action::Wait(format!(
                "shard {shard}: its replicas follow a master that is unreachable; waiting for Redis to fail over"
            )));
        };
        let master_id = observed.id_of(&master.name).expect("reachable").to_owned();
        for pod in p.reachable.iter().filter(|pod| pod.shard == shard && pod.name != master.name) {
            let fact = &observed.redis[&pod.name];
            let me = fact.myself().expect("reachable");
            if me.master_id.as_deref() == Some(master_id.as_str()) {
                continue;
            }
            if owns_slots(me) {
                return Some(Action::Wait(format!("shard {shard}: {} and {} both own slots", pod.name, master.name)));
            }
            // REPLICATE needs only the master to be known, not the whole cluster.
            if !fact.known_ids().contains(master_id.as_str()) {
                return Some(Action::Wait(format!(
                    "cluster handshake in progress: {} does not know its master yet",
                    pod.name
                )));
            }
            return Some(Action::Replicate { pod: pod.name.clone(), master_pod: master.name.clone(), master_id });
        }
    }
    None
}

/// A shard shrinking its replicas keeps its highest ordinals until its
/// master is on a Pod that stays: promote a caught-up replica that stays.
pub fn fail_over_off_removed_ordinals(p: &Planning) -> Option<Action> {
    let observed = p.observed;
    for (&shard, master) in &p.masters {
        let wanted = observed.replicas_per_master + 1 + usize::from(observed.surge == Some(shard));
        let master: &PodFact = (*master)?;
        if shard >= observed.shards || master.ordinal < wanted {
            continue;
        }
        let master_id = observed.id_of(&master.name)?;
        let candidate = observed.pods.iter().filter(|pod| pod.shard == shard && pod.ordinal < wanted).find(|pod| {
            observed.redis.get(&pod.name).is_some_and(|f| {
                f.promotable() && f.myself().is_some_and(|n| n.master_id.as_deref() == Some(master_id))
            })
        });
        return Some(match candidate {
            Some(pod) => Action::Failover {
                force: false,
                operation: None,
                spread: false,
                pod: pod.name.clone(),
                shard,
                reason: format!("{} is removed by replicasPerMaster {}", master.name, observed.replicas_per_master),
            },
            None => Action::Wait(format!("shard {shard}: waiting for a replica that stays to catch up")),
        });
    }
    None
}
