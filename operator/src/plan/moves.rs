//! Slot movement: finishing slots something left open, and balancing slots
//! over the staying masters (draining leaving ones), as batches of
//! [`SlotTransfer`]s between pairs of masters.

use std::collections::{BTreeMap, BTreeSet};

use slotkeeper_api::balance::{self, Move};
use slotkeeper_api::capacity::{MemoryFact, ScaleInCheck};

use super::{Action, BalanceBy, Batch, NodeRef, Observed, PlanInProgress, PodFact, SLOTS_PER_SOURCE_PER_STEP};
use crate::redis::migrate::SlotTransfer;
use crate::redis::topology::{Direction, SlotRange, count, expand, to_ranges};
use slotkeeper_api::{BalancePlan, SlotTarget};

fn node_ref(observed: &Observed, pod: &PodFact) -> Option<NodeRef> {
    Some(NodeRef { pod: pod.name.clone(), id: observed.id_of(&pod.name)?.to_owned(), ip: pod.ip.clone()? })
}

/// What a node says about one slot in its own view.
struct SlotView {
    owns: bool,
    importing: bool,
    migrating: bool,
}

fn view(observed: &Observed, pod: &str, slot: u16) -> SlotView {
    let me = observed.redis.get(pod).and_then(|f| f.myself());
    let open = |direction| me.is_some_and(|n| n.open_slots.iter().any(|o| o.slot == slot && o.direction == direction));
    SlotView {
        owns: me.is_some_and(|n| n.slots.iter().any(|r| r.start <= slot && slot <= r.end)),
        importing: open(Direction::Importing),
        migrating: open(Direction::Migrating),
    }
}

/// Slots any node marks importing or migrating are finished forward, to
/// the importing side, before anything else happens. A mark whose other end
/// is no longer a member cannot be finished and is cleared instead.
///
/// Roles may have changed since the marks were set (a failover, a lost
/// leader): each end is taken as the master of its shard now, whatever
/// Redis reports, so the move runs between masters. A replica's marks count
/// only while the move they describe is still to be made (its master's peer
/// owns the slot); Redis keeps them but lets only masters clear them.
pub fn repair_open_slots(observed: &Observed, reachable: &[&PodFact]) -> Option<Action> {
    let by_id: BTreeMap<&str, &PodFact> =
        reachable.iter().filter_map(|p| Some((observed.id_of(&p.name)?, *p))).collect();
    // A node's master now: itself, or the master it follows.
    let master_of = |id: &str| -> Option<String> {
        let me = observed.redis[&by_id.get(id)?.name].myself()?;
        if me.master { Some(me.id.clone()) } else { me.master_id.clone().filter(|m| by_id.contains_key(m.as_str())) }
    };
    // slot → (source id, target id)
    let mut open: BTreeMap<u16, (String, String)> = BTreeMap::new();
    let mut orphaned: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    for pod in reachable {
        let Some(me) = observed.redis[&pod.name].myself() else { continue };
        for mark in &me.open_slots {
            let ends = match mark.direction {
                Direction::Migrating => (me.id.as_str(), mark.peer.as_str()),
                Direction::Importing => (mark.peer.as_str(), me.id.as_str()),
            };
            let resolved = master_of(ends.0).zip(master_of(ends.1)).filter(|(source, target)| source != target);
            let Some((source, target)) = resolved else {
                // Nothing left to finish (its peer is gone, or both ends are
                // one shard now): a master's mark is cleared; a replica's
                // cannot be, and routes nothing.
                if me.master {
                    orphaned.entry(pod.name.clone()).or_default().push(mark.slot);
                }
                continue;
            };
            if !me.master && !replica_mark_counts(observed, mark.slot, by_id[source.as_str()], by_id[target.as_str()]) {
                continue;
            }
            // The importing side's mark names the destination for certain.
            if mark.direction == Direction::Importing || !open.contains_key(&mark.slot) {
                open.insert(mark.slot, (source, target));
            }
        }
    }
    if !orphaned.is_empty() {
        return Some(Action::Stabilize { slots_by_pod: orphaned });
    }
    if open.is_empty() {
        return None;
    }
    let mut batches: BTreeMap<(String, String), Batch> = BTreeMap::new();
    for (slot, (source_id, target_id)) in open {
        let (source, target) = (by_id[source_id.as_str()], by_id[target_id.as_str()]);
        let (Some(source_ref), Some(target_ref)) = (node_ref(observed, source), node_ref(observed, target)) else {
            // Never let later steps move roles while a slot is open.
            return Some(Action::Wait(format!("slot {slot} is open; waiting to address both of its masters")));
        };
        let (s, t) = (view(observed, &source.name, slot), view(observed, &target.name, slot));
        let transfer = SlotTransfer {
            slot,
            open_target: !t.importing && !t.owns,
            open_source: s.owns && !s.migrating,
            target_owns: t.owns,
        };
        batches
            .entry((source_id, target_id))
            .or_insert_with(|| Batch { source: source_ref, target: target_ref, slots: Vec::new() })
            .slots
            .push(transfer);
    }
    let batches: Vec<Batch> = batches.into_values().collect();
    let others = other_masters(observed, reachable, &batches);
    Some(Action::MoveSlots { batches, others, remaining: 0, repair: true })
}

