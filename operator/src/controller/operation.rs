//! The RedisOperation controller: a coordinated failover of one shard.
//!
//! Pending → validated (cluster exists, shard exists and has a replica, no
//! other operation running on the cluster) → Running: the target replica
//! must be linked and caught up, then the cluster's reconcile sends `CLUSTER
//! FAILOVER` (FORCE only when the master cannot be reached; see
//! `plan::intents`) → Succeeded once Redis reports the new roles, Failed
//! with the reason otherwise. Nothing is changed by a request that
//! fails validation. The status is the checkpoint: a restarted operator
//! resumes from the phase and whether the command was already sent.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::EventType;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource as _, ResourceExt as _};
use tracing::Instrument as _;

use super::{Context, observe};
use crate::api::names::FIELD_MANAGER;
use crate::api::{OperationPhase, OperationType, RedisCluster, RedisOperation, RedisOperationStatus};
use crate::error::{Error, Result};
use crate::plan::{PodFact, RedisFact};
use slotkeeper_readmodel::scope::Namespaces;

const POLL: Duration = Duration::from_millis(200);
/// How long Redis may take to report the new roles after the command.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(30);
/// A replica further behind than this is not promoted yet.
const MAX_LAG_BYTES: i64 = crate::api::rollout::MAX_REPLICA_LAG_BYTES as i64;

pub async fn run(ctx: Arc<Context>, namespaces: &Namespaces) {
    let (reader, writer) = kube::runtime::reflector::store();
    let watched = namespaces.watch::<RedisOperation>(&ctx.client, watcher::Config::default()).reflect(writer);
    Controller::for_stream(watched.applied_objects(), reader)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Err(kube::runtime::controller::Error::ReconcilerFailed(..)) | Ok(_) => {}
                Err(error) => tracing::warn!(%error, "operation controller error (watch or queue)"),
            }
        })
        .await;
}

fn error_policy(operation: Arc<RedisOperation>, error: &Error, _ctx: Arc<Context>) -> Requeue {
    tracing::warn!(operation = %operation.name_any(), namespace = operation.namespace().unwrap_or_default(), class = error.class(), %error, "operation reconcile failed");
    Requeue::requeue(error.retry_after())
}

