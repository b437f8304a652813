//! Read-your-writes for a cluster's status. A reconcile starts from the
//! watch cache, which can lag behind the status the previous reconcile
//! wrote (a rollout's checkpoint). Starting from the older copy would undo
//! a step just taken: a temporary replica asked to leave would be asked for
//! again, and its StatefulSet would grow back. So the object each status
//! write returned is kept until the cache has caught up with it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kube::ResourceExt as _;

use crate::api::RedisCluster;

#[derive(Default)]
pub struct Written(Mutex<BTreeMap<String, Arc<RedisCluster>>>);

impl Written {
    /// Keeps what the API server returned for a status write.
    pub fn remember(&self, written: RedisCluster) {
        self.0.lock().expect("written lock").insert(key_of(&written), Arc::new(written));
    }

    /// The cached object, or the one written last if the cache is behind it.
    pub fn freshest(&self, cached: Arc<RedisCluster>) -> Arc<RedisCluster> {
        let key = key_of(&cached);
        let mut written = self.0.lock().expect("written lock");
        match written.get(&key) {
            Some(ours) if ours.uid() == cached.uid() && is_newer(ours, &cached) => ours.clone(),
            Some(_) => {
                // The cache has it (or a later change, or another object).
                written.remove(&key);
                cached
            }
            None => cached,
        }
    }

    pub fn forget(&self, key: &str) {
        self.0.lock().expect("written lock").remove(key);
    }
}

fn key_of(cluster: &RedisCluster) -> String {
    format!("{}/{}", cluster.namespace().unwrap_or_default(), cluster.name_any())
}

/// The API server's resourceVersions are etcd revisions, which only grow;
/// one that is not a number is never taken as newer, so the cache wins.
fn is_newer(a: &RedisCluster, b: &RedisCluster) -> bool {
    let revision = |o: &RedisCluster| o.metadata.resource_version.as_deref()?.parse::<u64>().ok();
    matches!((revision(a), revision(b)), (Some(a), Some(b)) if a > b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RedisClusterStatus;

    fn cluster(uid: &str, revision: &str, phase_note: &str) -> RedisCluster {
        let mut c: RedisCluster = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "c", "namespace": "n"}, "spec": {"masters": 3, "redis": {"version": "7.0.15"}}}),
        )
        .expect("valid");
        c.metadata.uid = Some(uid.into());
        c.metadata.resource_version = Some(revision.into());
        c.status = Some(RedisClusterStatus { cluster_state: Some(phase_note.into()), ..Default::default() });
        c
    }

    #[test]
    fn the_status_written_last_wins_until_the_cache_catches_up() {
        let written = Written::default();
        written.remember(cluster("u1", "120", "written"));
        let stale = Arc::new(cluster("u1", "100", "stale"));
        assert_eq!(written.freshest(stale.clone()).status.as_ref().unwrap().cluster_state.as_deref(), Some("written"));
        let caught_up = Arc::new(cluster("u1", "120", "written"));
        assert!(Arc::ptr_eq(&written.freshest(caught_up.clone()), &caught_up));
        // Forgotten once the cache had it: an older copy is not replaced any more.
        assert!(Arc::ptr_eq(&written.freshest(stale.clone()), &stale));
    }

    #[test]
    fn a_later_change_or_another_object_of_the_same_name_is_taken_from_the_cache() {
        let written = Written::default();
        written.remember(cluster("u1", "120", "written"));
        let later = Arc::new(cluster("u1", "130", "spec changed"));
        assert!(Arc::ptr_eq(&written.freshest(later.clone()), &later));
        written.remember(cluster("u1", "120", "written"));
        let recreated = Arc::new(cluster("u2", "90", "new object"));
        assert!(Arc::ptr_eq(&written.freshest(recreated.clone()), &recreated));
        written.remember(cluster("u1", "not-a-number", "written"));
        assert!(Arc::ptr_eq(&written.freshest(later.clone()), &later));
    }
}
