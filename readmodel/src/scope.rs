//! Which namespaces a replica watches: every namespace (one cluster-wide
//! watch per kind, needing cluster-wide rights), or a list of them (one
//! watch per namespace and kind, needing only rights granted in each, e.g.
//! RoleBindings there).
//!
//! For a list, the namespaces' watches are merged into one stream that
//! behaves like a single watch to whatever reads it (a reflector's store,
//! the read model's event log): one listing (`Init`, `InitApply`…,
//! `InitDone` once every namespace has listed), then changes. When any of
//! them must list again (its watch expired), all list again together, so a
//! listing always covers every namespace.

use std::collections::{HashMap, HashSet};

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
                let open = move || -> Vec<BoxStream<'static, Watched<K>>> {
                    let each = |ns: &String| watcher(Api::namespaced(client.clone(), ns), config.clone());
                    names.iter().map(|ns| each(ns).default_backoff().boxed()).collect()
                };
                merged(open).boxed()
            }
        }
    }
}

pub type Watched<K> = Result<Event<K>, watcher::Error>;

/// The watches `open` makes, merged as described in the module's comment.
pub fn merged<K, F>(open: F) -> impl Stream<Item = Watched<K>> + Send
where
    K: Resource<DynamicType = ()> + Clone + Send + 'static,
    F: Fn() -> Vec<BoxStream<'static, Watched<K>>> + Send + 'static,
{
    fn tagged<K: Send + 'static>(
        streams: Vec<BoxStream<'static, Watched<K>>>,
    ) -> SelectAll<BoxStream<'static, (usize, Watched<K>)>> {
        futures::stream::select_all(streams.into_iter().enumerate().map(|(i, s)| s.map(move |e| (i, e)).boxed()))
    }
    let streams = open();
    let count = streams.len();
    let state = (open, tagged(streams), Round::<K>::new(count), Vec::<Event<K>>::new());
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
                    streams = tagged(open());
                    round = Round::new(count);
                    round.began = true;
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
    /// did: sent on after `InitDone`, since a store's listing replaces what
    /// it held at `InitDone` and would bring the deleted object back.
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
            // While others still list, a change joins the listing (the newest wins).
            Event::Apply(object) if !self.done() => {
                self.deleted.remove(&ObjectRef::from_obj(&object));
                Step::Emit(vec![Event::InitApply(object)])
            }
            Event::Delete(object) if !self.done() => {
                self.deleted.insert(ObjectRef::from_obj(&object), object);
                Step::Emit(vec![])
            }
            change => Step::Emit(vec![change]),
        }
    }
}

#[cfg(test)]
#[path = "scope_tests.rs"]
mod tests;
