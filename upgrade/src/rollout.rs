//! One rollout, from one catalog entry to the next, as pure functions: the
//! observed cluster and the checkpoint (`status.upgrade`) in, the next step,
//! the new checkpoint and each shard's image out.
//!
//! Shard by shard, the canary (shard 0) first: each replica is recreated on
//! the new image and must come back linked and caught up; then a coordinated
//! `CLUSTER FAILOVER` hands the master role to an upgraded replica (the first
//! one is the point of no return when the new version writes a newer RDB
//! format); then the old master is recreated and rejoins as a replica. Each
//! shard first gets a temporary replica on the new version (the surge), so
//! a replica acknowledges writes and holds the data while another node is
//! away; in a shard without replicas it is the one that takes over. It
//! leaves when the shard is done. After the canary,
//! a bake time with the same gates. A failed gate before the point of no
//! return rolls back (upgraded replicas return to the old image); after it,
//! the rollout halts until the gates pass again.
//!
//! Every decision comes from what is observed plus the checkpoint, so a
//! restarted operator resumes where it stopped: a recreated Pod carries its
//! image, a failover shows in the roles, and a failover sent but not yet
//! visible is in the checkpoint's step.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use slotkeeper_api::catalog::CatalogEntry;
use slotkeeper_api::rollout::{RollbackStatus, RolloutPhase, RolloutStep, UpgradeStatus};

use crate::view::{ClusterView, NodeView};

pub use slotkeeper_api::rollout::MAX_REPLICA_LAG_BYTES as MAX_LAG_BYTES;
/// How long Redis may take to show the new roles after `CLUSTER FAILOVER`.
const FAILOVER_SETTLE: Duration = Duration::from_secs(30);

pub const GATE_RESTARTS: &str = "ContainerRestarts";
pub const GATE_HEALTHY: &str = "NodeHealthy";
pub const GATE_CAUGHT_UP: &str = "CaughtUp";

/// The rollout asked for.
#[derive(Debug, Clone)]
pub struct Target {
    pub from: &'static CatalogEntry,
    pub from_image: String,
    pub to: &'static CatalogEntry,
    pub to_image: String,
    pub bake: Duration,
    pub step_timeout: Duration,
}

impl Target {
    /// The same release and image: every Pod is recreated once (a rolling restart).
    pub fn is_restart(&self) -> bool {
        self.from == self.to && self.from_image == self.to_image
    }

    /// A newer node as master cannot feed an older replica a full sync.
    fn has_point_of_no_return(&self) -> bool {
        self.to.rdb_format > self.from.rdb_format
    }
}

/// What to do now.
#[derive(Debug, Clone, PartialEq)]
pub enum Act {
    Wait(String),
    /// Delete the Pod: its StatefulSet (`OnDelete`) recreates it on the shard's image.
    Recreate {
        shard: usize,
        pod: String,
        reason: String,
        /// Replace its volume too: what it holds was written by a release
        /// the shard's image cannot read (a replica rolled back after it
        /// saved in a newer RDB format); it syncs from its master instead.
        fresh_data: bool,
    },
    /// `CLUSTER FAILOVER` on `pod`, a caught-up replica of `from_pod`.
    Failover {
        shard: usize,
        pod: String,
        from_pod: String,
        reason: String,
    },
    /// Nothing more: the rollout completed or rolled back.
    Done,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub act: Act,
    /// The checkpoint to write (before acting, when the act is a step).
    pub status: UpgradeStatus,
    /// The image of each staying shard's StatefulSet template.
    pub images: Vec<String>,
    /// A shard that runs one extra Pod (the surge replica).
    pub surge: Option<usize>,
}

/// The checkpoint of a rollout that begins now.
pub fn start(
    target: &Target,
    shards: usize,
    final_target: Option<String>,
    restarts: i32,
    now: Timestamp,
) -> UpgradeStatus {
    UpgradeStatus {
        phase: RolloutPhase::Progressing,
        from: target.from.release().to_string(),
        from_image: target.from_image.clone(),
        to: target.to.release().to_string(),
        to_image: target.to_image.clone(),
        final_target,
        step: None,
        step_started_time: Some(Time(now)),
        restarts_at_step_start: restarts,
        shards_done: 0,
        shards_total: shards as i32,
        canary_shard: 0,
        start_time: Some(Time(now)),
        ..UpgradeStatus::default()
    }
}

