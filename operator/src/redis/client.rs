//! A connection to one Redis node, with a deadline on every call.
//! The operator never shells out to redis-cli: everything is a native command.

use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::topology::{ClusterNode, ParseError, SlotRange, parse_cluster_nodes};

pub const REDIS_PORT: u16 = 6379;
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// Slots per `CLUSTER ADDSLOTS` call on versions without ADDSLOTSRANGE; each
/// call is atomic, so an interrupted assignment leaves whole batches done.
const ADDSLOTS_BATCH: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum RedisError {
    #[error("redis at {addr}: {command} timed out")]
    Timeout { addr: String, command: &'static str },
    #[error("redis at {addr}: {command} failed: {source}")]
    Command { addr: String, command: &'static str, source: redis::RedisError },
    #[error("redis at {addr}: {source}")]
    Parse { addr: String, source: ParseError },
}

/// The raw answers [`RedisNode::facts`] collects.
pub struct NodeFacts {
    pub nodes: Vec<ClusterNode>,
    pub cluster_info: String,
    pub server_info: String,
    pub replication_info: String,
    pub memory_info: String,
    pub persistence_info: String,
    /// `INFO stats` and `INFO clients`, for what the console charts.
    pub stats_info: String,
    pub clients_info: String,
}

pub struct RedisNode {
    addr: String,
    connection: MultiplexedConnection,
    login: Login,
}

/// Percent-encodes a user name or password for the userinfo part of a redis:// URL.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A user and password to sign in with (`None`: the `default` user). No
/// `Debug`: a password never reaches a log.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Login {
    pub user: Option<String>,
    pub password: String,
}

/// How the operator signs in to a cluster's nodes: as its own ACL user, or,
/// on a node that does not have that user yet (started by an earlier
/// release), as the `default` user, until the users are applied.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Logins {
    pub own: Login,
    pub fallback: Login,
}

impl RedisNode {
    /// Connects as the operator's own user, else as `default`.
    pub async fn connect(ip: &str, logins: &Logins) -> Result<Self, RedisError> {
        match Self::connect_as(ip, &logins.own).await {
            Err(RedisError::Command { .. }) if logins.fallback != logins.own => {
                Self::connect_as(ip, &logins.fallback).await
            }
            other => other,
        }
    }

    async fn connect_as(ip: &str, login: &Login) -> Result<Self, RedisError> {
        let addr = format!("{ip}:{REDIS_PORT}");
        let user = login.user.as_deref().map(encode).unwrap_or_default();
        let url = format!("redis://{user}:{}@{addr}/", encode(&login.password));
        let command_err = |source| RedisError::Command { addr: addr.clone(), command: "AUTH", source };
        let client = redis::Client::open(url).map_err(command_err)?;
        // The crate's own 500 ms response timeout would cut large pipelines
        // (a reshard batch) short; every call here carries its own deadline.
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let connection =
            tokio::time::timeout(CALL_TIMEOUT, client.get_multiplexed_async_connection_with_config(&config))
                .await
                .map_err(|_| RedisError::Timeout { addr: addr.clone(), command: "connect" })?
                .map_err(command_err)?;
        Ok(Self { addr, connection, login: login.clone() })
    }

    /// Wraps a connection that is already open and authenticated as `login`.
    pub fn from_connection(ip: &str, connection: MultiplexedConnection, login: Login) -> Self {
        Self { addr: format!("{ip}:{REDIS_PORT}"), connection, login }
    }

    /// Who this connection signed in as (MIGRATE signs in to the target the same way).
    pub fn login(&self) -> &Login {
        &self.login
    }

    /// A handle sharing this connection (multiplexed, cheap to clone).
    pub fn connection(&self) -> MultiplexedConnection {
        self.connection.clone()
    }

    /// Everything the planner reads from a node, in one round trip.
    pub async fn facts(&mut self) -> Result<NodeFacts, RedisError> {
        let mut pipe = redis::pipe();
        pipe.cmd("CLUSTER").arg("NODES").cmd("CLUSTER").arg("INFO");
        pipe.cmd("INFO").arg("server").cmd("INFO").arg("replication").cmd("INFO").arg("memory");
        pipe.cmd("INFO").arg("persistence").cmd("INFO").arg("stats").cmd("INFO").arg("clients");
        type Answers = (String, String, String, String, String, String, String, String);
        let (
            nodes,
            cluster_info,
            server_info,
            replication_info,
            memory_info,
            persistence_info,
            stats_info,
            clients_info,
        ): Answers = tokio::time::timeout(CALL_TIMEOUT, pipe.query_async(&mut self.connection))
            .await
            .map_err(|_| RedisError::Timeout { addr: self.addr.clone(), command: "CLUSTER NODES+INFO" })?
            .map_err(|source| RedisError::Command { addr: self.addr.clone(), command: "CLUSTER NODES+INFO", source })?;
        let nodes =
            parse_cluster_nodes(&nodes).map_err(|source| RedisError::Parse { addr: self.addr.clone(), source })?;
        Ok(NodeFacts {
            nodes,
            cluster_info,
            server_info,
            replication_info,
            memory_info,
            persistence_info,
            stats_info,
            clients_info,
        })
    }

