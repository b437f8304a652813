//! The `RedisCluster` controller: observe (Kubernetes and Redis) → plan (pure)
//! → act (one idempotent step) → report (status, events).
#![forbid(unsafe_code)]

pub mod api;
pub mod controller;
pub mod error;
pub mod failpoint;
pub mod leader;
pub mod metrics;
pub mod plan;
pub mod redis;
pub mod resources;
pub mod server;
