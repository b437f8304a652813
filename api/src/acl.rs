//! Redis ACL users (`spec.acl`): who may sign in to a cluster's nodes, and
//! with which rights. Three kinds of user:
//! - the operator's own ([`OPERATOR_USER`]): exactly the commands it sends;
//! - replication's ([`REPLICATION_USER`]): what a replica's link needs;
//! - applications', declared on the cluster, each with a password Secret and
//!   rules checked here (the CRD's CEL rules refuse most at admission; the
//!   operator checks again, per release, before anything reaches a node).
//!
//! The `default` user keeps the cluster password and every right unless
//! `spec.acl.defaultUser` is `Disabled`. Rules are single tokens from a short
//! grammar: categories, commands, key and channel patterns; nothing that sets
//! a password, turns a user on or off, or resets it. Commands that would let
//! an application take the cluster from the operator (ACL, CONFIG, MODULE,
//! DEBUG, SHUTDOWN, replication) are denied after the declared rules.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::catalog::{CatalogEntry, Engine};

/// The operator's user on every node.
pub const OPERATOR_USER: &str = "slotkeeper-operator";
/// The user a replica signs in as to its master (`masteruser`).
pub const REPLICATION_USER: &str = "slotkeeper-replication";
/// Names an application user may not take.
const RESERVED_PREFIX: &str = "slotkeeper";

/// The most users one cluster declares (keeps admission's Secret checks bounded).
pub const MAX_USERS: usize = 32;
/// The most rules one user has.
pub const MAX_RULES: usize = 64;

/// Commands the operator sends (see `operator/src/redis`), and nothing else.
/// Keys: MIGRATE and MEMORY USAGE touch every key; no channel.
pub const OPERATOR_RULES: &[&str] = &[
    "resetchannels",
    "-@all",
    "~*",
    "+ping",
    "+info",
    "+role",
    "+cluster|nodes",
    "+cluster|info",
    "+cluster|myid",
    "+cluster|meet",
    "+cluster|forget",
    "+cluster|replicate",
    "+cluster|failover",
    "+cluster|addslots",
    "+cluster|addslotsrange",
    "+cluster|setslot",
    "+cluster|countkeysinslot",
    "+cluster|getkeysinslot",
    "+memory|usage",
    "+migrate",
    // What MIGRATE sends the target, signed in as this user.
    "+select",
    "+restore-asking",
    "+restore",
    // A target's claim of its slots is one MULTI/EXEC.
    "+multi",
    "+exec",
    "+discard",
    "+acl|setuser",
    "+acl|deluser",
    "+acl|whoami",
    "+config|set",
];

/// What a replica's link sends its master.
pub const REPLICATION_RULES: &[&str] = &["resetchannels", "-@all", "+psync", "+replconf", "+ping"];

/// Denied to every application user after its own rules: these would let it
/// change users, configuration, modules or replication under the operator.
/// Only `ACL WHOAMI` is given back (clients ask it).
pub const APPLICATION_DENIED: &[&str] = &[
    "-acl",
    "-config",
    "-module",
    "-debug",
    "-shutdown",
    "-replicaof",
    "-slaveof",
    "-sync",
    "-psync",
    "-failover",
    "+acl|whoami",
];

/// The `default` user's rights while it is on (as before ACL users existed).
pub const DEFAULT_USER_RULES: &[&str] = &["~*", "&*", "+@all"];

/// Categories Redis 6.2, 7.0 and Valkey 8 all know.
const CATEGORIES: &[&str] = &[
    "all",
    "keyspace",
    "read",
    "write",
    "set",
    "sortedset",
    "list",
    "hash",
    "string",
    "bitmap",
    "hyperloglog",
    "geo",
    "stream",
    "pubsub",
    "admin",
    "fast",
    "slow",
    "blocking",
    "dangerous",
    "connection",
    "transaction",
    "scripting",
];

/// Words a rule may be on its own.
const WORDS: &[&str] = &["allkeys", "allchannels", "allcommands", "nocommands", "resetkeys", "resetchannels"];

/// The CEL rule on `spec.acl.users[].name`.
pub const NAME_RULE: &str =
    "self.matches('^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$') && self != 'default' && !self.startsWith('slotkeeper')";
