//! The `RedisCluster` controller: observe (Kubernetes and Redis) → plan (pure)
//! → act (one idempotent step) → report (status, events).
#![forbid(unsafe_code)]

/// The API types live in their own crate, so the console need not pull the controller in.
pub use slotkeeper_api as api;

pub mod config;
pub mod controller;
pub mod error;
pub mod failpoint;
pub mod leader;
pub mod metrics;
pub mod metrics_auth;
pub mod plan;
pub mod publish;
pub mod redis;
pub mod resources;
pub mod sampler;
pub mod server;
pub mod webhook;
