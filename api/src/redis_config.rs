//! The redis.conf keys a `RedisCluster` may set (`spec.redis.config`), each
//! with the shape of its value and the release that introduced it. One table
//! feeds the CRD's CEL rules (the apiserver refuses at admission), the
//! operator's own check (for objects admitted before a rule existed) and the
//! renderer, so they cannot disagree.
//!
//! Anything not listed is refused: keys the operator manages (port, dir,
//! cluster-*, requirepass, ...), keys that load code or reach the file system
//! (loadmodule, include, aclfile, enable-debug-command, ...) and keys that add
//! users. Keys are matched exactly, in the lower case Redis documents, so
//! `REQUIREPASS` or ` dir` never reach a file. Values are checked by type and
//! may hold no quote, backslash, newline or `#`.

use serde_json::{Value, json};

use crate::catalog::{CatalogEntry, Engine, Version};

/// What a key's value may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `yes` or `no`.
    Bool,
    /// A decimal integer in `min..=max`.
    Int { min: i64, max: i64 },
    /// A byte count with an optional unit (`b`, `k`, `kb`, `m`, `mb`, `g`, `gb`; any case).
    Bytes,
    /// Exactly one of these words.
    OneOf(&'static [&'static str]),
    /// One or more of these words, separated by single spaces.
    Flags(&'static [&'static str]),
    /// Empty (no snapshots) or pairs `seconds changes`.
    SavePoints,
    /// One or more groups `class hard-limit soft-limit soft-seconds`.
    BufferLimits,
    /// Any of these characters, possibly none.
    Chars(&'static str),
    /// Percentiles from 0 to 100, separated by single spaces.
    Percentiles,
    /// A DNS name (letters, digits, `.`, `-`), possibly empty.
    Hostname,
}

/// One allowed key.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub key: &'static str,
    pub shape: Shape,
    /// The release that introduced it; older releases do not know it.
    pub since: Option<(Engine, &'static str)>,
}

const fn s(key: &'static str, shape: Shape) -> Setting {
    Setting { key, shape, since: None }
}
const fn since(key: &'static str, shape: Shape, engine: Engine, version: &'static str) -> Setting {
    Setting { key, shape, since: Some((engine, version)) }
}

const B: Shape = Shape::Bool;
const BYTES: Shape = Shape::Bytes;
const fn int(min: i64, max: i64) -> Shape {
    Shape::Int { min, max }
}
const INT_MAX: i64 = i32::MAX as i64;
const LONG_MAX: i64 = i64::MAX;

const POLICIES: &[&str] = &[
    "volatile-lru",
    "allkeys-lru",
    "volatile-lfu",
    "allkeys-lfu",
    "volatile-random",
    "allkeys-random",
    "volatile-ttl",
    "noeviction",
];
const SHUTDOWN_FLAGS: &[&str] = &["default", "save", "nosave", "now", "force"];
const BUFFER_CLASSES: &[&str] = &["normal", "replica", "slave", "pubsub"];
const KEYSPACE_EVENTS: &str = "KEg$lshzxetdmnA";
const R7: &str = "7.0.0";

