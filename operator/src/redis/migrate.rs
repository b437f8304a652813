//! Moving slots between two masters with keys in them, many slots per round
//! trip: each phase (open, drain, hand over) is one pipeline over the whole
//! batch, so 100,000 small keys cost a few dozen round trips, not one per slot.
//!
//! Every phase is idempotent: a batch interrupted anywhere leaves slots open
//! (importing/migrating), which the planner finishes forward before anything
//! else; MIGRATE uses REPLACE so a repeated batch cannot fail on a key that
//! already arrived.
//!
//! The target claims a batch in one transaction with a single epoch bump:
//! `SETSLOT NODE` on an importing slot makes Redis 6.2 and 7.0 broadcast a
//! PONG to every node for every slot (5,000 messages for 1,000 slots in a
//! 6-node cluster, 89 ms on the target and 42 ms on a source that had to read
//! them, against 5 ms for the transaction; measured here with redis-server
//! 7.0.15), which every node then has to process while other pairs drain.

use std::time::Duration;

use redis::Value;

use super::client::{REDIS_PORT, RedisError, RedisNode};

/// Keys fetched per slot per GETKEYSINSLOT; a slot with more loops.
const KEYS_PER_CALL: usize = 1000;
/// MIGRATEs sent per round trip. Redis runs the commands a client has
/// pipelined back to back, and each MIGRATE waits for the target, so a
/// whole batch in one pipeline holds the source's other clients for as long
/// as the batch takes (with 1024-slot batches the bench's writers saw 261 ms
/// pauses). In chunks, the source serves them between chunks, for one more
/// round trip to the operator per chunk.
const MIGRATES_PER_CALL: usize = 32;
/// How long one MIGRATE may take on the wire, in milliseconds.
const MIGRATE_TIMEOUT_MS: u64 = 10_000;
/// Whole-pipeline deadline: a batch of hundreds of slots is one call.
const PIPELINE_TIMEOUT: Duration = Duration::from_secs(60);

/// One slot of a batch, with what still has to be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotTransfer {
    pub slot: u16,
    /// Mark the slot IMPORTING on the target (not yet open there, not owned).
    pub open_target: bool,
    /// Mark the slot MIGRATING on the source (owned there, not yet open).
    pub open_source: bool,
    /// The target owns it already (a batch interrupted after its claim).
    pub target_owns: bool,
}

/// The two masters of a batch.
pub struct Pair<'a> {
    pub source: &'a mut RedisNode,
    pub source_id: &'a str,
    pub target: &'a mut RedisNode,
    pub target_id: &'a str,
    pub target_ip: &'a str,
}

/// What a finished batch did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    pub slots: usize,
    pub keys: usize,
}

async fn run(node: &mut RedisNode, what: &'static str, pipe: &redis::Pipeline) -> Result<Vec<Value>, RedisError> {
    if pipe.is_empty() {
        return Ok(Vec::new());
    }
    node.pipeline(what, pipe, PIPELINE_TIMEOUT).await
}

/// Moves `slots` from the pair's source to its target, keys and ownership.
/// `after_drain` runs once the keys are over, before ownership changes (a
/// failpoint for crash tests).
pub async fn transfer(
    pair: Pair<'_>,
    slots: &[SlotTransfer],
    after_drain: &(dyn Fn() + Sync),
) -> Result<Moved, RedisError> {
    let started = std::time::Instant::now();
    // Open: importing on the target first, so no ASK redirect points at a
    // node that would refuse it.
    let mut importing = redis::pipe();
    for s in slots.iter().filter(|s| s.open_target) {
        importing.cmd("CLUSTER").arg("SETSLOT").arg(s.slot).arg("IMPORTING").arg(pair.source_id);
    }
    run(pair.target, "CLUSTER SETSLOT IMPORTING", &importing).await?;
    let mut migrating = redis::pipe();
    for s in slots.iter().filter(|s| s.open_source) {
        migrating.cmd("CLUSTER").arg("SETSLOT").arg(s.slot).arg("MIGRATING").arg(pair.target_id);
    }
    run(pair.source, "CLUSTER SETSLOT MIGRATING", &migrating).await?;
    let opened = started.elapsed();

    // Drain: list keys of every slot still holding some, MIGRATE them, repeat.
    let mut keys_moved = 0;
    let mut pending: Vec<u16> = slots.iter().map(|s| s.slot).collect();
    while !pending.is_empty() {
        let mut listing = redis::pipe();
        for slot in &pending {
            listing.cmd("CLUSTER").arg("GETKEYSINSLOT").arg(*slot).arg(KEYS_PER_CALL);
        }
        let listed = run(pair.source, "CLUSTER GETKEYSINSLOT", &listing).await?;
        let mut migrates: Vec<redis::Pipeline> = Vec::new();
        let mut still = Vec::new();
        for (slot, keys) in pending.iter().zip(listed) {
            let keys: Vec<Vec<u8>> = redis::from_redis_value(keys).map_err(|source| RedisError::Command {
                addr: pair.source.addr().to_owned(),
                command: "CLUSTER GETKEYSINSLOT",
                source: source.into(),
            })?;
            if keys.is_empty() {
                continue;
            }
            keys_moved += keys.len();
            still.push(*slot);
            if migrates.last().is_none_or(|p| p.len() >= MIGRATES_PER_CALL) {
                migrates.push(redis::pipe());
            }
            migrates
                .last_mut()
                .expect("just pushed")
                .cmd("MIGRATE")
                .arg(pair.target_ip)
                .arg(REDIS_PORT)
                .arg("")
                .arg(0)
                .arg(MIGRATE_TIMEOUT_MS)
                .arg("REPLACE");
            // The source signs in to the target as the operator reached the target.
            let migrate = migrates.last_mut().expect("just pushed");
            match &pair.target.login().user {
                Some(user) => migrate.arg("AUTH2").arg(user),
                None => migrate.arg("AUTH"),
            }
            .arg(&pair.target.login().password)
            .arg("KEYS")
            .arg(keys);
        }
        for migrate in &migrates {
            run(pair.source, "MIGRATE", migrate).await?;
        }
        pending = still;
    }

    let drained = started.elapsed();
    after_drain();
    // Hand over: the target first (it bumps its epoch and claims the slots),
    // then the source, which may only let go once empty.
    run(pair.target, "CLUSTER SETSLOT NODE", &claim(slots, pair.target_id)).await?;
    let claimed = started.elapsed();
    let mut handover = redis::pipe();
    for s in slots {
        handover.cmd("CLUSTER").arg("SETSLOT").arg(s.slot).arg("NODE").arg(pair.target_id);
    }
    match run(pair.source, "CLUSTER SETSLOT NODE", &handover).await {
        // A master that gave its last slot away has just become a replica of
        // the target (Redis's replica migration); it learned the owner already.
        Err(error) if error.to_string().contains("only with masters") => {}
        other => drop(other?),
    }
    tracing::debug!(
        source = pair.source.addr(),
        target = pair.target_ip,
        slots = slots.len(),
        keys = keys_moved,
        opened_ms = opened.as_secs_f64() * 1e3,
        drained_ms = drained.as_secs_f64() * 1e3,
        claimed_ms = claimed.as_secs_f64() * 1e3,
        total_ms = started.elapsed().as_secs_f64() * 1e3,
        "slot batch moved"
    );
    Ok(Moved { slots: slots.len(), keys: keys_moved })
}

