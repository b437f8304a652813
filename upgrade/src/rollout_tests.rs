use super::*;
use crate::sim::{BAD_IMAGE, Sim, entry, node};
use slotkeeper_api::catalog::Engine;

fn r62() -> &'static CatalogEntry {
    entry(Engine::Redis, "6.2.14")
}
fn r70() -> &'static CatalogEntry {
    entry(Engine::Redis, "7.0.15")
}
fn v81() -> &'static CatalogEntry {
    entry(Engine::Valkey, "8.1.8")
}

#[test]
fn replicas_go_first_then_a_failover_then_the_old_master_canary_shard_first() {
    let mut sim = Sim::new(3, 1, r62(), r70());
    let mut acts = vec![];
    while !matches!(acts.last(), Some(Act::Done)) {
        let before = sim.view.clone();
        acts.push(sim.tick(0));
        sim.assert_every_shard_has_a_master();
        // While a Pod is away, another replica acknowledges writes (WAIT 1).
        if let Some(Act::Recreate { shard, pod, .. }) = acts.last() {
            let others = before.shard(*shard).filter(|n| &n.pod != pod && !n.master && n.link_up).count();
            assert!(others >= 1, "{pod} recreated while it was its shard's only linked replica");
        }
        assert!(acts.len() < 300, "did not finish");
    }
    let steps: Vec<String> = acts
        .iter()
        .filter_map(|a| match a {
            Act::Recreate { pod, .. } => Some(format!("recreate {pod}")),
            Act::Failover { pod, .. } => Some(format!("failover {pod}")),
            _ => None,
        })
        .collect();
    let expected: Vec<String> = (0..3)
        .flat_map(|s| {
            [format!("recreate c-shard-{s}-1"), format!("failover c-shard-{s}-1"), format!("recreate c-shard-{s}-0")]
        })
        .collect();
    assert_eq!(steps, expected);
    assert_eq!(sim.view.nodes.len(), 6, "the temporary replicas left");
    assert_eq!(sim.status.phase, RolloutPhase::Completed);
    assert_eq!(sim.status.shards_done, 3);
    assert!(sim.status.point_of_no_return_time.is_some());
    assert!(sim.status.canary_bake_until.is_some(), "the canary baked");
    assert!(sim.view.nodes.iter().all(|n| n.image.as_deref() == Some(r70().image)));
}

#[test]
fn the_other_shards_wait_for_the_canary_to_bake() {
    let mut sim = Sim::new(3, 1, r70(), v81());
    // Canary: recreate, failover (+1 tick to show), recreate; then the bake.
    let mut first_other = None;
    for tick in 0..60 {
        if let Act::Recreate { shard: 1, .. } = sim.tick(0) {
            first_other = Some(tick);
            break;
        }
    }
    let bake_until = sim.status.canary_bake_until.as_ref().expect("bake set").0;
    let first_other = first_other.expect("shard 1 started");
    assert!(sim.now >= bake_until, "shard 1 started at tick {first_other} before the bake ended");
}

#[test]
fn images_follow_the_shard_in_progress() {
    let mut sim = Sim::new(3, 1, r62(), r70());
    let decision = next(&sim.view, &sim.target, &sim.status, sim.now);
    assert_eq!(decision.images, vec![r70().image, r62().image, r62().image]);
    // The canary first borrows a temporary replica on the new version.
    assert_eq!(decision.surge, Some(0));
    assert!(matches!(&decision.act, Act::Wait(why) if why.contains("temporary replica")), "{:?}", decision.act);
    sim.tick(0);
    let decision = next(&sim.view, &sim.target, &sim.status, sim.now);
    assert!(sim.view.nodes.iter().any(|n| n.pod == "c-shard-0-2" && n.image.as_deref() == Some(r70().image)));
    assert!(matches!(decision.act, Act::Recreate { shard: 0, ref pod, .. } if pod == "c-shard-0-1"));
}