/// Every key `spec.redis.config` may set, sorted by key.
pub const ALLOWED: &[Setting] = &[
    s("active-defrag-cycle-max", int(1, 99)),
    s("active-defrag-cycle-min", int(1, 99)),
    s("active-defrag-ignore-bytes", BYTES),
    s("active-defrag-max-scan-fields", int(1, LONG_MAX)),
    s("active-defrag-threshold-lower", int(0, 1000)),
    s("active-defrag-threshold-upper", int(0, 1000)),
    s("active-expire-effort", int(1, 10)),
    s("activedefrag", B),
    s("activerehashing", B),
    s("aof-load-truncated", B),
    since("aof-timestamp-enabled", B, Engine::Redis, R7),
    s("aof-use-rdb-preamble", B),
    s("appendfsync", Shape::OneOf(&["always", "everysec", "no"])),
    s("appendonly", B),
    s("auto-aof-rewrite-min-size", BYTES),
    s("auto-aof-rewrite-percentage", int(0, INT_MAX)),
    since("busy-reply-threshold", int(0, LONG_MAX), Engine::Redis, R7),
    s("client-output-buffer-limit", Shape::BufferLimits),
    s("client-query-buffer-limit", BYTES),
    since("cluster-allow-pubsubshard-when-down", B, Engine::Redis, R7),
    s("cluster-allow-reads-when-down", B),
    s("cluster-allow-replica-migration", B),
    since("cluster-announce-hostname", Shape::Hostname, Engine::Redis, R7),
    since("cluster-announce-human-nodename", Shape::Hostname, Engine::Valkey, "8.0.0"),
    since("cluster-link-sendbuf-limit", BYTES, Engine::Redis, R7),
    s("cluster-migration-barrier", int(0, INT_MAX)),
    since("cluster-preferred-endpoint-type", Shape::OneOf(&["ip", "hostname", "unknown-endpoint"]), Engine::Redis, R7),
    s("cluster-replica-no-failover", B),
    s("cluster-replica-validity-factor", int(0, INT_MAX)),
    s("cluster-require-full-coverage", B),
    s("dynamic-hz", B),
    s("hash-max-listpack-entries", int(0, LONG_MAX)),
    s("hash-max-listpack-value", int(0, LONG_MAX)),
    s("hash-max-ziplist-entries", int(0, LONG_MAX)),
    s("hash-max-ziplist-value", int(0, LONG_MAX)),
    s("hll-sparse-max-bytes", BYTES),
    s("hz", int(1, 500)),
    s("io-threads", int(1, 128)),
    s("io-threads-do-reads", B),
    s("jemalloc-bg-thread", B),
    s("latency-monitor-threshold", int(0, LONG_MAX)),
    since("latency-tracking", B, Engine::Redis, R7),
    since("latency-tracking-info-percentiles", Shape::Percentiles, Engine::Redis, R7),
    s("lazyfree-lazy-eviction", B),
    s("lazyfree-lazy-expire", B),
    s("lazyfree-lazy-server-del", B),
    s("lazyfree-lazy-user-del", B),
    s("lazyfree-lazy-user-flush", B),
    s("lfu-decay-time", int(0, INT_MAX)),
    s("lfu-log-factor", int(0, INT_MAX)),
    s("list-compress-depth", int(0, INT_MAX)),
    s("list-max-listpack-size", int(-5, INT_MAX)),
    s("list-max-ziplist-size", int(-5, INT_MAX)),
    s("loglevel", Shape::OneOf(&["debug", "verbose", "notice", "warning"])),
    s("lua-time-limit", int(0, LONG_MAX)),
    s("maxclients", int(1, INT_MAX)),
    s("maxmemory", BYTES),
    since("maxmemory-clients", BYTES, Engine::Redis, R7),
    s("maxmemory-eviction-tenacity", int(0, 100)),
    s("maxmemory-policy", Shape::OneOf(POLICIES)),
    s("maxmemory-samples", int(1, 64)),
    s("min-replicas-max-lag", int(0, INT_MAX)),
    s("min-replicas-to-write", int(0, INT_MAX)),
    s("no-appendfsync-on-rewrite", B),
    s("notify-keyspace-events", Shape::Chars(KEYSPACE_EVENTS)),
    s("proto-max-bulk-len", BYTES),
    s("rdb-del-sync-files", B),
    s("rdbchecksum", B),
    s("rdbcompression", B),
    s("repl-backlog-size", BYTES),
    s("repl-backlog-ttl", int(0, INT_MAX)),
    s("repl-disable-tcp-nodelay", B),
    s("repl-diskless-load", Shape::OneOf(&["disabled", "on-empty-db", "swapdb"])),
    s("repl-diskless-sync", B),
    s("repl-diskless-sync-delay", int(0, INT_MAX)),
    since("repl-diskless-sync-max-replicas", int(0, INT_MAX), Engine::Redis, R7),
    s("repl-ping-replica-period", int(1, INT_MAX)),
    s("repl-timeout", int(1, INT_MAX)),
    s("replica-ignore-maxmemory", B),
    s("replica-lazy-flush", B),
    s("replica-priority", int(0, INT_MAX)),
    s("replica-read-only", B),
    s("replica-serve-stale-data", B),
    s("save", Shape::SavePoints),
    s("set-max-intset-entries", int(0, LONG_MAX)),
    since("shutdown-on-sigint", Shape::Flags(SHUTDOWN_FLAGS), Engine::Redis, R7),
    since("shutdown-on-sigterm", Shape::Flags(SHUTDOWN_FLAGS), Engine::Redis, R7),
    since("shutdown-timeout", int(0, INT_MAX), Engine::Redis, R7),
    s("slowlog-log-slower-than", int(-1, LONG_MAX)),
    s("slowlog-max-len", int(0, LONG_MAX)),
    s("stop-writes-on-bgsave-error", B),
    s("stream-node-max-bytes", BYTES),
    s("stream-node-max-entries", int(0, LONG_MAX)),
    s("tcp-backlog", int(0, INT_MAX)),
    s("tcp-keepalive", int(0, INT_MAX)),
    s("timeout", int(0, INT_MAX)),
    s("tracking-table-max-keys", int(0, LONG_MAX)),
    s("zset-max-listpack-entries", int(0, LONG_MAX)),
    s("zset-max-listpack-value", int(0, LONG_MAX)),
    s("zset-max-ziplist-entries", int(0, LONG_MAX)),
    s("zset-max-ziplist-value", int(0, LONG_MAX)),
];

