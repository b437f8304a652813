//! Talking to Redis (client, pooled connections) and understanding what it
//! says (topology).

pub mod client;
pub mod migrate;
pub mod pool;
pub mod topology;
