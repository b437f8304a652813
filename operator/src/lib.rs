//! The `RedisCluster` controller.
#![forbid(unsafe_code)]

pub mod api;
