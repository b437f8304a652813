//! Slots nobody owns go to the staying shard whose bootstrap share holds
//! them. While masters are still alone this is the bootstrap assignment,
//! done before MEET so fresh masters skip Redis's rejoin delay.

use std::collections::BTreeSet;

use super::{Action, Planning};
use crate::redis::topology::{SLOTS, shard_range, to_ranges};

pub fn assign_unowned(p: &Planning) -> Option<Action> {
    if p.owned_count >= SLOTS as usize {
        return None;
    }
    p.masters.range(..p.observed.shards).find_map(|(&shard, master)| {
        let master = (*master)?;
        let target = shard_range(shard, p.observed.shards);
        let missing: BTreeSet<u16> = (target.start..=target.end).filter(|s| !p.owned.contains(*s)).collect();
        (!missing.is_empty()).then(|| Action::AddSlots { pod: master.name.clone(), shard, ranges: to_ranges(&missing) })
    })
}
