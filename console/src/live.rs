//! Live pages: a Server-Sent Events stream per open page, carrying HTML
//! fragments rendered by the same functions as the page, which our small
//! script swaps in by element id (`event: fragment`, data: the id on the
//! first line, the HTML after). Only what changed is sent: on the clusters
//! page a changed cluster's row, the whole table only when rows come, go or
//! reorder. Without the script the page is simply not live.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use http::StatusCode;
use k8s_openapi::jiff::Timestamp;
use leptos::prelude::*;
use slotkeeper_readmodel::{Change, ClusterKey};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use crate::Console;
use crate::access::{AccessError, ClusterAccess};
use crate::pages::cluster::FRAGMENTS;
use crate::pages::clusters::{self, Filter};
use crate::render::{digest, parse_digests};
use crate::session::Session;

/// Changes arriving closer together than this are sent as one update.
const COALESCE: Duration = Duration::from_millis(250);
/// Even with no change, ages and charts move: refresh this often.
const CLUSTER_TICK: Duration = Duration::from_secs(5);
const LIST_TICK: Duration = Duration::from_secs(15);

fn stream(mut events: mpsc::Receiver<Event>) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::poll_fn(move |cx| events.poll_recv(cx).map(|e| e.map(Ok)))
}

fn fragment(id: &str, html: &str) -> Event {
    Event::default().event("fragment").data(format!("{id}\n{html}"))
}

/// What the page that opened the stream already shows (`seen=…`).
#[derive(Debug, Default, serde::Deserialize)]
pub struct Seen {
    #[serde(default)]
    seen: String,
}

fn unauthorized() -> Response {
    (StatusCode::UNAUTHORIZED, "sign in first").into_response()
}

/// Waits for a change that `relevant` accepts, or the tick; `false` when
/// the page closed or the read model stopped.
async fn next_update(
    changes: &mut tokio::sync::broadcast::Receiver<Change>,
    tick: &mut tokio::time::Interval,
    out: &mpsc::Sender<Event>,
    relevant: &impl Fn(&Change) -> bool,
) -> bool {
    loop {
        tokio::select! {
            change = changes.recv() => match change {
                Ok(change) if relevant(&change) => break,
                Ok(_) => continue,
                Err(RecvError::Lagged(_)) => break,
                Err(RecvError::Closed) => return false,
            },
            _ = tick.tick() => break,
            _ = out.closed() => return false,
        }
    }
    // Gather what else arrives right behind it into the same update.
    tokio::time::sleep(COALESCE).await;
    loop {
        match changes.try_recv() {
            Ok(_) | Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => continue,
            Err(tokio::sync::broadcast::error::TryRecvError::Closed) => return false,
            Err(tokio::sync::broadcast::error::TryRecvError::Empty) => return true,
        }
    }
}

/// Ends the stream when the session expired or was signed out (on any
/// replica): the script reloads, which leads to sign-in.
async fn expired(console: &Console, session: &Session, out: &mpsc::Sender<Event>) -> bool {
    if console.sessions.alive(session, Timestamp::now().as_second()).await {
        return false;
    }
    signed_out(out).await;
    true
}

/// Tells the page its session is over (expired, or the token no longer
/// accepted); the script reloads it, which leads to sign-in.
async fn signed_out(out: &mpsc::Sender<Event>) {
    let _ = out.send(Event::default().event("signout").data("signed out")).await;
}

