//! Prometheus metrics under the names controller dashboards already use
//! (controller-runtime's), plus per-cluster Redis health gauges.

use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use futures::future::BoxFuture;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub const CONTROLLER: &str = "rediscluster";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub controller: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub namespace: String,
    pub cluster: String,
}

impl ClusterLabels {
    pub fn of(namespace: &str, cluster: &str) -> Self {
        Self { namespace: namespace.to_owned(), cluster: cluster.to_owned() }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub name: String,
}

pub struct Metrics {
    registry: Registry,
    pub reconcile_total: Family<ResultLabels, Counter>,
    pub reconcile_errors_total: Family<ControllerLabels, Counter>,
    pub reconcile_time_seconds: Family<ControllerLabels, Histogram>,
    pub workqueue_depth: Family<QueueLabels, Gauge>,
    pub rest_client_requests_total: Family<RequestLabels, Counter>,
    pub slots_assigned: Family<ClusterLabels, Gauge>,
    pub nodes_ready: Family<ClusterLabels, Gauge>,
    pub cluster_state_ok: Family<ClusterLabels, Gauge>,
    pub rollout_in_progress: Family<ClusterLabels, Gauge>,
    pub rollout_steps_total: Family<ClusterLabels, Counter>,
    pub rollout_rollbacks_total: Family<ClusterLabels, Counter>,
    pub conversion_reviews_total: Family<ReviewLabels, Counter>,
    pub conversion_objects_total: Counter,
    pub conversion_review_seconds: Histogram,
}

/// Reconcile-time buckets in seconds: fine below 50 ms, where a steady-state
/// reconcile lands (with an edge at the 20 ms target), coarse above, where
/// slot-moving steps land.
const RECONCILE_BUCKETS: [f64; 16] =
    [0.001, 0.002, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Conversion-review buckets in seconds: fine around the 5 ms target for a
/// 1,000-object list.
const REVIEW_BUCKETS: [f64; 12] = [0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.5];

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let reconcile_total = Family::<ResultLabels, Counter>::default();
        let reconcile_errors_total = Family::<ControllerLabels, Counter>::default();
        // Exposed at 0 from the start, so an alert on its rate has a series to read.
        drop(reconcile_errors_total.get_or_create(&ControllerLabels { controller: CONTROLLER.into() }));
        let reconcile_time_seconds =
            Family::<ControllerLabels, Histogram>::new_with_constructor(|| Histogram::new(RECONCILE_BUCKETS));
        let workqueue_depth = Family::<QueueLabels, Gauge>::default();
        let rest_client_requests_total = Family::<RequestLabels, Counter>::default();
        let slots_assigned = Family::<ClusterLabels, Gauge>::default();
        let nodes_ready = Family::<ClusterLabels, Gauge>::default();
        let cluster_state_ok = Family::<ClusterLabels, Gauge>::default();
        let rollout_in_progress = Family::<ClusterLabels, Gauge>::default();
        let rollout_steps_total = Family::<ClusterLabels, Counter>::default();
        let rollout_rollbacks_total = Family::<ClusterLabels, Counter>::default();
        let conversion_reviews_total = Family::<ReviewLabels, Counter>::default();
        let conversion_objects_total = Counter::default();
        let conversion_review_seconds = Histogram::new(REVIEW_BUCKETS);
        // prometheus-client appends `_total` to counters itself.
        registry.register("controller_runtime_reconcile", "Reconciles by result", reconcile_total.clone());
        registry.register(
            "controller_runtime_reconcile_errors",
            "Reconciles that failed",
            reconcile_errors_total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Time per reconcile",
            reconcile_time_seconds.clone(),
        );
        registry.register(
            "workqueue_depth",
            "Reconciles in progress (kube-runtime does not expose its queue)",
            workqueue_depth.clone(),
        );
        registry.register(
            "rest_client_requests",
            "Kubernetes API requests by method and status code",
            rest_client_requests_total.clone(),
        );
        registry.register("slotkeeper_cluster_slots_assigned", "Hash slots served, of 16384", slots_assigned.clone());
        registry.register("slotkeeper_cluster_nodes_ready", "Redis nodes that answered", nodes_ready.clone());
        registry.register(
            "slotkeeper_cluster_state_ok",
            "1 when every node reports cluster_state ok",
            cluster_state_ok.clone(),
        );
        registry.register(
            "slotkeeper_rollout_in_progress",
            "1 while a version rollout runs (also rolling back or halted)",
            rollout_in_progress.clone(),
        );
        registry.register(
            "slotkeeper_rollout_steps",
            "Rollout steps taken (Pods recreated, failovers)",
            rollout_steps_total.clone(),
        );
        registry.register(
            "slotkeeper_rollout_rollbacks",
            "Rollouts rolled back after a failed gate",
            rollout_rollbacks_total.clone(),
        );
        registry.register(
            "slotkeeper_conversion_reviews",
            "ConversionReviews answered by this replica's webhook, by result",
            conversion_reviews_total.clone(),
        );
        registry.register(
            "slotkeeper_conversion_objects",
            "Objects in the ConversionReviews this replica's webhook answered",
            conversion_objects_total.clone(),
        );
        registry.register(
            "slotkeeper_conversion_review_seconds",
            "Time to answer one ConversionReview, from its body read to its answer written",
            conversion_review_seconds.clone(),
        );
        Self {
            registry,
            reconcile_total,
            reconcile_errors_total,
            reconcile_time_seconds,
            workqueue_depth,
            rest_client_requests_total,
            slots_assigned,
            nodes_ready,
            cluster_state_ok,
            rollout_in_progress,
            rollout_steps_total,
            rollout_rollbacks_total,
            conversion_reviews_total,
            conversion_objects_total,
            conversion_review_seconds,
        }
    }
}

