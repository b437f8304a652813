//! Talking to Redis (client, pooled connections) and understanding what it
//! says (topology).

pub mod client;
pub mod migrate;
pub mod pool;
pub mod weights;
/// Parsing lives with the API types, which the console shares.
pub use slotkeeper_api::topology;
