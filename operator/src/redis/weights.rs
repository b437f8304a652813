//! How many bytes each slot of a master holds, estimated without reading
//! every key: `CLUSTER COUNTKEYSINSLOT`, times the mean `MEMORY USAGE` of up
//! to [`SAMPLE`] of its keys (exact for slots with that many keys or fewer;
//! for more, as good as the first keys Redis lists are typical of the slot:
//! with 4 samples, one small key among 41 large ones made a slot look 25%
//! lighter here, with 16 it is a few percent).
//! Read-only; pipelined in chunks so a master's 16384 slots take a few
//! round trips.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;

use super::client::{RedisError, RedisNode};

/// Keys sampled per slot.
const SAMPLE: usize = 16;
/// Commands per pipeline.
const CHUNK: usize = 2048;
const DEADLINE: Duration = Duration::from_secs(10);

fn parse<T: redis::FromRedisValue>(node: &RedisNode, command: &'static str, value: Value) -> Result<T, RedisError> {
    redis::from_redis_value(value).map_err(|source| RedisError::Command {
        addr: node.addr().to_owned(),
        command,
        source: source.into(),
    })
}

/// How many keys the node holds in each of `slots` (slots without keys are left out).
pub async fn keys_per_slot(node: &mut RedisNode, slots: &[u16]) -> Result<Vec<(u16, u64)>, RedisError> {
    let mut counts: Vec<(u16, u64)> = Vec::new();
    for chunk in slots.chunks(CHUNK) {
        let mut pipe = redis::pipe();
        for slot in chunk {
            pipe.cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(*slot);
        }
        let replies = node.pipeline("CLUSTER COUNTKEYSINSLOT", &pipe, DEADLINE).await?;
        for (slot, reply) in chunk.iter().zip(replies) {
            let n: u64 = parse(node, "CLUSTER COUNTKEYSINSLOT", reply)?;
            if n > 0 {
                counts.push((*slot, n));
            }
        }
    }
    Ok(counts)
}

/// Estimated bytes per slot of `slots` (slots without keys are left out).
pub async fn slot_bytes(node: &mut RedisNode, slots: &[u16]) -> Result<BTreeMap<u16, u64>, RedisError> {
    let counts = keys_per_slot(node, slots).await?;
    let mut bytes = BTreeMap::new();
    for chunk in counts.chunks(CHUNK / SAMPLE) {
        let mut listing = redis::pipe();
        for (slot, _) in chunk {
            listing.cmd("CLUSTER").arg("GETKEYSINSLOT").arg(*slot).arg(SAMPLE);
        }
        let listed = node.pipeline("CLUSTER GETKEYSINSLOT", &listing, DEADLINE).await?;
        let mut sampled: Vec<(u16, u64, usize)> = Vec::new();
        let mut usage = redis::pipe();
        for ((slot, n), keys) in chunk.iter().zip(listed) {
            let keys: Vec<Vec<u8>> = parse(node, "CLUSTER GETKEYSINSLOT", keys)?;
            sampled.push((*slot, *n, keys.len()));
            for key in keys {
                usage.cmd("MEMORY").arg("USAGE").arg(key);
            }
        }
        let mut sizes = node.pipeline("MEMORY USAGE", &usage, DEADLINE).await?.into_iter();
        for (slot, n, keys) in sampled {
            let mut total = 0u64;
            for size in sizes.by_ref().take(keys) {
                // A key deleted since it was listed answers nil.
                total += parse::<Option<u64>>(node, "MEMORY USAGE", size)?.unwrap_or(0);
            }
            let mean = if keys == 0 { 0 } else { total / keys as u64 };
            bytes.insert(slot, (n * mean).max(1));
        }
    }
    Ok(bytes)
}