/// What a reconcile decided about an operation.
enum Outcome {
    Fail(String),
    Start {
        from: String,
        to: String,
    },
    /// Started: the message, and the event's reason.
    Begin(String, &'static str),
    /// Running; the progress to show when it changed.
    Progress(String),
    /// A rolling restart in progress: looked at again every few seconds.
    Follow,
    Succeed(String),
    Wait,
}

async fn reconcile(operation: Arc<RedisOperation>, ctx: Arc<Context>) -> Result<Requeue> {
    let namespace = operation.namespace().unwrap_or_default();
    let span = tracing::info_span!("operation", operation = %operation.name_any(), cluster = %operation.spec.cluster_name, namespace = %namespace);
    reconcile_in_span(operation, ctx, namespace).instrument(span).await
}

async fn reconcile_in_span(operation: Arc<RedisOperation>, ctx: Arc<Context>, namespace: String) -> Result<Requeue> {
    let status = operation.status.clone().unwrap_or_default();
    if matches!(status.phase, Some(OperationPhase::Succeeded | OperationPhase::Failed)) {
        return Ok(Requeue::await_change());
    }
    ctx.caches.synced().await;
    let clusters: Api<RedisCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let cluster_name = &operation.spec.cluster_name;
    let Some(cluster) = clusters
        .get_opt(cluster_name)
        .await
        .map_err(Error::kube(format!("read RedisCluster {namespace}/{cluster_name}")))?
    else {
        let reason = format!("spec.clusterName: RedisCluster {cluster_name} does not exist in namespace {namespace}");
        finish(&ctx, &operation, None, status, OperationPhase::Failed, reason).await?;
        return Ok(Requeue::await_change());
    };
    // Held from the check for a running operation until this one is Running.
    let _start = match status.phase.unwrap_or_default() {
        OperationPhase::Pending => Some(ctx.operation_starts.lock().await),
        _ => None,
    };
    let outcome = match operation.spec.type_ {
        OperationType::Failover => decide_failover(&ctx, &operation, &cluster, &status, &namespace).await?,
        OperationType::RollingRestart => decide_restart(&ctx, &operation, &cluster, &status, &namespace).await?,
        OperationType::Rebalance => decide_rebalance(&ctx, &operation, &cluster, &status, &namespace).await?,
    };
    match outcome {
        Outcome::Fail(reason) => {
            finish(&ctx, &operation, Some(&cluster), status, OperationPhase::Failed, reason).await?;
            Ok(Requeue::await_change())
        }
        Outcome::Succeed(message) => {
            finish(&ctx, &operation, Some(&cluster), status, OperationPhase::Succeeded, message).await?;
            Ok(Requeue::await_change())
        }
        Outcome::Start { from, to } => {
            let message = format!("promoting {to}, a replica of {from}, once it is caught up");
            let next = RedisOperationStatus {
                phase: Some(OperationPhase::Running),
                start_time: Some(Time(Timestamp::now())),
                from_pod: Some(from),
                to_pod: Some(to),
                message: Some(message.clone()),
                ..status
            };
            write(&ctx, &operation, next).await?;
            ctx.nudge(&cluster);
            event(&ctx, &operation, Some(&cluster), EventType::Normal, "FailoverStarted", message).await;
            Ok(Requeue::requeue(Duration::ZERO))
        }
        Outcome::Progress(progress) => {
            if status.progress.as_ref() != Some(&progress) {
                write(&ctx, &operation, RedisOperationStatus { progress: Some(progress), ..status }).await?;
            }
            Ok(Requeue::requeue(Duration::from_secs(1)))
        }
        Outcome::Begin(message, reason) => {
            let next = RedisOperationStatus {
                phase: Some(OperationPhase::Running),
                start_time: Some(Time(Timestamp::now())),
                message: Some(message.clone()),
                ..status
            };
            write(&ctx, &operation, next).await?;
            ctx.nudge(&cluster);
            event(&ctx, &operation, Some(&cluster), EventType::Normal, reason, message).await;
            Ok(Requeue::requeue(POLL))
        }
        Outcome::Wait => Ok(Requeue::requeue(POLL)),
        Outcome::Follow => Ok(Requeue::requeue(Duration::from_secs(2))),
    }
}

async fn decide_failover(
    ctx: &Context,
    operation: &RedisOperation,
    cluster: &RedisCluster,
    status: &RedisOperationStatus,
    namespace: &str,
) -> Result<Outcome> {
    // The CRD requires it; an older CRD without the rule must not crash us.
    let Some(spec) = operation.spec.failover.as_ref() else {
        return Ok(Outcome::Fail(
            "spec.failover is required when spec.type is Failover (set spec.failover.shard)".into(),
        ));
    };
    let shard = spec.shard.max(0) as usize;
    if shard >= cluster.spec.masters.max(0) as usize {
        return Ok(Outcome::Fail(format!(
            "spec.failover.shard {shard}: cluster {} has shards 0 to {}",
            cluster.name_any(),
            cluster.spec.masters - 1
        )));
    }
    let phase = status.phase.unwrap_or_default();
    if phase == OperationPhase::Pending
        && let Some(reason) = blocked(ctx, operation, cluster, namespace).await?
    {
        return Ok(Outcome::Fail(reason));
    }
    let logins = super::users::logins(&ctx.client, cluster, namespace).await?;
    let pods: Vec<PodFact> =
        observe::pods(ctx, namespace, &cluster.name_any()).into_iter().filter(|p| p.shard == shard).collect();
    let key = format!("{namespace}/{}", cluster.name_any());
    let facts = observe::redis(&ctx.redis, &key, &pods, &logins).await;
    let view = ShardView::new(&pods, &facts);
    Ok(match phase {
        OperationPhase::Pending => match view.choose(spec.target_pod.as_deref(), shard) {
            Ok((from, to)) => Outcome::Start { from, to },
            Err(reason) => Outcome::Fail(reason),
        },
        OperationPhase::Running => {
            let (from, to) = (status.from_pod.clone().unwrap_or_default(), status.to_pod.clone().unwrap_or_default());
            if view.is_master(&to) && !view.is_master(&from) {
                return Ok(Outcome::Succeed(format!("{to} is the master of shard {shard}; {from} no longer is")));
            }
            match &status.failover_sent_time {
                Some(sent) => {
                    let waited = Timestamp::now().duration_since(sent.0);
                    if waited.as_secs_f64() > FAILOVER_DEADLINE.as_secs_f64() {
                        Outcome::Fail(format!(
                            "{to} did not become master within {FAILOVER_DEADLINE:?} of CLUSTER FAILOVER"
                        ))
                    } else {
                        Outcome::Wait
                    }
                }
                None => match view.readiness(&from, &to) {
                    // The cluster's reconcile sends the command (one writer to Redis).
                    Readiness::CaughtUp | Readiness::MasterGone => Outcome::Wait,
                    Readiness::Behind(lag) => {
                        let started = status.start_time.as_ref().map(|t| t.0).unwrap_or_else(Timestamp::now);
                        if Timestamp::now().duration_since(started).as_secs_f64() > FAILOVER_DEADLINE.as_secs_f64() {
                            let behind = if lag == i64::MAX {
                                "its link to the master is down".into()
                            } else {
                                format!("it is {lag} bytes behind")
                            };
                            Outcome::Fail(format!(
                                "{to} did not catch up with {from} within {FAILOVER_DEADLINE:?}: {behind}; nothing was changed"
                            ))
                        } else {
                            tracing::debug!(lag, "waiting for the replica to catch up");
                            Outcome::Wait
                        }
                    }
                    Readiness::Gone(reason) => Outcome::Fail(reason),
                },
            }
        }
        OperationPhase::Succeeded | OperationPhase::Failed => Outcome::Wait,
    })
}

/// Why an operation cannot start now: a rollout or another operation runs.
async fn blocked(
    ctx: &Context,
    operation: &RedisOperation,
    cluster: &RedisCluster,
    namespace: &str,
) -> Result<Option<String>> {
    let status = cluster.status.as_ref();
    if let Some(upgrade) =
        status.and_then(|s| s.upgrade.as_ref()).filter(|_| status.is_some_and(crate::plan::rollout::in_progress))
    {
        return Ok(Some(format!(
            "cluster {} is rolling out {} → {}; create this operation again once the rollout has finished",
            cluster.name_any(),
            upgrade.from,
            upgrade.to
        )));
    }
    Ok(running_operation(ctx, operation, namespace).await?.map(|other| {
        format!(
            "RedisOperation {other} is running on cluster {}; wait for it to finish, then create this one again",
            cluster.name_any()
        )
    }))
}

/// A rolling restart: the cluster's reconcile runs it as a rollout to the
/// same version (`status.upgrade.operation` names this operation).
async fn decide_restart(
    ctx: &Context,
    operation: &RedisOperation,
    cluster: &RedisCluster,
    status: &RedisOperationStatus,
    namespace: &str,
) -> Result<Outcome> {
    use crate::api::rollout::RolloutPhase;
    if status.phase.unwrap_or_default() == OperationPhase::Pending {
        if let Some(reason) = blocked(ctx, operation, cluster, namespace).await? {
            return Ok(Outcome::Fail(reason));
        }
        return Ok(Outcome::Begin(
            format!(
                "recreating every Pod of {} once, replicas first, each master handing over first",
                cluster.name_any()
            ),
            "RestartStarted",
        ));
    }
    let name = operation.name_any();
    let upgrade =
        cluster.status.as_ref().and_then(|s| s.upgrade.as_ref()).filter(|u| u.operation.as_deref() == Some(&name));
    Ok(match upgrade {
        Some(u) if u.phase == RolloutPhase::Completed => {
            Outcome::Succeed(format!("every Pod of {} shard(s) recreated once, nothing lost", u.shards_total))
        }
        Some(u) if matches!(u.phase, RolloutPhase::RolledBack | RolloutPhase::Halted) => {
            Outcome::Fail(u.message.clone().unwrap_or_else(|| format!("the restart stopped: {:?}", u.phase)))
        }
        _ => Outcome::Follow,
    })
}

/// A rebalance: the cluster's reconcile plans it (`status.reshard.plan`
/// names this operation) and follows the plan; `status.balance` records
/// the outcome.
async fn decide_rebalance(
    ctx: &Context,
    operation: &RedisOperation,
    cluster: &RedisCluster,
    status: &RedisOperationStatus,
    namespace: &str,
) -> Result<Outcome> {
    let balance = cluster.spec.balance.clone().unwrap_or_default();
    if status.phase.unwrap_or_default() == OperationPhase::Pending {
        if let Some(reason) = blocked(ctx, operation, cluster, namespace).await? {
            return Ok(Outcome::Fail(reason));
        }
        let how = match balance.by {
            crate::api::BalanceBy::Slots => "to even slot counts".to_owned(),
            crate::api::BalanceBy::Memory => {
                format!("so each master's data is within {}% of the mean", balance.tolerance_percent())
            }
        };
        return Ok(Outcome::Begin(
            format!("moving slots over the masters of {} {how} (spec.balance)", cluster.name_any()),
            "RebalanceStarted",
        ));
    }
    let name = operation.name_any();
    let cluster_status = cluster.status.clone().unwrap_or_default();
    if let Some(done) = cluster_status.balance.filter(|b| b.operation.as_deref() == Some(&name)) {
        return Ok(Outcome::Succeed(done.message.unwrap_or_else(|| "rebalanced".into())));
    }
    let reshard =
        cluster_status.reshard.filter(|r| r.plan.as_ref().and_then(|p| p.operation.as_deref()) == Some(&name));
    Ok(Outcome::Progress(match reshard {
        Some(r) => format!("{} of {} slots moved", r.slots_moved, r.slots_total),
        None => match cluster_status.step {
            Some(step) if step.name == "Refused" => {
                return Ok(Outcome::Fail(format!("the cluster refuses: {}", step.progress.unwrap_or_default())));
            }
            _ => "waiting for the cluster to plan it".into(),
        },
    }))
}

async fn running_operation(ctx: &Context, operation: &RedisOperation, namespace: &str) -> Result<Option<String>> {
    let api: Api<RedisOperation> = Api::namespaced(ctx.client.clone(), namespace);
    let all =
        api.list(&ListParams::default()).await.map_err(Error::kube(format!("list RedisOperations in {namespace}")))?;
    Ok(all
        .items
        .into_iter()
        .filter(|o| o.name_any() != operation.name_any() && o.spec.cluster_name == operation.spec.cluster_name)
        .find(|o| o.status.as_ref().and_then(|s| s.phase) == Some(OperationPhase::Running))
        .map(|o| o.name_any()))
}

/// One shard as Redis reports it: who is master, who follows, how far behind.
struct ShardView<'a> {
    pods: &'a [PodFact],
    facts: &'a std::collections::BTreeMap<String, RedisFact>,
}

