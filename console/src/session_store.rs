//! Where sessions begin and end. A session's cookie is `ID.SEALED`: the
//! session (name, groups, bearer token, expiry) sealed under a key of its
//! own, which lives only in the Secret `slotkeeper-console-sessions` of the
//! operator's namespace, under `ID`. So:
//! - whoever reads that Secret holds keys but no cookie, and a cookie alone
//!   opens nothing; a cookie captured once (a proxy log, a HAR file) stops
//!   opening, for anyone, the moment its session ends;
//! - signing out deletes the key, which ends the session on every replica
//!   within [`FRESH`] (and ends its live streams);
//! - any replica opens any session, and a restart signs nobody out.
//!
//! What it does not do: a copy of the Secret taken while a session was open,
//! with that session's cookie, still yields its token (sign-out cannot
//! revoke a token at the apiserver).
//!
//! Sessions are bounded: [`MOST_PER_USER`] per user and [`MOST`] in all (the
//! oldest gives way), expired ones pruned at each sign-in. Requests read the
//! sessions from memory; one read of the Secret at a time refreshes them.

use std::collections::HashMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use ring::rand::{SecureRandom as _, SystemRandom};
use tokio::sync::Mutex;

use crate::session::{Session, SessionKey};

pub const SECRET_NAME: &str = "slotkeeper-console-sessions";
/// Sessions open at once, over every user (about 100 bytes each in the Secret).
pub const MOST: usize = 2000;
/// Sessions of one user; signing in once more ends that user's oldest.
pub const MOST_PER_USER: usize = 16;
/// How old the known sessions may be before a request reads them again:
/// how long a session ended elsewhere may still open here.
pub const FRESH: Duration = Duration::from_secs(2);
/// A cookie naming a session not known here reads the Secret again, at most
/// this often (a session begun on another replica a moment ago).
const UNKNOWN_REREAD: Duration = Duration::from_millis(250);
/// After a failed read, nobody is signed in and nothing is read for this long.
const FAILED_PAUSE: Duration = Duration::from_secs(1);
const READ_TIMEOUT: Duration = Duration::from_secs(5);
const ID_BYTES: usize = 16;
const ID_CHARS: usize = 22;
const ENTRY_BYTES: usize = SessionKey::LEN + 8 + 8;

/// One session's key, when it ends, and whose it is (a fingerprint of the name).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Entry {
    key: [u8; SessionKey::LEN],
    expires: i64,
    user: u64,
}

impl Entry {
    fn encode(&self) -> Vec<u8> {
        let mut bytes = self.key.to_vec();
        bytes.extend(self.expires.to_be_bytes());
        bytes.extend(self.user.to_be_bytes());
        bytes
    }

    /// `None` for anything but exactly the bytes [`Entry::encode`] writes.
    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != ENTRY_BYTES {
            return None;
        }
        let (key, rest) = bytes.split_at(SessionKey::LEN);
        let (expires, user) = rest.split_at(8);
        Some(Self {
            key: key.try_into().ok()?,
            expires: i64::from_be_bytes(expires.try_into().ok()?),
            user: u64::from_be_bytes(user.try_into().ok()?),
        })
    }
}

fn fingerprint(user: &str) -> u64 {
    let digest = ring::digest::digest(&ring::digest::SHA256, user.as_bytes());
    u64::from_be_bytes(digest.as_ref()[..8].try_into().expect("8 bytes"))
}