/// The next step of the rollout checkpointed in `status`.
pub fn next(view: &ClusterView, target: &Target, status: &UpgradeStatus, now: Timestamp) -> Decision {
    let mut planner = Planner { view, target, status: status.clone(), now };
    let act = planner.decide();
    let images = planner.images();
    let surge = planner.status.surge_shard.map(|s| s as usize);
    Decision { act, status: planner.status, images, surge }
}

struct Planner<'a> {
    view: &'a ClusterView,
    target: &'a Target,
    status: UpgradeStatus,
    now: Timestamp,
}

impl Planner<'_> {
    fn decide(&mut self) -> Act {
        self.status.shards_total = self.view.shards as i32;
        self.status.shards_done = (0..self.view.shards).filter(|&s| self.shard_done(s)).count() as i32;
        if self.target.has_point_of_no_return()
            && self.status.point_of_no_return_time.is_none()
            && self.view.nodes.iter().any(|n| n.master && self.runs_new(n))
        {
            self.status.point_of_no_return_time = Some(Time(self.now));
        }
        match self.status.phase {
            RolloutPhase::Completed | RolloutPhase::RolledBack => Act::Done,
            RolloutPhase::RollingBack => self.roll_back(),
            RolloutPhase::Halted => match self.gate_failure(true) {
                Some((_, reason)) => Act::Wait(format!("halted: {reason}")),
                None => {
                    self.status.phase = RolloutPhase::Progressing;
                    self.status.message = None;
                    self.begin_step(RolloutStep { shard: -1, pod: None, action: "Resume".into(), detail: None });
                    Act::Wait("the gates pass again: resuming".into())
                }
            },
            RolloutPhase::Progressing => self.forward(),
        }
    }

    fn runs_new(&self, node: &NodeView) -> bool {
        let recreated = || {
            let started = self.status.start_time.as_ref().map(|t| t.0);
            // creationTimestamp has whole seconds: a Pod made in the second
            // the rollout started counts as made for it.
            node.created.zip(started).is_some_and(|(created, started)| created.as_second() >= started.as_second())
        };
        node.image.as_deref() == Some(self.target.to_image.as_str())
            && node.release.as_ref().is_none_or(|r| *r == self.target.to.release())
            && (!self.target.is_restart() || recreated())
    }

    fn on_old_image(&self, node: &NodeView) -> bool {
        node.image.as_deref() == Some(self.target.from_image.as_str())
    }

    fn caught_up(node: &NodeView) -> bool {
        node.reachable && node.link_up && node.lag.is_some_and(|lag| lag <= MAX_LAG_BYTES)
    }

    /// Every node of the shard on the new release, reachable, its master
    /// upgraded and its replicas linked and caught up.
    fn shard_done(&self, shard: usize) -> bool {
        let nodes: Vec<&NodeView> = self.view.shard(shard).collect();
        self.missing_ordinal(shard).is_none()
            && nodes.len() == self.view.replicas_per_master + 1
            && self.status.surge_shard != Some(shard as i32)
            && nodes.iter().all(|n| n.reachable && self.runs_new(n) && (n.master || Self::caught_up(n)))
    }

    /// An ordinal the shard should have and the view lacks (its Pod is being
    /// deleted or not made yet).
    fn missing_ordinal(&self, shard: usize) -> Option<usize> {
        let present: std::collections::BTreeSet<usize> = self.view.shard(shard).map(|n| n.ordinal).collect();
        (0..=self.view.replicas_per_master).find(|o| !present.contains(o))
    }

    /// The shards in rollout order: the canary first.
    fn order(&self) -> Vec<usize> {
        let canary = (self.status.canary_shard.max(0) as usize).min(self.view.shards.saturating_sub(1));
        std::iter::once(canary).chain((0..self.view.shards).filter(|&s| s != canary)).collect()
    }

    /// Shards up to the one in progress run the new image; the rest keep the
    /// old one (their Pods are not recreated yet, but a Pod that dies by
    /// itself must come back on its shard's version). Rolling back, all old.
    fn images(&self) -> Vec<String> {
        let (old, new) = (self.target.from_image.clone(), self.target.to_image.clone());
        match self.status.phase {
            RolloutPhase::RollingBack | RolloutPhase::RolledBack => vec![old; self.view.shards],
            RolloutPhase::Completed => vec![new; self.view.shards],
            _ => {
                let order = self.order();
                let current = order.iter().position(|&s| !self.shard_done(s)).unwrap_or(order.len());
                let mut images = vec![old; self.view.shards];
                for &s in order.iter().take(current + 1) {
                    images[s] = new.clone();
                }
                images
            }
        }
    }

    fn begin_step(&mut self, step: RolloutStep) {
        self.status.step = Some(step);
        self.status.step_started_time = Some(Time(self.now));
        self.status.restarts_at_step_start = self.view.restarts();
    }

    fn step_age(&self) -> Duration {
        let started = self.status.step_started_time.as_ref().map_or(self.now, |t| t.0);
        Duration::from_secs_f64(self.now.duration_since(started).as_secs_f64().max(0.0))
    }

    /// The gate that failed, if one did: containers restarted since the step
    /// began; or, once the step has taken longer than allowed, the cluster
    /// unhealthy or a replica on the new version not caught up.
    fn gate_failure(&self, any_time: bool) -> Option<(&'static str, String)> {
        if self.view.restarts() > self.status.restarts_at_step_start {
            let pods: Vec<String> = self
                .view
                .nodes
                .iter()
                .filter(|n| n.restarts > 0)
                .map(|n| format!("{} ({}×, image {})", n.pod, n.restarts, n.image.as_deref().unwrap_or("?")))
                .collect();
            return Some((GATE_RESTARTS, format!("containers restarted since the step began: {}", pods.join(", "))));
        }
        if !any_time && self.step_age() <= self.target.step_timeout {
            return None;
        }
        let waited = self.step_age().as_secs();
        if let Err(reason) = &self.view.healthy {
            return Some((GATE_HEALTHY, format!("not healthy after {waited}s: {reason}")));
        }
        let behind = self.view.nodes.iter().find(|n| !n.master && self.runs_new(n) && !Self::caught_up(n));
        behind.map(|n| {
            let how = match n.lag {
                _ if !n.link_up => "its link to the master is down or its data is not yet on disk".to_owned(),
                Some(lag) => format!("{lag} bytes behind"),
                None => "its offset is unknown".to_owned(),
            };
            (GATE_CAUGHT_UP, format!("{} not caught up after {waited}s: {how}", n.pod))
        })
    }

    /// A failed gate: roll back before the point of no return, halt after.
    fn fail(&mut self, gate: &'static str, reason: String) -> Act {
        if self.status.point_of_no_return_time.is_some() {
            self.status.phase = RolloutPhase::Halted;
            self.status.message = Some(format!(
                "gate {gate} failed after the point of no return ({} is master somewhere): {reason}; the rollout waits until the gates pass, going back is not possible",
                self.status.to
            ));
            self.begin_step(RolloutStep {
                shard: -1,
                pod: None,
                action: "Halted".into(),
                detail: Some(reason.clone()),
            });
            return Act::Wait(format!("halted: {reason}"));
        }
        self.status.phase = RolloutPhase::RollingBack;
        self.status.last_rollback = Some(RollbackStatus {
            target: self.status.to.clone(),
            target_image: self.status.to_image.clone(),
            gate: gate.into(),
            reason: reason.clone(),
            time: Some(Time(self.now)),
        });
        self.status.message = Some(format!("gate {gate} failed: {reason}; rolling back to {}", self.status.from));
        self.status.surge_shard = None;
        self.begin_step(RolloutStep { shard: -1, pod: None, action: "RollBack".into(), detail: Some(reason.clone()) });
        Act::Wait(format!("rolling back: gate {gate} failed: {reason}"))
    }

    fn forward(&mut self) -> Act {
        if let Some((gate, reason)) = self.gate_failure(false) {
            return self.fail(gate, reason);
        }
        let order = self.order();
        let Some(shard) = order.iter().copied().find(|&s| !self.shard_done(s)) else {
            self.status.phase = RolloutPhase::Completed;
            self.status.completion_time = Some(Time(self.now));
            self.status.step = None;
            self.status.message = None;
            return Act::Done;
        };
        // The canary bakes before any other shard starts.
        let canary = order[0];
        if shard != canary && self.target.bake > Duration::ZERO {
            let until = match &self.status.canary_bake_until {
                Some(until) => until.0,
                None => {
                    let until = self.now + self.target.bake;
                    self.status.canary_bake_until = Some(Time(until));
                    self.begin_step(RolloutStep {
                        shard: canary as i32,
                        pod: None,
                        action: "Bake".into(),
                        detail: None,
                    });
                    until
                }
            };
            if self.now < until {
                // Right after a step, a recreated Pod's old node id departs and
                // a handshake runs: expected, so the bake waits for health and
                // starts over; only the step's timeout (checked above) fails it.
                if let Err(reason) = &self.view.healthy {
                    self.status.canary_bake_until = Some(Time(self.now + self.target.bake));
                    return Act::Wait(format!("canary shard {canary} bakes once the cluster is healthy: {reason}"));
                }
                let left = until.duration_since(self.now).as_secs_f64().ceil();
                return Act::Wait(format!("canary shard {canary} bakes {left}s more"));
            }
        }
        self.upgrade_shard(shard)
    }

    fn upgrade_shard(&mut self, shard: usize) -> Act {
        if let Err(reason) = &self.view.healthy {
            return Act::Wait(reason.clone());
        }
        let nodes: Vec<&NodeView> = self.view.shard(shard).collect();
        let Some(master) = nodes.iter().copied().find(|n| n.master) else {
            return Act::Wait(format!("shard {shard} has no master"));
        };
        let wanted = self.view.replicas_per_master + 1;
        // A Pod being recreated is absent from the view: nothing is decided
        // about its shard until it is back.
        if let Some(ordinal) = self.missing_ordinal(shard) {
            return Act::Wait(format!("shard {shard}: its Pod of ordinal {ordinal} is being recreated"));
        }
        // Every shard borrows a replica on the new version for its turn: it
        // acknowledges writes (WAIT 1) and keeps a copy of the data while a
        // replica, then the old master, is away being recreated.
        if !self.runs_new(master) && self.status.surge_shard.is_none() {
            self.status.surge_shard = Some(shard as i32);
            self.begin_step(RolloutStep {
                shard: shard as i32,
                pod: None,
                action: "Surge".into(),
                detail: Some(format!("a temporary replica on {} joins shard {shard}", self.status.to)),
            });
            return Act::Wait(format!("shard {shard}: a temporary replica on the new version joins"));
        }
        if self.status.surge_shard == Some(shard as i32) && !self.runs_new(master) && nodes.len() <= wanted {
            return Act::Wait(format!("shard {shard}: waiting for the temporary replica to join"));
        }
        if let Some(behind) = nodes.iter().find(|n| !n.master && self.runs_new(n) && !Self::caught_up(n)) {
            return Act::Wait(format!("shard {shard}: {} catching up", behind.pod));
        }
        if let Some(old) = nodes.iter().find(|n| !n.master && !self.runs_new(n)) {
            let detail = format!("replica to {}", self.status.to);
            let reason = format!("replica of shard {shard} to {} ({})", self.status.to, self.target.to_image);
            return self.recreate(old, detail, reason, false);
        }
        if !self.runs_new(master) {
            // An upgraded replica takes over; the lowest ordinal first, so a
            // temporary (surge) Pod is chosen only when it is the only one.
            let candidate = nodes
                .iter()
                .filter(|n| !n.master && self.runs_new(n) && Self::caught_up(n))
                .min_by_key(|n| (self.view.is_temporary(n), n.lag));
            let Some(candidate) = candidate else {
                return Act::Wait(format!("shard {shard}: waiting for an upgraded replica to catch up"));
            };
            // Sent already (the checkpoint says so): wait for Redis to show it.
            if let Some(step) = &self.status.step
                && step.action == "Failover"
                && step.shard == shard as i32
                && self.step_age() < FAILOVER_SETTLE
            {
                return Act::Wait(format!(
                    "shard {shard}: failover to {} sent; waiting for the new roles",
                    candidate.pod
                ));
            }
            let (pod, from_pod) = (candidate.pod.clone(), master.pod.clone());
            self.begin_step(RolloutStep {
                shard: shard as i32,
                pod: Some(pod.clone()),
                action: "Failover".into(),
                detail: Some(format!("from {from_pod}")),
            });
            let reason = format!("shard {shard}: the upgraded replica takes over from {from_pod}");
            return Act::Failover { shard, pod, from_pod, reason };
        }
        if self.status.surge_shard == Some(shard as i32) {
            // Every Pod runs the new version: the temporary one leaves (the
            // cluster planner hands the master role back first).
            self.status.surge_shard = None;
            self.begin_step(RolloutStep {
                shard: shard as i32,
                pod: None,
                action: "EndSurge".into(),
                detail: Some("the temporary replica leaves".into()),
            });
            return Act::Wait(format!("shard {shard}: the temporary replica leaves"));
        }
        if nodes.len() > wanted {
            return Act::Wait(format!("shard {shard}: {} of {wanted} Pods left", nodes.len()));
        }
        Act::Wait(format!("shard {shard}: waiting for every node to report {}", self.status.to))
    }

    /// The step that recreates `node`'s Pod on its shard's image.
    fn recreate(&mut self, node: &NodeView, detail: String, reason: String, fresh_data: bool) -> Act {
        self.begin_step(RolloutStep {
            shard: node.shard as i32,
            pod: Some(node.pod.clone()),
            action: "Recreate".into(),
            detail: Some(detail),
        });
        // Its restarts leave with it: they must not hide the new Pod's.
        self.status.restarts_at_step_start -= node.restarts;
        Act::Recreate { shard: node.shard, pod: node.pod.clone(), reason, fresh_data }
    }

    fn roll_back(&mut self) -> Act {
        let old_reachable = self.view.nodes.iter().filter(|n| self.on_old_image(n)).all(|n| n.reachable);
        // A temporary replica is not brought back: it leaves (the checkpoint
        // no longer names a surge shard), unless Redis made it master.
        let leaves = |n: &NodeView| self.view.is_temporary(n) && !n.master;
        if let Some(node) = self.view.nodes.iter().find(|n| !self.on_old_image(n) && !leaves(n)) {
            if node.master && node.reachable {
                // Only after the point of no return can a new node be master;
                // rolling back was decided before it, so Redis failed over by
                // itself: stop and say so.
                self.status.phase = RolloutPhase::Halted;
                self.status.message =
                    Some(format!("{} on {} became master while rolling back; halted", node.pod, self.status.to));
                return Act::Wait("halted".into());
            }
            if !old_reachable {
                return Act::Wait("rolling back: waiting for the nodes on the old version".into());
            }
            // Before the point of no return it is a replica: its master has
            // the data, in a format the old release reads.
            let fresh_data = self.target.has_point_of_no_return();
            let detail = format!("back to {}", self.status.from);
            let mut reason = format!("rolling back {} to {} ({})", node.pod, self.status.from, self.target.from_image);
            if fresh_data {
                reason += &format!(
                    " with a fresh volume: {} saves RDB format {}, {} reads up to {}",
                    self.status.to, self.target.to.rdb_format, self.status.from, self.target.from.rdb_format
                );
            }
            return self.recreate(node, detail, reason, fresh_data);
        }
        if let Err(reason) = &self.view.healthy {
            return Act::Wait(format!("rolling back: {reason}"));
        }
        if let Some(behind) = self.view.nodes.iter().find(|n| !n.master && !Self::caught_up(n)) {
            return Act::Wait(format!("rolling back: {} catching up", behind.pod));
        }
        self.status.phase = RolloutPhase::RolledBack;
        self.status.completion_time = Some(Time(self.now));
        self.status.step = None;
        Act::Done
    }
}

#[cfg(test)]
#[path = "rollout_tests.rs"]
mod tests;