const NAME_MESSAGE: &str = "spec.acl.users[].name: 1 to 64 letters, digits, '_', '.' or '-', not 'default' and not starting with 'slotkeeper' (reserved for the operator's users)";
/// The CEL rule on each of `spec.acl.users[].rules`: the token grammar (the
/// operator also checks categories and what each release knows).
pub const RULE_RULE: &str = "self.all(r, r.matches('^([+-]@[a-z]+|[+-][a-z][a-z0-9_-]*([|][a-z][a-z0-9_-]*)?|(%(R|W|RW))?~[!#-&(-\\\\[\\\\]-~]+|&[!#-&(-\\\\[\\\\]-~]+|allkeys|allchannels|allcommands|nocommands|resetkeys|resetchannels)$'))";
const RULE_MESSAGE: &str = "spec.acl.users[].rules: each rule is one token: +@category, -@category, +command, -command, +command|subcommand, ~keypattern, %R~/%W~/%RW~keypattern, &channelpattern, allkeys, allchannels, allcommands, nocommands, resetkeys or resetchannels (passwords come from passwordSecret; no quotes, backslashes or spaces)";

/// `spec.acl`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AclSpec {
    /// `Enabled` (default): the `default` user signs in with the cluster
    /// password and has every right. `Disabled`: it cannot sign in;
    /// applications use the users below.
    #[serde(default)]
    pub default_user: DefaultUser,
    /// Application users, applied live on every node (ACL SETUSER); users
    /// made by hand are left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = kube::core::Rule::new("self.all(u, self.exists_one(o, o.name == u.name))").message("spec.acl.users: each name once"))]
    #[schemars(length(max = 32))]
    pub users: Vec<AclUser>,
}

#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DefaultUser {
    #[default]
    Enabled,
    Disabled,
}

/// One application user.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AclUser {
    /// The user name applications sign in with.
    #[x_kube(validation = kube::core::Rule::new(NAME_RULE).message(NAME_MESSAGE))]
    #[schemars(length(min = 1, max = 64))]
    pub name: String,
    /// The Secret (in the cluster's namespace) holding its password; its
    /// author must be able to read it.
    pub password_secret: SecretKeyRef,
    /// ACL rules, one token each, applied in order after `reset`; e.g.
    /// `["~app:*", "+@all", "-@dangerous"]`.
    #[serde(default)]
    #[x_kube(validation = kube::core::Rule::new(RULE_RULE).message(RULE_MESSAGE))]
    #[schemars(length(max = 64), inner(length(min = 1, max = 128)))]
    pub rules: Vec<String>,
}

/// A key of a Secret in the cluster's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[serde(default = "default_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn default_key() -> String {
    "password".into()
}

/// A user refused, naming the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclError {
    #[error("spec.acl.users: at most {MAX_USERS} users")]
    TooManyUsers,
    #[error("spec.acl.users[{index}].name {name:?}: {NAME_MESSAGE}")]
    Name { index: usize, name: String },
    #[error("spec.acl.users[{index}].name {name:?} is declared twice")]
    Duplicate { index: usize, name: String },
    #[error("spec.acl.users[{index}].rules: at most {MAX_RULES} rules")]
    TooManyRules { index: usize },
    #[error("spec.acl.users[{index}].rules: {rule:?} is not a rule Slotkeeper applies ({why})")]
    Rule { index: usize, rule: String, why: String },
}

fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        && name != "default"
        && !name.starts_with(RESERVED_PREFIX)
}