/// The slots the target claims quietly (`STABLE` ends their import, so
/// `NODE` neither bumps the epoch nor broadcasts) and the one it claims
/// last while still importing, which bumps its epoch above the source's and
/// broadcasts the whole claim once. `None` when the target owns every slot
/// already: its epoch was bumped by that claim.
fn claim_order(slots: &[SlotTransfer]) -> (Vec<u16>, Option<u16>) {
    let bump = slots.iter().rposition(|s| !s.target_owns);
    let quiet = slots.iter().enumerate().filter(|(i, _)| Some(*i) != bump).map(|(_, s)| s.slot).collect();
    (quiet, bump.map(|i| slots[i].slot))
}

/// The target's claim as one MULTI/EXEC: nothing (a client, a gossip message
/// with the source's older claim) can come between the quiet claims, made
/// with the target's old epoch, and the bump that makes them win.
fn claim(slots: &[SlotTransfer], target_id: &str) -> redis::Pipeline {
    let (quiet, bump) = claim_order(slots);
    let mut pipe = redis::pipe();
    pipe.atomic();
    for slot in quiet {
        pipe.cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("STABLE");
        pipe.cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("NODE").arg(target_id);
    }
    if let Some(slot) = bump {
        pipe.cmd("CLUSTER").arg("SETSLOT").arg(slot).arg("NODE").arg(target_id);
    }
    pipe
}

/// Tells another master who owns `slots` now, so clients are redirected
/// right away instead of after gossip; best effort by design.
pub async fn announce(node: &mut RedisNode, slots: &[u16], target_id: &str) -> Result<(), RedisError> {
    let mut pipe = redis::pipe();
    for slot in slots {
        pipe.cmd("CLUSTER").arg("SETSLOT").arg(*slot).arg("NODE").arg(target_id);
    }
    run(node, "CLUSTER SETSLOT NODE", &pipe).await.map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(slot: u16, target_owns: bool) -> SlotTransfer {
        SlotTransfer { slot, open_target: !target_owns, open_source: true, target_owns }
    }

    /// Each command of a pipeline as its words.
    fn words(pipe: &redis::Pipeline) -> Vec<String> {
        pipe.cmd_iter()
            .map(|cmd| {
                cmd.args_iter()
                    .map(|arg| match arg {
                        redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                        _ => "<other>".into(),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }

    #[test]
    fn a_claim_bumps_the_epoch_once_with_its_last_importing_slot() {
        let slots = [transfer(7, false), transfer(8, false), transfer(9, false)];
        assert_eq!(claim_order(&slots), (vec![7, 8], Some(9)));
        let pipe = claim(&slots, "t");
        assert!(pipe.is_transaction(), "the claim is one MULTI/EXEC");
        assert_eq!(
            words(&pipe),
            [
                "CLUSTER SETSLOT 7 STABLE",
                "CLUSTER SETSLOT 7 NODE t",
                "CLUSTER SETSLOT 8 STABLE",
                "CLUSTER SETSLOT 8 NODE t",
                "CLUSTER SETSLOT 9 NODE t",
            ]
        );
    }

    #[test]
    fn a_repaired_claim_bumps_with_a_slot_the_target_does_not_own_yet() {
        let slots = [transfer(7, false), transfer(8, true)];
        assert_eq!(claim_order(&slots), (vec![8], Some(7)));
        // Everything claimed before an interruption: nothing left to bump.
        assert_eq!(claim_order(&[transfer(7, true), transfer(8, true)]), (vec![7, 8], None));
    }
}
