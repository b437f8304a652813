//! Which namespaces a replica watches: every namespace (one cluster-wide
//! watch per kind, needing cluster-wide rights), or a list of them (one
//! watch per namespace and kind, needing only rights granted in each, e.g.
//! RoleBindings there).
//!
//! For a list, the namespaces' watches are merged into one stream that
//! behaves like a single watch to whatever reads it (a reflector's store,
//! the read model's event log): one listing (`Init`, `InitApply`…,
//! `InitDone` once every namespace has listed), then changes. When one of
//! them must list again (its watch expired, or its listing failed), the
//! others are opened again and all list together, so a listing always
//! covers every namespace; the one that asked keeps its own watch and its
//! backoff, so a namespace that cannot be listed retries ever more slowly
//! rather than making every namespace list again each second.

use std::collections::{HashMap, HashSet};
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::{BoxStream, SelectAll};
use futures::{Stream, StreamExt as _};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;

/// What a replica watches and manages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Namespaces {
    All,
    Only(Vec<String>),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScopeError {
    #[error(
        "--namespace {0:?} is not a namespace name (lower-case letters, digits and '-', at most 63): list namespaces separated by commas, or leave it out to watch all"
    )]
    BadName(String),
}

impl Namespaces {
    /// From `--namespace`'s values (`a,b` arrives split); none means all.
    pub fn parse(names: &[String]) -> Result<Self, ScopeError> {
        let mut only: Vec<String> = Vec::new();
        for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            let label = name.len() <= 63
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !name.starts_with('-')
                && !name.ends_with('-');
            if !label {
                return Err(ScopeError::BadName(name.to_owned()));
            }
            if !only.iter().any(|n| n == name) {
                only.push(name.to_owned());
            }
        }
        Ok(if only.is_empty() { Self::All } else { Self::Only(only) })
    }

    pub fn contains(&self, namespace: &str) -> bool {
        match self {
            Self::All => true,
            Self::Only(names) => names.iter().any(|n| n == namespace),
        }
    }

    /// For logs: `<all>` or the list.
    pub fn describe(&self) -> String {
        match self {
            Self::All => "<all>".into(),
            Self::Only(names) => names.join(","),
        }
    }

    /// One watch (retrying with backoff) over every namespace in scope.
    pub fn watch<K>(&self, client: &Client, config: watcher::Config) -> BoxStream<'static, Watched<K>>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        match self {
            Self::All => watcher(Api::all(client.clone()), config).default_backoff().boxed(),
            Self::Only(names) if names.len() == 1 => {
                watcher(Api::namespaced(client.clone(), &names[0]), config).default_backoff().boxed()
            }
            Self::Only(names) => {
                let (client, names) = (client.clone(), names.clone());
                let count = names.len();
                let open = move |ns: usize| -> BoxStream<'static, Watched<K>> {
                    watcher(Api::namespaced(client.clone(), &names[ns]), config.clone()).default_backoff().boxed()
                };
                merged(count, open).boxed()
            }
        }
    }
}

pub type Watched<K> = Result<Event<K>, watcher::Error>;

/// A namespace's watch, its events tagged with the namespace's place in the list.
struct Tagged<K> {
    namespace: usize,
    watch: BoxStream<'static, Watched<K>>,
}

impl<K> Stream for Tagged<K> {
    type Item = (usize, Watched<K>);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let namespace = self.namespace;
        self.watch.poll_next_unpin(cx).map(|event| event.map(|e| (namespace, e)))
    }
}

/// The watches of `count` namespaces (`open(i)` opens the i-th), merged as
/// described in the module's comment.
pub fn merged<K, F>(count: usize, open: F) -> impl Stream<Item = Watched<K>> + Send
where
    K: Resource<DynamicType = ()> + Clone + Send + 'static,
    F: Fn(usize) -> BoxStream<'static, Watched<K>> + Send + 'static,
{
    let streams: SelectAll<Tagged<K>> =
        futures::stream::select_all((0..count).map(|namespace| Tagged { namespace, watch: open(namespace) }));
    let state = (open, streams, Round::<K>::new(count), Vec::<Event<K>>::new());
    futures::stream::unfold(state, move |(open, mut streams, mut round, mut ready)| async move {
        loop {
            if let Some(event) = ready.pop() {
                return Some((Ok(event), (open, streams, round, ready)));
            }
            let (namespace, watched) = streams.next().await?;
            let event = match watched {
                Ok(event) => event,
                Err(error) => return Some((Err(error), (open, streams, round, ready))),
            };
            match round.step(namespace, event) {
                Step::Emit(events) => ready = events.into_iter().rev().collect(),
                Step::ListAgain => {
                    // The one that asked is listing already; the others start over.
                    let asked = streams.into_iter().filter(|t| t.namespace == namespace);
                    let others =
                        (0..count).filter(|n| *n != namespace).map(|n| Tagged { namespace: n, watch: open(n) });
                    streams = futures::stream::select_all(asked.chain(others));
                    round = Round::new(count);
                    round.began = true;
                    round.listing.insert(namespace);
                    ready = vec![Event::Init];
                }
            }
        }
    })
}

/// One listing of every namespace, as far as it went.
struct Round<K: Resource> {
    count: usize,
    /// `Init` sent on.
    began: bool,
    /// Namespaces that began listing, and that finished.
    listing: HashSet<usize>,
    listed: HashSet<usize>,
    /// Deletions seen after a namespace listed but before every namespace
    /// did: sent on at once and again after `InitDone`, since a store's
    /// listing replaces what it held at `InitDone` and would bring the
    /// deleted object back.
    deleted: HashMap<ObjectRef<K>, K>,
}

enum Step<K> {
    Emit(Vec<Event<K>>),
    /// A namespace lists again: every namespace does.
    ListAgain,
}

impl<K: Resource<DynamicType = ()> + Clone> Round<K> {
    fn new(count: usize) -> Self {
        Self { count, began: false, listing: HashSet::new(), listed: HashSet::new(), deleted: HashMap::new() }
    }

    fn done(&self) -> bool {
        self.listed.len() == self.count
    }

    fn step(&mut self, namespace: usize, event: Event<K>) -> Step<K> {
        match event {
            Event::Init if !self.listing.insert(namespace) => Step::ListAgain,
            Event::Init if self.began => Step::Emit(vec![]),
            Event::Init => {
                self.began = true;
                Step::Emit(vec![Event::Init])
            }
            Event::InitApply(object) => Step::Emit(vec![Event::InitApply(object)]),
            Event::InitDone => {
                self.listed.insert(namespace);
                if !self.done() {
                    return Step::Emit(vec![]);
                }
                let mut events = vec![Event::InitDone];
                events.extend(self.deleted.drain().map(|(_, object)| Event::Delete(object)));
                Step::Emit(events)
            }
            // While others still list, a change is made now and joins the
            // listing too (the newest wins), so neither goes stale.
            Event::Apply(object) if !self.done() => {
                self.deleted.remove(&ObjectRef::from_obj(&object));
                Step::Emit(vec![Event::InitApply(object.clone()), Event::Apply(object)])
            }
            Event::Delete(object) if !self.done() => {
                self.deleted.insert(ObjectRef::from_obj(&object), object.clone());
                Step::Emit(vec![Event::Delete(object)])
            }
            change => Step::Emit(vec![change]),
        }
    }
}

#[cfg(test)]
#[path = "scope_tests.rs"]
mod tests;
