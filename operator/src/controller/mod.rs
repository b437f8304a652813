//! The RedisCluster controller: one [`Context`], a reconcile that runs the
//! pipeline (observe → plan → act → report) and an error policy by class.

mod act;
mod apply;
pub mod cache;
pub(crate) mod observe;
mod operation;
pub mod report;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource as _, ResourceExt as _};
use tracing::Instrument as _;

use crate::api::names::FIELD_MANAGER;
use crate::api::{RedisCluster, RedisClusterStatus, StepStatus};
use crate::error::{Error, Result};
use crate::metrics::{ClusterLabels, Metrics};
use crate::plan::{self, Action, Observed};
use crate::publish;
use crate::redis::pool::Pool;
use cache::{Caches, Triggers};
use slotkeeper_readmodel::{ClusterKey, Publisher, Source};

/// Right after a step, look again at once (the next step usually follows);
/// while waiting on gossip, soon (Pod changes arrive by watch); once converged, a resync still
/// notices changes inside Redis that no Kubernetes watch reports, and its
/// observation is the console's sample (so the charts get one every ~10 s).
const REQUEUE_AFTER_STEP: Duration = Duration::from_millis(100);
const REQUEUE_WAITING: Duration = Duration::from_millis(200);
const REQUEUE_CONVERGED: Duration = Duration::from_secs(10);

/// `base` ±20%, so clusters created together do not resync in one burst.
fn jittered(base: Duration) -> Duration {
    use std::hash::BuildHasher as _;
    let random = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    base.mul_f64(0.8 + 0.4 * (random % 1000) as f64 / 1000.0)
}

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub caches: Caches,
    /// Open connections to Redis nodes, reused across reconciles.
    pub redis: Pool,
    /// What the last apply of each cluster wrote, so an unchanged cluster builds no object.
    applied: apply::Applied,
    /// Where every observation goes for the console (the read model).
    pub publisher: Publisher,
    /// Serialises the start of RedisOperations, so two created together
    /// cannot both see the other as not running yet.
    pub operation_starts: tokio::sync::Mutex<()>,
    /// Asks for a cluster's reconcile when something outside Kubernetes
    /// changed it (a failover by a RedisOperation), so status follows at once.
    nudges: tokio::sync::mpsc::UnboundedSender<ObjectRef<RedisCluster>>,
    nudged: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<ObjectRef<RedisCluster>>>>,
}

impl Context {
    pub fn new(client: Client, instance: String, metrics: Arc<Metrics>, caches: Caches, publisher: Publisher) -> Self {
        let reporter = Reporter { controller: FIELD_MANAGER.into(), instance: Some(instance) };
        let (nudges, nudged) = tokio::sync::mpsc::unbounded_channel();
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            caches,
            redis: Pool::default(),
            applied: Default::default(),
            publisher,
            operation_starts: Default::default(),
            nudges,
            nudged: std::sync::Mutex::new(Some(nudged)),
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
        self.metrics.forget_cluster(&ClusterLabels { namespace: namespace.to_owned(), cluster: name.to_owned() });
        self.publisher.forget(&ClusterKey::new(namespace, name));
    }

    async fn event(&self, cluster: &RedisCluster, type_: EventType, reason: &str, note: String) {
        self.publish(&cluster.object_ref(&()), type_, reason, note).await;
    }

    async fn publish(&self, object: &ObjectReference, type_: EventType, reason: &str, note: String) {
        let event = Event { type_, reason: reason.into(), note: Some(note), action: reason.into(), secondary: None };
        if let Err(error) = self.recorder.publish(&event, object).await {
            tracing::warn!(%error, "cannot publish event");
        }
    }
}

/// Runs the RedisCluster and RedisOperation controllers until they stop (the
/// process is stopping). `triggers` are the watches that fill `ctx.caches`.
pub async fn run(ctx: Arc<Context>, triggers: Triggers, namespace: Option<&str>) {
    futures::join!(run_clusters(ctx.clone(), triggers, namespace), operation::run(ctx, namespace));
}

