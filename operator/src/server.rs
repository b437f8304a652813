//! The operator's HTTP endpoints: `/healthz` (the process is alive),
//! `/readyz` (this replica leads and its controller runs, or it is a healthy
//! standby) and `/metrics` (Prometheus text).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

#[derive(Clone)]
pub struct ServerState {
    pub metrics: Arc<Metrics>,
    /// Set once the replica finished starting (as leader or standby).
    pub ready: Arc<AtomicBool>,
}

/// The operator's own routes; `main` merges them with the other components'.
pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Serves `app` on `addr` until the process stops.
pub async fn serve(addr: SocketAddr, app: Router) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving HTTP");
    // The peer address reaches handlers (the console limits sign-ins per client).
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
}

async fn readyz(State(state): State<ServerState>) -> impl IntoResponse {
    if state.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

async fn metrics(State(state): State<ServerState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], state.metrics.render())
}
