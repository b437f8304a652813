//! A simulated cluster for the rollout planner: Pods recreate on their
//! shard's image and come back as caught-up replicas, a failover shows one
//! tick after it is sent, a surge Pod joins and leaves. The operator may
//! crash at any point of a step; the simulation checks what must always hold.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use slotkeeper_api::catalog::{CatalogEntry, Engine, Release, lookup};
use slotkeeper_api::rollout::{RolloutPhase, UpgradeStatus};

use crate::rollout::{Act, Target, next, start};
use crate::view::{ClusterView, NodeView};

pub const BAD_IMAGE: &str = "registry.example/redis:broken";

pub struct Sim {
    pub view: ClusterView,
    pub status: UpgradeStatus,
    pub target: Target,
    pub now: Timestamp,
    pub failovers: usize,
    pub recreated: Vec<String>,
    /// A failover sent, shown at the next tick.
    pub pending_failover: Option<(usize, String)>,
}

pub fn entry(engine: Engine, version: &str) -> &'static CatalogEntry {
    lookup(engine, version).expect("in the catalog")
}

fn release_of(image: &str) -> Option<Release> {
    slotkeeper_api::catalog::CATALOG.iter().find(|e| e.image == image).map(|e| e.release())
}

pub fn node(shard: usize, ordinal: usize, image: &str, master: bool) -> NodeView {
    NodeView {
        pod: format!("c-shard-{shard}-{ordinal}"),
        shard,
        ordinal,
        image: Some(image.into()),
        created: Some(Timestamp::from_second(1_700_000_000).expect("valid")),
        restarts: 0,
        reachable: true,
        master,
        release: release_of(image),
        link_up: !master,
        lag: (!master).then_some(0),
    }
}

impl Sim {
    pub fn new(shards: usize, replicas: usize, from: &'static CatalogEntry, to: &'static CatalogEntry) -> Self {
        let nodes = (0..shards).flat_map(|s| (0..=replicas).map(move |o| node(s, o, from.image, o == 0))).collect();
        let view = ClusterView { shards, replicas_per_master: replicas, nodes, healthy: Ok(()) };
        let target = Target {
            from,
            from_image: from.image.into(),
            to,
            to_image: to.image.into(),
            bake: Duration::from_secs(5),
            step_timeout: Duration::from_secs(60),
        };
        let now = Timestamp::from_second(1_800_000_000).expect("valid");
        let status = start(&target, shards, None, 0, now);
        Self { view, status, target, now, failovers: 0, recreated: vec![], pending_failover: None }
    }

    /// One reconcile. `crash` 1: the operator dies before writing the
    /// checkpoint; 2: after the checkpoint, before acting.
    pub fn tick(&mut self, crash: u8) -> Act {
        self.now += Duration::from_secs(1);
        if let Some((shard, pod)) = self.pending_failover.take() {
            for n in self.view.nodes.iter_mut().filter(|n| n.shard == shard) {
                n.master = n.pod == pod;
                n.link_up = !n.master;
                n.lag = (!n.master).then_some(0);
            }
        }
        let decision = next(&self.view, &self.target, &self.status, self.now);
        self.follow_surge(decision.surge, &decision.images);
        if crash == 1 {
            return decision.act;
        }
        self.status = decision.status;
        if crash == 2 {
            return decision.act;
        }
        match &decision.act {
            Act::Recreate { shard, pod, .. } => {
                let image = decision.images[*shard].clone();
                let bad = image == BAD_IMAGE;
                let n = self.view.nodes.iter_mut().find(|n| &n.pod == pod).expect("exists");
                assert!(!n.master, "a master is never recreated: {pod}");
                n.release = release_of(&image);
                n.image = Some(image);
                n.created = Some(self.now);
                (n.reachable, n.restarts, n.link_up, n.lag) = (!bad, 0, !bad, (!bad).then_some(0));
                self.recreated.push(pod.clone());
            }
            Act::Failover { shard, pod, .. } => {
                self.failovers += 1;
                self.pending_failover = Some((*shard, pod.clone()));
            }
            Act::Wait(_) | Act::Done => {}
        }
        // A Pod on the bad image crash-loops.
        for n in self.view.nodes.iter_mut().filter(|n| n.image.as_deref() == Some(BAD_IMAGE)) {
            n.restarts += 1;
        }
        let down = self.view.nodes.iter().filter(|n| !n.reachable).count();
        self.view.healthy = if down == 0 { Ok(()) } else { Err(format!("{down} node(s) unreachable")) };
        decision.act
    }

    /// What the StatefulSet and the cluster planner do with a surge: a Pod
    /// joins as a replica; once it is asked to leave, the master role goes
    /// back to ordinal 0 and then the Pod goes.
    fn follow_surge(&mut self, surge: Option<usize>, images: &[String]) {
        let wanted = self.view.replicas_per_master + 1;
        for (shard, image) in images.iter().enumerate().take(self.view.shards) {
            let count = self.view.nodes.iter().filter(|n| n.shard == shard).count();
            if surge == Some(shard) && count == wanted {
                let mut surge = node(shard, wanted, image, false);
                surge.created = Some(self.now);
                self.view.nodes.push(surge);
            } else if surge != Some(shard) && count > wanted {
                let extra_is_master =
                    self.view.nodes.iter().any(|n| n.shard == shard && n.ordinal >= wanted && n.master);
                if extra_is_master {
                    self.failovers += 1;
                    for n in self.view.nodes.iter_mut().filter(|n| n.shard == shard) {
                        n.master = n.ordinal == 0;
                        (n.link_up, n.lag) = (!n.master, (!n.master).then_some(0));
                    }
                } else {
                    self.view.nodes.retain(|n| n.shard != shard || n.ordinal < wanted);
                }
            }
        }
    }

    /// Ticks until `pod` has been recreated.
    pub fn tick_until_recreated(&mut self, pod: &str) {
        for _ in 0..100 {
            if matches!(self.tick(0), Act::Recreate { pod: ref p, .. } if p == pod) {
                return;
            }
        }
        panic!("{pod} was not recreated: {:?}", self.status.step)
    }

    /// Every shard has exactly one master, always.
    pub fn assert_every_shard_has_a_master(&self) {
        for shard in 0..self.view.shards {
            let masters = self.view.nodes.iter().filter(|n| n.shard == shard && n.master && n.reachable).count();
            assert_eq!(masters, 1, "shard {shard} at {:?}", self.status.step);
        }
    }

    /// Runs until the rollout ends; `crash_at` crashes the given tick.
    pub fn run(&mut self, crash_at: Option<(usize, u8)>) -> RolloutPhase {
        for tick in 0..500 {
            let crash = crash_at.filter(|(at, _)| *at == tick).map_or(0, |(_, how)| how);
            let act = self.tick(crash);
            self.assert_every_shard_has_a_master();
            if act == Act::Done && crash == 0 {
                return self.status.phase;
            }
        }
        panic!("the rollout did not end: {:?}", self.status)
    }
}
