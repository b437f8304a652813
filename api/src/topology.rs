//! Parsing `CLUSTER NODES` and working with slot ranges: pure data, no IO.

use std::collections::BTreeSet;

pub const SLOTS: u16 = 16384;

/// One line of `CLUSTER NODES`, as one node sees another (or itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    pub id: String,
    pub ip: String,
    pub myself: bool,
    pub master: bool,
    /// The master's id when this node is a replica.
    pub master_id: Option<String>,
    /// `fail`, `fail?`, `handshake`, `noaddr` and so on.
    pub flags: Vec<String>,
    pub connected: bool,
    pub slots: Vec<SlotRange>,
    /// Slots this node is migrating out (`[slot->-target]`) or importing
    /// (`[slot-<-source]`); only shown on the `myself` line.
    pub open_slots: Vec<OpenSlot>,
}

/// A slot in the middle of a migration, as the node holding the mark says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenSlot {
    pub slot: u16,
    pub direction: Direction,
    /// The other end: the target when migrating, the source when importing.
    pub peer: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Migrating,
    Importing,
}

impl ClusterNode {
    pub fn in_handshake(&self) -> bool {
        self.flags.iter().any(|f| f == "handshake")
    }

    pub fn failing(&self) -> bool {
        self.flags.iter().any(|f| f == "fail" || f == "fail?")
    }
}

/// An inclusive range of hash slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SlotRange {
    pub start: u16,
    pub end: u16,
}

impl std::fmt::Display for SlotRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.start == self.end { write!(f, "{}", self.start) } else { write!(f, "{}-{}", self.start, self.end) }
    }
}

impl std::str::FromStr for SlotRange {
    type Err = String;

    /// `12` or `0-5460`, as [`Display`](std::fmt::Display) writes it.
    fn from_str(text: &str) -> Result<Self, String> {
        let slot = |t: &str| t.trim().parse::<u16>().ok().filter(|&s| s < SLOTS);
        let (start, end) = match text.split_once('-') {
            Some((a, b)) => (slot(a), slot(b)),
            None => (slot(text), slot(text)),
        };
        match (start, end) {
            (Some(start), Some(end)) if start <= end => Ok(SlotRange { start, end }),
            _ => Err(format!("{text:?} is not a slot or a range of slots below {SLOTS} such as 0-5460")),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("cannot parse CLUSTER NODES line {line:?}: {reason}")]
pub struct ParseError {
    pub line: String,
    pub reason: &'static str,
}

pub fn parse_cluster_nodes(text: &str) -> Result<Vec<ClusterNode>, ParseError> {
    text.lines().filter(|l| !l.trim().is_empty()).map(parse_line).collect()
}

fn parse_line(line: &str) -> Result<ClusterNode, ParseError> {
    let err = |reason| ParseError { line: line.to_owned(), reason };
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 8 {
        return Err(err("fewer than 8 fields"));
    }
    // ip:port@cport[,hostname]; the ip is empty for a node with no address yet.
    let ip = fields[1].split(['@', ',']).next().unwrap_or_default();
    let ip = ip.rsplit_once(':').map(|(host, _)| host).unwrap_or(ip).to_owned();
    let flags: Vec<String> = fields[2].split(',').map(str::to_owned).collect();
    let myself = flags.iter().any(|f| f == "myself");
    let master = flags.iter().any(|f| f == "master");
    let master_id = (fields[3] != "-").then(|| fields[3].to_owned());
    let mut slots = Vec::new();
    let mut open_slots = Vec::new();
    for token in &fields[8..] {
        if let Some(inner) = token.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            let (slot, direction, peer) = if let Some((slot, peer)) = inner.split_once("->-") {
                (slot, Direction::Migrating, peer)
            } else if let Some((slot, peer)) = inner.split_once("-<-") {
                (slot, Direction::Importing, peer)
            } else {
                return Err(err("bad open slot"));
            };
            let slot = slot.parse().map_err(|_| err("bad open slot"))?;
            open_slots.push(OpenSlot { slot, direction, peer: peer.to_owned() });
            continue;
        }
        let range = match token.split_once('-') {
            Some((a, b)) => SlotRange {
                start: a.parse().map_err(|_| err("bad slot range"))?,
                end: b.parse().map_err(|_| err("bad slot range"))?,
            },
            None => {
                let s = token.parse().map_err(|_| err("bad slot"))?;
                SlotRange { start: s, end: s }
            }
        };
        slots.push(range);
    }
    Ok(ClusterNode {
        id: fields[0].to_owned(),
        ip,
        myself,
        master,
        master_id,
        flags,
        connected: fields[7] == "connected",
        slots,
        open_slots,
    })
}

/// The even share of slots of shard `index` of `shards`: contiguous ranges,
/// the remainder spread over the first shards (as `redis-cli --cluster create`).
pub fn shard_range(index: usize, shards: usize) -> SlotRange {
    let total = SLOTS as usize;
    let base = total / shards;
    let extra = total % shards;
    let start = index * base + index.min(extra);
    let len = base + usize::from(index < extra);
    SlotRange { start: start as u16, end: (start + len - 1) as u16 }
}

/// Collapses a set of slots into sorted ranges.
pub fn to_ranges(slots: &BTreeSet<u16>) -> Vec<SlotRange> {
    let mut ranges: Vec<SlotRange> = Vec::new();
    for &slot in slots {
        match ranges.last_mut() {
            Some(last) if last.end + 1 == slot => last.end = slot,
            _ => ranges.push(SlotRange { start: slot, end: slot }),
        }
    }
    ranges
}

/// How many slots `ranges` cover (ranges of one node never overlap).
pub fn count(ranges: &[SlotRange]) -> usize {
    ranges.iter().map(|r| usize::from(r.end - r.start) + 1).sum()
}

/// Which of the 16384 slots are marked: a flat bitmap, so the union of every
/// node's view is a few thousand range fills, not tens of thousands of
/// ordered-set inserts on each reconcile.
pub struct SlotMap(Vec<bool>);

impl SlotMap {
    pub fn of<'a>(ranges: impl IntoIterator<Item = &'a SlotRange>) -> Self {
        let mut marked = vec![false; SLOTS as usize];
        for r in ranges {
            marked[usize::from(r.start)..=usize::from(r.end.min(SLOTS - 1))].fill(true);
        }
        Self(marked)
    }

