//! The RedisCluster controller: one [`Context`], a reconcile that runs the
//! pipeline (observe → plan → act → report) and an error policy by class.

mod act;
mod apply;
mod balance;
pub mod cache;
pub mod events;
pub(crate) mod observe;
mod operation;
pub mod report;
pub(crate) mod users;
mod written;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource as _, ResourceExt as _};
use tracing::Instrument as _;

use crate::api::lag::ReplicationLag;
use crate::api::names::FIELD_MANAGER;
use crate::api::{RedisCluster, RedisClusterStatus, StepStatus};
use crate::error::{Error, Result};
use crate::metrics::{ClusterLabels, Metrics};
use crate::plan::rollout::RolloutPlan;
use crate::plan::{self, Action, Observed};
use crate::publish;
use crate::redis::pool::Pool;
use crate::resources::ShardShape;
use cache::{Caches, Triggers};
use events::{EventType, Events};
use slotkeeper_readmodel::scope::Namespaces;
use slotkeeper_readmodel::{ClusterKey, Publisher, Source};

/// Right after a step, look again at once (the next step usually follows);
/// while waiting on gossip, soon (Pod changes arrive by watch); once converged, a resync still
/// notices changes inside Redis that no Kubernetes watch reports, and its
/// observation is the console's sample (so the charts get one every ~10 s).
const REQUEUE_AFTER_STEP: Duration = Duration::from_millis(100);
const REQUEUE_WAITING: Duration = Duration::from_millis(200);
const REQUEUE_CONVERGED: Duration = Duration::from_secs(10);
const REQUEUE_CATCHING_UP: Duration = Duration::from_secs(1);

/// `base` ±20%, so clusters created together do not resync in one burst.
fn jittered(base: Duration) -> Duration {
    use std::hash::BuildHasher as _;
    let random = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    base.mul_f64(0.8 + 0.4 * (random % 1000) as f64 / 1000.0)
}

/// A Pod runs at least this long before it is recreated in another
/// failure domain, so a scheduler that keeps choosing the same domain
/// cannot make Pods churn.
const MOVE_PODS_AFTER: Duration = Duration::from_secs(60);

/// The spec's own scheduling rules (a node selector or affinity) decide
/// where Pods may go: the operator does not move Pods to other domains.
fn own_scheduling(cluster: &RedisCluster) -> bool {
    cluster.spec.scheduling.as_ref().is_some_and(|s| !s.node_selector.is_empty() || s.affinity.is_some())
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub events: Events,
    pub metrics: Arc<Metrics>,
    pub caches: Caches,
    /// Open connections to Redis nodes, reused across reconciles.
    pub redis: Pool,
    /// What the last apply of each cluster wrote, so an unchanged cluster builds no object.
    applied: apply::Applied,
    /// The status each cluster's last write returned, while the cache lags behind it.
    written: written::Written,
    /// Where every observation goes for the console (the read model).
    pub publisher: Publisher,
    /// Nodes' labels, for each Pod's failure domain.
    node_labels: observe::NodeLabels,
    /// Domains with a Node that takes Pods now, for re-placing replicas.
    open_domains: observe::OpenDomains,
    /// Serialises the start of RedisOperations, so two created together
    /// cannot both see the other as not running yet.
    pub operation_starts: tokio::sync::Mutex<()>,
    /// Asks for a cluster's reconcile when something outside Kubernetes
    /// changed it (a failover by a RedisOperation), so status follows at once.
    nudges: tokio::sync::mpsc::UnboundedSender<ObjectRef<RedisCluster>>,
    nudged: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<ObjectRef<RedisCluster>>>>,
    /// Clusters reconciled successfully by this process: the leader says how
    /// many on its Lease, so an upgrade knows when a new leader has seen them all.
    reconciled: Arc<std::sync::Mutex<std::collections::BTreeSet<(String, String)>>>,
}