/// A replica's mark describes a move still to be made when its source
/// still owns the slot and its target holds keys of it (moved before roles
/// changed, reachable through no owner): those are finished forward. Any
/// other replica mark is stale (Redis keeps it on a demoted master) and
/// moves nothing.
fn replica_mark_counts(observed: &Observed, slot: u16, source: &PodFact, target: &PodFact) -> bool {
    let holds_keys = observed.redis.get(&target.name).is_some_and(|f| f.stray_keys.get(&slot).is_some_and(|&n| n > 0));
    holds_keys && view(observed, &source.name, slot).owns && !view(observed, &target.name, slot).owns
}

/// Whether a master marks a slot importing or migrating: no master role
/// moves until that is finished (a failover would leave the marks on a
/// replica and the move half made).
pub fn slots_open(observed: &Observed) -> bool {
    observed.redis.values().filter_map(|f| f.myself()).any(|me| me.master && !me.open_slots.is_empty())
}

fn other_masters(observed: &Observed, reachable: &[&PodFact], batches: &[Batch]) -> Vec<String> {
    let busy: BTreeSet<&str> = batches.iter().flat_map(|b| [b.source.pod.as_str(), b.target.pod.as_str()]).collect();
    reachable
        .iter()
        .filter(|p| observed.redis[&p.name].myself().is_some_and(|n| n.master))
        .map(|p| p.name.clone())
        .filter(|p| !busy.contains(p.as_str()))
        .collect()
}