async fn run_clusters(ctx: Arc<Context>, triggers: Triggers, namespace: Option<&str>) {
    let clusters: Api<RedisCluster> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let nudged = ctx.nudged.lock().expect("nudge lock").take().expect("the cluster controller runs once");
    Controller::new(clusters, watcher::Config::default())
        .reconcile_on(tokio_stream_of(nudged))
        .watches_stream(triggers.pods, |pod| cache::cluster_of(&pod))
        .owns_stream(triggers.secrets)
        .owns_stream(triggers.stateful_sets)
        .owns_stream(triggers.services)
        .owns_stream(triggers.config_maps)
        .owns_stream(triggers.disruption_budgets)
        .owns_stream(triggers.network_policies)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| {
            let ctx = ctx.clone();
            async move {
                match result {
                    // Failed reconciles are logged by the error policy.
                    Err(kube::runtime::controller::Error::ReconcilerFailed(..)) | Ok(_) => {}
                    // A cluster deleted without a finalizer in the way (`kubectl
                    // delete` propagates in the background) is gone before any
                    // reconcile sees its deletionTimestamp; its delete event ends here.
                    Err(kube::runtime::controller::Error::ObjectNotFound(gone)) => {
                        tracing::info!(cluster = %gone.name, namespace = gone.namespace.as_deref().unwrap_or_default(), "cluster deleted");
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
    let password = apply::password(ctx, cluster, namespace).await?;
    let mut pods = observe::pods(ctx, namespace, &name);
    tracing::debug!(pods = pods.len(), "observing redis");
    let key = format!("{namespace}/{name}");
    let live: std::collections::BTreeSet<&str> = pods.iter().filter_map(|p| p.ip.as_deref()).collect();
    ctx.redis.retain(&key, &live);
    let redis = observe::redis(&ctx.redis, &key, &pods, &password).await;
    observe::lost_nodes(ctx, &mut pods, &redis).await;
    let observed = Observed {
        shards: cluster.spec.masters.max(0) as usize,
        replicas_per_master: cluster.spec.replicas_per_master.max(0) as usize,
        pods,
        redis,
    };
    phases.lap("observe");
    let action = plan::plan(&observed);
    tracing::debug!(?action, "planned");
    phases.lap("plan");
    let step = (action != Action::Converged).then(|| {
        let (name, progress) = report::describe(&action);
        StepStatus { name: name.into(), progress: Some(progress) }.summary()
    });
    let observation = publish::observation(&observed.pods, &observed.redis, step, Source::Reconcile, Timestamp::now());
    ctx.publisher.publish(&ClusterKey::new(namespace, &name), observation);

    let applied = apply::owned_objects(ctx, cluster, &key, &password, &observed.shard_sizes()).await?;
    if !applied.is_empty() {
        ctx.event(cluster, EventType::Normal, "Applied", format!("applied {}", applied.join(", "))).await;
    }
    phases.lap("apply");

    let target =
        act::Target { namespace, cluster: &name, key: &key, password: &password, version: &cluster.spec.version };
    let step_started = Timestamp::now();
    let acted = act::act(ctx, &target, &action, &observed.pods).await;
    phases.lap("act");
    let status = report::build_status(cluster, &observed, &action, acted.is_ok(), step_started, Timestamp::now());
    let converged = action == Action::Converged;
    let labels = ClusterLabels { namespace: namespace.to_owned(), cluster: name.clone() };
    ctx.metrics.slots_assigned.get_or_create(&labels).set(i64::from(status.slots_assigned));
    ctx.metrics.nodes_ready.get_or_create(&labels).set(observed.redis.len() as i64);
    ctx.metrics.cluster_state_ok.get_or_create(&labels).set(i64::from(status.cluster_state.as_deref() == Some("ok")));
    if converged && cluster.status.as_ref().and_then(|s| s.phase) != status.phase {
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
        let note = format!("moved {} slots in {seconds:.1}s; slots are balanced", done.slots_total);
        ctx.event(cluster, EventType::Normal, "Rebalanced", note).await;
    }
    if let Action::Refused(reason) = &action
        && cluster.status.as_ref().and_then(|s| s.step.as_ref()).is_none_or(|s| s.progress.as_ref() != Some(reason))
    {
        tracing::warn!(%reason, "refused");
        ctx.event(cluster, EventType::Warning, crate::api::names::REASON_REFUSED, reason.clone()).await;
    }
    write_status(ctx, cluster, status).await?;
    phases.lap("report");
    tracing::debug!(phases = %phases, "reconcile timing");
    let requeue = match acted? {
        Some((reason, note)) => {
            tracing::info!(%reason, %note, "acted");
            ctx.event(cluster, EventType::Normal, &reason, note).await;
            REQUEUE_AFTER_STEP
        }
        None if converged || matches!(action, Action::Refused(_)) => jittered(REQUEUE_CONVERGED),
        None => REQUEUE_WAITING,
    };
    Ok(Requeue::requeue(requeue))
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
    let api: Api<RedisCluster> = Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let patch = crate::api::status_patch::<RedisCluster>(&status);
    api.patch_status(&cluster.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(patch))
        .await
        .map_err(Error::kube("write status"))?;
    Ok(())
}