#[test]
fn nothing_is_decided_about_a_shard_while_one_of_its_pods_is_away() {
    let mut sim = Sim::new(3, 1, r62(), r70());
    sim.tick_until_recreated("c-shard-0-1");
    sim.view.nodes.retain(|n| n.pod != "c-shard-0-1"); // deleted, not back yet
    let decision = next(&sim.view, &sim.target, &sim.status, sim.now);
    assert!(
        matches!(&decision.act, Act::Wait(why) if why.contains("ordinal 1 is being recreated")),
        "{:?}",
        decision.act
    );
}

#[test]
fn a_replica_that_is_behind_is_not_promoted() {
    let mut sim = Sim::new(3, 1, r62(), r70());
    sim.tick_until_recreated("c-shard-0-1");
    let replica = sim.view.nodes.iter_mut().find(|n| n.pod == "c-shard-0-1").unwrap();
    replica.lag = Some(MAX_LAG_BYTES * 4);
    let decision = next(&sim.view, &sim.target, &sim.status, sim.now);
    assert!(matches!(&decision.act, Act::Wait(why) if why.contains("catching up")), "{:?}", decision.act);
}

#[test]
fn a_shard_without_replicas_surges_and_never_loses_its_master() {
    let mut sim = Sim::new(3, 0, r70(), v81());
    assert_eq!(sim.run(None), RolloutPhase::Completed);
    assert_eq!(sim.view.nodes.len(), 3, "the temporary replicas left");
    assert!(sim.view.nodes.iter().all(|n| n.image.as_deref() == Some(v81().image) && n.master));
    assert_eq!(sim.recreated, vec!["c-shard-0-0", "c-shard-1-0", "c-shard-2-0"]);
    // Onto the surge replica, and back to ordinal 0 when it leaves.
    assert_eq!(sim.failovers, 6);
}

#[test]
fn a_canary_that_crash_loops_rolls_back_and_remembers_the_target() {
    let mut sim = Sim::new(3, 1, r62(), r70());
    sim.target.to_image = BAD_IMAGE.into();
    sim.status.to_image = BAD_IMAGE.into();
    assert_eq!(sim.run(None), RolloutPhase::RolledBack);
    let rollback = sim.status.last_rollback.clone().expect("recorded");
    assert_eq!(rollback.gate, GATE_RESTARTS);
    // The temporary replica is the first Pod on the new image.
    assert!(rollback.reason.contains("c-shard-0-2"), "{}", rollback.reason);
    assert_eq!(sim.view.nodes.len(), 6, "the temporary replica left");
    assert!(sim.recreated.is_empty(), "no Pod of the cluster was recreated: {:?}", sim.recreated);
    assert_eq!(rollback.target_image, BAD_IMAGE);
    assert_eq!(sim.failovers, 0, "never past the point of no return");
    assert!(sim.status.point_of_no_return_time.is_none());
    assert!(sim.view.nodes.iter().all(|n| n.image.as_deref() == Some(r62().image) && n.reachable));
    // Once rolled back, nothing more is done.
    let decision = next(&sim.view, &sim.target, &sim.status, sim.now);
    assert_eq!(decision.act, Act::Done);
    assert_eq!(decision.images, vec![r62().image; 3]);
}

#[test]
fn a_replica_that_never_comes_back_fails_its_gate_after_the_timeout() {
    let mut sim = Sim::new(3, 1, r62(), r70());
    sim.tick_until_recreated("c-shard-0-1");
    let replica = sim.view.nodes.iter_mut().find(|n| n.pod == "c-shard-0-1").unwrap();
    replica.reachable = false;
    sim.view.healthy = Err("5 of 6 Redis nodes reachable".into());
    let soon = next(&sim.view, &sim.target, &sim.status, sim.now + Duration::from_secs(10));
    assert_eq!(soon.status.phase, RolloutPhase::Progressing);
    let late = next(&sim.view, &sim.target, &sim.status, sim.now + Duration::from_secs(61));
    assert_eq!(late.status.phase, RolloutPhase::RollingBack);
    assert_eq!(late.status.last_rollback.unwrap().gate, GATE_HEALTHY);
}

