//! The `RedisCluster` controller: observe (Kubernetes and Redis) → plan (pure)
//! → act (one idempotent step) → report (status, events, metrics).
#![forbid(unsafe_code)]

pub mod api;
pub mod plan;
pub mod redis;
