//! Kubernetes Events about clusters, their Pods and their operations, kept
//! per involved object and bounded, so a reader lists a cluster's events
//! newest first without asking the API.

use std::collections::HashMap;
use std::sync::RwLock;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;

/// Events kept per involved object; older ones are dropped.
const PER_OBJECT: usize = 50;
/// Objects kept in all; the ones with the oldest news go first.
const OBJECTS: usize = 20_000;

pub const KIND_CLUSTER: &str = "RedisCluster";
pub const KIND_OPERATION: &str = "RedisOperation";
pub const KIND_POD: &str = "Pod";

/// One event as a reader shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct EventView {
    pub uid: String,
    pub namespace: String,
    /// The involved object.
    pub kind: String,
    pub name: String,
    /// `Normal` or `Warning`.
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub count: i32,
    pub last_seen: Option<Timestamp>,
    /// Who reported it (`slotkeeper`, `default-scheduler`, …).
    pub reporter: String,
}

impl EventView {
    pub fn of(event: &Event) -> Option<Self> {
        let involved = &event.involved_object;
        let last_seen = event
            .series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
            .or(event.last_timestamp.as_ref().map(|t| t.0))
            .or(event.event_time.as_ref().map(|t| t.0))
            .or(event.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let count = event.series.as_ref().and_then(|s| s.count).or(event.count).unwrap_or(1).max(1);
        let reporter = event
            .reporting_component
            .clone()
            .filter(|c| !c.is_empty())
            .or_else(|| event.source.as_ref().and_then(|s| s.component.clone()))
            .unwrap_or_default();
        Some(Self {
            uid: event.metadata.uid.clone()?,
            namespace: involved.namespace.clone().or(event.metadata.namespace.clone())?,
            kind: involved.kind.clone()?,
            name: involved.name.clone()?,
            type_: event.type_.clone().unwrap_or_else(|| "Normal".into()),
            reason: event.reason.clone().unwrap_or_default(),
            message: event.message.clone().unwrap_or_default(),
            count,
            last_seen,
            reporter,
        })
    }

    fn key(&self) -> ObjectKey {
        (self.namespace.clone(), self.kind.clone(), self.name.clone())
    }
}

/// The cluster a Pod belongs to, by the operator's naming
/// (`<cluster>-shard-<shard>-<ordinal>`).
pub fn cluster_of_pod(pod: &str) -> Option<&str> {
    let (rest, ordinal) = pod.rsplit_once('-')?;
    let (rest, shard) = rest.rsplit_once('-')?;
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !numeric(ordinal) || !numeric(shard) {
        return None;
    }
    rest.strip_suffix("-shard").filter(|c| !c.is_empty())
}

type ObjectKey = (String, String, String);

#[derive(Default)]
pub struct EventLog {
    objects: RwLock<HashMap<ObjectKey, Vec<EventView>>>,
}

impl EventLog {
    /// Adds or updates an event (a repeated event keeps its uid).
    pub fn apply(&self, event: EventView) {
        let mut objects = self.objects.write().expect("event log lock");
        if objects.len() >= OBJECTS && !objects.contains_key(&event.key()) {
            evict_stalest(&mut objects);
        }
        let list = objects.entry(event.key()).or_default();
        list.retain(|e| e.uid != event.uid);
        list.push(event);
        list.sort_by_key(|e| e.last_seen);
        if list.len() > PER_OBJECT {
            list.drain(..list.len() - PER_OBJECT);
        }
    }

    pub fn delete(&self, event: &EventView) {
        let mut objects = self.objects.write().expect("event log lock");
        if let Some(list) = objects.get_mut(&event.key()) {
            list.retain(|e| e.uid != event.uid);
            if list.is_empty() {
                objects.remove(&event.key());
            }
        }
    }

    /// Replaces everything of the given kind (after a watch re-listed).
    pub fn replace_kind(&self, kind: &str, events: Vec<EventView>) {
        self.objects.write().expect("event log lock").retain(|(_, k, _), _| k != kind);
        for event in events {
            self.apply(event);
        }
    }

