//! The web console, served by the operator process on every replica.
//!
//! ```text
//! browser ──▶ security (CSP nonce, same-origin writes) ──▶ session cookie ──▶
//!   pages   GET  /, /clusters/{ns}/{name}[/scale], /signin   read model ──▶ Leptos (SSR) ──▶ HTML
//!           GET  /upgrades                                   Kubernetes API *as the user* ──▶ Leptos (SSR) ──▶ HTML
//!   live    GET  /live/…                                     read model changes ──▶ SSE fragments
//!   actions POST /actions/…  (server functions)               Kubernetes API *as the user* ──▶ redirect + message
//! ```
//!
//! It reads the [`ReadModel`] and never the controller's state; it writes
//! nothing itself: every change is a Kubernetes call carrying the signed-in
//! user's own token. Pages are rendered on the server and work without any
//! script; `assets/console.js` only keeps them live.
#![forbid(unsafe_code)]

pub mod access;
pub mod actions;
pub mod keys;
pub mod limits;
pub mod live;
pub mod pages;
pub mod render;
mod routes;
pub mod security;
pub mod session;
pub mod session_store;
pub mod upgrade_plans;
pub mod users;
pub mod view;

use std::sync::Arc;

use axum::Router;
use axum::http::HeaderValue;
use axum::routing::{get, post};
use slotkeeper_readmodel::ReadModel;
use tower_http::set_header::SetResponseHeaderLayer;

use access::Access;
use keys::SessionKeys;
use render::Renders;
use session_store::SessionStore;
use users::UserClients;

/// What the console is built from.
pub struct ConsoleConfig {
    pub readmodel: ReadModel,
    /// The operator's own client: TokenReviews and the session key Secret.
    pub client: kube::Client,
    /// Where the apiserver is and how to trust it; the console's calls for a
    /// user take only this from it, never the operator's credentials.
    pub user_config: kube::Config,
    /// The operator's namespace, where the session key Secret lives.
    pub key_namespace: String,
}

/// Everything a console request needs, shared.
pub struct Console {
    pub(crate) readmodel: ReadModel,
    pub(crate) client: kube::Client,
    pub(crate) users: UserClients,
    pub(crate) access: Access,
    pub(crate) keys: Arc<SessionKeys>,
    pub(crate) sessions: SessionStore,
    pub(crate) renders: Renders,
    pub(crate) sign_ins: limits::SignInLimiter,
}

/// The console's routes, to merge beside the operator's. The session key is
/// loaded in the background; until then pages answer 503.
pub fn router(config: ConsoleConfig) -> Router {
    let keys = SessionKeys::load(config.client.clone(), config.key_namespace.clone());
    routes(Console {
        sessions: SessionStore::new(config.client.clone(), &config.key_namespace),
        readmodel: config.readmodel,
        users: UserClients::new(config.user_config),
        client: config.client,
        access: Access::default(),
        keys,
        renders: Renders::default(),
        sign_ins: limits::SignInLimiter::default(),
    })
}

fn routes(console: Console) -> Router {
    let console = Arc::new(console);
    let mut router = Router::new()
        .route("/", get(routes::clusters_page))
        .route("/signin", get(routes::sign_in_page))
        .route("/clusters/{namespace}/{name}", get(routes::cluster_page))
        .route("/clusters/{namespace}/{name}/scale", get(routes::scale_preview))
        .route("/clusters/{namespace}/{name}/version", get(routes::version_preview))
        .route(pages::paths::UPGRADES, get(routes::upgrades_page))
        .route("/live/clusters", get(live::clusters))
        .route("/live/clusters/{namespace}/{name}", get(live::cluster))
        .route("/actions/{*function}", post(routes::server_fns))
        .route("/assets/{file}", get(routes::asset))
        .layer(axum::middleware::from_fn_with_state(console.clone(), routes::sessions))
        .layer(axum::middleware::from_fn(security::same_origin_writes))
        .layer(axum::middleware::from_fn(security::content_security_policy));
    for (name, value) in security::STATIC_HEADERS {
        let value = HeaderValue::from_static(value);
        router = if name == axum::http::header::CACHE_CONTROL {
            router.layer(SetResponseHeaderLayer::if_not_present(name, value))
        } else {
            router.layer(SetResponseHeaderLayer::overriding(name, value))
        };
    }
    router.with_state(console)
}
