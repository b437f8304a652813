//! Balancing by weight (bytes per slot) instead of slot counts, for
//! keyspaces where a few slots hold most of the data.
//!
//! Leaving masters give every slot, heaviest first, each to the lightest
//! staying master. Then, while some master is outside the tolerance, the
//! heaviest master gives the lightest one the slot that best halves the gap
//! between them (every such move lowers the spread, so this ends). Last,
//! slots holding nothing are evened out by count, so that keys written
//! later spread too. A cluster already within the tolerance is left alone.

use std::collections::{BTreeMap, BTreeSet};

use super::Move;

/// The moves, and the bytes each staying master holds before and after.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightedPlan {
    pub moves: Vec<Move>,
    pub before: Vec<u64>,
    pub after: Vec<u64>,
    /// Every staying master ends within the tolerance of the mean. False
    /// when whole slots cannot get there (one slot alone is too heavy).
    pub within: bool,
}

/// How a plan is worked out: owner and weight per slot, and the load per shard.
struct Ledger {
    staying: usize,
    owner: BTreeMap<u16, usize>,
    /// Slots with data per staying shard, by (weight, slot).
    heavy: Vec<BTreeSet<(u64, u16)>>,
    load: Vec<u64>,
}

impl Ledger {
    fn give(&mut self, slot: u16, weight: u64, to: usize) {
        if let Some(&from) = self.owner.get(&slot)
            && from < self.staying
        {
            self.heavy[from].remove(&(weight, slot));
            self.load[from] -= weight;
        }
        self.owner.insert(slot, to);
        if weight > 0 {
            self.heavy[to].insert((weight, slot));
        }
        self.load[to] += weight;
    }

    fn lightest(&self) -> usize {
        (0..self.staying).min_by_key(|&s| (self.load[s], s)).unwrap_or(0)
    }

    fn heaviest(&self) -> usize {
        (0..self.staying).max_by_key(|&s| (self.load[s], std::cmp::Reverse(s))).unwrap_or(0)
    }

    fn within(&self, tolerance_percent: u32) -> bool {
        let total: u64 = self.load.iter().sum();
        let mean = total as f64 / self.staying as f64;
        let band = mean * f64::from(tolerance_percent) / 100.0;
        self.load.iter().all(|&l| (l as f64 - mean).abs() <= band)
    }

    /// The slot of `from` whose weight is closest to half of `gap`, if moving
    /// it narrows the gap (its weight is under the gap).
    fn best_slot(&self, from: usize, gap: u64) -> Option<(u64, u16)> {
        let half = gap / 2;
        let set = &self.heavy[from];
        let below = set.range(..=(half, u16::MAX)).next_back();
        let above = set.range((half + 1, 0)..).next();
        [below, above]
            .into_iter()
            .flatten()
            .filter(|(w, _)| *w > 0 && *w < gap)
            .min_by_key(|(w, _)| w.abs_diff(half))
            .copied()
    }
}

