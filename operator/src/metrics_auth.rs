//! Who may read `/metrics` (it names every namespace and cluster): a bearer
//! token the apiserver accepts (TokenReview) for a user RBAC allows `get` on
//! the non-resource URL `/metrics` (SubjectAccessReview), as kube-rbac-proxy
//! checks. Grant it with ClusterRole `slotkeeper-metrics-reader`. Answers are
//! kept a minute per token digest, so a scrape every few seconds costs two
//! reviews a minute; tokens not seen before are reviewed at most
//! [`REVIEWS_BURST`] at once, then one a second (429 meanwhile), so nobody
//! floods the apiserver with reviews made with the operator's rights.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Api;
use kube::api::PostParams;
use sha2::{Digest as _, Sha256};

/// The path RBAC is asked about.
pub const METRICS_PATH: &str = "/metrics";
/// How long an answer is reused.
const KEEP: Duration = Duration::from_secs(60);
/// Answers kept at most (then the oldest go).
const MAX_KEPT: usize = 256;
/// The longest token looked at (a service account token is ~1 KiB).
const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Reviews of new tokens at once; then [`REVIEWS_PER_SECOND`].
const REVIEWS_BURST: f64 = 10.0;
const REVIEWS_PER_SECOND: f64 = 1.0;

pub struct MetricsAuth {
    client: kube::Client,
    answers: Mutex<HashMap<[u8; 32], (Instant, StatusCode)>>,
    /// Reviews left, and when that was counted.
    reviews: Mutex<(f64, Instant)>,
}

impl MetricsAuth {
    pub fn new(client: kube::Client) -> Self {
        Self { client, answers: Mutex::default(), reviews: Mutex::new((REVIEWS_BURST, Instant::now())) }
    }

    /// Takes one review, if one is left.
    fn take_review(&self, now: Instant) -> bool {
        let mut reviews = self.reviews.lock().expect("reviews lock");
        let (left, at) = *reviews;
        let left = (left + now.saturating_duration_since(at).as_secs_f64() * REVIEWS_PER_SECOND).min(REVIEWS_BURST);
        let taken = left >= 1.0;
        *reviews = (if taken { left - 1.0 } else { left }, now);
        taken
    }

    /// `OK`, or the status to answer with: 401 without a valid token, 403
    /// for a user who may not `get` `/metrics`, 503 when the apiserver
    /// cannot be asked.
    pub async fn check(&self, headers: &HeaderMap) -> StatusCode {
        let Some(token) = bearer(headers) else { return StatusCode::UNAUTHORIZED };
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some((at, answer)) = self.answers.lock().expect("answers lock").get(&digest)
            && at.elapsed() < KEEP
        {
            return *answer;
        }
        if !self.take_review(Instant::now()) {
            return StatusCode::TOO_MANY_REQUESTS;
        }
        let answer = match self.review(token).await {
            Ok(answer) => answer,
            Err(error) => {
                tracing::warn!(%error, "cannot review a /metrics token");
                return StatusCode::SERVICE_UNAVAILABLE;
            }
        };
        let mut answers = self.answers.lock().expect("answers lock");
        answers.retain(|_, (at, _)| at.elapsed() < KEEP);
        if answers.len() >= MAX_KEPT {
            answers.clear();
        }
        answers.insert(digest, (Instant::now(), answer));
        answer
    }

    async fn review(&self, token: &str) -> Result<StatusCode, kube::Error> {
        let review =
            TokenReview { spec: TokenReviewSpec { token: token.to_owned(), audiences: None }, ..Default::default() };
        let reviewed = Api::<TokenReview>::all(self.client.clone()).create(&PostParams::default(), &review).await?;
        let status = reviewed.status.unwrap_or_default();
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
            return Ok(StatusCode::UNAUTHORIZED);
        };
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let decided =
            Api::<SubjectAccessReview>::all(self.client.clone()).create(&PostParams::default(), &access).await?;
        let allowed = decided.status.is_some_and(|s| s.allowed);
        Ok(if allowed { StatusCode::OK } else { StatusCode::FORBIDDEN })
    }
}

/// The token of an `Authorization: Bearer` header, if sane.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("bearer "))?.trim();
    (!token.is_empty() && token.len() <= MAX_TOKEN_BYTES).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn new_tokens_are_reviewed_in_a_burst_then_one_a_second() {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let auth = MetricsAuth::new(kube::Client::try_from(config).unwrap());
        let start = Instant::now();
        let taken = (0..100).filter(|_| auth.take_review(start)).count();
        assert_eq!(taken, REVIEWS_BURST as usize, "a flood of new tokens: only the burst is reviewed");
        assert!(!auth.take_review(start + Duration::from_millis(500)));
        assert!(auth.take_review(start + Duration::from_millis(1001)), "one more a second later");
        assert!(!auth.take_review(start + Duration::from_millis(1002)));
    }

    #[test]
    fn only_a_sane_bearer_token_is_read() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            headers
        };
        assert_eq!(bearer(&with("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&with("Basic abc")), None);
        assert_eq!(bearer(&with("Bearer ")), None);
        assert_eq!(bearer(&with(&format!("Bearer {}", "x".repeat(MAX_TOKEN_BYTES + 1)))), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }
}
