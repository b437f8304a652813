//! redis.conf per release: the user's `spec.redis.config` keys checked against what
//! each release understands, translated where a key was renamed, and the
//! features an older node cannot parse kept off while such a node is left
//! (one Redis 7.0 node announcing a hostname makes every 6.2 node mark it
//! failed: 6.2 drops cluster-bus messages with extensions).

use slotkeeper_api::catalog::{CatalogEntry, Engine};
use slotkeeper_api::redis_config::{self, ConfigError};

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

/// Whether `entry` runs Redis 7.0 or later (Valkey forked from Redis 7.2).
fn renamed_keys_known(entry: &CatalogEntry) -> bool {
    let release = entry.release();
    release.engine == Engine::Valkey || release.version.major >= 7
}

/// The configuration lines for `entry`, given every release the cluster's
/// nodes may run now (`in_use`); `Err` names the key that is not allowed, has
/// a bad value, or that `entry` cannot take. The allow-list is checked here
/// again because objects admitted before the CRD's rules existed still come in.
pub fn user_lines(
    config: &std::collections::BTreeMap<String, String>,
    entry: &CatalogEntry,
    in_use: &[&CatalogEntry],
) -> Result<Vec<String>, String> {
    redis_config::validate(config).map_err(|e| e.to_string())?;
    let all_speak_extensions = in_use.iter().all(|e| e.bus_extensions);
    let mut lines = Vec::new();
    for (key, value) in config {
        let setting =
            redis_config::setting(key).ok_or_else(|| ConfigError::KeyNotAllowed { key: key.clone() }.to_string())?;
        if BUS_EXTENSION_KEYS.contains(&key.as_str()) && !all_speak_extensions {
            // Kept off until no node without bus extensions is left.
            continue;
        }
        redis_config::known_by(setting, entry).map_err(|e| e.to_string())?;
        let name = match RENAMED_IN_7_0.iter().find(|(new, _)| new == key) {
            Some((_, old)) if !renamed_keys_known(entry) => old,
            _ => key.as_str(),
        };
        lines.extend(redis_config::render(name, setting.shape, value));
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
    fn an_injected_directive_never_reaches_the_file() {
        let r70 = lookup(Engine::Redis, "7.0.15").unwrap();
        for (key, value) in [("REQUIREPASS", ""), ("maxmemory-policy", "noeviction\nuser evil on +@all")] {
            let error = user_lines(&config(&[(key, value)]), r70, &[r70]).unwrap_err();
            assert!(error.starts_with(&format!("spec.redis.config.{key}: ")), "{error}");
        }
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
