//! The `RedisCluster` controller. Empty until the operator-core issue lands:
//! nothing here pretends to reconcile yet.
#![forbid(unsafe_code)]
