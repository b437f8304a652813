//! The page handlers: who is asking, what they may see, a snapshot of the
//! read model, then one of the pure page functions. Also the session
//! middleware and the server-function endpoint.

use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use k8s_openapi::jiff::Timestamp;
use leptos::prelude::*;
use serde::Deserialize;
use slotkeeper_readmodel::ClusterKey;

use crate::Console;
use crate::access::{AccessError, Check, ClusterAccess, Permission};
use crate::pages::shell::{Shell, document};
use crate::pages::{cluster, clusters, paths, scale, signin, upgrades, version};
use crate::render;
use crate::security::Nonce;
use crate::session::{FLASH_COOKIE, Flash, SESSION_COOKIE, Session, cookie, over_tls, set_cookie};
use crate::upgrade_plans;

/// Puts the request's session, if its cookie opens, has not expired and was
/// not signed out, in the request's extensions.
pub async fn sessions(State(console): State<Arc<Console>>, mut request: Request, next: Next) -> Response {
    // Assets are public: no session is looked up for them.
    if !request.uri().path().starts_with("/assets/")
        && let Some(sealed) = cookie(request.headers(), SESSION_COOKIE)
        && let Some(session) = console.sessions.open(sealed, Timestamp::now().as_second()).await
    {
        request.extensions_mut().insert(session);
    }
    next.run(request).await
}

/// Runs a server function with the console and the session in its context.
pub async fn server_fns(
    State(console): State<Arc<Console>>,
    session: Option<Extension<Session>>,
    request: Request<Body>,
) -> impl IntoResponse {
    let session = session.map(|Extension(s)| s);
    leptos_axum::handle_server_fns_with_context(
        move || {
            provide_context(console.clone());
            if let Some(session) = session.clone() {
                provide_context(session);
            }
        },
        request,
    )
    .await
}

/// An HTML page; clears the one-time message if the request carried one.
fn html(status: StatusCode, headers: &HeaderMap, body: String) -> Response {
    let mut response = (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response();
    if cookie(headers, FLASH_COOKIE).is_some() {
        response.headers_mut().append(header::SET_COOKIE, set_cookie(FLASH_COOKIE, "", 0, over_tls(headers)));
    }
    response
}

fn flash(console: &Console, headers: &HeaderMap) -> Option<Flash> {
    console.keys.get()?.open(cookie(headers, FLASH_COOKIE)?)
}

fn starting() -> Response {
    let body = "The console is starting: it is loading its session key. Try again in a moment.";
    (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "2")], body).into_response()
}

fn to_sign_in(uri: &Uri) -> Response {
    let next = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    Redirect::to(&format!("{}?next={}", paths::SIGN_IN, paths::encode(next))).into_response()
}

/// The user's token stopped working: end the session and say so.
fn signed_out(console: &Console, headers: &HeaderMap, uri: &Uri) -> Response {
    let mut response = to_sign_in(uri);
    let secure = over_tls(headers);
    response.headers_mut().append(header::SET_COOKIE, set_cookie(SESSION_COOKIE, "", 0, secure));
    if let Some(key) = console.keys.get() {
        let text = "Kubernetes no longer accepts your token; sign in again.";
        let sealed = key.seal(&Flash { ok: false, text: text.into() });
        response.headers_mut().append(header::SET_COOKIE, set_cookie(FLASH_COOKIE, &sealed, 60, secure));
    }
    response
}

/// A page request from a signed-in user: the session, this response's
/// nonce, and the request's headers (for the one-time message). Anyone else
/// is sent to sign in; while the session key loads, the console answers 503.
pub struct Visit {
    console: Arc<Console>,
    session: Session,
    nonce: String,
    headers: HeaderMap,
    uri: Uri,
}

impl FromRequestParts<Arc<Console>> for Visit {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, console: &Arc<Console>) -> Result<Self, Response> {
        if console.keys.get().is_none() {
            return Err(starting());
        }
        let Some(session) = parts.extensions.get::<Session>().cloned() else { return Err(to_sign_in(&parts.uri)) };
        let nonce = parts.extensions.get::<Nonce>().map(|n| n.0.clone()).unwrap_or_default();
        Ok(Visit { console: console.clone(), session, nonce, headers: parts.headers.clone(), uri: parts.uri.clone() })
    }
}

