//! A session: the signed-in user's name, groups, bearer token and expiry,
//! encrypted and authenticated with AES-256-GCM in an HttpOnly,
//! SameSite=Strict cookie, under a key of its own kept on the server (see
//! [`crate::session_store`]). One-time messages are sealed the same way
//! under the key every replica shares (see [`crate::keys`]).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::HeaderMap;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom as _, SystemRandom};
use serde::{Deserialize, Serialize};

pub const SESSION_COOKIE: &str = "slotkeeper_session";
pub const FLASH_COOKIE: &str = "slotkeeper_flash";
/// How long a sign-in lasts at most (less when the token expires sooner).
pub const SESSION_SECONDS: i64 = 8 * 3600;
const AAD: &[u8] = b"slotkeeper-console-session-v1";

/// A signed-in user. Its `Debug` never shows the token.
#[derive(Clone, Serialize, Deserialize, PartialEq)]
pub struct Session {
    pub user: String,
    #[serde(default)]
    pub groups: Vec<String>,
    token: String,
    /// Unix seconds.
    pub expires: i64,
    /// Which entry of the session store holds its key (not in the sealed part).
    #[serde(skip)]
    pub(crate) id: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("user", &self.user).field("expires", &self.expires).finish_non_exhaustive()
    }
}

impl Session {
    pub fn new(user: String, groups: Vec<String>, token: String, now: i64) -> Self {
        let expires = (now + SESSION_SECONDS).min(token_expiry(&token).unwrap_or(i64::MAX));
        Self { user, groups, token, expires, id: String::new() }
    }

    /// The user as a person reads it: a ServiceAccount's name and namespace
    /// rather than `system:serviceaccount:NS:NAME`.
    pub fn display_name(&self) -> String {
        match self.user.strip_prefix("system:serviceaccount:").and_then(|rest| rest.split_once(':')) {
            Some((namespace, name)) => format!("{name} (ServiceAccount in {namespace})"),
            None => self.user.clone(),
        }
    }

    /// The bearer token every Kubernetes call for this user carries.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// A fingerprint of the token, to key per-user caches without keeping it twice.
    pub fn token_id(&self) -> u64 {
        let digest = ring::digest::digest(&ring::digest::SHA256, self.token.as_bytes());
        u64::from_le_bytes(digest.as_ref()[..8].try_into().expect("8 bytes"))
    }

    pub fn expired(&self, now: i64) -> bool {
        now >= self.expires
    }
}

/// The `exp` claim of a JWT (a ServiceAccount token), read without checking
/// the signature: the apiserver checked the token already, this only keeps
/// a session from outliving it.
fn token_expiry(token: &str) -> Option<i64> {
    let payload = token.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice::<serde_json::Value>(&bytes).ok()?.get("exp")?.as_i64()
}

/// The shared key, sealing and opening cookie values.
pub struct SessionKey {
    key: LessSafeKey,
    random: SystemRandom,
}

#[derive(Debug, thiserror::Error)]
#[error("the session key must be 32 bytes, found {0}")]
pub struct BadKey(usize);

impl SessionKey {
    pub const LEN: usize = 32;

    pub fn new(bytes: &[u8]) -> Result<Self, BadKey> {
        let unbound = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| BadKey(bytes.len()))?;
        Ok(Self { key: LessSafeKey::new(unbound), random: SystemRandom::new() })
    }

    pub fn generate() -> [u8; Self::LEN] {
        let mut bytes = [0u8; Self::LEN];
        SystemRandom::new().fill(&mut bytes).expect("the system's random source works");
        bytes
    }

    /// Encrypts `value` as URL-safe text: nonce then ciphertext and tag.
    pub fn seal<T: Serialize>(&self, value: &T) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        self.random.fill(&mut nonce).expect("the system's random source works");
        let mut data = serde_json::to_vec(value).expect("serializable");
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(AAD), &mut data)
            .expect("sealing a cookie-sized value");
        let mut out = nonce.to_vec();
        out.extend(data);
        URL_SAFE_NO_PAD.encode(out)
    }

    /// The value sealed in `text`, or `None` if it was not sealed with this
    /// key, was altered, or does not parse.
    pub fn open<T: for<'de> Deserialize<'de>>(&self, text: &str) -> Option<T> {
        let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
        if bytes.len() < NONCE_LEN {
            return None;
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let mut sealed = sealed.to_vec();
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let plain = self.key.open_in_place(nonce, Aad::from(AAD), &mut sealed).ok()?;
        serde_json::from_slice(plain).ok()
    }
}

/// A message shown once on the next page, after a form post redirected.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Flash {
    pub ok: bool,
    pub text: String,
}

