//! The page handlers: who is asking, what they may see, a snapshot of the
//! read model, then one of the pure page functions. Also the session
//! middleware and the server-function endpoint.

use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use k8s_openapi::jiff::Timestamp;
use leptos::prelude::*;
use serde::Deserialize;
use slotkeeper_readmodel::ClusterKey;

use crate::Console;
use crate::access::{AccessError, Check, ClusterAccess};
use crate::pages::shell::{Shell, document};
use crate::pages::{cluster, clusters, paths, scale, signin};
use crate::security::Nonce;
use crate::session::{FLASH_COOKIE, Flash, SESSION_COOKIE, Session, cookie, over_tls, set_cookie};

/// Puts the request's session, if its cookie opens and has not expired, in
/// the request's extensions.
pub async fn sessions(State(console): State<Arc<Console>>, mut request: Request, next: Next) -> Response {
    if let Some(key) = console.keys.get()
        && let Some(sealed) = cookie(request.headers(), SESSION_COOKIE)
        && let Some(session) = key.open::<Session>(sealed)
        && !session.expired(Timestamp::now().as_second())
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

fn access_failed(
    console: &Console,
    error: AccessError,
    headers: &HeaderMap,
    uri: &Uri,
    session: &Session,
    nonce: &str,
) -> Response {
    match error {
        AccessError::SignedOut => signed_out(console, headers, uri),
        AccessError::Kube(error) => {
            tracing::warn!(user = %session.user, %error, "console: access check failed");
            let text = format!("Cannot ask Kubernetes what you may see: {error}. Try again in a moment.");
            let shell = Shell {
                title: "Kubernetes unreachable".into(),
                session: Some(session),
                nonce,
                flash: None,
                live: None,
            };
            let body = document(shell, || view! { <h1>"Kubernetes did not answer"</h1><p>{text}</p> }.into_any());
            html(StatusCode::BAD_GATEWAY, headers, body)
        }
    }
}

pub async fn clusters_page(
    State(console): State<Arc<Console>>,
    session: Option<Extension<Session>>,
    Extension(Nonce(nonce)): Extension<Nonce>,
    headers: HeaderMap,
    uri: Uri,
    Query(filter): Query<clusters::Filter>,
) -> Response {
    if console.keys.get().is_none() {
        return starting();
    }
    let Some(Extension(session)) = session else { return to_sign_in(&uri) };
    let all = console.readmodel.clusters();
    let present = crate::access::namespaces_of(&all).into_keys().collect();
    let visible = match console.access.cluster_namespaces(&console.users, &session, &present).await {
        Ok(visible) => visible,
        Err(error) => return access_failed(&console, error, &headers, &uri, &session, &nonce),
    };
    let now = Timestamp::now();
    let live = paths::live_clusters(&filter.query());
    let snapshot = clusters::snapshot(&console.readmodel, &visible, filter, now);
    let rows: Vec<Arc<str>> = snapshot.rows.iter().map(|r| console.renders.row(&console.readmodel, r, now)).collect();
    let shell = Shell {
        title: "Clusters".into(),
        session: Some(&session),
        nonce: &nonce,
        flash: flash(&console, &headers),
        live: Some(live),
    };
    let body = document(shell, || clusters::page(&snapshot, &rows));
    html(StatusCode::OK, &headers, body)
}

/// The answer for a cluster that does not exist and for one the user may not
/// see: the same, so the page tells nothing about what the user may not see.
fn not_found(console: &Console, key: &ClusterKey, session: &Session, nonce: &str, headers: &HeaderMap) -> Response {
    let text = format!("RedisCluster {key} does not exist, or {} may not see it.", session.user);
    let flash = flash(console, headers);
    let shell = Shell { title: "Not found".into(), session: Some(session), nonce, flash, live: None };
    let body =
        document(shell, || view! { <h1>"Not found"</h1><p>{text}</p><p><a href="/">"All clusters"</a></p> }.into_any());
    html(StatusCode::NOT_FOUND, headers, body)
}

pub async fn cluster_page(
    State(console): State<Arc<Console>>,
    session: Option<Extension<Session>>,
    Extension(Nonce(nonce)): Extension<Nonce>,
    headers: HeaderMap,
    uri: Uri,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    if console.keys.get().is_none() {
        return starting();
    }
    let Some(Extension(session)) = session else { return to_sign_in(&uri) };
    let key = ClusterKey::new(namespace, name);
    let access = match ClusterAccess::of(&console.access, &console.users, &session, &key).await {
        Ok(access) => access,
        Err(error) => return access_failed(&console, error, &headers, &uri, &session, &nonce),
    };
    let snapshot =
        access.view.allowed.then(|| cluster::snapshot(&console.readmodel, &key, access, Timestamp::now())).flatten();
    let Some(snapshot) = snapshot else { return not_found(&console, &key, &session, &nonce, &headers) };
    let shell = Shell {
        title: format!("{key}"),
        session: Some(&session),
        nonce: &nonce,
        flash: flash(&console, &headers),
        live: Some(paths::live_cluster(&key)),
    };
    let body = document(shell, || cluster::page(&snapshot));
    html(StatusCode::OK, &headers, body)
}

#[derive(Debug, Deserialize)]
pub struct ScaleQuery {
    masters: i32,
    replicas: Option<i32>,
}

pub async fn scale_preview(
    State(console): State<Arc<Console>>,
    session: Option<Extension<Session>>,
    Extension(Nonce(nonce)): Extension<Nonce>,
    headers: HeaderMap,
    uri: Uri,
    Path((namespace, name)): Path<(String, String)>,
    Query(query): Query<ScaleQuery>,
) -> Response {
    if console.keys.get().is_none() {
        return starting();
    }
    let Some(Extension(session)) = session else { return to_sign_in(&uri) };
    let key = ClusterKey::new(namespace, name);
    let checks = vec![Check::cluster("get", &key), Check::scale(&key)];
    let (view, permission) = match console.access.check_all(&console.users, &session, checks).await {
        Ok(verdicts) => (verdicts[0].clone(), verdicts[1].clone()),
        Err(error) => return access_failed(&console, error, &headers, &uri, &session, &nonce),
    };
    let cluster = console.readmodel.cluster(&key).filter(|_| view.allowed);
    let Some(cluster) = cluster else { return not_found(&console, &key, &session, &nonce, &headers) };
    let observation = console.readmodel.observation(&key);
    let nodes = crate::view::topology::nodes(&cluster, observation.as_deref());
    let current = cluster.spec.masters.max(0) as usize;
    let to = query.masters.max(0) as usize;
    let replicas = query.replicas.unwrap_or(cluster.spec.replicas_per_master);
    let preview = scale::preview(&key, &nodes, current, to, replicas);
    let shell = Shell {
        title: format!("Scale {key} in"),
        session: Some(&session),
        nonce: &nonce,
        flash: flash(&console, &headers),
        live: None,
    };
    let body = document(shell, || scale::page(&preview, &permission));
    html(StatusCode::OK, &headers, body)
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
