use super::*;
use crate::catalog::lookup;
use std::collections::BTreeMap;

fn config(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
}

/// The attacks of the security review, each refused naming the key.
#[test]
fn injected_directives_are_refused_naming_the_key() {
    let attacks = [
        ("REQUIREPASS", ""),
        (" dir", "/"),
        ("dir", "/etc"),
        ("user", "backdoor on >pw +@all"),
        ("loadmodule", "/tmp/evil.so"),
        ("enable-debug-command", "yes"),
        ("enable-module-command", "yes"),
        ("include", "/etc/passwd"),
        ("rename-command", "FLUSHALL \"\""),
        ("port", "7000"),
        ("cluster-config-file", "/tmp/x"),
        ("aclfile", "/tmp/acl"),
        ("Maxmemory", "1mb"),
    ];
    for (key, value) in attacks {
        let error = validate(&config(&[(key, value)])).unwrap_err();
        assert_eq!(error, ConfigError::KeyNotAllowed { key: key.into() });
        assert!(error.to_string().starts_with(&format!("spec.redis.config.{key}: not a redis.conf key")), "{error}");
    }
}

#[test]
fn values_that_would_add_a_line_or_break_quoting_are_refused() {
    let attacks = [
        ("maxmemory-policy", "allkeys-lru\nrequirepass \"\""),
        ("maxmemory-policy", "allkeys-lru\r\nuser x on +@all"),
        ("notify-keyspace-events", "Ex\"\ninclude /x"),
        ("save", "1 1\nloadmodule /x"),
        ("cluster-announce-hostname", "a\\\"b"),
        ("client-output-buffer-limit", "pubsub 1mb 1mb 60 # x"),
        ("maxmemory", "1mb "),
        ("hz", "10 # comment"),
        ("appendonly", "YES"),
    ];
    for (key, value) in attacks {
        let error = validate(&config(&[(key, value)])).unwrap_err();
        assert!(matches!(&error, ConfigError::BadValue { key: k, .. } if k == key), "{key}={value:?}: {error}");
        assert!(error.to_string().starts_with(&format!("spec.redis.config.{key}: ")), "{error}");
    }
}

#[test]
fn values_are_checked_by_type() {
    let good = [
        ("maxmemory", "100mb"),
        ("maxmemory", "1GB"),
        ("maxmemory", "1048576"),
        ("maxmemory-policy", "allkeys-lru"),
        ("hz", "500"),
        ("slowlog-log-slower-than", "-1"),
        ("list-max-listpack-size", "-2"),
        ("save", ""),
        ("save", "3600 1 300 100"),
        ("client-output-buffer-limit", "pubsub 32mb 8mb 60 replica 256mb 64mb 60"),
        ("notify-keyspace-events", ""),
        ("notify-keyspace-events", "KEA$"),
        ("latency-tracking-info-percentiles", "50 99 99.9"),
        ("shutdown-on-sigterm", "nosave now"),
        ("cluster-announce-hostname", "node-1.example.org"),
    ];
    assert_eq!(validate(&config(&good[..1])), Ok(()));
    for (key, value) in good {
        assert_eq!(validate(&config(&[(key, value)])), Ok(()), "{key}={value:?}");
    }
    let bad = [
        ("hz", "0"),
        ("hz", "501"),
        ("maxmemory-samples", "ten"),
        ("maxmemory", "1tb"),
        ("maxmemory", "-1"),
        ("maxmemory-policy", "lru"),
        ("save", "3600"),
        ("client-output-buffer-limit", "master 1mb 1mb 60"),
        ("latency-tracking-info-percentiles", "101"),
        ("shutdown-on-sigterm", "nosave  now"),
        ("notify-keyspace-events", "Q"),
        ("cluster-announce-hostname", "-node"),
        ("io-threads", "99999999999999999999999"),
    ];
    for (key, value) in bad {
        assert!(validate(&config(&[(key, value)])).is_err(), "{key}={value:?} was accepted");
    }
    let long = "1".repeat(MAX_VALUE_LEN + 1);
    assert!(validate(&config(&[("maxmemory", &long)])).is_err());
}

#[test]
fn at_most_max_keys_are_allowed() {
    let many: BTreeMap<String, String> =
        ALLOWED.iter().take(MAX_KEYS + 1).map(|s| (s.key.into(), String::new())).collect();
    assert_eq!(validate(&many), Err(ConfigError::TooManyKeys(MAX_KEYS + 1)));
}