/// The next step towards balanced masters: following the plan in progress,
/// making one (a `Rebalance` operation, or a scale when balancing by
/// memory), finishing it, or else the next batch towards even slot counts.
pub fn rebalance(observed: &Observed, masters: &BTreeMap<usize, Option<&PodFact>>) -> Option<Action> {
    // Slot counts first: the sets are built only when something must move.
    let mut ranges: BTreeMap<usize, &[SlotRange]> = BTreeMap::new();
    let mut by_shard: BTreeMap<usize, &PodFact> = BTreeMap::new();
    for (&shard, master) in masters {
        match *master {
            Some(master) => {
                let me = observed.redis[&master.name].myself()?;
                ranges.insert(shard, if me.master { &me.slots } else { &[] });
                by_shard.insert(shard, master);
            }
            // A drained leaving shard whose nodes now follow other masters.
            None if shard >= observed.shards => {
                ranges.insert(shard, &[]);
            }
            None => return None,
        }
    }
    if (0..observed.shards).any(|s| !by_shard.contains_key(&s)) {
        return None;
    }
    let counts: BTreeMap<usize, usize> = ranges.iter().map(|(&shard, r)| (shard, count(r))).collect();
    // A shard leaving with slots, or a staying one without: the shape changed.
    let reshaping = counts.iter().any(|(&shard, &n)| (shard >= observed.shards) == (n > 0));
    let intent = &observed.balance;
    let plan = intent.plan.as_ref().filter(|p| p.masters == observed.shards);
    if let Some(plan) = plan {
        let owner: BTreeMap<u16, usize> =
            ranges.iter().flat_map(|(&shard, r)| expand(r).into_iter().map(move |slot| (slot, shard))).collect();
        let moves: Vec<Move> = plan
            .target
            .iter()
            .filter_map(|(&slot, &to)| {
                owner.get(&slot).filter(|&&from| from != to).map(|&from| Move { slot, from, to })
            })
            .collect();
        if !moves.is_empty() {
            return Some(move_step(observed, &by_shard, &moves));
        }
        if !reshaping {
            let summary = balance_summary(observed, &by_shard, &counts, plan);
            return Some(Action::FinishBalance { by: plan.by, operation: plan.operation.clone(), summary });
        }
    }
    let asked = intent.operation.as_ref().filter(|op| plan.is_none_or(|p| p.operation.as_ref() != Some(*op)));
    if asked.is_some() || (intent.by == BalanceBy::Memory && reshaping) {
        let leaving_data = counts.range(observed.shards..).any(|(_, &n)| n > 0);
        if leaving_data && let Some(refusal) = scale_in_refusal(observed, &by_shard) {
            return Some(Action::Refused(refusal));
        }
        return Some(Action::PlanBalance {
            by: intent.by,
            tolerance_percent: intent.tolerance_percent,
            operation: asked.cloned(),
            staying: observed.shards,
            masters: by_shard
                .iter()
                .map(|(&shard, pod)| Some((shard, node_ref(observed, pod)?)))
                .collect::<Option<_>>()?,
            owned: ranges.iter().map(|(&shard, r)| (shard, r.to_vec())).collect(),
        });
    }
    if intent.by == BalanceBy::Memory || !balance::needs_balancing(&counts, observed.shards) {
        return None;
    }
    let owned: BTreeMap<usize, BTreeSet<u16>> = ranges.iter().map(|(&shard, r)| (shard, expand(r))).collect();
    let moves = balance::moves(&owned, observed.shards);
    if moves.is_empty() {
        return None;
    }
    Some(move_step(observed, &by_shard, &moves))
}

/// The next batch of `moves` (refused when draining leaving masters would
/// not fit in the staying ones).
fn move_step(observed: &Observed, by_shard: &BTreeMap<usize, &PodFact>, moves: &[Move]) -> Action {
    if moves.iter().any(|m| m.from >= observed.shards)
        && let Some(refusal) = scale_in_refusal(observed, by_shard)
    {
        return Action::Refused(refusal);
    }
    let batch = balance::next_batch(moves, SLOTS_PER_SOURCE_PER_STEP);
    let mut batches: BTreeMap<(usize, usize), Batch> = BTreeMap::new();
    for m in &batch {
        let (Some(source), Some(target)) = (node_ref(observed, by_shard[&m.from]), node_ref(observed, by_shard[&m.to]))
        else {
            return Action::Wait("a master's node id is not known yet".into());
        };
        batches
            .entry((m.from, m.to))
            .or_insert_with(|| Batch { source, target, slots: Vec::new() })
            .slots
            .push(SlotTransfer { slot: m.slot, open_target: true, open_source: true, target_owns: false });
    }
    let batches: Vec<Batch> = batches.into_values().collect();
    let members: Vec<&PodFact> = by_shard.values().copied().collect();
    let others = other_masters(observed, &members, &batches);
    Action::MoveSlots { batches, others, remaining: moves.len() - batch.len(), repair: false }
}

