//! Talking to Redis (client) and understanding what it says (topology).

pub mod client;
pub mod topology;