/// Moves that bring every staying master's bytes (`weights` per slot;
/// absent means empty) within `tolerance_percent` of the mean, draining
/// shards `>= staying`.
pub fn weighted_moves(
    owned: &BTreeMap<usize, BTreeSet<u16>>,
    weights: &BTreeMap<u16, u64>,
    staying: usize,
    tolerance_percent: u32,
) -> WeightedPlan {
    let weight = |slot: u16| weights.get(&slot).copied().unwrap_or(0);
    let mut ledger =
        Ledger { staying, owner: BTreeMap::new(), heavy: vec![BTreeSet::new(); staying], load: vec![0; staying] };
    for (&shard, slots) in owned {
        for &slot in slots {
            if shard < staying {
                ledger.give(slot, weight(slot), shard);
            } else {
                ledger.owner.insert(slot, shard);
            }
        }
    }
    let before = ledger.load.clone();
    let initial = ledger.owner.clone();
    if staying == 0 {
        return WeightedPlan { moves: Vec::new(), before, after: Vec::new(), within: false };
    }

    // Leaving masters' data first, heaviest slot to the lightest master.
    let mut leaving: Vec<(u64, u16)> = owned
        .range(staying..)
        .flat_map(|(_, slots)| slots.iter().map(|&s| (weight(s), s)))
        .filter(|(w, _)| *w > 0)
        .collect();
    leaving.sort_by(|a, b| b.cmp(a));
    for (w, slot) in leaving {
        let to = ledger.lightest();
        ledger.give(slot, w, to);
    }

    // Then the heaviest gives to the lightest until all are within the band.
    // Every move lowers the sum of squared loads, so the loop ends; the cap
    // only bounds the work on adversarial input.
    for _ in 0..(4 * super::SLOTS as usize) {
        if ledger.within(tolerance_percent) {
            break;
        }
        let (from, to) = (ledger.heaviest(), ledger.lightest());
        let gap = ledger.load[from] - ledger.load[to];
        let Some((w, slot)) = ledger.best_slot(from, gap) else { break };
        ledger.give(slot, w, to);
    }

    even_out_empty_slots(&mut ledger, weights);
    let moves = initial
        .iter()
        .filter_map(|(&slot, &from)| {
            let to = ledger.owner[&slot];
            (to != from).then_some(Move { slot, from, to })
        })
        .collect();
    let within = ledger.within(tolerance_percent);
    WeightedPlan { moves, before, after: ledger.load, within }
}