enum Readiness {
    CaughtUp,
    MasterGone,
    Behind(i64),
    Gone(String),
}

impl<'a> ShardView<'a> {
    fn new(pods: &'a [PodFact], facts: &'a std::collections::BTreeMap<String, RedisFact>) -> Self {
        Self { pods, facts }
    }

    fn is_master(&self, pod: &str) -> bool {
        self.facts.get(pod).and_then(|f| f.myself()).is_some_and(|n| n.master && !n.slots.is_empty())
    }

    fn id(&self, pod: &str) -> Option<&str> {
        self.facts.get(pod)?.myself().map(|n| n.id.as_str())
    }

    /// The master and the replica to promote, or why there is none.
    fn choose(&self, target: Option<&str>, shard: usize) -> std::result::Result<(String, String), String> {
        let master = self
            .pods
            .iter()
            .find(|p| self.is_master(&p.name))
            .ok_or_else(|| format!("shard {shard} has no reachable master owning slots right now; retry later"))?;
        let master_id = self.id(&master.name).unwrap_or_default();
        let replicas: Vec<&PodFact> = self
            .pods
            .iter()
            .filter(|p| {
                self.facts
                    .get(&p.name)
                    .and_then(|f| f.myself())
                    .is_some_and(|n| n.master_id.as_deref() == Some(master_id))
            })
            .collect();
        if replicas.is_empty() {
            return Err(format!(
                "shard {shard} has no replica to promote (spec.replicasPerMaster is 0, or its replicas are not attached)"
            ));
        }
        let chosen = match target {
            Some(name) => replicas.iter().find(|p| p.name == name).ok_or_else(|| {
                let names: Vec<&str> = replicas.iter().map(|p| p.name.as_str()).collect();
                format!(
                    "spec.failover.targetPod {name} is not a replica of shard {shard}'s master {}; its replicas are {}",
                    master.name,
                    names.join(", ")
                )
            })?,
            None => replicas
                .iter()
                .max_by_key(|p| (self.facts[&p.name].promotable(), self.facts[&p.name].replication_offset))
                .expect("non-empty"),
        };
        Ok((master.name.clone(), chosen.name.clone()))
    }

