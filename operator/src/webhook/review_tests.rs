use axum::body::Body;
use http_body_util::BodyExt as _;
use kube::Resource as _;
use slotkeeper_api::{RedisCluster, v1alpha1};
use tower::ServiceExt as _;

use super::*;

fn review(objects: Vec<serde_json::Value>, desired: &str) -> String {
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "request": {"uid": "u-1", "desiredAPIVersion": desired, "objects": objects}
    })
    .to_string()
}

fn old_cluster(name: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": v1alpha1::RedisCluster::api_version(&()), "kind": "RedisCluster",
        "metadata": {"name": name, "namespace": "n", "uid": name}, "spec": {"masters": 3, "version": "7.0.15"}})
}

/// Posts `body` to the router; the status and the answer's JSON (or text).
async fn post_review(metrics: &Arc<Metrics>, body: String) -> (StatusCode, serde_json::Value) {
    let request = axum::http::Request::post(PATH).body(Body::from(body)).unwrap();
    let response = router(metrics.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
}

#[tokio::test]
async fn every_object_comes_back_converted_in_order_with_the_requests_uid() {
    let metrics = Arc::new(Metrics::default());
    let body = review(vec![old_cluster("a"), old_cluster("b")], &RedisCluster::api_version(&()));
    let (status, json) = post_review(&metrics, body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json["apiVersion"], "apiextensions.k8s.io/v1");
    assert_eq!(json["kind"], "ConversionReview");
    assert_eq!(json["response"]["uid"], "u-1");
    assert_eq!(json["response"]["result"]["status"], "Success");
    let objects = json["response"]["convertedObjects"].as_array().unwrap();
    assert_eq!(objects.iter().map(|o| o["metadata"]["name"].clone()).collect::<Vec<_>>(), ["a", "b"]);
    assert!(
        objects
            .iter()
            .all(|o| o["apiVersion"] == slotkeeper_api::API_VERSION && o["spec"]["redis"]["version"] == "7.0.15")
    );
    let rendered = metrics.render();
    assert!(rendered.contains(r#"slotkeeper_conversion_reviews_total{result="Success"} 1"#), "{rendered}");
    assert!(rendered.contains("slotkeeper_conversion_objects_total 2"), "{rendered}");
    assert!(rendered.contains("slotkeeper_conversion_review_seconds_count 1"), "{rendered}");
}

#[tokio::test]
async fn a_failure_names_the_object_and_keeps_the_uid() {
    let metrics = Arc::new(Metrics::default());
    let mut broken = old_cluster("bad");
    broken["spec"]["masters"] = "three".into();
    let (status, json) =
        post_review(&metrics, review(vec![old_cluster("a"), broken], &RedisCluster::api_version(&()))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json["response"]["uid"], "u-1");
    assert_eq!(json["response"]["result"]["status"], "Failure");
    assert!(json["response"]["result"]["message"].as_str().unwrap().contains("RedisCluster bad"));
    assert!(metrics.render().contains(r#"slotkeeper_conversion_reviews_total{result="Failure"} 1"#));
}

#[tokio::test]
async fn what_is_not_a_review_gets_400_with_the_reason() {
    let metrics = Arc::new(Metrics::default());
    let (status, text) = post_review(&metrics, "{\"kind\": 3".into()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(text.as_str().unwrap().starts_with("not a ConversionReview"), "{text}");
    let (status, text) = post_review(&metrics, r#"{"kind":"ConversionReview"}"#.into()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(text, "the ConversionReview has no request");
    assert!(metrics.render().contains(r#"slotkeeper_conversion_reviews_total{result="BadRequest"} 2"#));
}

/// A list of 5,000 clusters is one review of about 3 MiB: more than axum
/// accepts by default.
#[tokio::test]
async fn a_review_of_a_large_list_is_answered() {
    let metrics = Arc::new(Metrics::default());
    let objects: Vec<_> = (0..5000).map(|i| old_cluster(&format!("cluster-{i:05}-{}", "x".repeat(400)))).collect();
    let body = review(objects, &RedisCluster::api_version(&()));
    assert!(body.len() > 2 * 1024 * 1024, "{} bytes", body.len());
    let (status, json) = post_review(&metrics, body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json["response"]["convertedObjects"].as_array().unwrap().len(), 5000);
}

/// Security review finding 5: a body over the limit is refused unread.
#[tokio::test]
async fn a_review_over_the_limit_is_refused() {
    let metrics = Arc::new(Metrics::default());
    let mut objects = Vec::new();
    let mut size = 0;
    while size <= MAX_REVIEW_BYTES {
        let mut object = old_cluster(&format!("c{}", objects.len()));
        object["metadata"]["annotations"] = serde_json::json!({ "pad": "x".repeat(64 * 1024) });
        size += object.to_string().len();
        objects.push(object);
    }
    let (status, _) = post_review(&metrics, review(objects, &RedisCluster::api_version(&()))).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

/// At most MAX_REVIEWS_IN_FLIGHT reviews are read and converted at once.
#[tokio::test]
async fn reviews_wait_for_a_turn() {
    let turns = Arc::new(Semaphore::new(MAX_REVIEWS_IN_FLIGHT));
    let held: Vec<_> = (0..MAX_REVIEWS_IN_FLIGHT).map(|_| turns.clone().try_acquire_owned().unwrap()).collect();
    let app = Router::new()
        .route(PATH, post(|| async { "converted" }))
        .layer(middleware::from_fn_with_state(turns.clone(), one_at_a_turn));
    let request = || axum::http::Request::post(PATH).body(Body::empty()).unwrap();
    let waiting = tokio::time::timeout(std::time::Duration::from_millis(200), app.clone().oneshot(request())).await;
    assert!(waiting.is_err(), "a review ran while every turn was taken");
    drop(held);
    let response = app.oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}