impl Context {
    /// How many clusters this process has reconciled successfully, as a
    /// counter shared with whoever reports it (the leader Lease).
    pub fn reconciled_counter(&self) -> impl Fn() -> usize + Send + Sync + 'static {
        let reconciled = self.reconciled.clone();
        move || reconciled.lock().expect("reconciled lock").len()
    }

    pub fn new(client: Client, instance: String, metrics: Arc<Metrics>, caches: Caches, publisher: Publisher) -> Self {
        let (nudges, nudged) = tokio::sync::mpsc::unbounded_channel();
        Self {
            events: Events::new(client.clone(), FIELD_MANAGER.into(), instance),
            client,
            metrics,
            caches,
            redis: Pool::default(),
            applied: Default::default(),
            written: Default::default(),
            publisher,
            node_labels: Default::default(),
            open_domains: Default::default(),
            operation_starts: Default::default(),
            nudges,
            nudged: std::sync::Mutex::new(Some(nudged)),
            reconciled: Default::default(),
        }
    }

    /// Reconciles `cluster` soon, whatever else triggers it.
    pub fn nudge(&self, cluster: &RedisCluster) {
        // The receiver lives as long as the controller; a send fails only while stopping.
        let _ = self.nudges.send(ObjectRef::from_obj(cluster));
    }

    /// Drops what is kept for a deleted cluster: its Redis connections, what
    /// was applied, its metric series.
    fn forget(&self, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        self.redis.forget_cluster(&key);
        self.applied.forget_cluster(&key);
        self.written.forget(&key);
        self.metrics.forget_cluster(&ClusterLabels { namespace: namespace.to_owned(), cluster: name.to_owned() });
        self.publisher.forget(&ClusterKey::new(namespace, name));
    }

    async fn event(&self, cluster: &RedisCluster, type_: EventType, reason: &str, note: String) {
        self.publish(&cluster.object_ref(&()), type_, reason, note).await;
    }

    async fn publish(&self, object: &ObjectReference, type_: EventType, reason: &str, note: String) {
        if let Err(error) = self.events.publish(object, type_, reason, note).await {
            tracing::warn!(%error, "cannot publish event");
        }
    }
}

/// Runs the RedisCluster and RedisOperation controllers until they stop (the
/// process is stopping). `triggers` are the watches that fill `ctx.caches`.
pub async fn run(ctx: Arc<Context>, triggers: Triggers, namespaces: &Namespaces) {
    futures::join!(run_clusters(ctx.clone(), triggers, namespaces), operation::run(ctx, namespaces));
}

async fn run_clusters(ctx: Arc<Context>, triggers: Triggers, namespaces: &Namespaces) {
    let nudged = ctx.nudged.lock().expect("nudge lock").take().expect("the cluster controller runs once");
    let (reader, writer) = kube::runtime::reflector::store();
    let watched = namespaces
        .watch::<RedisCluster>(&ctx.client, watcher::Config::default())
        .modify(cache::slim)
        .reflect(writer)
        .applied_objects();
    Controller::for_stream(watched, reader)
        .reconcile_on(tokio_stream_of(nudged))
        .watches_stream(triggers.pods, |pod| cache::cluster_of(&pod))
        .owns_stream(triggers.stateful_sets)
        .owns_stream(triggers.services)
        .owns_stream(triggers.config_maps)
        .owns_stream(triggers.disruption_budgets)
        .owns_stream(triggers.network_policies)
        .watches_stream(triggers.operations, |op| {
            Some(ObjectRef::new(&op.spec.cluster_name).within(op.metadata.namespace.as_deref()?))
        })
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| {
            let ctx = ctx.clone();
            async move {
                match result {
                    // Failed reconciles are logged by the error policy.
                    Ok((cluster, _)) => {
                        let key = (cluster.namespace.unwrap_or_default(), cluster.name);
                        ctx.reconciled.lock().expect("reconciled lock").insert(key);
                    }
                    Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
                    // A cluster deleted without a finalizer in the way (`kubectl
                    // delete` propagates in the background) is gone before any
                    // reconcile sees its deletionTimestamp; its delete event ends here.
                    Err(kube::runtime::controller::Error::ObjectNotFound(gone)) => {
                        tracing::info!(cluster = %gone.name, namespace = gone.namespace.as_deref().unwrap_or_default(), "cluster deleted");
                        let key = (gone.namespace.clone().unwrap_or_default(), gone.name.clone());
                        ctx.reconciled.lock().expect("reconciled lock").remove(&key);
                        ctx.forget(gone.namespace.as_deref().unwrap_or_default(), &gone.name);
                    }
                    Err(error) => tracing::warn!(%error, "controller error (watch or queue)"),
                }
            }
        })
        .await;
}