/// The prefix browsers keep for cookies set over HTTPS by this very host, for
/// the whole site (Secure, Path=/, no Domain): no other host or plain-HTTP
/// page can plant or overwrite one.
const HOST_ONLY: &str = "__Host-";

/// The value of cookie `name` in the request: over TLS only its `__Host-` form.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let name = if over_tls(headers) { format!("{HOST_ONLY}{name}") } else { name.to_owned() };
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name.as_str())
        .map(|(_, value)| value)
}

/// A `Set-Cookie` value: HttpOnly, SameSite=Strict, `Secure` when the
/// console is reached over TLS; `max_age` 0 deletes the cookie.
pub fn set_cookie(name: &str, value: &str, max_age: i64, secure: bool) -> http::HeaderValue {
    let (prefix, secure) = if secure { (HOST_ONLY, "; Secure") } else { ("", "") };
    let text = format!("{prefix}{name}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}");
    http::HeaderValue::from_str(&text).expect("cookie values are URL-safe base64")
}

/// Whether the browser reached us over TLS (directly or through a proxy that says so).
pub fn over_tls(headers: &HeaderMap) -> bool {
    headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()) == Some("https")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SessionKey {
        SessionKey::new(&SessionKey::generate()).unwrap()
    }

    #[test]
    fn sealed_sessions_open_only_with_their_key_and_unaltered() {
        let key = key();
        let session = Session::new("alice".into(), vec!["devs".into()], "secret-token".into(), 1000);
        let sealed = key.seal(&session);
        assert!(!sealed.contains("secret-token") && !sealed.contains("alice"), "the cookie is encrypted");
        assert_eq!(key.open::<Session>(&sealed), Some(session.clone()));
        assert_eq!(SessionKey::new(&SessionKey::generate()).unwrap().open::<Session>(&sealed), None, "another key");
        let mut altered = sealed.into_bytes();
        let last = altered.len() - 5;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(key.open::<Session>(&String::from_utf8(altered).unwrap()), None, "tampered");
        assert_eq!(key.open::<Session>("not-base64!"), None);
        assert!(SessionKey::new(&[0u8; 16]).is_err());
    }

    #[test]
    fn sessions_expire_with_the_session_time_or_the_token_whichever_is_first() {
        let plain = Session::new("alice".into(), vec![], "opaque".into(), 1000);
        assert_eq!(plain.expires, 1000 + SESSION_SECONDS);
        assert!(!plain.expired(1000) && plain.expired(1000 + SESSION_SECONDS));
        let claims = URL_SAFE_NO_PAD.encode(br#"{"exp":1600,"sub":"system:serviceaccount:default:demo"}"#);
        let jwt = format!("eyJhbGciOiJSUzI1NiJ9.{claims}.signature");
        assert_eq!(Session::new("demo".into(), vec![], jwt, 1000).expires, 1600);
    }

    #[test]
    fn service_accounts_read_as_name_and_namespace() {
        let sa = Session::new("system:serviceaccount:default:console-demo".into(), vec![], "t".into(), 0);
        assert_eq!(sa.display_name(), "console-demo (ServiceAccount in default)");
        assert_eq!(Session::new("alice".into(), vec![], "t".into(), 0).display_name(), "alice");
    }

    #[test]
    fn debug_never_shows_the_token() {
        let session = Session::new("alice".into(), vec![], "secret-token".into(), 0);
        assert!(!format!("{session:?}").contains("secret-token"));
    }

    #[test]
    fn cookies_are_found_by_name_and_set_strict_and_http_only() {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::COOKIE, "a=1; slotkeeper_session=abc; b=2".parse().unwrap());
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&headers, "missing"), None);
        let set = set_cookie(SESSION_COOKIE, "abc", 60, true);
        let text = set.to_str().unwrap();
        assert!(text.contains("HttpOnly") && text.contains("SameSite=Strict") && text.contains("Secure"));
        assert!(text.starts_with("__Host-slotkeeper_session=abc; Path=/;") && !text.contains("Domain"), "{text}");
        assert!(!set_cookie(SESSION_COOKIE, "", 0, false).to_str().unwrap().contains("Secure"));
    }

    /// Over HTTPS only the `__Host-` cookie counts: one planted without the
    /// prefix (by a sibling host or a plain-HTTP page) is not read.
    #[test]
    fn over_tls_only_the_host_only_cookie_is_read() {
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-proto", "https".parse().unwrap());
        headers.insert(http::header::COOKIE, "slotkeeper_session=planted".parse().unwrap());
        assert_eq!(cookie(&headers, SESSION_COOKIE), None);
        headers.insert(
            http::header::COOKIE,
            "slotkeeper_session=planted; __Host-slotkeeper_session=ours".parse().unwrap(),
        );
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("ours"));
    }
}
