//! Rendered HTML kept while nothing it shows has changed, so a hundred open
//! pages on the same data cost one render, not a hundred. A render is valid
//! for the read model's version of its cluster and for one [`BUCKET`] of
//! wall time (ages and charts move with the clock).

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::sync::{Arc, Mutex};

use k8s_openapi::jiff::Timestamp;
use leptos::prelude::*;
use slotkeeper_readmodel::{ClusterKey, ReadModel};

use crate::access::ClusterAccess;
use crate::pages::cluster::{self, ClusterPage, FRAGMENTS};
use crate::pages::clusters::{self, Row};

/// Seconds of wall time a render stays current.
pub const BUCKET: i64 = 5;
/// Renders kept at most; beyond that the map starts over.
const MOST: usize = 4096;

type Version = ((u64, u64), i64);

/// A row of the clusters page and its digest, computed once per render.
#[derive(Debug, Clone)]
pub struct RenderedRow {
    pub html: Arc<str>,
    pub digest: u64,
}

/// A cluster page's live fragments: (id, HTML) in page order.
pub type Fragments = Arc<Vec<(&'static str, String)>>;

#[derive(Default)]
pub struct Renders {
    rows: Mutex<HashMap<ClusterKey, (Version, RenderedRow)>>,
    pages: Mutex<HashMap<(ClusterKey, u64), (Version, Fragments)>>,
}

/// A fingerprint of rendered HTML, the same on every replica of one
/// version: a page names what it shows, so its live stream sends only what
/// changed since.
pub fn digest(html: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    html.hash(&mut hasher);
    hasher.finish()
}

/// Digests as they travel in a live stream's URL (`seen=…`).
pub fn digests_param(htmls: &[&str]) -> String {
    htmls.iter().map(|h| format!("{:x}", digest(h))).collect::<Vec<_>>().join(".")
}

pub fn parse_digests(param: &str) -> Vec<u64> {
    param.split('.').filter_map(|d| u64::from_str_radix(d, 16).ok()).collect()
}

fn bucket(now: Timestamp) -> i64 {
    now.as_second() / BUCKET
}

fn fingerprint(access: &ClusterAccess) -> u64 {
    let mut hasher = DefaultHasher::new();
    access.hash(&mut hasher);
    hasher.finish()
}

impl Renders {
    /// A row of the clusters page.
    pub fn row(&self, readmodel: &ReadModel, row: &Row, now: Timestamp) -> RenderedRow {
        let version = (readmodel.version(&row.key), bucket(now));
        if let Some((v, rendered)) = self.rows.lock().expect("renders lock").get(&row.key)
            && *v == version
        {
            return rendered.clone();
        }
        let html = clusters::row_html(row, now);
        let rendered = RenderedRow { digest: digest(&html), html: html.into() };
        let mut rows = self.rows.lock().expect("renders lock");
        if rows.len() >= MOST {
            rows.clear();
        }
        rows.insert(row.key.clone(), (version, rendered.clone()));
        rendered
    }

    /// Every live fragment of a cluster's page as a user with `access` sees
    /// it; `None` when the cluster is gone. The snapshot is taken only when
    /// nothing current is kept.
    pub fn cluster(
        &self,
        readmodel: &ReadModel,
        key: &ClusterKey,
        access: &ClusterAccess,
        now: Timestamp,
    ) -> Option<Fragments> {
        if let Some(fragments) = self.kept(readmodel, key, access, now)
            && readmodel.cluster(key).is_some()
        {
            return Some(fragments);
        }
        Some(self.fragments(readmodel, &cluster::snapshot(readmodel, key, access.clone(), now)?))
    }

    /// The fragments of a snapshot the caller already took (a page render),
    /// from what is kept when it is current.
    pub fn fragments(&self, readmodel: &ReadModel, page: &ClusterPage) -> Fragments {
        if let Some(fragments) = self.kept(readmodel, &page.key, &page.access, page.now) {
            return fragments;
        }
        let version = (readmodel.version(&page.key), bucket(page.now));
        let fragments: Fragments = Arc::new(
            FRAGMENTS
                .iter()
                .map(|id| (*id, Owner::new().with(|| cluster::render_fragment(page, id).to_html())))
                .collect(),
        );
        let mut pages = self.pages.lock().expect("renders lock");
        if pages.len() >= MOST {
            pages.clear();
        }
        pages.insert((page.key.clone(), fingerprint(&page.access)), (version, fragments.clone()));
        fragments
    }

    fn kept(
        &self,
        readmodel: &ReadModel,
        key: &ClusterKey,
        access: &ClusterAccess,
        now: Timestamp,
    ) -> Option<Fragments> {
        let version = (readmodel.version(key), bucket(now));
        let pages = self.pages.lock().expect("renders lock");
        pages.get(&(key.clone(), fingerprint(access))).filter(|(v, _)| *v == version).map(|(_, f)| f.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_survive_the_url() {
        let param = digests_param(&["<p>a</p>", "<p>b</p>"]);
        assert!(!param.contains(' ') && param.contains('.'));
        assert_eq!(parse_digests(&param), vec![digest("<p>a</p>"), digest("<p>b</p>")]);
        assert!(parse_digests("").is_empty());
    }
}