#[test]
fn the_table_is_sorted_lower_case_and_without_operator_keys() {
    let keys: Vec<&str> = ALLOWED.iter().map(|s| s.key).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(keys, sorted, "ALLOWED is sorted and has no duplicate");
    for key in &keys {
        assert!(key.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'), "{key}");
    }
    let managed = [
        "port",
        "bind",
        "dir",
        "dbfilename",
        "appendfilename",
        "appenddirname",
        "cluster-enabled",
        "cluster-config-file",
        "cluster-announce-ip",
        "cluster-announce-port",
        "cluster-announce-bus-port",
        "cluster-node-timeout",
        "replica-announce-ip",
        "requirepass",
        "masterauth",
        "masteruser",
        "user",
        "rename-command",
        "include",
        "loadmodule",
        "daemonize",
        "pidfile",
        "logfile",
        "unixsocket",
        "protected-mode",
        "aclfile",
        "replicaof",
        "slaveof",
        "enable-debug-command",
        "enable-module-command",
        "enable-protected-configs",
        "tls-port",
        "syslog-enabled",
        "oom-score-adj",
    ];
    for key in managed {
        assert!(setting(key).is_none(), "{key} must not be settable");
    }
}

#[test]
fn keys_newer_than_a_release_are_refused_for_it() {
    let (r62, r70, v81) = (
        lookup(Engine::Redis, "6.2.14").unwrap(),
        lookup(Engine::Redis, "7.0.15").unwrap(),
        lookup(Engine::Valkey, "8.1.8").unwrap(),
    );
    let tracking = setting("latency-tracking").unwrap();
    let error = known_by(tracking, r62).unwrap_err();
    assert!(error.to_string().starts_with("spec.redis.config.latency-tracking: redis 6.2.14 does not know it"));
    assert_eq!(known_by(tracking, r70), Ok(()));
    assert_eq!(known_by(tracking, v81), Ok(()));
    let zone = setting("cluster-announce-human-nodename").unwrap();
    assert!(known_by(zone, r70).is_err());
    assert_eq!(known_by(zone, v81), Ok(()));
}

#[test]
fn rendering_gives_one_line_per_save_point_and_buffer_class() {
    assert_eq!(render("save", Shape::SavePoints, "3600 1 300 100"), ["save 3600 1", "save 300 100"]);
    assert_eq!(render("save", Shape::SavePoints, ""), ["save \"\""]);
    assert_eq!(
        render("client-output-buffer-limit", Shape::BufferLimits, "pubsub 32mb 8mb 60 replica 1gb 1gb 0"),
        ["client-output-buffer-limit pubsub 32mb 8mb 60", "client-output-buffer-limit replica 1gb 1gb 0"]
    );
    assert_eq!(
        render("shutdown-on-sigterm", Shape::Flags(SHUTDOWN_FLAGS), "nosave now"),
        ["shutdown-on-sigterm nosave now"]
    );
    assert_eq!(render("notify-keyspace-events", Shape::Chars(KEYSPACE_EVENTS), ""), ["notify-keyspace-events \"\""]);
    assert_eq!(render("maxmemory-policy", Shape::OneOf(POLICIES), "allkeys-lru"), ["maxmemory-policy allkeys-lru"]);
}

#[test]
fn quoting_escapes_every_byte_that_could_end_the_token_or_the_line() {
    assert_eq!(quote_token("plain-1.5"), "plain-1.5");
    assert_eq!(quote_token(""), "\"\"");
    assert_eq!(quote_token("a b"), "\"a b\"");
    assert_eq!(quote_token("x\"\\y"), "\"x\\\"\\\\y\"");
    assert_eq!(quote_token("pw\nuser evil on"), "\"pw\\x0auser evil on\"");
    assert_eq!(quote_token("\r#é"), "\"\\x0d#\\xc3\\xa9\"");
    proptest::proptest!(|(token in proptest::prelude::any::<String>())| {
        let quoted = quote_token(&token);
        proptest::prop_assert!(!quoted.contains(['\n', '\r', '\0']));
        proptest::prop_assert!(quoted.is_ascii());
    });
}

#[test]
fn the_schema_has_a_rule_per_key_naming_it() {
    let schema = schema("spec.redis.config", "overrides");
    let rules = schema["x-kubernetes-validations"].as_array().unwrap();
    assert_eq!(rules.len(), ALLOWED.len() + 1);
    assert!(rules[0]["rule"].as_str().unwrap().contains("'maxmemory-policy'"));
    let hz = rules.iter().find(|r| r["rule"].as_str().unwrap().starts_with("!('hz' in self)")).unwrap();
    assert_eq!(hz["message"], "spec.redis.config.hz: must be an integer from 1 to 500");
    assert_eq!(schema["maxProperties"], MAX_KEYS);
    assert_eq!(schema["additionalProperties"]["maxLength"], MAX_VALUE_LEN);
    // CEL string literals are single-quoted and regexes have no backslash to escape.
    for rule in rules {
        assert!(!rule["rule"].as_str().unwrap().contains('\\'), "{rule}");
    }
}