    async fn call<T: redis::FromRedisValue>(&mut self, name: &'static str, cmd: &redis::Cmd) -> Result<T, RedisError> {
        tokio::time::timeout(CALL_TIMEOUT, cmd.query_async(&mut self.connection))
            .await
            .map_err(|_| RedisError::Timeout { addr: self.addr.clone(), command: name })?
            .map_err(|source| RedisError::Command { addr: self.addr.clone(), command: name, source })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Runs a pipeline with its own deadline (batches can be large).
    pub async fn pipeline(
        &mut self,
        what: &'static str,
        pipe: &redis::Pipeline,
        deadline: Duration,
    ) -> Result<Vec<redis::Value>, RedisError> {
        tokio::time::timeout(deadline, pipe.query_async(&mut self.connection))
            .await
            .map_err(|_| RedisError::Timeout { addr: self.addr.clone(), command: what })?
            .map_err(|source| RedisError::Command { addr: self.addr.clone(), command: what, source })
    }

    pub async fn forget(&mut self, id: &str) -> Result<(), RedisError> {
        self.call("CLUSTER FORGET", redis::cmd("CLUSTER").arg("FORGET").arg(id)).await
    }

    /// `CLUSTER FAILOVER` on a replica: a coordinated hand-over with the
    /// master's agreement, no write acknowledged by the old master lost.
    pub async fn failover(&mut self) -> Result<(), RedisError> {
        self.call("CLUSTER FAILOVER", redis::cmd("CLUSTER").arg("FAILOVER")).await
    }

    /// `ROLE`'s first word is `master`.
    pub async fn is_master(&mut self) -> Result<bool, RedisError> {
        let role: Vec<redis::Value> = self.call("ROLE", &redis::cmd("ROLE")).await?;
        Ok(matches!(role.first(), Some(redis::Value::BulkString(word)) if word.as_slice() == b"master"))
    }

    /// `CLUSTER FAILOVER FORCE`: only when the master cannot be reached.
    pub async fn failover_force(&mut self) -> Result<(), RedisError> {
        self.call("CLUSTER FAILOVER FORCE", redis::cmd("CLUSTER").arg("FAILOVER").arg("FORCE")).await
    }

    pub async fn stabilize(&mut self, slot: u16) -> Result<(), RedisError> {
        self.call("CLUSTER SETSLOT STABLE", redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("STABLE")).await
    }

    pub async fn meet(&mut self, ip: &str) -> Result<(), RedisError> {
        self.call("CLUSTER MEET", redis::cmd("CLUSTER").arg("MEET").arg(ip).arg(REDIS_PORT)).await
    }

    /// Assigns `ranges`; `after_batch` runs after each atomic call.
    pub async fn add_slots(
        &mut self,
        ranges: &[SlotRange],
        has_range_command: bool,
        after_batch: impl Fn(),
    ) -> Result<(), RedisError> {
        if has_range_command {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("ADDSLOTSRANGE");
            for r in ranges {
                cmd.arg(r.start).arg(r.end);
            }
            self.call::<()>("CLUSTER ADDSLOTSRANGE", &cmd).await?;
            after_batch();
            return Ok(());
        }
        let slots: Vec<u16> = ranges.iter().flat_map(|r| r.start..=r.end).collect();
        for batch in slots.chunks(ADDSLOTS_BATCH) {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("ADDSLOTS").arg(batch);
            self.call::<()>("CLUSTER ADDSLOTS", &cmd).await?;
            after_batch();
        }
        Ok(())
    }

    pub async fn replicate(&mut self, master_id: &str) -> Result<(), RedisError> {
        self.call("CLUSTER REPLICATE", redis::cmd("CLUSTER").arg("REPLICATE").arg(master_id)).await
    }

    /// `ACL SETUSER <name> <rules...>` (the rules start with `reset`).
    pub async fn set_user(&mut self, name: &str, rules: &[String]) -> Result<(), RedisError> {
        self.call("ACL SETUSER", redis::cmd("ACL").arg("SETUSER").arg(name).arg(rules)).await
    }

    /// `ACL DELUSER <name>`; a user already gone is fine.
    pub async fn delete_user(&mut self, name: &str) -> Result<(), RedisError> {
        self.call::<i64>("ACL DELUSER", redis::cmd("ACL").arg("DELUSER").arg(name)).await.map(drop)
    }

    /// How this node, as a replica, signs in to its master (`masteruser`,
    /// `masterauth`; one `CONFIG SET` each, as Redis 6.2 takes one at a time).
    pub async fn sign_in_to_master(&mut self, user: &str, password: &str) -> Result<(), RedisError> {
        self.call::<()>("CONFIG SET", redis::cmd("CONFIG").arg("SET").arg("masteruser").arg(user)).await?;
        self.call("CONFIG SET", redis::cmd("CONFIG").arg("SET").arg("masterauth").arg(password)).await
    }
}

/// The value of `field` in an INFO-style `key:value` text.
pub fn info_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_url_safe() {
        assert_eq!(encode("a b/c@d:%"), "a%20b%2Fc%40d%3A%25");
        assert_eq!(encode("Abc-123_~."), "Abc-123_~.");
    }

    #[test]
    fn info_fields_are_found_by_exact_name() {
        let text = "# Server\r\nredis_version:7.0.15\r\nredis_version_extra:x\r\n";
        assert_eq!(info_field(text, "redis_version"), Some("7.0.15"));
        assert_eq!(info_field(text, "missing"), None);
    }
}
