//! Masters apart. Redis Cluster promotes a replica only with the votes of a
//! majority of masters, so where the masters sit decides whether losing one
//! failure domain (a Node, a zone) costs seconds or an outage. Scheduling
//! keeps a shard's Pods apart; roles change at runtime (failovers,
//! recreated Pods), so the planner picks which Pod of a fresh shard becomes
//! master and later moves master roles back apart with a coordinated
//! `CLUSTER FAILOVER`, one shard at a time, only on a healthy cluster.

use std::collections::BTreeMap;

use super::intents::caught_up;
use super::{Action, Observed, Planning, PodFact, owns_slots};

/// The masters and replicas one failure domain holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainCensus {
    pub masters: Vec<String>,
    pub replicas: Vec<String>,
}

/// Per failure domain, the Pods serving as masters (owning slots) and as
/// replicas, as the nodes report themselves. Pods whose domain is unknown
/// (the Node lacks the label) are left out.
pub fn census(observed: &Observed) -> BTreeMap<String, DomainCensus> {
    let mut domains: BTreeMap<String, DomainCensus> = BTreeMap::new();
    for pod in &observed.pods {
        let Some(domain) = &pod.domain else { continue };
        let entry = domains.entry(domain.clone()).or_default();
        match observed.redis.get(&pod.name).and_then(|f| f.myself()) {
            Some(me) if owns_slots(me) => entry.masters.push(pod.name.clone()),
            Some(me) if me.master_id.is_some() => entry.replicas.push(pod.name.clone()),
            _ => {}
        }
    }
    domains
}

/// Masters per domain of the given shard masters, with every domain that
/// holds a member Pod present (at zero if it holds no master).
fn load<'a>(members: &[&'a PodFact], masters: impl Iterator<Item = &'a PodFact>) -> BTreeMap<&'a str, usize> {
    let mut load: BTreeMap<&str, usize> = members.iter().filter_map(|p| p.domain.as_deref()).map(|d| (d, 0)).collect();
    for master in masters {
        if let Some(domain) = master.domain.as_deref() {
            *load.entry(domain).or_default() += 1;
        }
    }
    load
}

/// The Pod of a fresh shard (no slots, nobody following anyone) to make its
/// master: the one in the domain holding the fewest masters so far, else
/// the lowest ordinal. `chosen` are the masters already known or picked.
pub fn choose_fresh_master<'a>(
    candidates: &[&'a PodFact],
    members: &[&'a PodFact],
    chosen: &[&'a PodFact],
) -> Option<&'a PodFact> {
    let load = load(members, chosen.iter().copied());
    let masters_in = |p: &PodFact| p.domain.as_deref().map_or(usize::MAX, |d| load.get(d).copied().unwrap_or(0));
    candidates.iter().copied().min_by_key(|p| (masters_in(p), p.ordinal))
}

/// A coordinated failover that spreads masters more evenly: from the domain
/// holding the most masters to a caught-up replica of one of its shards in
/// a domain holding at least two fewer (so the spread strictly improves and
/// never flaps). `None` when no such move exists, or when roles are held (a
/// rollout or a RedisOperation is moving them). A master a user placed with
/// a Failover operation stays; other shards move around it.
pub fn restore_spread(p: &Planning) -> Option<Action> {
    let observed = p.observed;
    if observed.roles_held {
        return None;
    }
    let masters: Vec<&PodFact> = p.masters.range(..observed.shards).filter_map(|(_, m)| *m).collect();
    let load = load(&p.members, masters.iter().copied());
    let mut moves: Vec<(usize, usize, &PodFact, &PodFact, &str, &str)> = Vec::new();
    for master in masters.iter().filter(|m| !observed.user_placed.contains(&m.name)) {
        let Some(from) = master.domain.as_deref() else { continue };
        for replica in p.reachable.iter().filter(|r| r.shard == master.shard && r.name != master.name) {
            let Some(to) = replica.domain.as_deref() else { continue };
            if load[to] + 2 <= load[from] {
                moves.push((load[from] - load[to], master.shard, master, replica, from, to));
            }
        }
    }
    // The largest improvement first; then the lowest shard, for a stable choice.
    moves.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.3.name.cmp(&b.3.name)));
    let ready = moves.iter().find(|m| caught_up(observed, &m.2.name, &m.3.name).is_ok());
    match (ready, moves.first()) {
        (Some(&(_, shard, master, replica, from, to)), _) => Some(Action::Failover {
            pod: replica.name.clone(),
            shard,
            force: false,
            operation: None,
            spread: true,
            reason: format!(
                "spreading masters over failure domains: {from} holds {} of {} masters, {to} holds {}; {} moves to {to}",
                load[from],
                masters.len(),
                load[to],
                master.name
            ),
        }),
        (None, Some(&(_, shard, master, replica, ..))) => {
            let why = caught_up(observed, &master.name, &replica.name).err().unwrap_or_default();
            Some(Action::Wait(format!("shard {shard}: spreading masters waits for {}: {why}", replica.name)))
        }
        (None, None) => None,
    }
}