#[test]
fn a_failed_gate_after_the_point_of_no_return_halts_instead() {
    let mut sim = Sim::new(3, 1, r62(), r70());
    while sim.status.point_of_no_return_time.is_none() {
        sim.tick(0);
    }
    sim.view.nodes.iter_mut().find(|n| n.pod == "c-shard-2-0").unwrap().restarts = 1;
    let decision = next(&sim.view, &sim.target, &sim.status, sim.now);
    assert_eq!(decision.status.phase, RolloutPhase::Halted);
    assert!(decision.status.message.clone().unwrap().contains("point of no return"));
    // It resumes once the gates pass again.
    let mut halted = Sim { status: decision.status, ..sim };
    halted.view.nodes.iter_mut().for_each(|n| n.restarts = n.restarts.min(0));
    halted.status.restarts_at_step_start = 0;
    assert_eq!(halted.run(None), RolloutPhase::Completed);
}

/// Security review finding 10: right after the canary's step, the cluster
/// still lists the recreated Pod's old id (a departed node not yet marked
/// failed). The bake waits for health and starts over; it does not fail.
#[test]
fn a_departed_node_during_the_bake_is_waited_for_not_a_failed_gate() {
    let mut sim = Sim::new(3, 1, r70(), r70());
    while sim.status.canary_bake_until.is_none() {
        sim.tick(0);
    }
    let departed = Err("1 departed node(s) not yet marked failed by the cluster".to_owned());
    for _ in 0..20 {
        sim.view.healthy = departed.clone();
        let decision = next(&sim.view, &sim.target, &sim.status, sim.now + Duration::from_secs(1));
        assert_eq!(decision.status.phase, RolloutPhase::Progressing, "{:?}", decision.status.message);
        assert!(
            matches!(&decision.act, Act::Wait(why) if why.contains("once the cluster is healthy")),
            "{:?}",
            decision.act
        );
        sim.status = decision.status;
        sim.now += Duration::from_secs(1);
    }
    // The bake starts over from the last unhealthy moment.
    let until = sim.status.canary_bake_until.as_ref().unwrap().0;
    assert!(until >= sim.now + sim.target.bake - Duration::from_secs(1));
    sim.view.healthy = Ok(());
    assert_eq!(sim.run(None), RolloutPhase::Completed);
    assert_eq!(sim.recreated.len(), 6, "every Pod recreated once: {:?}", sim.recreated);
    // Unhealthy for longer than a step may take still fails the gate.
    let mut stuck = Sim::new(3, 1, r70(), r70());
    while stuck.status.canary_bake_until.is_none() {
        stuck.tick(0);
    }
    stuck.view.healthy = departed;
    let late = next(&stuck.view, &stuck.target, &stuck.status, stuck.now + stuck.target.step_timeout * 2);
    assert!(matches!(late.status.phase, RolloutPhase::RollingBack | RolloutPhase::Halted), "{:?}", late.status);
}

#[test]
fn a_rolling_restart_recreates_every_pod_once_replicas_first() {
    let mut sim = Sim::new(3, 1, r70(), r70());
    assert_eq!(sim.run(None), RolloutPhase::Completed);
    assert_eq!(sim.recreated.len(), 6, "{:?}", sim.recreated);
    assert_eq!(&sim.recreated[..2], ["c-shard-0-1", "c-shard-0-0"]);
    assert_eq!(sim.failovers, 3);
    assert!(sim.status.point_of_no_return_time.is_none(), "the same version has none");
}

/// A crash before the checkpoint, or between the checkpoint and the act, at
/// every tick: the rollout still completes, never repeats a failover that
/// Redis already made, and recreates each Pod once.
#[test]
fn a_crash_at_any_tick_resumes_without_repeating_a_step() {
    let ticks = {
        let mut sim = Sim::new(3, 1, r62(), r70());
        sim.run(None);
        ((sim.now.as_second() - 1_800_000_000) as usize).max(1)
    };
    for tick in 0..ticks {
        for how in [1, 2] {
            let mut sim = Sim::new(3, 1, r62(), r70());
            assert_eq!(sim.run(Some((tick, how))), RolloutPhase::Completed, "crash {how} at tick {tick}");
            assert_eq!(sim.failovers, 3, "crash {how} at tick {tick}: one failover per shard");
            let mut recreated = sim.recreated.clone();
            recreated.sort();
            recreated.dedup();
            assert_eq!(recreated.len(), sim.recreated.len(), "crash {how} at tick {tick}: {:?}", sim.recreated);
        }
    }
}