impl Visit {
    /// A whole page; the one-time message, if any, is shown and cleared.
    fn page(
        &self,
        status: StatusCode,
        title: String,
        live: Option<String>,
        content: impl FnOnce() -> AnyView,
    ) -> Response {
        let flash = flash(&self.console, &self.headers);
        let shell = Shell { title, session: Some(&self.session), nonce: &self.nonce, flash, live };
        html(status, &self.headers, document(shell, content))
    }

    fn access_failed(&self, error: AccessError) -> Response {
        match error {
            AccessError::SignedOut => signed_out(&self.console, &self.headers, &self.uri),
            AccessError::Kube(error) => {
                tracing::warn!(user = %self.session.user, %error, "console: access check failed");
                let text = format!("Cannot ask Kubernetes what you may see: {error}. Try again in a moment.");
                self.page(StatusCode::BAD_GATEWAY, "Kubernetes unreachable".into(), None, || {
                    view! { <h1>"Kubernetes did not answer"</h1><p>{text}</p> }.into_any()
                })
            }
        }
    }

    /// The answer for a cluster that does not exist and for one the user may
    /// not see: the same, so the page tells nothing about what the user may not see.
    fn not_found(&self, key: &ClusterKey) -> Response {
        let text = format!("RedisCluster {key} does not exist, or {} may not see it.", self.session.user);
        self.page(StatusCode::NOT_FOUND, "Not found".into(), None, || {
            view! { <h1>"Not found"</h1><p>{text}</p><p><a href="/">"All clusters"</a></p> }.into_any()
        })
    }
}

pub async fn clusters_page(visit: Visit, Query(filter): Query<clusters::Filter>) -> Response {
    let console = &visit.console;
    let all = console.readmodel.clusters();
    let present = crate::access::namespaces_of(&all).into_keys().collect();
    let visible = match console.access.cluster_namespaces(&console.users, &visit.session, &present).await {
        Ok(visible) => visible,
        Err(error) => return visit.access_failed(error),
    };
    let now = Timestamp::now();
    let query = filter.query();
    let snapshot = clusters::snapshot(&console.readmodel, &visible, filter, now);
    let rows: Vec<_> = snapshot.rows.iter().map(|r| console.renders.row(&console.readmodel, r, now)).collect();
    let table = Owner::new().with(|| clusters::table(&snapshot, &rows).to_html());
    let live = paths::live_clusters(&query, &render::digests_param(&[&table]));
    visit.page(StatusCode::OK, "Clusters".into(), Some(live), || clusters::page(&snapshot, &table))
}

pub async fn cluster_page(visit: Visit, Path((namespace, name)): Path<(String, String)>) -> Response {
    let console = &visit.console;
    let key = ClusterKey::new(namespace, name);
    let access = match ClusterAccess::of(&console.access, &console.users, &visit.session, &key).await {
        Ok(access) => access,
        Err(error) => return visit.access_failed(error),
    };
    let snapshot =
        access.view.allowed.then(|| cluster::snapshot(&console.readmodel, &key, access, Timestamp::now())).flatten();
    let Some(snapshot) = snapshot else { return visit.not_found(&key) };
    let fragments = console.renders.fragments(&console.readmodel, &snapshot);
    let htmls: Vec<&str> = fragments.iter().map(|(_, h)| h.as_str()).collect();
    let live = paths::live_cluster(&key, &render::digests_param(&htmls));
    visit.page(StatusCode::OK, key.to_string(), Some(live), || cluster::page(&snapshot, &fragments))
}

#[derive(Debug, Deserialize)]
pub struct ScaleQuery {
    masters: i32,
    replicas: Option<i32>,
}

pub async fn scale_preview(
    visit: Visit,
    Path((namespace, name)): Path<(String, String)>,
    Query(query): Query<ScaleQuery>,
) -> Response {
    let console = &visit.console;
    let key = ClusterKey::new(namespace, name);
    let checks = vec![Check::cluster("get", &key), Check::scale(&key)];
    let (view, permission) = match console.access.check_all(&console.users, &visit.session, checks).await {
        Ok(verdicts) => (verdicts[0].clone(), verdicts[1].clone()),
        Err(error) => return visit.access_failed(error),
    };
    let Some(cluster) = console.readmodel.cluster(&key).filter(|_| view.allowed) else { return visit.not_found(&key) };
    let observation = console.readmodel.observation(&key);
    let nodes = crate::view::topology::nodes(&cluster, observation.as_deref());
    let current = cluster.spec.masters.max(0) as usize;
    let replicas = query.replicas.unwrap_or(cluster.spec.replicas_per_master);
    let preview = scale::preview(&key, &nodes, current, query.masters.max(0) as usize, replicas);
    visit.page(StatusCode::OK, format!("Scale {key} in"), None, || scale::page(&preview, &permission))
}

