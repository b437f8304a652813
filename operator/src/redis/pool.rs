//! Connections kept open between the reconciles of a cluster with work going
//! on, one per Redis node, so each step costs one pipelined round trip per
//! node instead of a TCP handshake and AUTH; a converged cluster's are
//! dropped until its next resync. Entries are grouped by cluster: a
//! reconcile drops its cluster's connections to addresses no Pod holds any
//! more, and a failed call drops the connection it used.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash as _, Hasher as _};
use std::sync::Mutex;

use redis::aio::MultiplexedConnection;

use super::client::{Logins, RedisError, RedisNode};

/// `namespace/cluster`.
pub type ClusterKey = String;

struct Pooled {
    /// A password change must not reuse a connection authenticated with the
    /// old one; only a fingerprint of the logins is kept, never a password.
    logins_fingerprint: u64,
    /// Whether it signed in as the operator's own user (else as `default`).
    own: bool,
    connection: MultiplexedConnection,
}

#[derive(Default)]
pub struct Pool {
    clusters: Mutex<HashMap<ClusterKey, HashMap<String, Pooled>>>,
}

fn fingerprint(logins: &Logins) -> u64 {
    let mut hasher = DefaultHasher::new();
    logins.hash(&mut hasher);
    hasher.finish()
}

impl Pool {
    /// A connection to `ip`, reused when one is open with these logins.
    pub async fn node(&self, cluster: &str, ip: &str, logins: &Logins) -> Result<RedisNode, RedisError> {
        let wanted = fingerprint(logins);
        let reused = self.clusters.lock().expect("pool lock").get(cluster).and_then(|nodes| {
            nodes.get(ip).filter(|p| p.logins_fingerprint == wanted).map(|p| (p.connection.clone(), p.own))
        });
        if let Some((connection, own)) = reused {
            let login = if own { logins.own.clone() } else { logins.fallback.clone() };
            return Ok(RedisNode::from_connection(ip, connection, login));
        }
        let node = RedisNode::connect(ip, logins).await?;
        let own = node.login() == &logins.own;
        let pooled = Pooled { logins_fingerprint: wanted, own, connection: node.connection() };
        self.clusters.lock().expect("pool lock").entry(cluster.to_owned()).or_default().insert(ip.to_owned(), pooled);
        Ok(node)
    }

    pub fn contains(&self, cluster: &str, ip: &str) -> bool {
        self.clusters.lock().expect("pool lock").get(cluster).is_some_and(|nodes| nodes.contains_key(ip))
    }

    /// Forgets the connection to `ip` (after it failed).
    pub fn discard(&self, cluster: &str, ip: &str) {
        if let Some(nodes) = self.clusters.lock().expect("pool lock").get_mut(cluster) {
            nodes.remove(ip);
        }
    }

    /// Keeps only connections to addresses the cluster's Pods hold now.
    pub fn retain(&self, cluster: &str, live: &BTreeSet<&str>) {
        if let Some(nodes) = self.clusters.lock().expect("pool lock").get_mut(cluster) {
            nodes.retain(|ip, _| live.contains(ip.as_str()));
        }
    }

    pub fn forget_cluster(&self, cluster: &str) {
        self.clusters.lock().expect("pool lock").remove(cluster);
    }
}
