//! The operator's HTTP endpoints: `/healthz` (the process is alive),
//! `/readyz` (this replica leads and its controller runs, or it is a healthy
//! standby) and `/metrics` (Prometheus text, for a token RBAC lets `get`
//! `/metrics`: see [`crate::metrics_auth`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;
use crate::metrics_auth::MetricsAuth;

#[derive(Clone)]
pub struct ServerState {
    pub metrics: Arc<Metrics>,
    /// Set once the replica finished starting (as leader or standby).
    pub ready: Arc<AtomicBool>,
    /// Who may read `/metrics`; `None` serves it to anyone (tests of the
    /// router alone).
    pub metrics_auth: Option<Arc<MetricsAuth>>,
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

async fn metrics(State(state): State<ServerState>, headers: HeaderMap) -> axum::response::Response {
    if let Some(auth) = &state.metrics_auth {
        let answer = auth.check(&headers).await;
        if answer != StatusCode::OK {
            let challenge = [(header::WWW_AUTHENTICATE, "Bearer")];
            return (answer, challenge, "a bearer token allowed to get /metrics is required\n").into_response();
        }
    }
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], state.metrics.render()).into_response()
}
