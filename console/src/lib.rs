//! The web console served by the operator process. Its pages come next;
//! this is the router `main` merges beside the operator's.
#![forbid(unsafe_code)]

use slotkeeper_readmodel::ReadModel;

/// What the console is built from.
pub struct ConsoleConfig {
    pub readmodel: ReadModel,
    /// The operator's own client.
    pub client: kube::Client,
    /// Where the apiserver is and how to trust it, for calls made as a user.
    pub user_config: kube::Config,
    /// The operator's namespace.
    pub key_namespace: String,
}

/// The console's routes, to merge beside the operator's.
pub fn router(_config: ConsoleConfig) -> axum::Router {
    axum::Router::new()
}