/// Whether `id` has the shape of a session id (URL-safe base64 of 16 bytes).
fn id_like(id: &str) -> bool {
    id.len() == ID_CHARS && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The session id and sealed part of a cookie value, if it has their shape.
fn parse_cookie(value: &str) -> Option<(&str, &str)> {
    let (id, sealed) = value.split_once('.')?;
    id_like(id).then_some((id, sealed))
}

/// The well-formed sessions a Secret holds; anything else in it is ignored.
fn entries_of(secret: &Secret) -> HashMap<String, Entry> {
    let data = secret.data.iter().flatten();
    data.filter(|(id, _)| id_like(id)).filter_map(|(id, bytes)| Some((id.clone(), Entry::decode(&bytes.0)?))).collect()
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {context}: {source}")]
    Kube { context: &'static str, source: kube::Error },
    #[error("reading the console sessions took longer than {READ_TIMEOUT:?}")]
    Slow,
    #[error("the token has expired")]
    Expired,
}

/// The sessions to remove so that one more of `user` fits: the expired ones,
/// that user's oldest beyond [`MOST_PER_USER`], then the oldest of all
/// beyond [`MOST`] (a full store keeps nobody from signing in).
fn make_room(entries: &HashMap<String, Entry>, user: u64, now: i64) -> Vec<String> {
    let mut remove: Vec<String> = entries.iter().filter(|(_, e)| e.expires <= now).map(|(id, _)| id.clone()).collect();
    let mut live: Vec<(&String, &Entry)> = entries.iter().filter(|(_, e)| e.expires > now).collect();
    live.sort_by_key(|(id, e)| (e.expires, (*id).clone()));
    let theirs = live.iter().filter(|(_, e)| e.user == user).count();
    let mut over = (theirs + 1).saturating_sub(MOST_PER_USER);
    live.retain(|(id, e)| {
        let drop = e.user == user && over > 0;
        if drop {
            over -= 1;
            remove.push((*id).clone());
        }
        !drop
    });
    let beyond = (live.len() + 1).saturating_sub(MOST);
    remove.extend(live.into_iter().take(beyond).map(|(id, _)| id.clone()));
    remove
}

#[derive(Default)]
struct Known {
    entries: HashMap<String, Entry>,
    /// When the entries were asked for.
    read: Option<Instant>,
    /// When a read last failed.
    failed: Option<Instant>,
}

impl Known {
    /// The entry of `id` if what is known may answer: read at most
    /// [`FRESH`] ago (and, for an id not known, [`UNKNOWN_REREAD`] ago), or
    /// `Some(None)` within [`FAILED_PAUSE`] of a failed read. `None`: read first.
    fn answer(&self, id: &str) -> Option<Option<Entry>> {
        let age = self.read.map(|read| read.elapsed());
        let stale = age.is_none_or(|age| age >= FRESH);
        let unknown = !self.entries.contains_key(id) && age.is_none_or(|age| age >= UNKNOWN_REREAD);
        if !(stale || unknown) {
            return Some(self.entries.get(id).copied());
        }
        let failed_just_now = self.failed.is_some_and(|failed| failed.elapsed() < FAILED_PAUSE);
        failed_just_now.then_some(None)
    }
}

pub struct SessionStore {
    secrets: Api<Secret>,
    known: RwLock<Known>,
    /// One read or write of the Secret at a time on this replica.
    busy: Mutex<()>,
    random: SystemRandom,
}

impl SessionStore {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        Self {
            secrets: Api::namespaced(client, namespace),
            known: RwLock::default(),
            busy: Mutex::new(()),
            random: SystemRandom::new(),
        }
    }

    fn known(&self) -> RwLockReadGuard<'_, Known> {
        self.known.read().expect("sessions lock")
    }

    fn known_mut(&self) -> RwLockWriteGuard<'_, Known> {
        self.known.write().expect("sessions lock")
    }

    /// Reads the sessions; the caller holds `busy`.
    async fn read(&self) -> Result<(), StoreError> {
        let asked = Instant::now();
        let read = match tokio::time::timeout(READ_TIMEOUT, self.secrets.get_opt(SECRET_NAME)).await {
            Ok(Ok(secret)) => Ok(secret.as_ref().map(entries_of).unwrap_or_default()),
            Ok(Err(source)) => Err(StoreError::Kube { context: "read the console sessions", source }),
            Err(_) => Err(StoreError::Slow),
        };
        let mut known = self.known_mut();
        match read {
            Ok(entries) => {
                *known = Known { entries, read: Some(asked), failed: None };
                Ok(())
            }
            Err(error) => {
                known.read = None;
                known.failed = Some(Instant::now());
                Err(error)
            }
        }
    }

    /// The entry of session `id`, from sessions read at most [`FRESH`] ago.
    /// Fails closed: when the Secret cannot be read, no session opens.
    async fn entry(&self, id: &str) -> Option<Entry> {
        if let Some(answer) = self.known().answer(id) {
            return answer;
        }
        let _busy = self.busy.lock().await;
        // Read by another request while this one waited?
        if let Some(answer) = self.known().answer(id) {
            return answer;
        }
        if let Err(error) = self.read().await {
            tracing::warn!(%error, "console: sessions unreadable; nobody is signed in until they are");
            return None;
        }
        self.known().entries.get(id).copied()
    }

    /// The session a cookie holds, if it is still open and not expired.
    pub async fn open(&self, cookie: &str, now: i64) -> Option<Session> {
        let (id, sealed) = parse_cookie(cookie)?;
        let entry = self.entry(id).await.filter(|e| e.expires > now)?;
        let mut session: Session = SessionKey::new(&entry.key).ok()?.open(sealed)?;
        session.id = id.to_owned();
        (!session.expired(now)).then_some(session)
    }

    /// Whether `session` is still open (not signed out anywhere, not expired).
    pub async fn alive(&self, session: &Session, now: i64) -> bool {
        !session.expired(now) && self.entry(&session.id).await.is_some_and(|e| e.expires > now)
    }

    /// Records a new session; the cookie value that opens it.
    pub async fn begin(&self, session: &Session, now: i64) -> Result<String, StoreError> {
        if session.expired(now) {
            return Err(StoreError::Expired);
        }
        let _busy = self.busy.lock().await;
        self.read().await?;
        let user = fingerprint(&session.user);
        let remove = make_room(&self.known().entries, user, now);
        let mut id = [0u8; ID_BYTES];
        self.random.fill(&mut id).expect("the system's random source works");
        let id = URL_SAFE_NO_PAD.encode(id);
        let entry = Entry { key: SessionKey::generate(), expires: session.expires, user };
        let mut data: serde_json::Map<String, serde_json::Value> =
            remove.iter().map(|gone| (gone.clone(), serde_json::Value::Null)).collect();
        data.insert(id.clone(), STANDARD.encode(entry.encode()).into());
        self.write(data, &entry, &id).await?;
        {
            let mut known = self.known_mut();
            for gone in &remove {
                known.entries.remove(gone);
            }
            known.entries.insert(id.clone(), entry);
        }
        let sealed = SessionKey::new(&entry.key).expect("a generated key has its length").seal(session);
        Ok(format!("{id}.{sealed}"))
    }

    /// Adds and removes sessions by merge patch (each key on its own, so
    /// replicas signing people in at once do not overwrite each other);
    /// creates the Secret with the first session.
    async fn write(
        &self,
        data: serde_json::Map<String, serde_json::Value>,
        entry: &Entry,
        id: &str,
    ) -> Result<(), StoreError> {
        let patch = Patch::Merge(serde_json::json!({ "data": data }));
        let patched = self.secrets.patch(SECRET_NAME, &PatchParams::default(), &patch).await;
        match patched {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => return Err(StoreError::Kube { context: "record the session", source }),
        }
        let secret = crate::keys::console_secret(SECRET_NAME, id, entry.encode());
        match self.secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => Ok(()),
            // Another replica made it first: add to theirs.
            Err(kube::Error::Api(e)) if e.code == 409 => self
                .secrets
                .patch(SECRET_NAME, &PatchParams::default(), &patch)
                .await
                .map(|_| ())
                .map_err(|source| StoreError::Kube { context: "record the session", source }),
            Err(source) => Err(StoreError::Kube { context: "create the console sessions Secret", source }),
        }
    }

    /// Ends `session` (one that opened) on every replica: its key is deleted.
    pub async fn end(&self, session: &Session) -> Result<(), StoreError> {
        let id = session.id.as_str();
        if !id_like(id) {
            return Ok(());
        }
        let _busy = self.busy.lock().await;
        let patch = Patch::Merge(serde_json::json!({ "data": { id: null } }));
        match self.secrets.patch(SECRET_NAME, &PatchParams::default(), &patch).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(source) => return Err(StoreError::Kube { context: "end the session", source }),
        }
        self.known_mut().entries.remove(id);
        Ok(())
    }
}

#[cfg(test)]
#[path = "session_store_tests.rs"]
mod tests;
