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
/// Bytes of event text kept in all (every replica holds this log, whoever
/// files the Events): past it, the objects with the oldest news go first.
pub const BUDGET_BYTES: usize = 8 * 1024 * 1024;
/// The longest message kept; a longer one is cut at a character boundary.
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// The longest name, kind, reason or reporter kept (a DNS subdomain's length).
const MAX_FIELD_BYTES: usize = 253;

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
        // An Event is about an object of its own namespace: anyone who may
        // create Events in one namespace must not write on another's page.
        let namespace = event.metadata.namespace.clone()?;
        if involved.namespace.as_ref().is_some_and(|ns| *ns != namespace) {
            return None;
        }
        let field = |value: Option<&String>| truncated(value.map_or("", String::as_str), MAX_FIELD_BYTES);
        Some(Self {
            uid: truncated(event.metadata.uid.as_deref()?, MAX_FIELD_BYTES),
            namespace,
            kind: field(Some(involved.kind.as_ref()?)),
            name: field(Some(involved.name.as_ref()?)),
            type_: if event.type_.as_deref() == Some("Warning") { "Warning" } else { "Normal" }.into(),
            reason: field(event.reason.as_ref()),
            message: truncated(event.message.as_deref().unwrap_or_default(), MAX_MESSAGE_BYTES),
            count,
            last_seen,
            reporter: truncated(&reporter, MAX_FIELD_BYTES),
        })
    }

    /// About how many bytes this view holds.
    fn size(&self) -> usize {
        let text = [&self.uid, &self.namespace, &self.kind, &self.name, &self.type_, &self.reason, &self.message];
        std::mem::size_of::<Self>() + text.iter().map(|s| s.len()).sum::<usize>() + self.reporter.len()
    }

    fn key(&self) -> ObjectKey {
        (self.namespace.clone(), self.kind.clone(), self.name.clone())
    }
}

/// `text` cut to at most `max` bytes at a character boundary, marked with `…` when cut.
fn truncated(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
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
    inner: RwLock<Log>,
}

#[derive(Default)]
struct Log {
    objects: HashMap<ObjectKey, Vec<EventView>>,
    /// The sum of every kept view's size.
    bytes: usize,
}

impl Log {
    fn remove_object(&mut self, key: &ObjectKey) {
        if let Some(events) = self.objects.remove(key) {
            self.bytes -= events.iter().map(EventView::size).sum::<usize>();
        }
    }

    /// The object whose newest event is the oldest, other than `keep`.
    fn stalest_except(&self, keep: &ObjectKey) -> Option<ObjectKey> {
        let others = self.objects.iter().filter(|(k, _)| *k != keep);
        others.min_by_key(|(_, events)| events.last().and_then(|e| e.last_seen)).map(|(k, _)| k.clone())
    }

    /// Removes the event `uid` of object `key`, if kept; the bytes it held.
    fn remove_event(&mut self, key: &ObjectKey, uid: &str) -> usize {
        let Some(list) = self.objects.get_mut(key) else { return 0 };
        let Some(at) = list.iter().position(|e| e.uid == uid) else { return 0 };
        let freed = list.remove(at).size();
        self.bytes -= freed;
        freed
    }
}

impl EventLog {
    /// Adds or updates an event (a repeated event keeps its uid).
    pub fn apply(&self, event: EventView) {
        let mut log = self.inner.write().expect("event log lock");
        let key = event.key();
        if log.objects.len() >= OBJECTS
            && !log.objects.contains_key(&key)
            && let Some(stalest) = log.stalest_except(&key)
        {
            log.remove_object(&stalest);
        }
        log.remove_event(&key, &event.uid);
        log.bytes += event.size();
        let list = log.objects.entry(key.clone()).or_default();
        list.push(event);
        list.sort_by_key(|e| e.last_seen);
        let dropped: usize = list.drain(..list.len().saturating_sub(PER_OBJECT)).map(|e| e.size()).sum();
        log.bytes -= dropped;
        // Over the budget, other objects go, the stalest first.
        while log.bytes > BUDGET_BYTES {
            let Some(stalest) = log.stalest_except(&key) else { break };
            log.remove_object(&stalest);
        }
    }

    pub fn delete(&self, event: &EventView) {
        let mut log = self.inner.write().expect("event log lock");
        let key = event.key();
        log.remove_event(&key, &event.uid);
        if log.objects.get(&key).is_some_and(Vec::is_empty) {
            log.objects.remove(&key);
        }
    }

    /// Bytes held now (at most [`BUDGET_BYTES`] plus one object's events).
    pub fn bytes(&self) -> usize {
        self.inner.read().expect("event log lock").bytes
    }

    /// Replaces everything of the given kind (after a watch re-listed).
    pub fn replace_kind(&self, kind: &str, events: Vec<EventView>) {
        {
            let mut log = self.inner.write().expect("event log lock");
            let gone: Vec<ObjectKey> = log.objects.keys().filter(|(_, k, _)| k == kind).cloned().collect();
            gone.iter().for_each(|key| log.remove_object(key));
        }
        for event in events {
            self.apply(event);
        }
    }

    /// The events of cluster `name` in `namespace`, its Pods and the given
    /// operations, newest first, at most `limit`.
    pub fn for_cluster(&self, namespace: &str, name: &str, operations: &[String], limit: usize) -> Vec<EventView> {
        let log = self.inner.read().expect("event log lock");
        let mut found: Vec<EventView> = log
            .objects
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

    fn k8s_event(namespace: &str, involved_namespace: &str, message: String) -> Event {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "e", "namespace": namespace, "uid": format!("{namespace}-{}", message.len())},
            "involvedObject": {"kind": KIND_CLUSTER, "name": "cache", "namespace": involved_namespace},
            "reason": "Flood", "message": message, "type": "Warning",
        }))
        .unwrap()
    }

    /// Security review finding 4: an Event filed under another namespace's cluster.
    #[test]
    fn an_event_about_another_namespaces_object_is_dropped() {
        assert!(EventView::of(&k8s_event("tenant", "payments", "hello".into())).is_none());
        let own = EventView::of(&k8s_event("payments", "payments", "hello".into())).unwrap();
        assert_eq!((own.namespace.as_str(), own.name.as_str()), ("payments", "cache"));
    }

    #[test]
    fn messages_are_cut_and_the_log_holds_its_budget_under_a_flood() {
        let view = EventView::of(&k8s_event("apps", "apps", "é".repeat(1024 * 1024))).unwrap();
        assert!(view.message.len() <= MAX_MESSAGE_BYTES && view.message.ends_with('…'), "{}", view.message.len());
        let log = EventLog::default();
        let (mut flood, mut count) = (0, 0);
        while flood < 4 * BUDGET_BYTES {
            let mut event = event(&format!("f{count}"), KIND_CLUSTER, &format!("c{count}"), 1000 + count);
            event.message = "x".repeat(MAX_MESSAGE_BYTES);
            flood += event.size();
            count += 1;
            log.apply(event);
            assert!(log.bytes() <= BUDGET_BYTES, "{} bytes after {count} events", log.bytes());
        }
        // The newest news is kept, the oldest went.
        assert_eq!(log.for_cluster("apps", &format!("c{}", count - 1), &[], 1).len(), 1);
        assert!(log.for_cluster("apps", "c0", &[], 1).is_empty());
    }
}