/// Slots with no data, spread evenly by count (leaving masters give all):
/// moving them costs no keys, and keys written later land evenly. Left as
/// they are when every master is within 1% of its share.
fn even_out_empty_slots(ledger: &mut Ledger, weights: &BTreeMap<u16, u64>) {
    let staying = ledger.staying;
    let empty_of = |ledger: &Ledger, shard: usize| -> Vec<u16> {
        ledger
            .owner
            .iter()
            .filter(|&(slot, &owner)| owner == shard && weights.get(slot).copied().unwrap_or(0) == 0)
            .map(|(&slot, _)| slot)
            .collect()
    };
    let shards: BTreeSet<usize> = ledger.owner.values().copied().chain(0..staying).collect();
    let mut empties: BTreeMap<usize, Vec<u16>> = shards.iter().map(|&s| (s, empty_of(ledger, s))).collect();
    let total: usize = empties.values().map(Vec::len).sum();
    let share = |shard: usize| total / staying + usize::from(shard < total % staying);
    let counts: BTreeMap<usize, usize> = empties.iter().map(|(&s, e)| (s, e.len())).collect();
    let lopsided = counts.iter().any(|(&shard, &n)| {
        if shard >= staying {
            return n > 0;
        }
        let target = share(shard) as f64;
        (n as f64 - target).abs() > (target * 0.01).max(1.0)
    });
    if !lopsided {
        return;
    }
    // Surplus: each donor's highest empty slots.
    let mut surplus: Vec<u16> = Vec::new();
    for (&shard, slots) in &mut empties {
        let keep = if shard < staying { share(shard) } else { 0 };
        let excess = slots.len().saturating_sub(keep);
        surplus.extend(slots.split_off(slots.len() - excess));
    }
    let mut given = surplus.into_iter();
    for shard in 0..staying {
        let missing = share(shard).saturating_sub(empties[&shard].len());
        for slot in given.by_ref().take(missing) {
            ledger.owner.insert(slot, shard);
        }
    }
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

    fn apply(owned: &BTreeMap<usize, BTreeSet<u16>>, plan: &WeightedPlan) -> BTreeMap<usize, BTreeSet<u16>> {
        let mut owned = owned.clone();
        for m in &plan.moves {
            assert!(owned.get_mut(&m.from).unwrap().remove(&m.slot), "{m:?}: the donor does not own it");
            owned.entry(m.to).or_default().insert(m.slot);
        }
        owned
    }

    fn loads(owned: &BTreeMap<usize, BTreeSet<u16>>, weights: &BTreeMap<u16, u64>, staying: usize) -> Vec<u64> {
        (0..staying)
            .map(|s| owned.get(&s).map_or(0, |set| set.iter().map(|x| weights.get(x).unwrap_or(&0)).sum()))
            .collect()
    }

    /// Every slot 100 bytes, and 20 slots of shard 0 holding 50,000 each.
    fn skewed() -> BTreeMap<u16, u64> {
        let mut weights: BTreeMap<u16, u64> = (0..crate::topology::SLOTS).map(|s| (s, 100)).collect();
        for slot in 0..20 {
            weights.insert(slot * 7, 50_000);
        }
        weights
    }

    #[test]
    fn a_skewed_keyspace_ends_within_the_tolerance() {
        let owned = bootstrap(3);
        let weights = skewed();
        let plan = weighted_moves(&owned, &weights, 3, 10);
        assert!(plan.within, "{plan:?}");
        let after = apply(&owned, &plan);
        let measured = loads(&after, &weights, 3);
        assert_eq!(measured, plan.after, "the plan's figures are what the moves give");
        let mean = measured.iter().sum::<u64>() as f64 / 3.0;
        assert!(measured.iter().all(|&l| (l as f64 - mean).abs() <= mean * 0.1), "{measured:?}");
        assert!(plan.before[0] > plan.before[1] * 2, "shard 0 started with most bytes: {:?}", plan.before);
        // Only what is needed moves: far fewer than a third of the slots.
        assert!(plan.moves.len() < 2000, "{} moves", plan.moves.len());
        // And a second look finds nothing to do.
        assert!(weighted_moves(&after, &weights, 3, 10).moves.is_empty());
    }

    #[test]
    fn an_even_keyspace_is_left_alone() {
        let weights: BTreeMap<u16, u64> = (0..crate::topology::SLOTS).map(|s| (s, 100)).collect();
        let plan = weighted_moves(&bootstrap(3), &weights, 3, 10);
        assert!(plan.moves.is_empty() && plan.within);
    }

    #[test]
    fn scale_out_gives_the_new_master_its_share_of_bytes_and_of_empty_slots() {
        let owned = bootstrap(3);
        let mut weights = skewed();
        // Half the slots hold nothing.
        for slot in (1..crate::topology::SLOTS).step_by(2) {
            if weights[&slot] == 100 {
                weights.remove(&slot);
            }
        }
        let plan = weighted_moves(&owned, &weights, 4, 10);
        assert!(plan.within, "{plan:?}");
        let after = apply(&owned, &plan);
        assert_eq!(loads(&after, &weights, 4), plan.after);
        let empty = |shard: usize| after[&shard].iter().filter(|s| !weights.contains_key(s)).count() as f64;
        let share = (0..4).map(empty).sum::<f64>() / 4.0;
        for shard in 0..4 {
            assert!((empty(shard) - share).abs() <= share * 0.01 + 1.0, "shard {shard}: {} empty slots", empty(shard));
        }
    }

    #[test]
    fn scale_in_drains_the_leaving_master_by_bytes() {
        let owned = bootstrap(4);
        let weights = skewed();
        let plan = weighted_moves(&owned, &weights, 3, 10);
        let after = apply(&owned, &plan);
        assert!(after[&3].is_empty(), "the leaving shard keeps {} slots", after[&3].len());
        assert!(plan.within, "{plan:?}");
        assert_eq!(loads(&after, &weights, 3), plan.after);
    }

    #[test]
    fn one_slot_heavier_than_the_band_is_reported_not_looped_on() {
        let mut weights: BTreeMap<u16, u64> = (0..crate::topology::SLOTS).map(|s| (s, 1)).collect();
        weights.insert(5, 10_000_000);
        let plan = weighted_moves(&bootstrap(3), &weights, 3, 10);
        assert!(!plan.within, "one slot holds nearly everything: no placement is within 10%");
        // The other masters still took what evens them out as far as possible.
        assert!(plan.after[0] >= 10_000_000);
    }
}