    fn readiness(&self, from: &str, to: &str) -> Readiness {
        let Some(replica) = self.facts.get(to) else {
            return Readiness::Gone(format!("the replica {to} cannot be reached"));
        };
        let Some(master) = self.facts.get(from) else {
            return Readiness::MasterGone;
        };
        if !replica.promotable() {
            return Readiness::Behind(i64::MAX);
        }
        let lag = master.replication_offset.unwrap_or(0) - replica.replication_offset.unwrap_or(0);
        if lag > MAX_LAG_BYTES { Readiness::Behind(lag) } else { Readiness::CaughtUp }
    }
}

/// Records on a running failover that the cluster's reconcile sends its
/// command now (the checkpoint before the act), with an event on both.
pub(super) async fn mark_sent(ctx: &Context, cluster: &RedisCluster, name: &str, to: &str, force: bool) -> Result<()> {
    let key = kube::runtime::reflector::ObjectRef::new(name).within(&cluster.namespace().unwrap_or_default());
    let Some(operation) = ctx.caches.operations.get(&key) else { return Ok(()) };
    let status = operation.status.clone().unwrap_or_default();
    let how = if force { "CLUSTER FAILOVER FORCE (the master is unreachable)" } else { "CLUSTER FAILOVER" };
    let message = format!("sent {how} to {to}; waiting for the new roles");
    let next = RedisOperationStatus {
        failover_sent_time: Some(Time(Timestamp::now())),
        message: Some(message.clone()),
        ..status
    };
    write(ctx, &operation, next).await?;
    event(ctx, &operation, Some(cluster), EventType::Normal, "FailoverSent", message).await;
    Ok(())
}