pub async fn clusters(
    State(console): State<Arc<Console>>,
    session: Option<Extension<Session>>,
    Query(filter): Query<Filter>,
    Query(seen): Query<Seen>,
) -> Response {
    let Some(Extension(session)) = session else { return unauthorized() };
    let mut shown = parse_digests(&seen.seen).first().copied();
    let (out, events) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut changes = console.readmodel.subscribe();
        let mut tick = tokio::time::interval(LIST_TICK);
        tick.tick().await;
        let mut order: Vec<ClusterKey> = Vec::new();
        let mut sent: HashMap<String, u64> = HashMap::new();
        let mut first = true;
        loop {
            if !first && !next_update(&mut changes, &mut tick, &out, &|_| true).await {
                return;
            }
            first = false;
            if expired(&console, &session, &out).await {
                return;
            }
            let present = crate::access::namespaces_of(&console.readmodel.clusters()).into_keys().collect();
            let visible = match console.access.cluster_namespaces(&console.users, &session, &present).await {
                Ok(visible) => visible,
                Err(AccessError::SignedOut) => return signed_out(&out).await,
                Err(error) => {
                    tracing::debug!(user = %session.user, %error, "live clusters: access check failed");
                    continue;
                }
            };
            let now = Timestamp::now();
            let snapshot = clusters::snapshot(&console.readmodel, &visible, filter.clone(), now);
            let rows: Vec<_> = snapshot.rows.iter().map(|r| console.renders.row(&console.readmodel, r, now)).collect();
            let keys: Vec<ClusterKey> = snapshot.rows.iter().map(|r| r.key.clone()).collect();
            let mut updates = Vec::new();
            if keys != order || keys.is_empty() {
                let html = Owner::new().with(|| clusters::table(&snapshot, &rows).to_html());
                // The page already shows this table: start from it.
                let known = sent.get("clusters").copied().or(shown.take());
                sent.insert("clusters".into(), digest(&html));
                if known != Some(digest(&html)) {
                    updates.push(fragment("clusters", &html));
                }
                for (key, row) in keys.iter().zip(&rows) {
                    sent.insert(clusters::row_id(key), row.digest);
                }
                order = keys;
            } else {
                for (key, row) in keys.iter().zip(&rows) {
                    let id = clusters::row_id(key);
                    if sent.insert(id.clone(), row.digest) != Some(row.digest) {
                        updates.push(fragment(&id, &row.html));
                    }
                }
            }
            for update in updates {
                if out.send(update).await.is_err() {
                    return;
                }
            }
        }
    });
    Sse::new(stream(events)).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

pub async fn cluster(
    State(console): State<Arc<Console>>,
    session: Option<Extension<Session>>,
    Path((namespace, name)): Path<(String, String)>,
    Query(seen): Query<Seen>,
) -> Response {
    let Some(Extension(session)) = session else { return unauthorized() };
    let key = ClusterKey::new(namespace, name);
    let (out, events) = mpsc::channel(32);
    // The fragments the page already shows are not sent again.
    let shown: HashMap<&'static str, u64> = FRAGMENTS.iter().copied().zip(parse_digests(&seen.seen)).collect();
    tokio::spawn(async move {
        let mut changes = console.readmodel.subscribe();
        let mut tick = tokio::time::interval(CLUSTER_TICK);
        tick.tick().await;
        let mut sent = shown;
        let relevant = |change: &Change| change.touches(&key);
        let mut first = true;
        loop {
            if !first && !next_update(&mut changes, &mut tick, &out, &relevant).await {
                return;
            }
            first = false;
            if expired(&console, &session, &out).await {
                return;
            }
            let access = match ClusterAccess::of(&console.access, &console.users, &session, &key).await {
                Ok(access) if access.view.allowed => access,
                Ok(_) => {
                    let _ = out.send(Event::default().event("gone").data("you may no longer see this cluster")).await;
                    return;
                }
                Err(AccessError::SignedOut) => return signed_out(&out).await,
                Err(error) => {
                    tracing::debug!(user = %session.user, %error, "live cluster: access check failed");
                    continue;
                }
            };
            let Some(fragments) = console.renders.cluster(&console.readmodel, &key, &access, Timestamp::now()) else {
                let _ = out.send(Event::default().event("gone").data(format!("RedisCluster {key} was deleted"))).await;
                return;
            };
            for (id, html) in fragments.iter() {
                if sent.insert(id, digest(html)) != Some(digest(html)) && out.send(fragment(id, html)).await.is_err() {
                    return;
                }
            }
        }
    });
    Sse::new(stream(events)).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}
