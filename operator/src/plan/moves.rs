//! Slot movement: finishing slots something left open, and balancing slots
//! over the staying masters (draining leaving ones), as batches of
//! [`SlotTransfer`]s between pairs of masters.

use std::collections::{BTreeMap, BTreeSet};

use slotkeeper_api::balance;
use slotkeeper_api::capacity::{MemoryFact, ScaleInCheck};

use super::{Action, Batch, NodeRef, Observed, PodFact, SLOTS_PER_PAIR_PER_STEP};
use crate::redis::migrate::SlotTransfer;
use crate::redis::topology::{Direction, count, expand};

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
pub fn repair_open_slots(observed: &Observed, reachable: &[&PodFact]) -> Option<Action> {
    let by_id: BTreeMap<&str, &PodFact> =
        reachable.iter().filter_map(|p| Some((observed.id_of(&p.name)?, *p))).collect();
    // slot → (source id, target id)
    let mut open: BTreeMap<u16, (String, String)> = BTreeMap::new();
    let mut orphaned: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    for pod in reachable {
        let Some(me) = observed.redis[&pod.name].myself() else { continue };
        for mark in &me.open_slots {
            if !by_id.contains_key(mark.peer.as_str()) {
                orphaned.entry(pod.name.clone()).or_default().push(mark.slot);
                continue;
            }
            let ends = match mark.direction {
                Direction::Migrating => (me.id.clone(), mark.peer.clone()),
                Direction::Importing => (mark.peer.clone(), me.id.clone()),
            };
            // The importing side's mark names the destination for certain.
            if mark.direction == Direction::Importing || !open.contains_key(&mark.slot) {
                open.insert(mark.slot, ends);
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
        let (source_ref, target_ref) = (node_ref(observed, source)?, node_ref(observed, target)?);
        let (s, t) = (view(observed, &source.name, slot), view(observed, &target.name, slot));
        let transfer = SlotTransfer { slot, open_target: !t.importing && !t.owns, open_source: s.owns && !s.migrating };
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

fn other_masters(observed: &Observed, reachable: &[&PodFact], batches: &[Batch]) -> Vec<String> {
    let busy: BTreeSet<&str> = batches.iter().flat_map(|b| [b.source.pod.as_str(), b.target.pod.as_str()]).collect();
    reachable
        .iter()
        .filter(|p| observed.redis[&p.name].myself().is_some_and(|n| n.master))
        .map(|p| p.name.clone())
        .filter(|p| !busy.contains(p.as_str()))
        .collect()
}

/// The next batch of slots towards the even share over the staying masters.
pub fn rebalance(observed: &Observed, masters: &BTreeMap<usize, Option<&PodFact>>) -> Option<Action> {
    // Slot counts first: the sets are built only when something must move.
    let mut ranges: BTreeMap<usize, &[crate::redis::topology::SlotRange]> = BTreeMap::new();
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
    let counts: BTreeMap<usize, usize> = ranges.iter().map(|(&shard, r)| (shard, count(r))).collect();
    if !balance::needs_balancing(&counts, observed.shards) {
        return None;
    }
    let owned = || -> BTreeMap<usize, BTreeSet<u16>> { ranges.iter().map(|(&shard, r)| (shard, expand(r))).collect() };
    if (0..observed.shards).any(|s| !by_shard.contains_key(&s)) {
        return None;
    }
    let moves = balance::moves(&owned(), observed.shards);
    if moves.is_empty() {
        return None;
    }
    if moves.iter().any(|m| m.from >= observed.shards)
        && let Some(refusal) = scale_in_refusal(observed, &by_shard)
    {
        return Some(Action::Refused(refusal));
    }
    let batch = balance::next_batch(&moves, SLOTS_PER_PAIR_PER_STEP);
    let mut batches: BTreeMap<(usize, usize), Batch> = BTreeMap::new();
    for m in &batch {
        let entry = match batches.entry((m.from, m.to)) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => e.insert(Batch {
                source: node_ref(observed, by_shard[&m.from])?,
                target: node_ref(observed, by_shard[&m.to])?,
                slots: Vec::new(),
            }),
        };
        entry.slots.push(SlotTransfer { slot: m.slot, open_target: true, open_source: true });
    }
    let batches: Vec<Batch> = batches.into_values().collect();
    let members: Vec<&PodFact> = by_shard.values().copied().collect();
    let others = other_masters(observed, &members, &batches);
    Some(Action::MoveSlots { batches, others, remaining: moves.len() - batch.len(), repair: false })
}

/// Why draining the leaving masters is unsafe, if it is: the data of every
/// master must fit in the staying masters' maxmemory, with headroom.
fn scale_in_refusal(observed: &Observed, by_shard: &BTreeMap<usize, &PodFact>) -> Option<String> {
    let memory = |p: &&PodFact| observed.redis[&p.name].memory;
    let masters: Vec<MemoryFact> = by_shard.values().map(memory).collect();
    let staying: Vec<MemoryFact> = by_shard.range(..observed.shards).map(|(_, p)| memory(p)).collect();
    ScaleInCheck::new(&masters, &staying).refusal(by_shard.len(), observed.shards)
}
