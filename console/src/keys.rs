//! The session key: 32 random bytes in a Secret of the operator's own
//! namespace, created by whichever replica starts first and read by the
//! others, so a cookie sealed by one replica opens on every other. Loaded in
//! the background: the console answers "starting" until it is there, and
//! nothing else waits for it.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::session::SessionKey;

pub const SECRET_NAME: &str = "slotkeeper-console-session";
const KEY_FIELD: &str = "session-key";
const RETRY: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct SessionKeys {
    key: OnceLock<SessionKey>,
}

impl SessionKeys {
    /// Starts loading (or creating) the key in `namespace`.
    pub fn load(client: kube::Client, namespace: String) -> Arc<Self> {
        let keys = Arc::new(Self::default());
        let loading = keys.clone();
        tokio::spawn(async move {
            let secrets: Api<Secret> = Api::namespaced(client, &namespace);
            loop {
                match read_or_create(&secrets).await {
                    Ok(key) => {
                        let _ = loading.key.set(key);
                        tracing::info!(namespace, secret = SECRET_NAME, "console session key loaded");
                        return;
                    }
                    Err(error) => {
                        tracing::warn!(namespace, secret = SECRET_NAME, %error, "cannot load the console session key; retrying")
                    }
                }
                tokio::time::sleep(RETRY).await;
            }
        });
        keys
    }

    pub fn get(&self) -> Option<&SessionKey> {
        self.key.get()
    }
}

#[derive(Debug, thiserror::Error)]
enum KeyError {
    #[error("{context}: {source}")]
    Kube { context: &'static str, source: kube::Error },
    #[error("Secret {SECRET_NAME} has no valid {KEY_FIELD:?}: {0}; delete it and the console makes a new one")]
    Invalid(String),
}

async fn read_or_create(secrets: &Api<Secret>) -> Result<SessionKey, KeyError> {
    let kube = |context| move |source| KeyError::Kube { context, source };
    if let Some(secret) = secrets.get_opt(SECRET_NAME).await.map_err(kube("read the session key Secret"))? {
        return key_in(&secret);
    }
    let bytes = SessionKey::generate();
    let secret = console_secret(SECRET_NAME, KEY_FIELD, bytes.to_vec());
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(created) => key_in(&created),
        // Another replica made it first: use theirs.
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let secret = secrets.get(SECRET_NAME).await.map_err(kube("read the session key Secret"))?;
            key_in(&secret)
        }
        Err(source) => Err(KeyError::Kube { context: "create the session key Secret", source }),
    }
}

/// A Secret of the console's own (labelled as such) holding `key`.
pub(crate) fn console_secret(name: &str, key: &str, value: Vec<u8>) -> Secret {
    let labels = [("app.kubernetes.io/name", "slotkeeper"), ("app.kubernetes.io/component", "console")];
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels.map(|(k, v)| (k.to_owned(), v.to_owned())).into()),
            ..Default::default()
        },
        data: Some([(key.to_owned(), ByteString(value))].into()),
        ..Default::default()
    }
}

fn key_in(secret: &Secret) -> Result<SessionKey, KeyError> {
    let bytes = secret.data.as_ref().and_then(|d| d.get(KEY_FIELD)).map(|b| b.0.as_slice()).unwrap_or_default();
    SessionKey::new(bytes).map_err(|e| KeyError::Invalid(e.to_string()))
}
