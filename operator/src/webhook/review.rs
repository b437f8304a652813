//! `POST /convert`: the apiserver's `ConversionReview`s, answered with the API
//! crate's pure conversion. Reads no custom resource and no cache, so a
//! replica answers from its first second, leader or not.
//!
//! The apiserver converts a whole list in one review (1,000 objects are
//! about 630 KiB), so the review is read and written as text: each object is
//! borrowed from the request body and converted by
//! [`slotkeeper_api::conversion::wire`], never built as a JSON tree.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::core::Status;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::Semaphore;

pub use slotkeeper_api::names::WEBHOOK_PATH as PATH;

use crate::metrics::Metrics;

/// The largest review accepted. The apiserver converts a list read at a
/// version it does not store as one review (1,000 clusters are about
/// 630 KiB), so 8 MiB holds a list of some 12,000; anything larger is refused
/// before it is read. The process also runs the controller and the console:
/// a body, its parse and its answer are held at once, so a cap on reviews in
/// flight bounds the webhook's memory at about 2 × 3 × 8 MiB whoever posts.
pub const MAX_REVIEW_BYTES: usize = 8 * 1024 * 1024;
/// Reviews converted at once; more wait, unread, for a turn.
pub const MAX_REVIEWS_IN_FLIGHT: usize = 2;
const REVIEW_API_VERSION: &str = "apiextensions.k8s.io/v1";

pub fn router(metrics: Arc<Metrics>) -> Router {
    let turns = Arc::new(Semaphore::new(MAX_REVIEWS_IN_FLIGHT));
    Router::new()
        .route(PATH, post(convert))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .layer(middleware::from_fn_with_state(turns, one_at_a_turn))
        .with_state(metrics)
}

/// Holds a request, body unread, until one of the turns is free.
async fn one_at_a_turn(State(turns): State<Arc<Semaphore>>, request: axum::extract::Request, next: Next) -> Response {
    let Ok(_turn) = turns.acquire().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response();
    };
    next.run(request).await
}

#[derive(Deserialize)]
struct Incoming<'a> {
    #[serde(borrow)]
    request: Option<Request<'a>>,
}

#[derive(Deserialize)]
struct Request<'a> {
    uid: String,
    #[serde(rename = "desiredAPIVersion")]
    desired_api_version: String,
    #[serde(borrow, default)]
    objects: Vec<&'a RawValue>,
}

#[derive(Serialize)]
struct Outgoing {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    response: Answer,
}

#[derive(Serialize)]
struct Answer {
    uid: String,
    result: Status,
    #[serde(rename = "convertedObjects")]
    converted_objects: Vec<Box<RawValue>>,
}

async fn convert(State(metrics): State<Arc<Metrics>>, body: Bytes) -> Response {
    let started = Instant::now();
    let (answer, result, objects) = match serde_json::from_slice::<Incoming>(&body) {
        Ok(Incoming { request: Some(request) }) => {
            let objects = request.objects.len();
            let (answer, result) = answer(request);
            let body = serde_json::to_vec(&answer).expect("plain data serializes");
            (([(header::CONTENT_TYPE, "application/json")], body).into_response(), result, objects)
        }
        Ok(Incoming { request: None }) => (bad_request("the ConversionReview has no request".into()), "BadRequest", 0),
        Err(error) => (bad_request(format!("not a ConversionReview: {error}")), "BadRequest", 0),
    };
    metrics.conversion_finished(result, objects, started.elapsed());
    answer
}

fn bad_request(message: String) -> Response {
    tracing::warn!(%message, "conversion review refused");
    (StatusCode::BAD_REQUEST, message).into_response()
}

/// The answer to one review: every object converted, or the first failure
/// (the apiserver takes all or nothing, in the same order); and its result.
fn answer(request: Request) -> (Outgoing, &'static str) {
    let desired = &request.desired_api_version;
    let converted: Result<Vec<_>, _> =
        request.objects.iter().map(|object| slotkeeper_api::conversion::wire::convert(object.get(), desired)).collect();
    let (result, converted_objects, label) = match converted {
        Ok(objects) => (Status::success(), objects, "Success"),
        Err(error) => {
            tracing::warn!(%error, desired_api_version = %desired, "conversion refused");
            (Status::failure(&error.to_string(), "ConversionFailed"), Vec::new(), "Failure")
        }
    };
    let answer = Answer { uid: request.uid, result, converted_objects };
    (Outgoing { api_version: REVIEW_API_VERSION, kind: "ConversionReview", response: answer }, label)
}

#[cfg(test)]
#[path = "review_tests.rs"]
mod tests;
