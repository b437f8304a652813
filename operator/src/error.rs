//! The controller's errors, each with the context to act on it and a class
//! that decides how soon to retry.

use std::time::Duration;

use crate::redis::client::RedisError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec cannot be acted on until a human changes something.
    #[error("invalid spec: {0}")]
    InvalidSpec(String),
    #[error("kubernetes API: {context}: {source}")]
    Kube { context: String, source: kube::Error },
    #[error(transparent)]
    Redis(#[from] RedisError),
}

impl Error {
    pub fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let context = context.into();
        move |source| Error::Kube { context, source }
    }

    /// Short class name for metrics and logs.
    pub fn class(&self) -> &'static str {
        match self {
            Error::InvalidSpec(_) => "invalid_spec",
            Error::Kube { .. } => "kubernetes",
            Error::Redis(_) => "redis",
        }
    }

    /// How long to wait before trying again: never a hot loop on a spec error.
    pub fn retry_after(&self) -> Duration {
        match self {
            Error::InvalidSpec(_) => Duration::from_secs(300),
            Error::Kube { .. } => Duration::from_secs(5),
            Error::Redis(_) => Duration::from_secs(2),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
