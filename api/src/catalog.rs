//! The version catalog: which engines and versions Slotkeeper runs, the image
//! for each, what the planner must know about them, and the upgrade edges
//! (which entry may follow which). `spec.engine` and `spec.version` must name
//! an entry (the CRD enforces it); versions compare as semver, never as text.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

pub use semver::Version;
use serde::{Deserialize, Serialize};

/// The server a catalog entry runs.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    #[default]
    Redis,
    Valkey,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Redis => "redis",
            Engine::Valkey => "valkey",
        }
    }
}

impl std::str::FromStr for Engine {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "redis" => Ok(Engine::Redis),
            "valkey" => Ok(Engine::Valkey),
            other => Err(format!("{other:?} is not an engine (redis, valkey)")),
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A supported release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogEntry {
    pub engine: Engine,
    pub version: &'static str,
    pub image: &'static str,
    /// Redis 7.0 added CLUSTER ADDSLOTSRANGE; older versions take slot lists.
    pub has_addslotsrange: bool,
    /// The RDB format version it writes. A node cannot load a newer format,
    /// so once a node writing a newer one is master, an older replica can no
    /// longer take a full sync from it: the point of no return.
    pub rdb_format: u8,
    /// It sends cluster-bus messages with extensions (hostnames, ...) when
    /// configured to; Redis 6.2 drops such messages and marks the sender failed.
    pub bus_extensions: bool,
    /// The entries a rollout may go to from this one, in one hop.
    pub next: &'static [(Engine, &'static str)],
}

pub const CATALOG: &[CatalogEntry] = &[
    CatalogEntry {
        engine: Engine::Redis,
        version: "6.2.14",
        image: "redis:6.2.14",
        has_addslotsrange: false,
        rdb_format: 9,
        bus_extensions: false,
        next: &[(Engine::Redis, "7.0.15")],
    },
    CatalogEntry {
        engine: Engine::Redis,
        version: "7.0.15",
        image: "redis:7.0.15",
        has_addslotsrange: true,
        rdb_format: 10,
        bus_extensions: true,
        next: &[(Engine::Valkey, "8.1.8")],
    },
    CatalogEntry {
        engine: Engine::Valkey,
        version: "8.1.8",
        image: "valkey/valkey:8.1.8",
        has_addslotsrange: true,
        rdb_format: 11,
        bus_extensions: true,
        next: &[],
    },
];

/// An entry's identity: engine and version, e.g. `valkey 8.1.8`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Release {
    pub engine: Engine,
    pub version: Version,
}

impl Release {
    /// `None` when `version` is not semver.
    pub fn parse(engine: Engine, version: &str) -> Option<Self> {
        Some(Self { engine, version: Version::parse(version).ok()? })
    }

    pub fn entry(&self) -> Option<&'static CatalogEntry> {
        CATALOG.iter().find(|e| e.release() == *self)
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.engine, self.version)
    }
}

impl CatalogEntry {
    pub fn release(&self) -> Release {
        Release::parse(self.engine, self.version).expect("catalog versions are semver")
    }

    fn successors(&self) -> impl Iterator<Item = &'static CatalogEntry> {
        self.next.iter().filter_map(|&(engine, version)| Release::parse(engine, version)?.entry())
    }
}

pub fn lookup(engine: Engine, version: &str) -> Option<&'static CatalogEntry> {
    Release::parse(engine, version)?.entry()
}

/// The hops from `from` to `to` along the upgrade edges (the shortest way),
/// excluding `from`; empty when they are the same; `None` when `to` cannot
/// be reached (a downgrade, an unknown edge).
pub fn path(from: &CatalogEntry, to: &CatalogEntry) -> Option<Vec<&'static CatalogEntry>> {
    if from == to {
        return Some(vec![]);
    }
    let mut came_from: BTreeMap<Release, Release> = BTreeMap::new();
    let mut queue = VecDeque::from([*from]);
    while let Some(entry) = queue.pop_front() {
        for next in entry.successors() {
            if next.release() == from.release() || came_from.contains_key(&next.release()) {
                continue;
            }
            came_from.insert(next.release(), entry.release());
            if next == to {
                let mut hops = vec![next];
                let mut at = entry.release();
                while at != from.release() {
                    hops.push(at.entry().expect("in the catalog"));
                    at = came_from[&at].clone();
                }
                hops.reverse();
                return Some(hops);
            }
            queue.push_back(*next);
        }
    }
    None
}