fn tokio_stream_of<T: Send + 'static>(
    mut receiver: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

fn error_policy(cluster: Arc<RedisCluster>, error: &Error, _ctx: Arc<Context>) -> Requeue {
    tracing::warn!(cluster = %cluster.name_any(), namespace = cluster.namespace().unwrap_or_default(), class = error.class(), %error, "reconcile failed");
    Requeue::requeue(error.retry_after())
}

async fn reconcile(cluster: Arc<RedisCluster>, ctx: Arc<Context>) -> Result<Requeue> {
    let name = cluster.name_any();
    let namespace = cluster.namespace().unwrap_or_default();
    let span = tracing::info_span!("reconcile", cluster = %name, namespace = %namespace);
    let _timer = ctx.metrics.reconcile_started();
    let result = reconcile_in_span(cluster, ctx.clone(), namespace).instrument(span).await;
    ctx.metrics.reconcile_finished(if result.is_ok() { "success" } else { "error" });
    result
}

async fn reconcile_in_span(cluster: Arc<RedisCluster>, ctx: Arc<Context>, namespace: String) -> Result<Requeue> {
    tracing::debug!("waiting for caches");
    ctx.caches.synced().await;
    let cluster = ctx.written.freshest(cluster);
    if cluster.metadata.deletion_timestamp.is_some() {
        ctx.forget(&namespace, &cluster.name_any());
        return Ok(Requeue::await_change()); // owner references clean up
    }
    if cluster.spec.paused {
        write_status(&ctx, &cluster, report::paused_status(&cluster, Timestamp::now())).await?;
        return Ok(Requeue::requeue(jittered(REQUEUE_CONVERGED)));
    }
    match reconcile_steps(&cluster, &ctx, &namespace).await {
        Err(Error::InvalidSpec(message)) => {
            ctx.event(&cluster, EventType::Warning, crate::api::names::REASON_INVALID_SPEC, message.clone()).await;
            Err(Error::InvalidSpec(message))
        }
        other => other,
    }
}

