//! All 16,384 slots as a 128 × 128 grid, coloured by the shard whose master
//! owns them, slots being imported or migrated outlined, and a legend that
//! says the same in words; plus the reshard's progress from status.

use leptos::prelude::*;
use slotkeeper_api::ReshardStatus;
use slotkeeper_api::topology::{SLOTS, count};
use slotkeeper_readmodel::NodeView;

use super::format;

const SIDE: usize = 128;
const CELL: usize = 4;
/// Shard colours cycle through this many classes (`s0` … `s11`).
const PALETTE: usize = 12;

/// Which shard owns each slot, from the masters' own views.
pub fn owners(nodes: &[NodeView]) -> Vec<Option<usize>> {
    let mut owner = vec![None; SLOTS as usize];
    for node in nodes.iter().filter(|n| n.is_master()) {
        for range in &node.slots {
            for slot in range.start..=range.end.min(SLOTS - 1) {
                owner[usize::from(slot)] = Some(node.shard);
            }
        }
    }
    owner
}

/// Runs of equal owners within each grid row: (row, first column, length, owner).
fn runs(owner: &[Option<usize>]) -> Vec<(usize, usize, usize, Option<usize>)> {
    let mut runs = Vec::new();
    for row in 0..SIDE {
        let cells = &owner[row * SIDE..(row + 1) * SIDE];
        let mut start = 0;
        for column in 1..=SIDE {
            if column == SIDE || cells[column] != cells[start] {
                runs.push((row, start, column - start, cells[start]));
                start = column;
            }
        }
    }
    runs
}

pub fn slot_map(nodes: &[NodeView]) -> AnyView {
    let owner = owners(nodes);
    let assigned = owner.iter().filter(|o| o.is_some()).count();
    let cells = runs(&owner)
        .into_iter()
        .map(|(row, column, length, owner)| {
            let class = owner.map(|s| format!("slots s{}", s % PALETTE)).unwrap_or_else(|| "slots none".into());
            view! { <rect x=column * CELL y=row * CELL width=length * CELL height=CELL class=class></rect> }
        })
        .collect_view();
    let moving: Vec<(u16, &'static str)> = nodes
        .iter()
        .flat_map(|n| {
            n.importing.iter().map(|s| (*s, "importing")).chain(n.migrating.iter().map(|s| (*s, "migrating")))
        })
        .collect();
    let marks = moving
        .iter()
        .map(|(slot, direction)| {
            let slot = usize::from(*slot);
            view! {
                <rect x=(slot % SIDE) * CELL y=(slot / SIDE) * CELL width=CELL height=CELL class=format!("mark {direction}")>
                    <title>{format!("slot {slot} {direction}")}</title>
                </rect>
            }
        })
        .collect_view();
    let masters: Vec<&NodeView> = {
        let mut masters: Vec<&NodeView> = nodes.iter().filter(|n| n.is_master() && !n.slots.is_empty()).collect();
        masters.sort_by_key(|n| n.shard);
        masters
    };
    let legend = masters
        .iter()
        .map(|n| {
            let swatch = format!("swatch s{}", n.shard % PALETTE);
            let ranges: Vec<String> = n.slots.iter().map(ToString::to_string).collect();
            view! {
                <li>
                    <span class=swatch aria-hidden="true"></span>
                    {format!("shard {} ({}): {} slots", n.shard, n.pod, count(&n.slots))}
                    <span class="ranges">{format!(" {}", ranges.join(", "))}</span>
                </li>
            }
        })
        .collect_view();
    let unassigned = SLOTS as usize - assigned;
    let moving_count = moving.len();
    let side = SIDE * CELL;
    let label = format!("Slot map: {assigned} of {SLOTS} slots assigned, {moving_count} moving");
    view! {
        <div class="slotmap">
            <svg viewBox=format!("0 0 {side} {side}") width=side height=side role="img" aria-label=label.clone()>
                {cells}
                {marks}
            </svg>
            <div>
                <p class="slot-summary" data-assigned=assigned>{label}</p>
                <ul class="legend">
                    {legend}
                    {(unassigned > 0).then(|| view! { <li><span class="swatch none" aria-hidden="true"></span>{format!("unassigned: {unassigned} slots")}</li> })}
                    {(moving_count > 0).then(|| view! { <li><span class="swatch mark" aria-hidden="true"></span>"outlined: importing or migrating"</li> })}
                </ul>
            </div>
        </div>
    }
    .into_any()
}

/// `status.reshard` as a progress bar and words.
pub fn reshard(progress: Option<&ReshardStatus>) -> AnyView {
    let Some(r) = progress else {
        return view! { <p class="reshard idle">"No slots are moving."</p> }.into_any();
    };
    let total = r.slots_total.max(1);
    let percent = r.slots_moved as f64 * 100.0 / total as f64;
    let since = r.started_time.as_ref().map(|t| format!(" since {}", format::time(t.0))).unwrap_or_default();
    let moving = (!r.moving.is_empty()).then(|| format!("Now moving: {}", r.moving.join("; ")));
    view! {
        <div class="reshard active">
            <label for="reshard-progress">
                {format!("Resharding: {} of {} slots moved ({percent:.0}%){since}", r.slots_moved, r.slots_total)}
            </label>
            <progress id="reshard-progress" max=r.slots_total value=r.slots_moved></progress>
            {moving.map(|m| view! { <p>{m}</p> })}
        </div>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotkeeper_api::topology::{SlotRange, shard_range};
    use slotkeeper_readmodel::Role;

    fn masters(shards: usize) -> Vec<NodeView> {
        (0..shards)
            .map(|shard| NodeView {
                pod: format!("c-shard-{shard}-0"),
                shard,
                role: Some(Role::Master),
                reachable: true,
                slots: vec![shard_range(shard, shards)],
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn every_slot_is_drawn_once_by_its_owner() {
        let nodes = masters(3);
        let owner = owners(&nodes);
        assert!(owner.iter().all(Option::is_some));
        let runs = runs(&owner);
        assert_eq!(runs.iter().map(|r| r.2).sum::<usize>(), SLOTS as usize, "runs tile the grid");
        let html = Owner::new().with(|| slot_map(&nodes).to_html());
        assert!(html.contains("16384 of 16384 slots assigned"), "{html}");
        assert!(html.contains("shard 2 (c-shard-2-0): 5461 slots"));
    }

    #[test]
    fn moving_and_unassigned_slots_are_marked_in_words_too() {
        let mut nodes = masters(3);
        nodes[0].slots = vec![SlotRange { start: 0, end: 99 }];
        nodes[1].importing = vec![5];
        let html = Owner::new().with(|| slot_map(&nodes).to_html());
        assert!(html.contains("unassigned: 5362 slots"), "{html}");
        assert!(html.contains("slot 5 importing") && html.contains("1 moving"));
    }

    #[test]
    fn reshard_progress_reads_as_a_fraction() {
        let status = ReshardStatus {
            slots_total: 200,
            slots_moved: 50,
            moving: vec!["a -> b: 10 slots".into()],
            ..Default::default()
        };
        let html = Owner::new().with(|| reshard(Some(&status)).to_html());
        assert!(html.contains("50 of 200 slots moved (25%)") && html.contains("a -&gt; b: 10 slots"), "{html}");
        assert!(Owner::new().with(|| reshard(None).to_html()).contains("No slots are moving"));
    }
}