#[test]
fn the_view_counts_restarts_of_every_node() {
    let mut a = node(0, 0, r62().image, true);
    a.restarts = 2;
    let view = ClusterView { shards: 1, replicas_per_master: 0, nodes: vec![a], healthy: Ok(()) };
    assert_eq!(view.restarts(), 2);
}

#[test]
fn the_rollout_is_not_complete_until_the_last_replica_has_caught_up() {
    let mut sim = Sim::new(3, 1, r62(), r70());
    while !matches!(sim.tick(0), Act::Recreate { ref pod, .. } if pod == "c-shard-2-0") {}
    let last = sim.view.nodes.iter_mut().find(|n| n.pod == "c-shard-2-0").unwrap();
    (last.link_up, last.lag) = (false, None);
    for _ in 0..3 {
        assert_ne!(sim.tick(0), Act::Done, "done while c-shard-2-0 has not linked up");
        assert_eq!(sim.status.phase, RolloutPhase::Progressing);
    }
    let last = sim.view.nodes.iter_mut().find(|n| n.pod == "c-shard-2-0").unwrap();
    (last.link_up, last.lag) = (true, Some(0));
    assert_eq!(sim.run(None), RolloutPhase::Completed);
}

#[test]
fn a_pod_made_in_the_second_a_restart_started_counts_as_restarted() {
    let mut sim = Sim::new(3, 1, r70(), r70());
    sim.tick(0); // the temporary replica joins
    // The rollout started mid-second; creationTimestamp has whole seconds.
    let started = sim.status.start_time.as_ref().unwrap().0;
    sim.status.start_time = Some(Time(started + Duration::from_millis(400)));
    let replica = sim.view.nodes.iter_mut().find(|n| n.pod == "c-shard-0-1").unwrap();
    replica.created = Some(started);
    let decision = next(&sim.view, &sim.target, &sim.status, sim.now + Duration::from_secs(1));
    assert!(
        matches!(&decision.act, Act::Failover { pod, .. } if pod == "c-shard-0-1"),
        "c-shard-0-1 is not recreated twice: {:?}",
        decision.act
    );
}

#[test]
fn a_replica_rolled_back_from_a_newer_rdb_format_gets_a_fresh_volume() {
    for (from, to, fresh) in [(r70(), v81(), true), (r70(), r70(), false)] {
        let mut sim = Sim::new(3, 1, from, to);
        let mut forward = None;
        for _ in 0..100 {
            if let Act::Recreate { pod, fresh_data, .. } = sim.tick(0)
                && pod == "c-shard-0-1"
            {
                forward = Some(fresh_data);
                break;
            }
        }
        assert_eq!(forward, Some(false), "going forward, a Pod keeps its volume");
        // Cancelled (spec set back) before the point of no return.
        sim.status.phase = RolloutPhase::RollingBack;
        let mut back = vec![];
        while sim.status.phase == RolloutPhase::RollingBack {
            if let Act::Recreate { pod, fresh_data, reason, .. } = sim.tick(0) {
                back.push((pod, fresh_data, reason));
            }
            assert!(back.len() < 10);
        }
        if from == to {
            assert!(back.is_empty(), "a restart has nothing to take back: {back:?}");
            continue;
        }
        assert_eq!(back.len(), 1, "{back:?}");
        assert_eq!((back[0].0.as_str(), back[0].1), ("c-shard-0-1", fresh), "{back:?}");
        assert!(back[0].2.contains("fresh volume") && back[0].2.contains("RDB format 11"), "{}", back[0].2);
    }
}