async fn finish(
    ctx: &Context,
    operation: &RedisOperation,
    cluster: Option<&RedisCluster>,
    status: RedisOperationStatus,
    phase: OperationPhase,
    message: String,
) -> Result<()> {
    let succeeded = phase == OperationPhase::Succeeded;
    let now = Time(Timestamp::now());
    let condition = Condition {
        type_: "Complete".into(),
        status: if succeeded { "True" } else { "False" }.into(),
        reason: if succeeded { "Succeeded" } else { "Failed" }.into(),
        message: message.clone(),
        observed_generation: operation.metadata.generation,
        last_transition_time: now.clone(),
    };
    let next = RedisOperationStatus {
        phase: Some(phase),
        start_time: status.start_time.clone().or(Some(now.clone())),
        completion_time: Some(now),
        message: Some(message.clone()),
        conditions: vec![condition],
        ..status
    };
    write(ctx, operation, next).await?;
    if let Some(cluster) = cluster {
        ctx.nudge(cluster);
    }
    let (type_, reason) =
        if succeeded { (EventType::Normal, "OperationSucceeded") } else { (EventType::Warning, "OperationFailed") };
    tracing::info!(?phase, %message, "operation finished");
    event(ctx, operation, cluster, type_, reason, message).await;
    Ok(())
}

async fn write(ctx: &Context, operation: &RedisOperation, mut status: RedisOperationStatus) -> Result<()> {
    status.observed_generation = operation.metadata.generation;
    let api: Api<RedisOperation> = Api::namespaced(ctx.client.clone(), &operation.namespace().unwrap_or_default());
    let patch = crate::api::status_patch::<RedisOperation>(&status);
    api.patch_status(&operation.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(patch))
        .await
        .map_err(Error::kube("write RedisOperation status"))?;
    Ok(())
}

/// The same event on the operation and, when it exists, its cluster.
async fn event(
    ctx: &Context,
    operation: &RedisOperation,
    cluster: Option<&RedisCluster>,
    type_: EventType,
    reason: &str,
    note: String,
) {
    if let Some(cluster) = cluster {
        let on_cluster = format!("RedisOperation {}: {note}", operation.name_any());
        ctx.publish(&cluster.object_ref(&()), type_, reason, on_cluster).await;
    }
    ctx.publish(&operation.object_ref(&()), type_, reason, note).await;
}