fn command_word(word: &str) -> bool {
    let mut bytes = word.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// A key or channel pattern: printable, no space, quote or backslash.
fn pattern(p: &str) -> bool {
    !p.is_empty() && p.bytes().all(|b| b.is_ascii_graphic() && !b"\"'\\".contains(&b))
}

/// Whether `release` reads `rule`; `None` for any release.
fn check_rule(rule: &str, release: Option<&CatalogEntry>) -> Result<(), String> {
    let six = release.is_some_and(|e| e.engine == Engine::Redis && e.release().version.major < 7);
    if WORDS.contains(&rule) {
        return Ok(());
    }
    if let Some(category) = rule.strip_prefix("+@").or_else(|| rule.strip_prefix("-@")) {
        return if CATEGORIES.contains(&category) {
            Ok(())
        } else {
            Err(format!("unknown category; known: {}", CATEGORIES.join(", ")))
        };
    }
    if let Some(command) = rule.strip_prefix('+').or_else(|| rule.strip_prefix('-')) {
        let (command, sub) = command.split_once('|').map_or((command, None), |(c, s)| (c, Some(s)));
        if !command_word(command) || sub.is_some_and(|s| !command_word(s)) {
            return Err("a command is lower-case letters, digits, '_' or '-'".into());
        }
        if sub.is_some() && rule.starts_with('-') && six {
            return Err("Redis 6.2 cannot deny a single subcommand".into());
        }
        return Ok(());
    }
    let selector = ["%RW~", "%R~", "%W~"].iter().find_map(|s| rule.strip_prefix(s));
    if let Some(keys) = selector {
        if six {
            return Err("read/write key patterns (%R~, %W~) need Redis 7.0 or later".into());
        }
        return if pattern(keys) { Ok(()) } else { Err("a pattern has no space, quote or backslash".into()) };
    }
    if let Some(p) = rule.strip_prefix('~').or_else(|| rule.strip_prefix('&')) {
        return if pattern(p) { Ok(()) } else { Err("a pattern has no space, quote or backslash".into()) };
    }
    Err("passwords, on/off, reset and selectors are the operator's".into())
}

/// Checks every user for `releases` (each release the nodes may run now).
pub fn validate(acl: &AclSpec, releases: &[&CatalogEntry]) -> Result<(), AclError> {
    if acl.users.len() > MAX_USERS {
        return Err(AclError::TooManyUsers);
    }
    for (index, user) in acl.users.iter().enumerate() {
        if !valid_name(&user.name) {
            return Err(AclError::Name { index, name: user.name.clone() });
        }
        if acl.users[..index].iter().any(|u| u.name == user.name) {
            return Err(AclError::Duplicate { index, name: user.name.clone() });
        }
        if user.rules.len() > MAX_RULES {
            return Err(AclError::TooManyRules { index });
        }
        for rule in &user.rules {
            let releases = if releases.is_empty() { vec![None] } else { releases.iter().map(|r| Some(*r)).collect() };
            for release in releases {
                check_rule(rule, release).map_err(|why| AclError::Rule { index, rule: rule.clone(), why })?;
            }
        }
    }
    Ok(())
}

/// A user as every node should have it: `ACL SETUSER <name> <rules...>`
/// (the rules start with `reset`, so applying twice changes nothing).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserRules {
    pub name: String,
    pub rules: Vec<String>,
}

/// `#<sha256 hex>`: a password as a rule, so no command or file holds it in the clear.
pub fn password_rule(password_sha256_hex: &str) -> String {
    format!("#{password_sha256_hex}")
}

fn user(name: &str, on: bool, password_hash: Option<&str>, rules: impl IntoIterator<Item = String>) -> UserRules {
    let mut all = vec!["reset".to_owned(), if on { "on" } else { "off" }.to_owned()];
    all.extend(password_hash.map(password_rule));
    all.extend(rules);
    UserRules { name: name.to_owned(), rules: all }
}

/// Password hashes (lower-case sha256 hex) of the users a cluster has.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hashes {
    pub default: String,
    pub operator: String,
    pub replication: String,
    /// Per application user, in `spec.acl.users` order.
    pub applications: Vec<String>,
}

/// Every user the operator keeps on a cluster's nodes, the `default` user
/// last (turning it off must come after the users that replace it).
pub fn users(acl: &AclSpec, hashes: &Hashes) -> Vec<UserRules> {
    let owned = |rules: &[&str]| rules.iter().map(|r| (*r).to_owned()).collect::<Vec<_>>();
    let mut users = vec![
        user(OPERATOR_USER, true, Some(&hashes.operator), owned(OPERATOR_RULES)),
        user(REPLICATION_USER, true, Some(&hashes.replication), owned(REPLICATION_RULES)),
    ];
    for (app, hash) in acl.users.iter().zip(&hashes.applications) {
        let rules = app.rules.iter().cloned().chain(owned(APPLICATION_DENIED));
        users.push(user(&app.name, true, Some(hash), rules));
    }
    users.push(match acl.default_user {
        DefaultUser::Enabled => user("default", true, Some(&hashes.default), owned(DEFAULT_USER_RULES)),
        DefaultUser::Disabled => user("default", false, None, owned(&["resetchannels", "-@all"])),
    });
    users
}

#[cfg(test)]
#[path = "acl_tests.rs"]
mod tests;