    pub fn contains(&self, slot: u16) -> bool {
        self.0.get(usize::from(slot)).copied().unwrap_or(false)
    }

    pub fn len(&self) -> usize {
        self.0.iter().filter(|m| **m).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub fn expand(ranges: &[SlotRange]) -> BTreeSet<u16> {
    ranges.iter().flat_map(|r| r.start..=r.end).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.1.0.5:6379@16379 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.1.0.2:6379@16379,host-a myself,master - 0 1426238316232 2 connected 5461-10922 [10923->-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f] [42-<-07c37dfeb235213a872192d90877d0cd55635b91]
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f :0@0 master,fail?,noaddr - 1426238318243 1426238318243 3 disconnected 10924 10926-16383
6ec23923021cf3ffec47632106199cb7f496ce01 127.1.0.9:6379@16379 handshake - 0 0 0 connected
";

    #[test]
    fn parses_roles_slots_open_slots_and_flags() {
        let nodes = parse_cluster_nodes(NODES).unwrap();
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[0].master_id.as_deref(), Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca"));
        assert!(!nodes[0].master && nodes[0].slots.is_empty());
        assert!(nodes[1].myself && nodes[1].master && nodes[1].ip == "127.1.0.2");
        assert_eq!(nodes[1].slots, vec![SlotRange { start: 5461, end: 10922 }]);
        let open = |slot, direction, peer: &str| OpenSlot { slot, direction, peer: peer.into() };
        assert_eq!(
            nodes[1].open_slots,
            vec![
                open(10923, Direction::Migrating, "292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f"),
                open(42, Direction::Importing, "07c37dfeb235213a872192d90877d0cd55635b91"),
            ]
        );
        assert!(nodes[2].failing() && !nodes[2].connected && nodes[2].ip.is_empty());
        assert_eq!(nodes[2].slots.len(), 2);
        assert!(nodes[3].in_handshake());
    }

    #[test]
    fn slot_maps_union_overlapping_views_and_count_once() {
        let a = [SlotRange { start: 0, end: 99 }, SlotRange { start: 200, end: 200 }];
        let b = [SlotRange { start: 50, end: 149 }, SlotRange { start: 16383, end: 16383 }];
        let map = SlotMap::of(a.iter().chain(&b));
        assert_eq!(map.len(), 150 + 1 + 1);
        assert!(map.contains(0) && map.contains(149) && map.contains(200) && map.contains(16383));
        assert!(!map.contains(150) && !map.contains(199));
        assert_eq!(count(&a), 101);
    }

    #[test]
    fn rejects_garbage_with_the_line() {
        let err = parse_cluster_nodes("abc 1.2.3.4:1@2 master").unwrap_err();
        assert!(err.to_string().contains("abc 1.2.3.4"));
    }

    #[test]
    fn shard_ranges_cover_every_slot_once() {
        for shards in [3, 5, 7, 10] {
            let mut covered = BTreeSet::new();
            for i in 0..shards {
                let r = shard_range(i, shards);
                for s in r.start..=r.end {
                    assert!(covered.insert(s), "slot {s} twice with {shards} shards");
                }
            }
            assert_eq!(covered.len(), SLOTS as usize);
        }
        assert_eq!(shard_range(0, 3), SlotRange { start: 0, end: 5461 });
        assert_eq!(shard_range(2, 3), SlotRange { start: 10923, end: 16383 });
    }

    #[test]
    fn ranges_round_trip() {
        let slots: BTreeSet<u16> = [1, 2, 3, 7, 9, 10].into();
        let ranges = to_ranges(&slots);
        assert_eq!(ranges.iter().map(ToString::to_string).collect::<Vec<_>>(), ["1-3", "7", "9-10"]);
        assert_eq!(expand(&ranges), slots);
    }
}