/// The entries reachable from `from` (what the console offers), nearest first.
pub fn reachable_from(from: &CatalogEntry) -> Vec<&'static CatalogEntry> {
    let mut found: Vec<&'static CatalogEntry> =
        CATALOG.iter().filter(|e| path(from, e).is_some_and(|p| !p.is_empty())).collect();
    found.sort_by_key(|e| path(from, e).map_or(usize::MAX, |p| p.len()));
    found
}

/// The CEL rule over `spec` that the engine and version name a catalog entry.
pub fn cel_rule() -> String {
    let mut by_engine: BTreeMap<Engine, Vec<String>> = BTreeMap::new();
    for entry in CATALOG {
        by_engine.entry(entry.engine).or_default().push(format!("'{}'", entry.version));
    }
    let clauses: Vec<String> = by_engine
        .iter()
        .map(|(engine, versions)| format!("(self.engine == '{engine}' && self.version in [{}])", versions.join(", ")))
        .collect();
    clauses.join(" || ")
}

/// The catalog in words, for messages: `redis 6.2.14, redis 7.0.15, valkey 8.1.8`.
pub fn describe() -> String {
    CATALOG.iter().map(|e| e.release().to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(engine: Engine, version: &str) -> &'static CatalogEntry {
        lookup(engine, version).expect("in the catalog")
    }

    #[test]
    fn catalog_has_the_promised_versions() {
        assert_eq!(entry(Engine::Redis, "7.0.15").image, "redis:7.0.15");
        assert!(!entry(Engine::Redis, "6.2.14").has_addslotsrange);
        assert_eq!(entry(Engine::Valkey, "8.1.8").image, "valkey/valkey:8.1.8");
        assert!(lookup(Engine::Redis, "7.2.0").is_none());
        assert!(lookup(Engine::Valkey, "7.0.15").is_none(), "engine and version name an entry together");
        assert!(lookup(Engine::Redis, "7.0").is_none(), "not semver");
    }

    #[test]
    fn every_edge_goes_up_and_names_an_entry() {
        for entry in CATALOG {
            for &(engine, version) in entry.next {
                let next =
                    lookup(engine, version).unwrap_or_else(|| panic!("{engine} {version} is not in the catalog"));
                assert!(next.rdb_format >= entry.rdb_format, "{} → {}", entry.release(), next.release());
                if next.engine == entry.engine {
                    assert!(next.release().version > entry.release().version);
                }
            }
        }
    }

    #[test]
    fn paths_follow_the_edges_hop_by_hop() {
        let (r62, r70, v81) =
            (entry(Engine::Redis, "6.2.14"), entry(Engine::Redis, "7.0.15"), entry(Engine::Valkey, "8.1.8"));
        assert_eq!(path(r62, r70), Some(vec![r70]));
        assert_eq!(path(r62, v81), Some(vec![r70, v81]), "two consecutive rollouts");
        assert_eq!(path(r70, r70), Some(vec![]));
        assert_eq!(path(r70, r62), None, "no downgrade");
        assert_eq!(path(v81, r70), None);
        assert_eq!(reachable_from(r62), vec![r70, v81]);
        assert!(reachable_from(v81).is_empty());
    }

    #[test]
    fn semver_orders_versions_numerically() {
        let a = Release::parse(Engine::Redis, "7.0.9").unwrap();
        let b = Release::parse(Engine::Redis, "7.0.15").unwrap();
        assert!(a < b, "7.0.9 < 7.0.15, which text comparison gets wrong");
    }

    #[test]
    fn the_cel_rule_lists_each_engine_with_its_versions() {
        assert_eq!(
            cel_rule(),
            "(self.engine == 'redis' && self.version in ['6.2.14', '7.0.15']) || (self.engine == 'valkey' && self.version in ['8.1.8'])"
        );
    }
}
