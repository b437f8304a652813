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
    let replica = observed.redis.get(&intent.to)?;
    let failover = |force: bool| Action::Failover {
        pod: intent.to.clone(),
        shard: intent.shard,
        reason: format!("RedisOperation {}", intent.operation),
        force,
        operation: Some(intent.operation.clone()),
    };
    let Some(master) = observed.redis.get(&intent.from) else {
        // The master is gone: only FORCE can promote, and Redis would fail
        // over by itself soon anyway.
        return Some(failover(true));
    };
    if !replica.link_up {
        return Some(Action::Wait(format!("{}: its link to the master is down", intent.to)));
    }
    let lag = master.replication_offset.unwrap_or(0) - replica.replication_offset.unwrap_or(0);
    if lag > MAX_LAG_BYTES {
        return Some(Action::Wait(format!("{} is {lag} bytes behind {}", intent.to, intent.from)));
    }
    Some(failover(false))
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
    fn a_replica_behind_waits_and_a_gone_master_forces() {
        let mut o = healthy();
        o.redis.get_mut("c-shard-0-0").unwrap().replication_offset = Some(MAX_LAG_BYTES * 3);
        assert!(matches!(failover_step(&o, &intent(false)), Some(Action::Wait(w)) if w.contains("bytes behind")));
        o.redis.remove("c-shard-0-0");
        assert!(matches!(failover_step(&o, &intent(false)), Some(Action::Failover { force: true, .. })));
    }
}
