//! Intents beside the spec: a running `RedisOperation` asks for one shard's
//! master role to move. Its controller validates it and watches the outcome;
//! the cluster planner decides the command from what it observed, so every
//! Redis command still comes from one planner and one act layer.

use super::{Action, Observed};

/// A running failover: promote `to`, a replica of `from`.
#[derive(Debug, Clone, PartialEq)]
pub struct FailoverIntent {
    pub operation: String,
    pub shard: usize,
    pub from: String,
    pub to: String,
    /// The command was sent (the operation's status says so): wait for Redis.
    pub sent: bool,
}

const MAX_LAG_BYTES: i64 = slotkeeper_api::rollout::MAX_REPLICA_LAG_BYTES as i64;

/// The step for a running failover, or `None` when there is nothing to send
/// (done, or the replica is gone: the operation's controller says which).
pub fn failover_step(observed: &Observed, intent: &FailoverIntent) -> Option<Action> {
    let is_master =
        |pod: &str| observed.redis.get(pod).and_then(|f| f.myself()).is_some_and(|n| n.master && !n.slots.is_empty());
    if is_master(&intent.to) && !is_master(&intent.from) {
        return None;
    }
    if intent.sent {
        return Some(Action::Wait(format!(
            "RedisOperation {}: waiting for {} to take over",
            intent.operation, intent.to
        )));
    }
    observed.redis.get(&intent.to)?;
    let failover = |force: bool| Action::Failover {
        pod: intent.to.clone(),
        shard: intent.shard,
        reason: format!("RedisOperation {}", intent.operation),
        force,
        operation: Some(intent.operation.clone()),
        spread: false,
    };
    if !observed.redis.contains_key(&intent.from) {
        // The master is gone: only FORCE can promote, and Redis would fail
        // over by itself soon anyway.
        return Some(failover(true));
    }
    match caught_up(observed, &intent.from, &intent.to) {
        Ok(()) => Some(failover(false)),
        Err(why) => Some(Action::Wait(why)),
    }
}