/// How even the staying masters are once a plan is done: slots, and for a
/// memory plan the data each holds (`used_memory_dataset`) against the mean.
fn balance_summary(
    observed: &Observed,
    by_shard: &BTreeMap<usize, &PodFact>,
    counts: &BTreeMap<usize, usize>,
    plan: &PlanInProgress,
) -> String {
    let staying: Vec<usize> = (0..observed.shards).collect();
    let slots: Vec<String> = staying.iter().map(|s| counts.get(s).copied().unwrap_or(0).to_string()).collect();
    let mut summary = format!("slots per master: {}", slots.join(", "));
    if plan.by == BalanceBy::Memory {
        let bytes: Vec<u64> = staying.iter().map(|s| observed.redis[&by_shard[s].name].memory.dataset).collect();
        let mean = bytes.iter().sum::<u64>() as f64 / bytes.len().max(1) as f64;
        let worst = bytes.iter().map(|&b| (b as f64 - mean).abs() / mean.max(1.0) * 100.0).fold(0.0, f64::max);
        let mib: Vec<String> = bytes.iter().map(|&b| format!("{:.2}", b as f64 / 1048576.0)).collect();
        summary = format!("data per master: {} MiB, at most {worst:.1}% from the mean; {summary}", mib.join(", "));
    }
    if let Some(expected) = &plan.expected {
        summary = format!("{summary} (planned: {expected})");
    }
    summary
}

/// Why draining the leaving masters is unsafe, if it is: the data of every
/// master must fit in the staying masters' maxmemory, with headroom.
fn scale_in_refusal(observed: &Observed, by_shard: &BTreeMap<usize, &PodFact>) -> Option<String> {
    let memory = |p: &&PodFact| observed.redis[&p.name].memory;
    let masters: Vec<MemoryFact> = by_shard.values().map(memory).collect();
    let staying: Vec<MemoryFact> = by_shard.range(..observed.shards).map(|(_, p)| memory(p)).collect();
    ScaleInCheck::new(&masters, &staying).refusal(by_shard.len(), observed.shards)
}

/// Where slots go for a rebalance `by` slot counts (exact shares) or by
/// `weights` (bytes per slot), as the plan checkpointed in status, and how
/// many slots it moves. Pure: the weights were read before.
pub fn make_plan(
    by: BalanceBy,
    tolerance_percent: u32,
    operation: Option<String>,
    staying: usize,
    owned: &BTreeMap<usize, Vec<SlotRange>>,
    weights: &BTreeMap<u16, u64>,
) -> (BalancePlan, usize) {
    let owned: BTreeMap<usize, BTreeSet<u16>> = owned.iter().map(|(&shard, r)| (shard, expand(r))).collect();
    let (moves, expected) = match by {
        BalanceBy::Slots => {
            let counts: Vec<String> = balance::targets(staying).iter().map(ToString::to_string).collect();
            (balance::exact_moves(&owned, staying), format!("slots per master: {}", counts.join(", ")))
        }
        BalanceBy::Memory => {
            let plan = balance::weighted_moves(&owned, weights, staying, tolerance_percent);
            let mib =
                |v: &[u64]| v.iter().map(|&b| format!("{:.2}", b as f64 / 1048576.0)).collect::<Vec<_>>().join(", ");
            let reach = if plan.within {
                format!("within {tolerance_percent}% of the mean")
            } else {
                format!("as close to {tolerance_percent}% as whole slots allow (one slot alone is too heavy)")
            };
            let expected =
                format!("estimated data per master {} → {} MiB, {reach}", mib(&plan.before), mib(&plan.after));
            (plan.moves, expected)
        }
    };
    let mut by_target: BTreeMap<usize, BTreeSet<u16>> = BTreeMap::new();
    for m in &moves {
        by_target.entry(m.to).or_default().insert(m.slot);
    }
    let targets = by_target
        .into_iter()
        .map(|(shard, slots)| SlotTarget {
            shard: shard as i32,
            slots: to_ranges(&slots).iter().map(ToString::to_string).collect(),
        })
        .collect();
    let plan = BalancePlan { by, operation, masters: staying as i32, targets, expected: Some(expected) };
    (plan, moves.len())
}
