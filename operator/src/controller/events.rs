//! Kubernetes events, one per distinct message. kube's `Recorder` folds
//! every event with the same reason about the same object into one series
//! for six minutes and keeps the first message, so "shard 1: … promoted"
//! would only raise the count of an earlier "shard 0: … promoted". Here the
//! message is part of what makes two events the same: only a true repeat
//! is counted on the first one (`series`), as Kubernetes' own recorders do.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};

pub use kube::runtime::events::EventType;

/// How long a repeat is counted on the first event instead of creating another.
const REPEAT_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// What makes two events the same one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    regarding: (Option<String>, Option<String>, Option<String>, Option<String>),
    type_: EventType,
    reason: String,
    note: String,
}

/// The event a key was last published as.
#[derive(Debug, Clone)]
struct Published {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
}

/// Create a new event, or count a repeat on an existing one.
#[derive(Debug, Clone, PartialEq)]
enum Publication {
    Create,
    Repeat { namespace: String, name: String, count: i32 },
}

/// The events published within the repeat window, by key.
#[derive(Debug, Default)]
struct Recent(HashMap<Key, Published>);

impl Recent {
    /// Forgets what left the window, then says how to publish `key` at `now`.
    fn decide(&mut self, key: &Key, now: Timestamp) -> Publication {
        self.0.retain(|_, p| p.last + REPEAT_WINDOW > now);
        match self.0.get(key) {
            Some(p) => Publication::Repeat { namespace: p.namespace.clone(), name: p.name.clone(), count: p.count + 1 },
            None => Publication::Create,
        }
    }

    fn remember(&mut self, key: Key, published: Published) {
        self.0.insert(key, published);
    }
}

/// Publishes the operator's events (events.k8s.io/v1).
pub struct Events {
    client: Client,
    controller: String,
    instance: String,
    recent: Mutex<Recent>,
}

impl Events {
    pub fn new(client: Client, controller: String, instance: String) -> Self {
        Self { client, controller, instance, recent: Mutex::default() }
    }

    /// Publishes `note` about `regarding` (its namespace holds the event).
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = Key {
            regarding: (
                regarding.kind.clone(),
                regarding.namespace.clone(),
                regarding.name.clone(),
                regarding.uid.clone(),
            ),
            type_,
            reason: reason.to_owned(),
            note: note.clone(),
        };
        let decision = self.recent.lock().expect("events lock").decide(&key, now);
        let published = match decision {
            Publication::Repeat { namespace, name, count } => {
                let series = EventSeries { count, last_observed_time: MicroTime(now) };
                let patch = serde_json::json!({ "series": series });
                let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
                events.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                Published { namespace, name, count, last: now }
            }
            Publication::Create => {
                let event = self.event(regarding, type_, reason, note, now);
                let (namespace, name) = (event.metadata.namespace.clone(), event.metadata.name.clone());
                let (namespace, name) = (namespace.expect("set by event()"), name.expect("set by event()"));
                let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
                events.create(&PostParams::default(), &event).await?;
                Published { namespace, name, count: 1, last: now }
            }
        };
        self.recent.lock().expect("events lock").remember(key, published);
        Ok(())
    }

    /// A new event, named after the object and the moment, in its namespace.
    fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
        now: Timestamp,
    ) -> K8sEvent {
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let name = format!("{}.{:x}", regarding.name.as_deref().unwrap_or(&self.controller), now.as_nanosecond());
        K8sEvent {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_owned()),
                name: Some(name.to_owned()),
                ..Default::default()
            },
            action: Some(reason.to_owned()),
            reason: Some(reason.to_owned()),
            note: Some(note),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(match type_ {
                EventType::Normal => "Normal".to_owned(),
                EventType::Warning => "Warning".to_owned(),
            }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(reason: &str, note: &str) -> Key {
        Key {
            regarding: (Some("RedisCluster".into()), Some("ns".into()), Some("c".into()), Some("u1".into())),
            type_: EventType::Normal,
            reason: reason.into(),
            note: note.into(),
        }
    }

    fn published(name: &str, count: i32, last: Timestamp) -> Published {
        Published { namespace: "ns".into(), name: name.into(), count, last }
    }

    #[test]
    fn the_same_reason_with_another_message_is_a_new_event() {
        let now = Timestamp::now();
        let mut recent = Recent::default();
        assert_eq!(recent.decide(&key("MastersSpread", "shard 0: a promoted"), now), Publication::Create);
        recent.remember(key("MastersSpread", "shard 0: a promoted"), published("c.1", 1, now));
        assert_eq!(recent.decide(&key("MastersSpread", "shard 1: b promoted"), now), Publication::Create);
    }

    #[test]
    fn a_true_repeat_is_counted_on_the_first_event_within_the_window() {
        let now = Timestamp::now();
        let mut recent = Recent::default();
        recent.remember(key("Refused", "spec.masters: too few"), published("c.1", 2, now));
        let later = now + SignedDuration::from_mins(1);
        assert_eq!(
            recent.decide(&key("Refused", "spec.masters: too few"), later),
            Publication::Repeat { namespace: "ns".into(), name: "c.1".into(), count: 3 }
        );
        let much_later = now + SignedDuration::from_mins(7);
        assert_eq!(recent.decide(&key("Refused", "spec.masters: too few"), much_later), Publication::Create);
        assert!(recent.0.is_empty(), "what left the window is forgotten");
    }
}