/// Whether `replica` follows `master` with its link up and at most
/// [`MAX_LAG_BYTES`] behind, so a coordinated failover finishes quickly;
/// else why not.
pub fn caught_up(observed: &Observed, master: &str, replica: &str) -> Result<(), String> {
    let (Some(m), Some(r)) = (observed.redis.get(master), observed.redis.get(replica)) else {
        return Err(format!("{master} or {replica} does not answer"));
    };
    let master_id = m.myself().map(|n| n.id.as_str());
    if r.myself().and_then(|n| n.master_id.as_deref()) != master_id {
        return Err(format!("{replica} does not replicate {master}"));
    }
    if !r.link_up {
        return Err(format!("{replica}: its link to the master is down"));
    }
    if !r.promotable() {
        return Err(format!("{replica}: its append-only file is being rewritten after a sync (not yet on disk)"));
    }
    // The master ignores the replica's request to take over until its own
    // view has it as a replica (right after roles changed, gossip lags).
    let replica_id = r.myself().map(|n| n.id.as_str());
    if !m.nodes.iter().any(|n| Some(n.id.as_str()) == replica_id && n.master_id.as_deref() == master_id) {
        return Err(format!("{master} does not see {replica} as its replica yet"));
    }
    // The other masters vote, and deny a node they still see as a master
    // ("it is a master node"): right after a failover moved the role away
    // from `replica`, their view lags by a gossip round or two.
    if let Some(voter) = observed.redis.iter().find_map(|(pod, f)| {
        let me = f.myself()?;
        let voter = me.master && !me.slots.is_empty() && pod != master;
        let stale = f.nodes.iter().any(|n| Some(n.id.as_str()) == replica_id && n.master);
        (voter && stale).then_some(pod)
    }) {
        return Err(format!("{voter} still sees {replica} as a master; waiting for gossip before the election"));
    }
    let lag = m.replication_offset.unwrap_or(0) - r.replication_offset.unwrap_or(0);
    if lag > MAX_LAG_BYTES {
        return Err(format!("{replica} is {lag} bytes behind {master}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::sim::{converge, fresh};

    fn healthy() -> Observed {
        let mut o = fresh(3, 1);
        converge(&mut o);
        for (name, fact) in o.redis.iter_mut() {
            fact.replication_offset = Some(if name.ends_with("-0") { 9000 } else { 8900 });
            fact.link_up = !name.ends_with("-0");
        }
        o
    }

    fn intent(sent: bool) -> FailoverIntent {
        FailoverIntent {
            operation: "move-0".into(),
            shard: 0,
            from: "c-shard-0-0".into(),
            to: "c-shard-0-1".into(),
            sent,
        }
    }

    #[test]
    fn a_caught_up_replica_is_promoted_once() {
        let o = healthy();
        let Some(Action::Failover { pod, force, operation, .. }) = failover_step(&o, &intent(false)) else {
            panic!("a failover")
        };
        assert_eq!((pod.as_str(), force, operation.as_deref()), ("c-shard-0-1", false, Some("move-0")));
        assert!(matches!(failover_step(&o, &intent(true)), Some(Action::Wait(_))), "sent: never twice");
    }

    #[test]
    fn nothing_is_sent_before_the_master_sees_the_replica_as_its_own() {
        let mut o = healthy();
        let replica_id = o.redis["c-shard-0-1"].myself().unwrap().id.clone();
        let seen = o.redis.get_mut("c-shard-0-0").unwrap().nodes.iter_mut().find(|n| n.id == replica_id).unwrap();
        (seen.master, seen.master_id) = (true, None);
        assert!(matches!(failover_step(&o, &intent(false)), Some(Action::Wait(w)) if w.contains("does not see")));
    }

    #[test]
    fn nothing_is_sent_while_another_master_still_sees_the_replica_as_a_master() {
        // A spread failover just took the role from c-shard-0-1; c-shard-1-0
        // has not heard yet and would deny it its vote.
        let mut o = healthy();
        let replica_id = o.redis["c-shard-0-1"].myself().unwrap().id.clone();
        let seen = o.redis.get_mut("c-shard-1-0").unwrap().nodes.iter_mut().find(|n| n.id == replica_id).unwrap();
        (seen.master, seen.master_id) = (true, None);
        assert!(
            matches!(failover_step(&o, &intent(false)), Some(Action::Wait(w)) if w.contains("c-shard-1-0 still sees c-shard-0-1 as a master"))
        );
        // A replica's stale view does not matter: replicas do not vote.
        let mut o = healthy();
        let seen = o.redis.get_mut("c-shard-1-1").unwrap().nodes.iter_mut().find(|n| n.id == replica_id).unwrap();
        (seen.master, seen.master_id) = (true, None);
        assert!(matches!(failover_step(&o, &intent(false)), Some(Action::Failover { force: false, .. })));
    }

    #[test]
    fn a_replica_still_writing_its_data_to_disk_is_not_promoted() {
        let mut o = healthy();
        o.redis.get_mut("c-shard-0-1").unwrap().aof_rewriting = true;
        assert!(matches!(failover_step(&o, &intent(false)), Some(Action::Wait(w)) if w.contains("append-only")));
        o.redis.get_mut("c-shard-0-1").unwrap().aof_rewriting = false;
        assert!(matches!(failover_step(&o, &intent(false)), Some(Action::Failover { force: false, .. })));
    }

    #[test]
    fn a_replica_behind_waits_and_a_gone_master_forces() {
        let mut o = healthy();
        o.redis.get_mut("c-shard-0-0").unwrap().replication_offset = Some(MAX_LAG_BYTES * 3);
        assert!(matches!(failover_step(&o, &intent(false)), Some(Action::Wait(w)) if w.contains("bytes behind")));
        o.redis.remove("c-shard-0-0");
        assert!(matches!(failover_step(&o, &intent(false)), Some(Action::Failover { force: true, .. })));
    }
}