/// The most keys a cluster may set (the CRD's `maxProperties`).
pub const MAX_KEYS: usize = 64;
/// The longest value (the CRD's `maxLength`): three output-buffer classes fit.
pub const MAX_VALUE_LEN: usize = 256;

/// The allowed key `key`, if it is one.
pub fn setting(key: &str) -> Option<&'static Setting> {
    ALLOWED.iter().find(|s| s.key == key)
}

/// Why a `spec.redis.config` entry is refused; the message names the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "spec.redis.config.{key}: not a redis.conf key a RedisCluster may set (unknown, managed by the operator, or unsafe); remove it (keys are lower case, as Redis documents them)"
    )]
    KeyNotAllowed { key: String },
    #[error("spec.redis.config.{key}: {expected}")]
    BadValue { key: String, expected: String },
    #[error("spec.redis.config sets {0} keys; at most {MAX_KEYS} are allowed")]
    TooManyKeys(usize),
    #[error(
        "spec.redis.config.{key}: {release} does not know it (it appeared in {engine} {since}); remove it until every node runs a release that does"
    )]
    NotInRelease { key: String, release: String, engine: Engine, since: &'static str },
}

impl Shape {
    /// What the value must be, as said in an error message.
    pub fn expected(&self) -> String {
        match self {
            Shape::Bool => "must be yes or no".into(),
            Shape::Int { min, max } => format!("must be an integer from {min} to {max}"),
            Shape::Bytes => "must be a byte count such as 100mb (units b, k, kb, m, mb, g, gb)".into(),
            Shape::OneOf(words) => format!("must be one of {}", words.join(", ")),
            Shape::Flags(words) => format!("must be one or more of {}, separated by spaces", words.join(", ")),
            Shape::SavePoints => "must be empty or pairs of seconds and changes such as '3600 1 300 100'".into(),
            Shape::BufferLimits => {
                "must be groups of class (normal, replica, pubsub), hard limit, soft limit and seconds such as 'pubsub 32mb 8mb 60'".into()
            }
            Shape::Chars(chars) => format!("may only hold the characters {chars}"),
            Shape::Percentiles => "must be percentiles from 0 to 100 separated by spaces, such as '50 99 99.9'".into(),
            Shape::Hostname => "must be a DNS name (letters, digits, '.' and '-', at most 253 characters)".into(),
        }
    }

