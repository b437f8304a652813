//! Which slots move where: pure arithmetic over who owns what.
//!
//! Targets are the even share per staying master (the remainder to the lowest
//! shards, as at bootstrap); leaving masters give everything. Donors give
//! their highest slots and receivers take them in shard order, so moved
//! slots stay in few contiguous ranges. A cluster already within 1% of the
//! even share everywhere is left as it is: balancing never churns.

use std::collections::{BTreeMap, BTreeSet};

use crate::topology::SLOTS;

mod weighted;
pub use weighted::{WeightedPlan, weighted_moves};

/// One slot to move from one shard's master to another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Move {
    pub slot: u16,
    pub from: usize,
    pub to: usize,
}

/// The slot count each of `staying` masters should own.
pub fn targets(staying: usize) -> Vec<usize> {
    let total = SLOTS as usize;
    (0..staying).map(|i| total / staying + usize::from(i < total % staying)).collect()
}

/// Whether `counts` (slots per shard) are off the even share of `staying`
/// masters by more than 1% anywhere, or a leaving shard still owns slots.
pub fn needs_balancing(counts: &BTreeMap<usize, usize>, staying: usize) -> bool {
    let share = SLOTS as f64 / staying as f64;
    counts.iter().any(|(&shard, &n)| {
        if shard >= staying {
            return n > 0;
        }
        (n as f64 - share).abs() > share * 0.01
    }) || (0..staying).any(|shard| !counts.contains_key(&shard))
}

/// Every move needed to reach the targets; empty when already balanced.
pub fn moves(owned: &BTreeMap<usize, BTreeSet<u16>>, staying: usize) -> Vec<Move> {
    let counts: BTreeMap<usize, usize> = owned.iter().map(|(&shard, slots)| (shard, slots.len())).collect();
    if staying == 0 || !needs_balancing(&counts, staying) {
        return Vec::new();
    }
    exact_moves(owned, staying)
}

/// Every move to the exact even share, however close the cluster already is
/// (what a `Rebalance` operation by slots asks for).
pub fn exact_moves(owned: &BTreeMap<usize, BTreeSet<u16>>, staying: usize) -> Vec<Move> {
    if staying == 0 {
        return Vec::new();
    }
    let targets = targets(staying);
    let target_of = |shard: usize| targets.get(shard).copied().unwrap_or(0);
    // Surplus slots, highest first from each donor, donors in shard order.
    let mut surplus: Vec<(u16, usize)> = Vec::new();
    for (&shard, slots) in owned {
        let excess = slots.len().saturating_sub(target_of(shard));
        surplus.extend(slots.iter().rev().take(excess).map(|&slot| (slot, shard)));
    }
    let mut moves = Vec::new();
    let mut given = surplus.into_iter();
    for (shard, &target) in targets.iter().enumerate() {
        let has = owned.get(&shard).map_or(0, BTreeSet::len);
        for (slot, from) in given.by_ref().take(target.saturating_sub(has)) {
            moves.push(Move { slot, from, to: shard });
        }
    }
    moves.sort();
    moves
}

