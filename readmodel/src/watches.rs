//! The watches that feed the read model, started on every replica whether
//! or not it leads: RedisClusters and RedisOperations into stores, Events
//! (about clusters, operations and their Pods) into the [`EventLog`].

use std::sync::Arc;

use futures::StreamExt as _;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Event;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::{self, Event as Watched};
use kube::runtime::{WatchStreamExt as _, reflector};
use kube::{Client, Resource, ResourceExt as _};
use slotkeeper_api::{RedisCluster, RedisOperation};

use crate::events::{EventView, KIND_CLUSTER, KIND_OPERATION, KIND_POD, cluster_of_pod};
use crate::scope::{Namespaces, Watched as Watch};
use crate::{Change, ClusterKey, Inner};

/// Drops what nothing here reads from a cached object: `managedFields`,
/// the field managers' bookkeeping, often a third of an object's size.
pub fn slim<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

fn key_of<K: Resource>(object: &K) -> ClusterKey {
    ClusterKey::new(object.meta().namespace.clone().unwrap_or_default(), object.meta().name.clone().unwrap_or_default())
}

pub(crate) fn spawn(
    client: &Client,
    namespaces: &Namespaces,
    inner: &Arc<Inner>,
    clusters: Writer<RedisCluster>,
    operations: Writer<RedisOperation>,
    synced: tokio::sync::watch::Sender<bool>,
) {
    let all = watcher::Config::default();
    tokio::spawn(watch_clusters(namespaces.watch(client, all.clone()), clusters, inner.clone()));
    tokio::spawn(watch_operations(namespaces.watch(client, all), operations, inner.clone()));
    for kind in [KIND_CLUSTER, KIND_OPERATION, KIND_POD] {
        // Small pages: a relist after a flood of large Events (any namespace
        // may file them; the namespaces are filtered only once they arrive)
        // holds one page at a time, not 500 Events of up to 1 MB each.
        let config = watcher::Config::default().fields(&format!("involvedObject.kind={kind}")).page_size(EVENT_PAGE);
        tokio::spawn(watch_events(namespaces.watch(client, config), kind, inner.clone()));
    }
    let stores = inner.clone();
    tokio::spawn(async move {
        // A dropped writer means the process is stopping; nothing to wait for.
        let _ = futures::join!(stores.clusters.wait_until_ready(), stores.operations.wait_until_ready());
        synced.send_replace(true);
    });
}

async fn watch_clusters(
    watch: BoxStream<'static, Watch<RedisCluster>>,
    writer: Writer<RedisCluster>,
    inner: Arc<Inner>,
) {
    let mut stream = std::pin::pin!(watch.modify(slim).reflect(writer));
    while let Some(event) = stream.next().await {
        match event {
            Ok(Watched::Apply(cluster)) => inner.notify(Change::Cluster(key_of(&cluster))),
            Ok(Watched::Delete(cluster)) => {
                let key = key_of(&cluster);
                inner.forget(&key);
                inner.notify(Change::Cluster(key));
            }
            Ok(Watched::InitDone) => {
                // Clusters deleted while the watch was away leave nothing behind.
                let present: std::collections::HashSet<ClusterKey> =
                    inner.clusters.state().iter().map(|c| key_of(c.as_ref())).collect();
                inner.observations.write().expect("observations lock").retain(|k, _| present.contains(k));
                inner.samples.lock().expect("samples lock").retain(|k, _| present.contains(k));
                inner.notify(Change::Everything);
            }
            Ok(Watched::Init | Watched::InitApply(_)) => {}
            Err(error) => tracing::warn!(%error, "read model: RedisCluster watch failed; retrying"),
        }
    }
}

async fn watch_operations(
    watch: BoxStream<'static, Watch<RedisOperation>>,
    writer: Writer<RedisOperation>,
    inner: Arc<Inner>,
) {
    let mut stream = std::pin::pin!(watch.modify(slim).reflect(writer));
    while let Some(event) = stream.next().await {
        match event {
            Ok(Watched::Apply(operation) | Watched::Delete(operation)) => {
                let key =
                    ClusterKey::new(operation.namespace().unwrap_or_default(), operation.spec.cluster_name.clone());
                inner.notify(Change::Cluster(key));
            }
            Ok(Watched::InitDone) => inner.notify(Change::Everything),
            Ok(Watched::Init | Watched::InitApply(_)) => {}
            Err(error) => tracing::warn!(%error, "read model: RedisOperation watch failed; retrying"),
        }
    }
}

/// Events listed per page on a relist (a page of 1 MB Events is 16 MB).
const EVENT_PAGE: u32 = 16;

/// Events whose involved object is of `kind`, narrowed by the apiserver.
async fn watch_events(watch: BoxStream<'static, Watch<Event>>, kind: &'static str, inner: Arc<Inner>) {
    let mut stream = watch;
    // By uid: an Event updated while a listing runs is listed once, newest.
    let mut relisted: std::collections::HashMap<String, EventView> = Default::default();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Watched::Init) => relisted.clear(),
            Ok(Watched::InitApply(event)) => relisted.extend(relevant(&event, kind).map(|v| (v.uid.clone(), v))),
            Ok(Watched::InitDone) => {
                if *inner.synced.borrow() {
                    let managed: std::collections::HashSet<String> =
                        inner.clusters.state().iter().filter_map(|c| c.namespace()).collect();
                    relisted.retain(|_, view| managed.contains(&view.namespace));
                }
                // Oldest first: under the budget the newest are the ones kept.
                let mut listed: Vec<EventView> = std::mem::take(&mut relisted).into_values().collect();
                listed.sort_by_key(|view| view.last_seen);
                inner.events.replace_kind(kind, listed);
                inner.notify(Change::Everything);
            }
            Ok(Watched::Apply(event)) => {
                if let Some(view) = relevant(&event, kind).filter(|v| managed(&inner, &v.namespace)) {
                    let key = cluster_of(&inner, &view);
                    inner.events.apply(view);
                    if let Some(key) = key {
                        inner.notify(Change::Cluster(key));
                    }
                }
            }
            Ok(Watched::Delete(event)) => {
                if let Some(view) = relevant(&event, kind) {
                    inner.events.delete(&view);
                }
            }
            Err(error) => tracing::warn!(%error, kind, "read model: Event watch failed; retrying"),
        }
    }
}

/// Whether a RedisCluster lives in `namespace` (or the clusters are not
/// listed yet): Events anyone files in other namespaces are not kept.
fn managed(inner: &Inner, namespace: &str) -> bool {
    !*inner.synced.borrow() || inner.clusters.state().iter().any(|c| c.namespace().as_deref() == Some(namespace))
}

/// Events of Pods count only for Pods named as the operator names them.
fn relevant(event: &Event, kind: &str) -> Option<EventView> {
    let view = EventView::of(event)?;
    (kind != KIND_POD || cluster_of_pod(&view.name).is_some()).then_some(view)
}

fn cluster_of(inner: &Inner, event: &EventView) -> Option<ClusterKey> {
    let name = match event.kind.as_str() {
        KIND_CLUSTER => event.name.clone(),
        KIND_POD => cluster_of_pod(&event.name)?.to_owned(),
        _ => {
            let operation = inner.operations.get(&reflector::ObjectRef::new(&event.name).within(&event.namespace))?;
            operation.spec.cluster_name.clone()
        }
    };
    Some(ClusterKey::new(event.namespace.clone(), name))
}
