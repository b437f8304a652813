//! `POST /convert`: the apiserver's `ConversionReview`s, answered with the API
//! crate's pure conversion. Reads no custom resource and no cache, so a
//! replica answers from its first second, leader or not.

use axum::Json;
use axum::Router;
use axum::routing::post;
use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};

pub use slotkeeper_api::names::WEBHOOK_PATH as PATH;

pub fn router() -> Router {
    Router::new().route(PATH, post(convert))
}

async fn convert(Json(review): Json<ConversionReview>) -> Json<ConversionReview> {
    Json(answer(review))
}

/// The answer to one review: every object converted, or the first failure
/// (the apiserver takes all or nothing, in the same order).
pub fn answer(review: ConversionReview) -> ConversionReview {
    let request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(error) => {
            return ConversionResponse::invalid(Status::failure(&error.to_string(), "BadRequest")).into_review();
        }
    };
    let desired = request.desired_api_version.clone();
    let converted: Result<Vec<_>, _> =
        request.objects.iter().cloned().map(|object| slotkeeper_api::conversion::convert(object, &desired)).collect();
    let response = ConversionResponse::for_request(request);
    match converted {
        Ok(objects) => response.success(objects),
        Err(error) => {
            tracing::warn!(%error, desired_api_version = %desired, "conversion refused");
            response.failure(Status::failure(&error.to_string(), "ConversionFailed"))
        }
    }
    .into_review()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource as _;
    use slotkeeper_api::{RedisCluster, v1alpha1};

    fn review(objects: Vec<serde_json::Value>, desired: &str) -> ConversionReview {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "u-1", "desiredAPIVersion": desired, "objects": objects}
        }))
        .unwrap()
    }

    fn old_cluster(name: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": v1alpha1::RedisCluster::api_version(&()), "kind": "RedisCluster",
            "metadata": {"name": name, "namespace": "n", "uid": name}, "spec": {"masters": 3, "version": "7.0.15"}})
    }

    #[test]
    fn every_object_comes_back_converted_in_order_with_the_requests_uid() {
        let answered = answer(review(vec![old_cluster("a"), old_cluster("b")], &RedisCluster::api_version(&())));
        let json = serde_json::to_value(&answered).unwrap();
        assert_eq!(json["response"]["uid"], "u-1");
        assert_eq!(json["response"]["result"]["status"], "Success");
        let objects = json["response"]["convertedObjects"].as_array().unwrap();
        assert_eq!(objects.iter().map(|o| o["metadata"]["name"].clone()).collect::<Vec<_>>(), ["a", "b"]);
        assert!(
            objects
                .iter()
                .all(|o| o["apiVersion"] == slotkeeper_api::API_VERSION && o["spec"]["redis"]["version"] == "7.0.15")
        );
    }

    #[test]
    fn a_failure_names_the_object_and_keeps_the_uid() {
        let mut broken = old_cluster("bad");
        broken["spec"]["masters"] = "three".into();
        let answered = answer(review(vec![old_cluster("a"), broken], &RedisCluster::api_version(&())));
        let json = serde_json::to_value(&answered).unwrap();
        assert_eq!(json["response"]["uid"], "u-1");
        assert_eq!(json["response"]["result"]["status"], "Failure");
        assert!(json["response"]["result"]["message"].as_str().unwrap().contains("RedisCluster bad"));
    }
}