    /// Whether `value` has this shape.
    pub fn accepts(&self, value: &str) -> bool {
        if value.len() > MAX_VALUE_LEN {
            return false;
        }
        match self {
            Shape::Bool => matches!(value, "yes" | "no"),
            Shape::Int { min, max } => {
                is_integer(value) && value.parse::<i64>().is_ok_and(|n| (*min..=*max).contains(&n))
            }
            Shape::Bytes => is_bytes(value),
            Shape::OneOf(words) => words.contains(&value),
            Shape::Flags(words) => value.split(' ').all(|w| words.contains(&w)),
            Shape::SavePoints => {
                let parts: Vec<&str> = value.split(' ').collect();
                value.is_empty() || (parts.len().is_multiple_of(2) && parts.iter().all(|p| is_digits(p, 10)))
            }
            Shape::BufferLimits => {
                let parts: Vec<&str> = value.split(' ').collect();
                parts.len().is_multiple_of(4)
                    && parts.chunks(4).all(|g| {
                        BUFFER_CLASSES.contains(&g[0]) && is_bytes(g[1]) && is_bytes(g[2]) && is_digits(g[3], 10)
                    })
            }
            Shape::Chars(chars) => value.chars().all(|c| chars.contains(c)),
            Shape::Percentiles => value.split(' ').all(is_percentile),
            Shape::Hostname => {
                value.is_empty()
                    || (value.len() <= 253
                        && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
                        && !value.starts_with(['.', '-'])
                        && !value.ends_with(['.', '-']))
            }
        }
    }

    /// A CEL expression that is true when `v` (a CEL string expression) has
    /// this shape. It says what [`Shape::accepts`] says, except that
    /// percentiles above 100 are left to the operator's own check.
    fn cel(&self, v: &str) -> String {
        match self {
            Shape::Bool => format!("{v} in ['yes', 'no']"),
            Shape::Int { min, max } => {
                format!("{v}.matches('^-?[0-9]{{1,19}}$') && int({v}) >= {min} && int({v}) <= {max}")
            }
            Shape::Bytes => format!("{v}.matches('^{BYTES_RE}$')"),
            Shape::OneOf(words) => format!("{v} in [{}]", cel_list(words)),
            Shape::Flags(words) => {
                let word = format!("({})", words.join("|"));
                format!("{v}.matches('^{word}( {word})*$')")
            }
            Shape::SavePoints => {
                format!("{v}.matches('^([0-9]{{1,10}} [0-9]{{1,10}}( [0-9]{{1,10}} [0-9]{{1,10}})*)?$')")
            }
            Shape::BufferLimits => {
                let group = format!("({}) {BYTES_RE} {BYTES_RE} [0-9]{{1,10}}", BUFFER_CLASSES.join("|"));
                format!("{v}.matches('^{group}( {group})*$')")
            }
            Shape::Chars(chars) => format!("{v}.matches('^[{chars}]*$')"),
            Shape::Percentiles => {
                let p = "[0-9]{1,3}([.][0-9]{1,6})?";
                format!("{v}.matches('^{p}( {p})*$')")
            }
            Shape::Hostname => {
                format!("{v}.size() <= 253 && {v}.matches('^([a-zA-Z0-9]([a-zA-Z0-9.-]*[a-zA-Z0-9])?)?$')")
            }
        }
    }
}

const BYTES_RE: &str = "[0-9]{1,19}([kKmMgG][bB]?|[bB])?";

fn is_digits(s: &str, max_len: usize) -> bool {
    !s.is_empty() && s.len() <= max_len && s.bytes().all(|b| b.is_ascii_digit())
}

fn is_integer(s: &str) -> bool {
    is_digits(s.strip_prefix('-').unwrap_or(s), 19)
}

fn is_bytes(s: &str) -> bool {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let unit = s[digits..].to_ascii_lowercase();
    is_digits(&s[..digits], 19) && matches!(unit.as_str(), "" | "b" | "k" | "kb" | "m" | "mb" | "g" | "gb")
}

fn is_percentile(s: &str) -> bool {
    let (whole, fraction) = s.split_once('.').map_or((s, None), |(w, f)| (w, Some(f)));
    is_digits(whole, 3)
        && fraction.is_none_or(|f| is_digits(f, 6))
        && s.parse::<f64>().is_ok_and(|p| (0.0..=100.0).contains(&p))
}

fn cel_list(words: &[&str]) -> String {
    words.iter().map(|w| format!("'{w}'")).collect::<Vec<_>>().join(", ")
}

/// Checks every entry, whatever the release: the key is allowed and the value has its shape.
pub fn validate(config: &std::collections::BTreeMap<String, String>) -> Result<(), ConfigError> {
    if config.len() > MAX_KEYS {
        return Err(ConfigError::TooManyKeys(config.len()));
    }
    for (key, value) in config {
        let setting = setting(key).ok_or_else(|| ConfigError::KeyNotAllowed { key: key.clone() })?;
        if !setting.shape.accepts(value) {
            return Err(ConfigError::BadValue { key: key.clone(), expected: setting.shape.expected() });
        }
    }
    Ok(())
}