async fn reconcile_steps(cluster: &RedisCluster, ctx: &Context, namespace: &str) -> Result<Requeue> {
    let name = cluster.name_any();
    let mut phases = PhaseTimer::start();
    let users = users::read(&ctx.client, cluster, namespace).await?;
    let mut pods = observe::pods(ctx, namespace, &name);
    tracing::debug!(pods = pods.len(), "observing redis");
    let key = format!("{namespace}/{name}");
    let live: std::collections::BTreeSet<&str> = pods.iter().filter_map(|p| p.ip.as_deref()).collect();
    ctx.redis.retain(&key, &live);
    let redis = observe::redis(&ctx.redis, &key, &pods, &users.logins).await;
    observe::lost_nodes(ctx, &mut pods, &redis).await;
    ctx.node_labels.fill_domains(&ctx.client, &mut pods, cluster.spec.topology_key()).await;
    let intent = ctx.caches.failover_intent(namespace, &name);
    let restart = ctx.caches.restart_intent(namespace, &name);
    let running = cluster
        .status
        .as_ref()
        .and_then(|s| s.upgrade.as_ref())
        .filter(|_| cluster.status.as_ref().is_some_and(plan::rollout::in_progress));
    let mut observed = Observed {
        shards: cluster.spec.masters.max(0) as usize,
        replicas_per_master: cluster.spec.replicas_per_master.max(0) as usize,
        pods,
        redis,
        surge: running.and_then(|u| u.surge_shard).map(|s| s.max(0) as usize),
        roles_held: running.is_some() || intent.is_some() || restart.is_some(),
        user_placed: ctx.caches.user_placed_masters(namespace, &name),
        open_domains: if own_scheduling(cluster) {
            Default::default()
        } else {
            ctx.open_domains.of(&ctx.client, cluster.spec.topology_key()).await
        },
        movable_before: Timestamp::now().checked_sub(MOVE_PODS_AFTER).ok(),
        balance: balance_intent(cluster, ctx.caches.rebalance_intent(namespace, &name))?,
        users: plan::UsersIntent {
            pending: (applied_users(cluster).map(|a| &a.revision) != Some(&users.revision))
                .then(|| users.revision.clone()),
        },
    };
    phases.lap("observe");
    let cluster_step = plan::plan(&observed);
    let healthy = match &cluster_step {
        Action::Converged => Ok(()),
        other => Err(report::describe(other).1),
    };
    let rollout = plan::rollout::plan(cluster, &observed, healthy, restart.as_deref(), Timestamp::now());
    observed.surge = rollout.surge;
    // The cluster's own health first; the rollout steps only when it has
    // nothing to do, except that rolling back replaces a Pod that cannot run
    // (the cluster waits for that very Pod).
    let rolling_back =
        rollout.status.as_ref().is_some_and(|u| u.phase == crate::api::rollout::RolloutPhase::RollingBack);
    // A running RedisOperation goes before the rollout (one intent at a
    // time), and may act while the cluster waits (FORCE for a lost master).
    let intent_step = intent.as_ref().and_then(|i| plan::intents::failover_step(&observed, i));
    // No master role moves while a slot is open (the repair goes first).
    let slots_open = plan::moves::slots_open(&observed);
    let action = match (&cluster_step, intent_step, &rollout.action) {
        _ if slots_open => cluster_step,
        (Action::Converged | Action::Wait(_), Some(step), _) => step,
        _ if intent.is_some() => cluster_step,
        (Action::Converged, None, Some(step)) => step.clone(),
        (Action::Wait(_), None, Some(step @ Action::RecreatePod { .. })) if rolling_back => step.clone(),
        _ => cluster_step,
    };
    let rollout_step = matches!(action, Action::RecreatePod { .. })
        || (matches!(action, Action::Failover { .. }) && rollout.action.as_ref() == Some(&action));
    tracing::debug!(?action, "planned");
    phases.lap("plan");
    let step = (action != Action::Converged).then(|| {
        let (name, progress) = report::describe(&action);
        StepStatus { name: name.into(), progress: Some(progress) }.summary()
    });
    let observation = publish::observation(&observed.pods, &observed.redis, step, Source::Reconcile, Timestamp::now());
    ctx.publisher.publish(&ClusterKey::new(namespace, &name), observation);

    for entry in &rollout.in_use {
        crate::config::user_lines(&cluster.spec.redis.config, entry, &rollout.in_use).map_err(Error::InvalidSpec)?;
    }
    if let Some(acl) = &cluster.spec.acl {
        slotkeeper_api::acl::validate(acl, &rollout.in_use).map_err(|e| Error::InvalidSpec(e.to_string()))?;
    }
    let shapes: std::collections::BTreeMap<usize, ShardShape> = observed
        .shard_sizes()
        .into_iter()
        .map(|(shard, pods)| {
            let image = rollout.images.get(shard).cloned().unwrap_or_else(|| rollout.current.2.clone());
            let release = rollout.releases.get(shard).copied().unwrap_or(rollout.in_use[0]);
            (shard, ShardShape { pods, image, conf: crate::config::file_name(release) })
        })
        .collect();
    let applied = apply::owned_objects(ctx, cluster, &key, &users, &shapes, &rollout.in_use).await?;
    if !applied.is_empty() {
        ctx.event(cluster, EventType::Normal, "Applied", format!("applied {}", applied.join(", "))).await;
    }
    phases.lap("apply");

    let release = crate::api::catalog::lookup(rollout.current.0, &rollout.current.1);
    let applied_before = applied_users(cluster).map(|a| a.users.clone()).unwrap_or_default();
    let target =
        act::Target { namespace, cluster: &name, key: &key, users: &users, applied_before: &applied_before, release };
    let step_started = Timestamp::now();
    if let Action::Failover { pod, force, operation: Some(operation), .. } = &action {
        // The operation's status records the command before it is sent:
        // a restarted operator waits for its outcome instead of sending again.
        operation::mark_sent(ctx, cluster, operation, pod, *force).await?;
    }
    if rollout_step {
        // The checkpoint goes first: a crash after the step finds it recorded
        // (a failover sent is not sent again while Redis settles).
        let checkpoint = report::build_status(cluster, &observed, &action, &rollout, false, step_started, step_started);
        write_status(ctx, cluster, checkpoint).await?;
        ctx.metrics.rollout_steps_total.get_or_create(&ClusterLabels::of(namespace, &name)).inc();
    }
    let (acted, planned) = match balance::plan(ctx, &target, &action).await {
        Ok(Some((plan, note))) => (Ok(Some(("RebalancePlanned".to_owned(), note))), Some(plan)),
        Ok(None) => (act::act(ctx, &target, &action, &observed.pods).await, None),
        Err(error) => (Err(error), None),
    };
    phases.lap("act");
    let mut status =
        report::build_status(cluster, &observed, &action, &rollout, acted.is_ok(), step_started, Timestamp::now());
    report::record_balance(&mut status, &action, planned, Timestamp::now());
    if let (Action::ApplyUsers { revision, .. }, Ok(_)) = (&action, &acted) {
        status.acl = Some(crate::api::AclStatus { revision: revision.clone(), users: users.applications.clone() });
    }
    rollout_events(ctx, cluster, &status, &rollout).await;
    let converged = action == Action::Converged;
    let labels = ClusterLabels { namespace: namespace.to_owned(), cluster: name.clone() };
    ctx.metrics.slots_assigned.get_or_create(&labels).set(i64::from(status.slots_assigned));
    ctx.metrics.nodes_ready.get_or_create(&labels).set(observed.redis.len() as i64);
    ctx.metrics.cluster_state_ok.get_or_create(&labels).set(i64::from(status.cluster_state.as_deref() == Some("ok")));
    ctx.metrics.rollout_in_progress.get_or_create(&labels).set(i64::from(plan::rollout::in_progress(&status)));
    if converged && rollout.refusal.is_none() && cluster.status.as_ref().and_then(|s| s.phase) != status.phase {
        ctx.event(
            cluster,
            EventType::Normal,
            "ClusterReady",
            format!("{} masters serve all 16384 slots", status.ready_masters),
        )
        .await;
    }
    if let (None, Some(done)) = (&status.reshard, cluster.status.as_ref().and_then(|s| s.reshard.as_ref())) {
        let seconds = done.started_time.as_ref().map_or(0.0, |t| Timestamp::now().duration_since(t.0).as_secs_f64());
        let how = match (&action, &status.balance) {
            (Action::FinishBalance { .. }, Some(balance)) => balance.message.clone().unwrap_or_default(),
            _ => "slots are balanced".to_owned(),
        };
        let note = format!("moved {} slots in {seconds:.1}s; {how}", done.slots_total);
        ctx.event(cluster, EventType::Normal, "Rebalanced", note).await;
    }
    if let Action::Refused(reason) = &action
        && cluster.status.as_ref().and_then(|s| s.step.as_ref()).is_none_or(|s| s.progress.as_ref() != Some(reason))
    {
        tracing::warn!(%reason, "refused");
        ctx.event(cluster, EventType::Warning, crate::api::names::REASON_REFUSED, reason.clone()).await;
    }
    // A replica still syncing or behind: look again soon, so the status says
    // when it has caught up (not only at the next 10 s resync).
    let catching_up = status.replication_lag.is_some_and(|lag| lag != ReplicationLag::InSync);
    write_status(ctx, cluster, status).await?;
    if converged && !catching_up {
        // Until the next resync (~10 s) its connections would sit idle, and
        // an idle connection's buffers cost ~20 KiB: 6 MiB for a hundred
        // clusters. A resync reconnects (a handshake and AUTH) instead; a
        // cluster with work going on keeps them.
        ctx.redis.forget_cluster(&key);
    }
    phases.lap("report");
    tracing::debug!(phases = %phases, "reconcile timing");
    let requeue = match acted? {
        Some((reason, note)) => {
            tracing::info!(%reason, %note, "acted");
            ctx.event(cluster, EventType::Normal, &reason, note).await;
            REQUEUE_AFTER_STEP
        }
        None if converged && catching_up => REQUEUE_CATCHING_UP,
        None if converged || matches!(action, Action::Refused(_)) => jittered(REQUEUE_CONVERGED),
        None => REQUEUE_WAITING,
    };
    Ok(Requeue::requeue(requeue))
}

