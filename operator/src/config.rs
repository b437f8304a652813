//! redis.conf per release: the user's `spec.redis.config` keys checked against what
//! each release understands, translated where a key was renamed, and the
//! features an older node cannot parse kept off while such a node is left
//! (one Redis 7.0 node announcing a hostname makes every 6.2 node mark it
//! failed: 6.2 drops cluster-bus messages with extensions).

use slotkeeper_api::catalog::{CatalogEntry, Engine};

/// Keys that appeared in a release: unknown to anything older.
const INTRODUCED: &[(&str, Engine, &str)] = &[
    ("latency-tracking", Engine::Redis, "7.0.0"),
    ("latency-tracking-info-percentiles", Engine::Redis, "7.0.0"),
    ("cluster-allow-pubsubshard-when-down", Engine::Redis, "7.0.0"),
    ("cluster-link-sendbuf-limit", Engine::Redis, "7.0.0"),
    ("cluster-announce-hostname", Engine::Redis, "7.0.0"),
    ("cluster-preferred-endpoint-type", Engine::Redis, "7.0.0"),
    ("shutdown-timeout", Engine::Redis, "7.0.0"),
    ("shutdown-on-sigterm", Engine::Redis, "7.0.0"),
    ("shutdown-on-sigint", Engine::Redis, "7.0.0"),
    ("enable-debug-command", Engine::Redis, "7.0.0"),
    ("enable-module-command", Engine::Redis, "7.0.0"),
    ("enable-protected-configs", Engine::Redis, "7.0.0"),
    ("aof-timestamp-enabled", Engine::Redis, "7.0.0"),
    ("cluster-announce-human-nodename", Engine::Valkey, "8.0.0"),
    ("availability-zone", Engine::Valkey, "8.0.0"),
];

/// Keys Redis 7.0 renamed (it still accepts the old names): older releases
/// get the old name.
const RENAMED_IN_7_0: &[(&str, &str)] = &[
    ("hash-max-listpack-entries", "hash-max-ziplist-entries"),
    ("hash-max-listpack-value", "hash-max-ziplist-value"),
    ("zset-max-listpack-entries", "zset-max-ziplist-entries"),
    ("zset-max-listpack-value", "zset-max-ziplist-value"),
    ("list-max-listpack-size", "list-max-ziplist-size"),
];

/// Keys that make a node send cluster-bus extensions.
const BUS_EXTENSION_KEYS: &[&str] = &["cluster-announce-hostname", "cluster-announce-human-nodename"];

/// Releases are ordered Redis < Valkey (Valkey forked from Redis 7.2).
fn at_least(entry: &CatalogEntry, engine: Engine, version: &str) -> bool {
    let since = slotkeeper_api::catalog::Version::parse(version).expect("table versions are semver");
    let own = entry.release();
    match (own.engine, engine) {
        (Engine::Valkey, Engine::Redis) => true,
        (Engine::Redis, Engine::Valkey) => false,
        _ => own.version >= since,
    }
}

/// The configuration lines for `entry`, given every release the cluster's
/// nodes may run now (`in_use`); `Err` names a key `entry` cannot take.
pub fn user_lines(
    config: &std::collections::BTreeMap<String, String>,
    entry: &CatalogEntry,
    in_use: &[&CatalogEntry],
) -> Result<Vec<String>, String> {
    let all_speak_extensions = in_use.iter().all(|e| e.bus_extensions);
    let mut lines = Vec::new();
    for (key, value) in config {
        if BUS_EXTENSION_KEYS.contains(&key.as_str()) && !all_speak_extensions {
            // Kept off until no node without bus extensions is left.
            continue;
        }
        if let Some(&(_, engine, since)) = INTRODUCED.iter().find(|(k, ..)| k == key)
            && !at_least(entry, engine, since)
        {
            return Err(format!(
                "spec.redis.config.{key}: {} does not know it (it appeared in {engine} {since}); remove it until every node runs a release that does",
                entry.release()
            ));
        }
        let name = match RENAMED_IN_7_0.iter().find(|(new, _)| new == key) {
            Some((_, old)) if !at_least(entry, Engine::Redis, "7.0.0") => old,
            _ => key.as_str(),
        };
        lines.push(format!("{name} {value}"));
    }
    Ok(lines)
}

/// The file each release reads, e.g. `redis-7.0.15.conf`.
pub fn file_name(entry: &CatalogEntry) -> String {
    format!("{}-{}.conf", entry.engine, entry.version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotkeeper_api::catalog::lookup;
    use std::collections::BTreeMap;

    fn config(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
    }

    #[test]
    fn renamed_keys_are_translated_for_older_releases() {
        let (r62, r70) = (lookup(Engine::Redis, "6.2.14").unwrap(), lookup(Engine::Redis, "7.0.15").unwrap());
        let c = config(&[("hash-max-listpack-entries", "256"), ("maxmemory-policy", "allkeys-lru")]);
        assert_eq!(
            user_lines(&c, r62, &[r62, r70]).unwrap(),
            ["hash-max-ziplist-entries 256", "maxmemory-policy allkeys-lru"]
        );
        assert_eq!(
            user_lines(&c, r70, &[r62, r70]).unwrap(),
            ["hash-max-listpack-entries 256", "maxmemory-policy allkeys-lru"]
        );
    }

    #[test]
    fn a_key_an_older_release_does_not_know_is_refused_naming_it() {
        let r62 = lookup(Engine::Redis, "6.2.14").unwrap();
        let error = user_lines(&config(&[("latency-tracking", "yes")]), r62, &[r62]).unwrap_err();
        assert!(error.starts_with("spec.redis.config.latency-tracking: redis 6.2.14 does not know it"), "{error}");
    }

    #[test]
    fn hostnames_stay_off_while_a_node_without_bus_extensions_is_left() {
        let (r62, r70, v81) = (
            lookup(Engine::Redis, "6.2.14").unwrap(),
            lookup(Engine::Redis, "7.0.15").unwrap(),
            lookup(Engine::Valkey, "8.1.8").unwrap(),
        );
        let c = config(&[("cluster-announce-hostname", "node.example")]);
        assert!(user_lines(&c, r70, &[r62, r70]).unwrap().is_empty(), "6.2 would mark the 7.0 node failed");
        assert_eq!(user_lines(&c, r70, &[r70, v81]).unwrap(), ["cluster-announce-hostname node.example"]);
        assert_eq!(file_name(v81), "valkey-8.1.8.conf");
    }
}