/// Whether `entry`'s release knows `setting`.
pub fn known_by(setting: &Setting, entry: &CatalogEntry) -> Result<(), ConfigError> {
    let Some((engine, version)) = setting.since else { return Ok(()) };
    let since = Version::parse(version).expect("table versions are semver");
    let own = entry.release();
    // Releases are ordered Redis < Valkey (Valkey forked from Redis 7.2).
    let known = match (own.engine, engine) {
        (Engine::Valkey, Engine::Redis) => true,
        (Engine::Redis, Engine::Valkey) => false,
        _ => own.version >= since,
    };
    if known {
        Ok(())
    } else {
        Err(ConfigError::NotInRelease { key: setting.key.into(), release: own.to_string(), engine, since: version })
    }
}

/// The redis.conf lines for one validated entry, written under `name` (the
/// key, or its older name): one line per save point or buffer class, as
/// Redis 6.2 reads only one per line; tokens that are empty or hold anything
/// but plain characters are quoted and escaped.
pub fn render(name: &str, shape: Shape, value: &str) -> Vec<String> {
    let line = |tokens: &[&str]| {
        let mut line = name.to_string();
        for token in tokens {
            line.push(' ');
            line.push_str(&quote_token(token));
        }
        line
    };
    let tokens: Vec<&str> = if value.is_empty() { vec![""] } else { value.split(' ').collect() };
    match shape {
        Shape::SavePoints if !value.is_empty() => tokens.chunks(2).map(line).collect(),
        Shape::BufferLimits => tokens.chunks(4).map(line).collect(),
        Shape::Flags(_) | Shape::Percentiles => vec![line(&tokens)],
        _ => vec![line(&[value])],
    }
}

/// A token as redis.conf reads it back byte for byte: plain tokens as they
/// are, anything else in double quotes with `\\`, `\"` and every byte outside
/// printable ASCII as `\xHH` (so a newline can never start another directive).
pub fn quote_token(token: &str) -> String {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"-_.:$@%+/=,".contains(&b);
    if !token.is_empty() && token.bytes().all(plain) {
        return token.to_string();
    }
    let mut quoted = String::with_capacity(token.len() + 2);
    quoted.push('"');
    for b in token.bytes() {
        match b {
            b'\\' => quoted.push_str("\\\\"),
            b'"' => quoted.push_str("\\\""),
            0x20..=0x7e => quoted.push(b as char),
            _ => quoted.push_str(&format!("\\x{b:02x}")),
        }
    }
    quoted.push('"');
    quoted
}

/// The OpenAPI schema of `spec.redis.config`: a map of bounded strings and
/// CEL rules made from [`ALLOWED`], one for the keys and one per key for its
/// value, each message naming the field and what it must be.
pub fn schema(field: &str, description: &str) -> Value {
    let keys = cel_list(&ALLOWED.iter().map(|s| s.key).collect::<Vec<_>>());
    let mut rules = vec![json!({
        "rule": format!("self.all(k, k in [{keys}])"),
        "messageExpression": format!(
            "'{field}.' + self.filter(k, !(k in [{keys}]))[0] + ': not a redis.conf key a RedisCluster may set (unknown, managed by the operator, or unsafe); remove it (keys are lower case, as Redis documents them)'"
        ),
        "reason": "FieldValueForbidden",
    })];
    rules.extend(ALLOWED.iter().map(|s| {
        let value = format!("self['{}']", s.key);
        json!({
            "rule": format!("!('{}' in self) || ({})", s.key, s.shape.cel(&value)),
            "message": format!("{field}.{}: {}", s.key, s.shape.expected()),
        })
    }));
    json!({
        "description": description,
        "type": "object",
        "maxProperties": MAX_KEYS,
        "additionalProperties": { "type": "string", "maxLength": MAX_VALUE_LEN },
        "x-kubernetes-validations": rules,
    })
}

#[cfg(test)]
#[path = "redis_config_tests.rs"]
mod tests;