/// What status says every node's users were last made from.
fn applied_users(cluster: &RedisCluster) -> Option<&crate::api::AclStatus> {
    cluster.status.as_ref()?.acl.as_ref()
}

/// `spec.balance`, the `Rebalance` operation waiting (one whose outcome
/// `status.balance` does not record yet) and the checkpointed plan.
fn balance_intent(cluster: &RedisCluster, operation: Option<String>) -> Result<plan::BalanceIntent> {
    let spec = cluster.spec.balance.clone().unwrap_or_default();
    let status = cluster.status.as_ref();
    let done = status.and_then(|s| s.balance.as_ref()).and_then(|b| b.operation.as_ref());
    let plan = match status.and_then(|s| s.reshard.as_ref()).and_then(|r| r.plan.as_ref()) {
        Some(p) => Some(plan::PlanInProgress::of(p).map_err(Error::InvalidSpec)?),
        None => None,
    };
    Ok(plan::BalanceIntent {
        by: spec.by,
        tolerance_percent: spec.tolerance_percent(),
        operation: operation.filter(|op| done != Some(op)),
        plan,
    })
}

/// An event for each change of a rollout's course: started, the canary
/// baking, the point of no return, rolling back, rolled back, halted,
/// completed; and a refused version, once.
async fn rollout_events(ctx: &Context, cluster: &RedisCluster, status: &RedisClusterStatus, rollout: &RolloutPlan) {
    use crate::api::rollout::RolloutPhase;
    let old = cluster.status.clone().unwrap_or_default();
    let (before, after) = (old.upgrade.as_ref(), status.upgrade.as_ref());
    let labels = ClusterLabels::of(&cluster.namespace().unwrap_or_default(), &cluster.name_any());
    if let Some(reason) = &rollout.refusal {
        let ready_said = |s: &RedisClusterStatus| {
            s.conditions.iter().find(|c| c.type_ == crate::api::names::CONDITION_READY).map(|c| c.message.clone())
        };
        if ready_said(&old) != ready_said(status) {
            ctx.event(cluster, EventType::Warning, crate::api::names::REASON_VERSION_REFUSED, reason.clone()).await;
        }
    }
    let Some(after) = after else { return };
    let changed = |f: fn(&crate::api::rollout::UpgradeStatus) -> bool| before.is_none_or(|b| !f(b)) && f(after);
    if before.is_none_or(|b| b.start_time != after.start_time) {
        let note = format!(
            "rolling out {} → {} ({}, {} shard(s), canary shard {}){}",
            after.from,
            after.to,
            after.to_image,
            after.shards_total,
            after.canary_shard,
            after.final_target.as_ref().map(|t| format!("; then on to {t}")).unwrap_or_default()
        );
        ctx.event(cluster, EventType::Normal, "RolloutStarted", note).await;
    }
    if changed(|u| u.canary_bake_until.is_some()) {
        let until = after.canary_bake_until.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
        ctx.event(
            cluster,
            EventType::Normal,
            "CanaryBaking",
            format!("canary shard {} upgraded; baking until {until}", after.canary_shard),
        )
        .await;
    }
    if changed(|u| u.point_of_no_return_time.is_some()) {
        let note = format!(
            "a node on {} is master: the point of no return is passed; failed gates now halt instead of rolling back",
            after.to
        );
        ctx.event(cluster, EventType::Normal, "PointOfNoReturn", note).await;
    }
    let phase_changed = before.is_none_or(|b| b.phase != after.phase);
    if !phase_changed {
        return;
    }
    let message = after.message.clone().unwrap_or_default();
    match after.phase {
        RolloutPhase::RollingBack => {
            ctx.metrics.rollout_rollbacks_total.get_or_create(&labels).inc();
            ctx.event(cluster, EventType::Warning, "RolloutRollingBack", message).await;
        }
        RolloutPhase::RolledBack => {
            let why =
                after.last_rollback.as_ref().map(|r| format!("gate {}: {}", r.gate, r.reason)).unwrap_or_default();
            let note =
                format!("every node runs {} again; {} is not retried until spec changes ({why})", after.from, after.to);
            ctx.event(cluster, EventType::Warning, "RolloutRolledBack", note).await;
        }
        RolloutPhase::Halted => ctx.event(cluster, EventType::Warning, "RolloutHalted", message).await,
        RolloutPhase::Completed => {
            let took = after
                .start_time
                .as_ref()
                .zip(after.completion_time.as_ref())
                .map_or(0.0, |(a, b)| b.0.duration_since(a.0).as_secs_f64());
            let note = format!("every node runs {} ({}); took {took:.0}s", after.to, after.to_image);
            ctx.event(cluster, EventType::Normal, "RolloutCompleted", note).await;
        }
        RolloutPhase::Progressing => {}
    }
}