/// Why losing one failure domain would stop writes beyond Redis's own
/// failover, or `None`: a domain holding a majority of the masters (the
/// rest cannot elect replicas), or a shard whose Pods all share a domain.
/// Only for clusters that can fail over at all (3 or more masters, each
/// with a replica); a domain is named only when known.
pub fn risk(observed: &Observed) -> Option<String> {
    if observed.shards < 3 || observed.replicas_per_master == 0 {
        return None;
    }
    let census = census(observed);
    let masters: usize = census.values().map(|d| d.masters.len()).sum();
    if let Some((domain, held)) = census.iter().max_by_key(|(_, d)| d.masters.len())
        && held.masters.len() * 2 > masters
    {
        let spread = if census.len() < 3 {
            format!("the cluster's Pods sit in {} domain(s); at least 3 are needed", census.len())
        } else {
            "no replica in another domain can take a master role over".to_owned()
        };
        return Some(format!(
            "failure domain {domain} holds {} of {masters} masters ({}): losing it leaves too few masters to elect replicas; {spread}",
            held.masters.len(),
            held.masters.join(", ")
        ));
    }
    for shard in 0..observed.shards {
        let domains: std::collections::BTreeSet<&str> =
            observed.pods.iter().filter(|p| p.shard == shard).filter_map(|p| p.domain.as_deref()).collect();
        let pods = observed.pods.iter().filter(|p| p.shard == shard).count();
        if pods > 1 && domains.len() == 1 {
            let domain = domains.first().expect("one");
            return Some(format!(
                "shard {shard}: all its Pods are in failure domain {domain}: losing it loses the shard's slots until its Pods return"
            ));
        }
    }
    None
}

/// Recreate one replica so the scheduler can put it in an emptier failure
/// domain: when the cluster's Pods are uneven over the open domains (one
/// holds two or more Pods more than another, as after a Node came back
/// from a stop), or a shard shares a domain while an open one holds none of
/// its Pods. Only replicas (a master role is moved first by the spread),
/// only Pods that have run a while (a minute: a scheduler that disagrees
/// gets at most one Pod a minute recreated; the Pods' anti-affinity to
/// their cluster's makes it agree), one at a time, on a healthy cluster.
pub fn move_crowded_replica(p: &Planning) -> Option<Action> {
    let observed = p.observed;
    let movable_before = observed.movable_before?;
    if observed.roles_held || observed.open_domains.is_empty() {
        return None;
    }
    let mut pods_in: BTreeMap<&str, usize> = observed.open_domains.iter().map(|d| (d.as_str(), 0)).collect();
    for pod in &p.members {
        if let Some(domain) = pod.domain.as_deref() {
            *pods_in.entry(domain).or_default() += 1;
        }
    }
    let (&emptiest, &fewest) =
        pods_in.iter().filter(|(d, _)| observed.open_domains.contains(**d)).min_by_key(|(_, n)| **n)?;
    let most = pods_in.values().copied().max().unwrap_or(0);
    let shard_in =
        |shard: usize, domain: &str| p.members.iter().any(|m| m.shard == shard && m.domain.as_deref() == Some(domain));
    let open_without_shard =
        |shard: usize| observed.open_domains.iter().find(|d| !shard_in(shard, d)).map(String::as_str);
    let masters: Vec<&str> = p.masters.values().flatten().map(|m| m.name.as_str()).collect();
    let mut candidates = p.reachable.iter().filter(|r| {
        r.shard < observed.shards
            && !masters.contains(&r.name.as_str())
            && r.created.is_some_and(|c| c < movable_before)
            && observed.redis[&r.name].myself().is_some_and(|n| n.master_id.is_some())
    });
    candidates.find_map(|replica| {
        let domain = replica.domain.as_deref()?;
        let shares = p
            .members
            .iter()
            .any(|m| m.shard == replica.shard && m.name != replica.name && m.domain.as_deref() == Some(domain));
        let reason = if pods_in[domain] >= fewest + 2 && most == pods_in[domain] && !shard_in(replica.shard, emptiest) {
            format!(
                "failure domain {domain} holds {} of the cluster's Pods and {emptiest} holds {fewest}",
                pods_in[domain]
            )
        } else if shares && let Some(free) = open_without_shard(replica.shard) {
            format!("shard {} has two Pods in failure domain {domain} while {free} holds none", replica.shard)
        } else {
            return None;
        };
        Some(Action::MovePod { pod: replica.name.clone(), shard: replica.shard, reason })
    })
}