    /// The events of cluster `name` in `namespace`, its Pods and the given
    /// operations, newest first, at most `limit`.
    pub fn for_cluster(&self, namespace: &str, name: &str, operations: &[String], limit: usize) -> Vec<EventView> {
        let objects = self.objects.read().expect("event log lock");
        let mut found: Vec<EventView> = objects
            .iter()
            .filter(|((ns, kind, object), _)| {
                ns == namespace
                    && match kind.as_str() {
                        KIND_CLUSTER => object == name,
                        KIND_POD => cluster_of_pod(object) == Some(name),
                        KIND_OPERATION => operations.iter().any(|o| o == object),
                        _ => false,
                    }
            })
            .flat_map(|(_, events)| events.iter().cloned())
            .collect();
        found.sort_by(|a, b| b.last_seen.cmp(&a.last_seen).then_with(|| a.uid.cmp(&b.uid)));
        found.truncate(limit);
        found
    }
}

fn evict_stalest(objects: &mut HashMap<ObjectKey, Vec<EventView>>) {
    let stalest =
        objects.iter().min_by_key(|(_, events)| events.last().and_then(|e| e.last_seen)).map(|(k, _)| k.clone());
    if let Some(key) = stalest {
        objects.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(uid: &str, kind: &str, name: &str, second: i64) -> EventView {
        EventView {
            uid: uid.into(),
            namespace: "apps".into(),
            kind: kind.into(),
            name: name.into(),
            type_: "Normal".into(),
            reason: "Test".into(),
            message: format!("event {uid}"),
            count: 1,
            last_seen: Some(Timestamp::from_second(second).unwrap()),
            reporter: "slotkeeper".into(),
        }
    }

    #[test]
    fn pods_belong_to_their_cluster_by_name() {
        assert_eq!(cluster_of_pod("cache-shard-2-1"), Some("cache"));
        assert_eq!(cluster_of_pod("my-cache-shard-12-0"), Some("my-cache"));
        assert_eq!(cluster_of_pod("cache-7d9f-abcde"), None);
        assert_eq!(cluster_of_pod("-shard-1-0"), None);
        assert_eq!(cluster_of_pod("shard-1-0"), None);
    }

    #[test]
    fn a_cluster_sees_its_own_its_pods_and_its_operations_events_newest_first() {
        let log = EventLog::default();
        log.apply(event("1", KIND_CLUSTER, "cache", 10));
        log.apply(event("2", KIND_POD, "cache-shard-0-1", 30));
        log.apply(event("3", KIND_OPERATION, "failover-1", 20));
        log.apply(event("4", KIND_CLUSTER, "other", 40));
        log.apply(event("5", KIND_POD, "other-shard-0-0", 50));
        let uids = |events: Vec<EventView>| events.into_iter().map(|e| e.uid).collect::<Vec<_>>();
        assert_eq!(uids(log.for_cluster("apps", "cache", &["failover-1".into()], 10)), ["2", "3", "1"]);
        assert_eq!(uids(log.for_cluster("apps", "cache", &[], 2)), ["2", "1"]);
        assert!(log.for_cluster("elsewhere", "cache", &[], 10).is_empty());
    }

    #[test]
    fn repeats_update_in_place_and_each_object_is_bounded() {
        let log = EventLog::default();
        log.apply(event("1", KIND_CLUSTER, "cache", 10));
        let mut again = event("1", KIND_CLUSTER, "cache", 20);
        again.count = 2;
        log.apply(again);
        let events = log.for_cluster("apps", "cache", &[], 10);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].count, 2);
        for i in 0..(PER_OBJECT as i64 + 10) {
            log.apply(event(&format!("n{i}"), KIND_CLUSTER, "cache", 100 + i));
        }
        let events = log.for_cluster("apps", "cache", &[], 1000);
        assert_eq!(events.len(), PER_OBJECT);
        assert_eq!(events[0].uid, format!("n{}", PER_OBJECT + 9), "the newest survive");
        log.delete(&events[0]);
        assert_eq!(log.for_cluster("apps", "cache", &[], 1000).len(), PER_OBJECT - 1);
    }
}
