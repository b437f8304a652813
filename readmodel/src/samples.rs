//! The last 15 minutes of each cluster's figures, one sample per
//! [`SPACING`] at most, in a ring bounded by [`WINDOW`]: what the console's
//! charts draw. Samples come from observations the operator makes anyway.

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::observation::Observation;

pub const WINDOW: Duration = Duration::from_secs(15 * 60);
pub const SPACING: Duration = Duration::from_secs(5);
/// The most samples a ring holds: one per [`SPACING`] over the [`WINDOW`].
pub const CAPACITY: usize = (WINDOW.as_secs() / SPACING.as_secs()) as usize + 1;

/// A cluster's figures at one moment; hits and misses are cumulative.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub at: Timestamp,
    pub ops_per_sec: u64,
    pub used_memory: u64,
    /// 0 when unlimited.
    pub maxmemory: u64,
    pub connected_clients: u64,
    pub keyspace_hits: u64,
    pub keyspace_misses: u64,
    pub max_lag_bytes: u64,
    /// Which nodes answered: counters are comparable only between samples
    /// of the same nodes.
    answered: u64,
}

impl Sample {
    pub fn of(observation: &Observation) -> Self {
        let reachable = observation.nodes.iter().filter(|n| n.reachable);
        let mut hasher = DefaultHasher::new();
        let mut hits = 0;
        let mut misses = 0;
        for node in reachable {
            node.id.hash(&mut hasher);
            hits += node.stats.keyspace_hits;
            misses += node.stats.keyspace_misses;
        }
        let (used_memory, maxmemory) = observation.memory();
        Self {
            at: observation.at,
            ops_per_sec: observation.ops_per_sec(),
            used_memory,
            maxmemory,
            connected_clients: observation.nodes.iter().map(|n| n.stats.connected_clients).sum(),
            keyspace_hits: hits,
            keyspace_misses: misses,
            max_lag_bytes: observation.max_lag(),
            answered: hasher.finish(),
        }
    }
}

/// Per-second rate of a counter between two samples; `None` across a
/// restart (the counter went back) or a change in who answered.
pub fn rate(earlier: &Sample, later: &Sample, counter: impl Fn(&Sample) -> u64) -> Option<f64> {
    let seconds = later.at.duration_since(earlier.at).as_secs_f64();
    if seconds <= 0.0 || earlier.answered != later.answered {
        return None;
    }
    let (a, b) = (counter(earlier), counter(later));
    (b >= a).then(|| (b - a) as f64 / seconds)
}

#[derive(Debug, Default, Clone)]
pub struct SampleRing {
    samples: VecDeque<Sample>,
}

impl SampleRing {
    /// Keeps `sample` if the last one is at least [`SPACING`] older, and
    /// drops what fell out of the [`WINDOW`].
    pub fn push(&mut self, sample: Sample) {
        if self.samples.back().is_some_and(|last| sample.at.duration_since(last.at) < signed(SPACING)) {
            return;
        }
        let oldest = sample.at - signed(WINDOW);
        while self.samples.front().is_some_and(|s| s.at < oldest) || self.samples.len() >= CAPACITY {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
    }

    pub fn samples(&self) -> impl Iterator<Item = &Sample> {
        self.samples.iter()
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).expect("small durations")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observation::{NodeView, Role, Source, StatsFact};

    fn observation(at_secs: i64, hits: u64, id: &str) -> Observation {
        let node = NodeView {
            pod: "c-shard-0-0".into(),
            reachable: true,
            id: Some(id.into()),
            role: Some(Role::Master),
            stats: StatsFact { ops_per_sec: 5, connected_clients: 2, keyspace_hits: hits, keyspace_misses: 0 },
            ..Default::default()
        };
        Observation {
            at: Timestamp::from_second(at_secs).unwrap(),
            nodes: vec![node],
            step: None,
            source: Source::Reconcile,
        }
    }

    #[test]
    fn keeps_one_sample_per_spacing_over_the_window() {
        let mut ring = SampleRing::default();
        for second in 0..(20 * 60) {
            ring.push(Sample::of(&observation(second, 0, "a")));
        }
        assert_eq!(ring.len(), CAPACITY, "15 minutes at one per 5 s, both ends included");
        let first = ring.samples().next().unwrap().at;
        let last = ring.samples().last().unwrap().at;
        assert!(last.duration_since(first) <= signed(WINDOW));
    }

    #[test]
    fn rates_skip_restarts_and_changed_membership() {
        let a = Sample::of(&observation(0, 100, "a"));
        let b = Sample::of(&observation(10, 600, "a"));
        assert_eq!(rate(&a, &b, |s| s.keyspace_hits), Some(50.0));
        let restarted = Sample::of(&observation(20, 3, "a"));
        assert_eq!(rate(&b, &restarted, |s| s.keyspace_hits), None);
        let other = Sample::of(&observation(20, 900, "b"));
        assert_eq!(rate(&b, &other, |s| s.keyspace_hits), None);
    }
}
