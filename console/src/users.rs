//! Kubernetes clients that act as the signed-in user: the operator's own
//! connection settings (API address, CA) with the user's bearer token and
//! nothing of the operator's identity, so RBAC, admission and the audit log
//! see the real person. Kept briefly per token, since building one sets up TLS.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::config::AuthInfo;

use crate::session::Session;

const KEEP: Duration = Duration::from_secs(300);
const MOST: usize = 512;

pub struct UserClients {
    base: kube::Config,
    clients: Mutex<HashMap<u64, (kube::Client, Instant)>>,
}

impl UserClients {
    pub fn new(mut base: kube::Config) -> Self {
        // Only where and how to connect; who connects comes from the session.
        base.auth_info = AuthInfo::default();
        base.headers.clear();
        Self { base, clients: Mutex::default() }
    }

    pub fn client(&self, session: &Session) -> Result<kube::Client, kube::Error> {
        let id = session.token_id();
        let now = Instant::now();
        let mut clients = self.clients.lock().expect("user clients lock");
        if let Some((client, made)) = clients.get(&id)
            && now.duration_since(*made) < KEEP
        {
            return Ok(client.clone());
        }
        let mut config = self.base.clone();
        config.auth_info = AuthInfo { token: Some(session.token().to_owned().into()), ..AuthInfo::default() };
        let client = kube::Client::try_from(config)?;
        if clients.len() >= MOST {
            clients.retain(|_, (_, made)| now.duration_since(*made) < KEEP);
            if clients.len() >= MOST {
                clients.clear();
            }
        }
        clients.insert(id, (client.clone(), now));
        Ok(client)
    }
}
