//! Browser-facing protections: a Content-Security-Policy whose only scripts
//! are our own file and those carrying this response's nonce, no framing, no
//! referrer; and every request that changes something must come from the
//! console's own pages (Sec-Fetch-Site, else Origin), so another site cannot
//! make a signed-in browser act.

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use ring::rand::{SecureRandom as _, SystemRandom};

/// This response's script nonce.
#[derive(Debug, Clone)]
pub struct Nonce(pub String);

/// Gives each request a nonce and each response the policy naming it.
pub async fn content_security_policy(mut request: Request, next: Next) -> Response {
    let mut bytes = [0u8; 16];
    SystemRandom::new().fill(&mut bytes).expect("the system's random source works");
    let nonce = base64::engine::general_purpose::STANDARD.encode(bytes);
    request.extensions_mut().insert(Nonce(nonce.clone()));
    let mut response = next.run(request).await;
    let policy = format!(
        "default-src 'none'; script-src 'self' 'nonce-{nonce}'; style-src 'self'; img-src 'self'; \
         connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    );
    response.headers_mut().insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_str(&policy).expect("ASCII"));
    response
}

/// The static headers every console response carries, for tower-http's
/// `SetResponseHeaderLayer`.
pub const STATIC_HEADERS: [(header::HeaderName, &str); 4] = [
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::REFERRER_POLICY, "no-referrer"),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::CACHE_CONTROL, "no-store"),
];

/// Refuses any request but GET and HEAD that does not come from our own pages.
pub async fn same_origin_writes(request: Request, next: Next) -> Response {
    if matches!(*request.method(), Method::GET | Method::HEAD) {
        return next.run(request).await;
    }
    match same_origin(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(why) => {
            tracing::warn!(path = %request.uri().path(), %why, "refused a cross-origin request");
            let body = format!(
                "Refused: this request did not come from the console's own pages ({why}). \
                 Nothing was changed. Use the console at its own address."
            );
            (StatusCode::FORBIDDEN, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
        }
    }
}

/// Whether the browser says the request came from our origin. Browsers send
/// `Sec-Fetch-Site` to secure origins (HTTPS, localhost); elsewhere `Origin`
/// must name the host asked. With `Referrer-Policy: no-referrer` a form post
/// carries `Origin: null`, which proves nothing and is refused.
pub fn same_origin(headers: &HeaderMap) -> Result<(), String> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("?");
        return if site == "same-origin" { Ok(()) } else { Err(format!("Sec-Fetch-Site: {site}")) };
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    match headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) {
        Some(origin) if origin != "null" => {
            let authority = origin.split_once("://").map(|(_, a)| a).unwrap_or(origin);
            if Some(authority) == host { Ok(()) } else { Err(format!("Origin: {origin}")) }
        }
        Some(_) => Err("Origin: null, and no Sec-Fetch-Site: serve the console over HTTPS".into()),
        None => Err("neither Sec-Fetch-Site nor Origin was sent".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (header::HeaderName::from_static(k), HeaderValue::from_static(v))).collect()
    }

    #[test]
    fn same_origin_is_proven_by_fetch_metadata_or_a_matching_origin() {
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin")])).is_ok());
        assert!(same_origin(&headers(&[("sec-fetch-site", "cross-site"), ("origin", "http://h:1")])).is_err());
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-site")])).is_err(), "another port is another origin");
        assert!(same_origin(&headers(&[("host", "h:1"), ("origin", "http://h:1")])).is_ok());
        assert!(same_origin(&headers(&[("host", "h:1"), ("origin", "http://evil:1")])).is_err());
        assert!(same_origin(&headers(&[("host", "h:1"), ("origin", "null")])).is_err());
        assert!(same_origin(&headers(&[("host", "h:1")])).is_err());
    }
}