/// The next batch: up to `per_source` moves for every giving master, spread
/// over its receivers in turn. A master sends MIGRATEs one at a time (each
/// waits for the receiver), so the givers are what run in parallel: capping
/// each giver alike keeps all of them busy for the whole step, where a cap
/// per pair had a master giving to two receivers take twice as long as the
/// others while they sat idle.
pub fn next_batch(moves: &[Move], per_source: usize) -> Vec<Move> {
    let mut by_pair: BTreeMap<(usize, usize), std::collections::VecDeque<Move>> = BTreeMap::new();
    for m in moves {
        by_pair.entry((m.from, m.to)).or_default().push_back(*m);
    }
    let sources: BTreeSet<usize> = by_pair.keys().map(|&(from, _)| from).collect();
    let mut batch = Vec::new();
    for source in sources {
        let mut taken = 0;
        while taken < per_source {
            let before = taken;
            for (_, queue) in by_pair.range_mut((source, 0)..=(source, usize::MAX)) {
                if taken < per_source
                    && let Some(m) = queue.pop_front()
                {
                    batch.push(m);
                    taken += 1;
                }
            }
            if taken == before {
                break;
            }
        }
    }
    batch.sort();
    batch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::shard_range;

    fn bootstrap(shards: usize) -> BTreeMap<usize, BTreeSet<u16>> {
        (0..shards)
            .map(|i| {
                let r = shard_range(i, shards);
                (i, (r.start..=r.end).collect())
            })
            .collect()
    }

    fn apply(owned: &mut BTreeMap<usize, BTreeSet<u16>>, moves: &[Move]) {
        for m in moves {
            assert!(owned.get_mut(&m.from).unwrap().remove(&m.slot), "{m:?} moves a slot its donor does not own");
            owned.entry(m.to).or_default().insert(m.slot);
        }
    }

    #[test]
    fn targets_sum_to_all_slots() {
        for n in 1..=12 {
            assert_eq!(targets(n).iter().sum::<usize>(), SLOTS as usize);
        }
        assert_eq!(targets(3), vec![5462, 5461, 5461]);
    }

    #[test]
    fn a_bootstrapped_cluster_needs_nothing() {
        for n in 3..=8 {
            assert!(moves(&bootstrap(n), n).is_empty(), "{n} shards");
        }
    }

    #[test]
    fn scale_out_moves_only_what_the_new_masters_need() {
        let mut owned = bootstrap(3);
        let moves = moves(&owned, 5);
        // The new masters receive exactly their targets; nothing else moves.
        assert_eq!(moves.len(), targets(5)[3] + targets(5)[4]);
        assert!(moves.iter().all(|m| m.from < 3 && m.to >= 3));
        apply(&mut owned, &moves);
        let counts: Vec<usize> = (0..5).map(|i| owned[&i].len()).collect();
        assert_eq!(counts, targets(5));
        assert!(super::moves(&owned, 5).is_empty());
    }

    #[test]
    fn scale_in_drains_leaving_masters_over_all_staying_ones() {
        let mut owned = bootstrap(5);
        let moves = moves(&owned, 3);
        assert!(moves.iter().all(|m| m.from >= 3 && m.to < 3), "only leaving masters give");
        let receivers: BTreeSet<usize> = moves.iter().map(|m| m.to).collect();
        assert_eq!(receivers, BTreeSet::from([0, 1, 2]), "spread, not dumped on one survivor");
        apply(&mut owned, &moves);
        assert!(owned[&3].is_empty() && owned[&4].is_empty());
        let counts: Vec<usize> = (0..3).map(|i| owned[&i].len()).collect();
        assert_eq!(counts, targets(3));
    }

    #[test]
    fn within_one_percent_is_balanced_enough() {
        let mut owned = bootstrap(3);
        let moved: Vec<u16> = owned.get(&0).unwrap().iter().rev().take(40).copied().collect();
        for slot in moved {
            owned.get_mut(&0).unwrap().remove(&slot);
            owned.get_mut(&1).unwrap().insert(slot);
        }
        assert!(moves(&owned, 3).is_empty(), "40 slots off is under 1% of 5461");
        let moved: Vec<u16> = owned.get(&0).unwrap().iter().rev().take(100).copied().collect();
        for slot in moved {
            owned.get_mut(&0).unwrap().remove(&slot);
            owned.get_mut(&1).unwrap().insert(slot);
        }
        let fix = moves(&owned, 3);
        apply(&mut owned, &fix);
        assert_eq!((0..3).map(|i| owned[&i].len()).collect::<Vec<_>>(), targets(3));
    }

    #[test]
    fn batches_cap_each_giver_alike_and_cover_every_pair() {
        // 3 → 5: the middle master gives to both new ones, the others to one.
        let all = moves(&bootstrap(3), 5);
        let batch = next_batch(&all, 100);
        for source in 0..3 {
            assert_eq!(batch.iter().filter(|m| m.from == source).count(), 100, "giver {source}");
        }
        let pairs: BTreeSet<(usize, usize)> = all.iter().map(|m| (m.from, m.to)).collect();
        assert!(pairs.len() > 3, "{pairs:?}");
        for pair in &pairs {
            assert!(batch.iter().any(|m| (m.from, m.to) == *pair), "{pair:?} waits");
        }
        assert!(batch.iter().all(|m| all.contains(m)));
    }

    #[test]
    fn batches_take_what_is_left_and_end() {
        let mut owned = bootstrap(3);
        let mut left = moves(&owned, 5);
        let mut steps = 0;
        while !left.is_empty() {
            let batch = next_batch(&left, 1024);
            assert!(!batch.is_empty());
            apply(&mut owned, &batch);
            left.retain(|m| !batch.contains(m));
            steps += 1;
        }
        // Each giver owes about 2,184 slots: three steps, not five.
        assert_eq!(steps, 3);
        assert_eq!((0..5).map(|i| owned[&i].len()).collect::<Vec<_>>(), targets(5));
    }
}