#[derive(Debug, Deserialize)]
pub struct VersionQuery {
    to: String,
}

pub async fn version_preview(
    visit: Visit,
    Path((namespace, name)): Path<(String, String)>,
    Query(query): Query<VersionQuery>,
) -> Response {
    let console = &visit.console;
    let key = ClusterKey::new(namespace, name);
    let checks = vec![Check::cluster("get", &key), Check::cluster("patch", &key)];
    let (view, permission) = match console.access.check_all(&console.users, &visit.session, checks).await {
        Ok(verdicts) => (verdicts[0].clone(), verdicts[1].clone()),
        Err(error) => return visit.access_failed(error),
    };
    let Some(cluster) = console.readmodel.cluster(&key).filter(|_| view.allowed) else { return visit.not_found(&key) };
    let Some(to) = version::entry_of(&query.to) else { return visit.not_found(&key) };
    let steps = version::planned_steps(&cluster, to);
    visit.page(StatusCode::OK, format!("Move {key} to {}", to.release()), None, || {
        version::page(&key, to, &steps, &permission)
    })
}

/// Slotkeeper's own upgrade plans, listed as the user (the read model does
/// not hold them); the right to approve is asked only when a step waits for it.
pub async fn upgrades_page(visit: Visit) -> Response {
    let console = &visit.console;
    let client = match console.users.client(&visit.session) {
        Ok(client) => client,
        Err(error) => return visit.access_failed(AccessError::Kube(error)),
    };
    let plans = match upgrade_plans::list(client).await {
        Ok(plans) => plans,
        Err(kube::Error::Api(e)) if e.code == 401 => return visit.access_failed(AccessError::SignedOut),
        Err(error) => {
            let status = match &error {
                kube::Error::Api(e) if e.code == 403 => StatusCode::FORBIDDEN,
                kube::Error::Api(e) if e.code == 404 => StatusCode::NOT_FOUND,
                _ => StatusCode::BAD_GATEWAY,
            };
            let user = visit.session.user.clone();
            return visit.page(status, "Upgrades".into(), None, || upgrades::refused(&user, &error));
        }
    };
    let approve = if upgrades::any_awaiting_approval(&plans) {
        match console.access.check(&console.users, &visit.session, Check::upgrades("patch")).await {
            Ok(permission) => permission,
            Err(error) => return visit.access_failed(error),
        }
    } else {
        // No button is shown, so there is nothing to ask.
        Permission::allowed()
    };
    visit.page(StatusCode::OK, "Upgrades".into(), None, || upgrades::page(&plans, &approve, Timestamp::now()))
}

#[derive(Debug, Deserialize)]
pub struct NextQuery {
    next: Option<String>,
}

pub async fn sign_in_page(
    State(console): State<Arc<Console>>,
    session: Option<Extension<Session>>,
    Extension(Nonce(nonce)): Extension<Nonce>,
    headers: HeaderMap,
    Query(query): Query<NextQuery>,
) -> Response {
    if console.keys.get().is_none() {
        return starting();
    }
    let session = session.map(|Extension(s)| s);
    let shell = Shell {
        title: "Sign in".into(),
        session: session.as_ref(),
        nonce: &nonce,
        flash: flash(&console, &headers),
        live: None,
    };
    let body = document(shell, || signin::page(query.next));
    html(StatusCode::OK, &headers, body)
}

/// Our stylesheet and script, compiled in.
pub async fn asset(Path(file): Path<String>) -> Response {
    let (content_type, body) = match file.as_str() {
        "console.css" => ("text/css; charset=utf-8", include_str!("../assets/console.css")),
        "console.js" => ("text/javascript; charset=utf-8", include_str!("../assets/console.js")),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    let mut response = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    response
}