/// Wall time per reconcile phase, for the debug log: which phase a slow
/// reconcile spent its time in.
struct PhaseTimer {
    last: std::time::Instant,
    laps: Vec<(&'static str, Duration)>,
}

impl PhaseTimer {
    fn start() -> Self {
        Self { last: std::time::Instant::now(), laps: Vec::with_capacity(5) }
    }

    fn lap(&mut self, phase: &'static str) {
        let now = std::time::Instant::now();
        self.laps.push((phase, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for PhaseTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (phase, took)) in self.laps.iter().enumerate() {
            write!(f, "{}{phase}={:.2}ms", if i == 0 { "" } else { " " }, took.as_secs_f64() * 1000.0)?;
        }
        Ok(())
    }
}

async fn write_status(ctx: &Context, cluster: &RedisCluster, status: RedisClusterStatus) -> Result<()> {
    if cluster.status.as_ref() == Some(&status) {
        return Ok(());
    }
    // Writes are rare by design (none in steady state): say what changed.
    tracing::info!(changed = ?changed_fields(cluster.status.as_ref(), &status), "writing status");
    let api: Api<RedisCluster> = Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let patch = crate::api::status_patch::<RedisCluster>(&status);
    let written = api
        .patch_status(&cluster.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(patch))
        .await
        .map_err(Error::kube("write status"))?;
    ctx.written.remember(written);
    Ok(())
}

/// The status fields that differ, down to each node's (`nodes[<pod>].role`).
fn changed_fields(before: Option<&RedisClusterStatus>, after: &RedisClusterStatus) -> Vec<String> {
    let (before, after) =
        (serde_json::to_value(before).unwrap_or_default(), serde_json::to_value(after).unwrap_or_default());
    let empty = serde_json::Map::new();
    let fields = |v: &serde_json::Value| v.as_object().cloned().unwrap_or_default();
    let (b, a) = (fields(&before), fields(&after));
    let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut changed = Vec::new();
    for key in keys.into_iter().filter(|k| b.get(*k) != a.get(*k)) {
        let nodes = |m: &serde_json::Map<String, serde_json::Value>| -> Vec<serde_json::Value> {
            m.get("nodes").and_then(|n| n.as_array()).cloned().unwrap_or_default()
        };
        if key != "nodes" {
            changed.push(key.clone());
            continue;
        }
        let (old, new) = (nodes(&b), nodes(&a));
        for node in &new {
            let pod = node["pod"].as_str().unwrap_or_default();
            let was = old.iter().find(|n| n["pod"] == node["pod"]).and_then(|n| n.as_object()).unwrap_or(&empty);
            let now = node.as_object().unwrap_or(&empty);
            let mut fields: Vec<&String> = was.keys().chain(now.keys()).collect();
            fields.sort();
            fields.dedup();
            for field in fields.into_iter().filter(|f| was.get(*f) != now.get(*f)) {
                changed.push(format!("nodes[{pod}].{field}"));
            }
        }
        if old.len() != new.len() {
            changed.push(format!("nodes ({} → {})", old.len(), new.len()));
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NodeStatus;

    #[test]
    fn changed_fields_name_the_node_and_its_field() {
        let node = |pod: &str, role: Option<&str>| NodeStatus {
            pod: pod.into(),
            role: role.map(String::from),
            ..Default::default()
        };
        let before = RedisClusterStatus {
            nodes: vec![node("c-0", Some("master")), node("c-1", Some("replica"))],
            ..Default::default()
        };
        let mut after = before.clone();
        after.nodes[1].role = None;
        after.ready_masters = 2;
        assert_eq!(changed_fields(Some(&before), &after), ["nodes[c-1].role", "readyMasters"]);
        assert!(changed_fields(Some(&before), &before).is_empty());
    }
}