impl Metrics {
    /// The text exposition, with the process's resident memory appended.
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode_registry(&mut text, &self.registry).expect("writing to a String");
        // Our own samples go before the closing `# EOF`.
        text = format!("{}\n", text.trim_end().trim_end_matches("# EOF").trim_end());
        text += "# HELP process_resident_memory_bytes Resident memory size in bytes.\n";
        text += "# TYPE process_resident_memory_bytes gauge\n";
        text += &format!("process_resident_memory_bytes {}\n", resident_memory_bytes());
        text += "# EOF\n";
        text
    }

    /// Starts timing one reconcile; the guard records it when dropped.
    pub fn reconcile_started(self: &Arc<Self>) -> ReconcileTimer {
        let labels = ControllerLabels { controller: CONTROLLER.into() };
        self.workqueue_depth.get_or_create(&QueueLabels { name: CONTROLLER.into() }).inc();
        ReconcileTimer { metrics: self.clone(), started: Instant::now(), labels }
    }

    pub fn reconcile_finished(&self, result: &str) {
        self.reconcile_total
            .get_or_create(&ResultLabels { controller: CONTROLLER.into(), result: result.into() })
            .inc();
        if result == "error" {
            self.reconcile_errors_total.get_or_create(&ControllerLabels { controller: CONTROLLER.into() }).inc();
        }
    }

    /// One ConversionReview answered with `result` (`Success`, `Failure`, `BadRequest`).
    pub fn conversion_finished(&self, result: &str, objects: usize, took: std::time::Duration) {
        self.conversion_reviews_total.get_or_create(&ReviewLabels { result: result.into() }).inc();
        self.conversion_objects_total.inc_by(objects as u64);
        self.conversion_review_seconds.observe(took.as_secs_f64());
    }

    pub fn forget_cluster(&self, labels: &ClusterLabels) {
        self.slots_assigned.remove(labels);
        self.nodes_ready.remove(labels);
        self.cluster_state_ok.remove(labels);
        self.rollout_in_progress.remove(labels);
        self.rollout_steps_total.remove(labels);
        self.rollout_rollbacks_total.remove(labels);
    }
}

pub struct ReconcileTimer {
    metrics: Arc<Metrics>,
    started: Instant,
    labels: ControllerLabels,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.metrics.reconcile_time_seconds.get_or_create(&self.labels).observe(self.started.elapsed().as_secs_f64());
        self.metrics.workqueue_depth.get_or_create(&QueueLabels { name: CONTROLLER.into() }).dec();
    }
}

fn resident_memory_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    pages * 4096
}

/// A tower layer counting every Kubernetes API request by method and code.
#[derive(Clone)]
pub struct CountRequestsLayer(pub Arc<Metrics>);

impl<S> tower::Layer<S> for CountRequestsLayer {
    type Service = CountRequests<S>;
    fn layer(&self, inner: S) -> Self::Service {
        CountRequests { inner, metrics: self.0.clone() }
    }
}

#[derive(Clone)]
pub struct CountRequests<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S, B, RB> tower::Service<http::Request<B>> for CountRequests<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.method().to_string();
        let metrics = self.metrics.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "<error>".into(),
            };
            metrics.rest_client_requests_total.get_or_create(&RequestLabels { method, code }).inc();
            result
        })
    }
}
