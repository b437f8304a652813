//! Whether the data fits where a scale-in would put it: the check the
//! planner refuses a scale-in by, and the verdict the console shows before
//! a user confirms one. Pure arithmetic over `INFO memory` figures.

/// Memory figures of one node, from `INFO memory`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryFact {
    pub used: u64,
    pub dataset: u64,
    /// 0 means unlimited.
    pub maxmemory: u64,
}

/// Headroom kept free in the staying masters' maxmemory after a scale-in.
pub const SCALE_IN_FILL_LIMIT: f64 = 0.9;

/// The data of every master against the room the staying masters have.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaleInCheck {
    /// Bytes of data over all masters, leaving ones included.
    pub dataset: u64,
    /// Bytes the staying masters can take within [`SCALE_IN_FILL_LIMIT`]
    /// of their maxmemory; `None` when one of them has no limit.
    pub room: Option<u64>,
}

impl ScaleInCheck {
    /// `masters`: every master (staying and leaving); `staying`: those that stay.
    pub fn new(masters: &[MemoryFact], staying: &[MemoryFact]) -> Self {
        let dataset = masters.iter().map(|m| m.dataset).sum();
        if staying.iter().any(|m| m.maxmemory == 0) {
            return Self { dataset, room: None };
        }
        // Overhead (used beyond the dataset) stays where it is; the rest of
        // each staying master's share of maxmemory is room for data.
        let room = staying
            .iter()
            .map(|m| (m.maxmemory as f64 * SCALE_IN_FILL_LIMIT - m.used.saturating_sub(m.dataset) as f64).max(0.0))
            .sum::<f64>();
        Self { dataset, room: Some(room as u64) }
    }

    pub fn fits(&self) -> bool {
        self.room.is_none_or(|room| self.dataset <= room)
    }

    /// Why a scale-in from `from` to `to` masters is refused, if it is; the
    /// message names what to change.
    pub fn refusal(&self, from: usize, to: usize) -> Option<String> {
        let room = self.room.filter(|_| !self.fits())?;
        Some(format!(
            "scale-in from {from} to {to} masters refused, nothing was moved: the data ({}) does not fit in \
             {:.0}% of the staying masters' maxmemory ({} free); raise spec.resources.limits.memory or \
             spec.config.maxmemory, or set spec.masters back to {from}",
            mib(self.dataset),
            SCALE_IN_FILL_LIMIT * 100.0,
            mib(room),
        ))
    }
}

/// Bytes as MiB with one decimal, e.g. `12.5 MiB`.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    fn node(used: u64, dataset: u64, maxmemory: u64) -> MemoryFact {
        MemoryFact { used: used * MIB, dataset: dataset * MIB, maxmemory: maxmemory * MIB }
    }

    #[test]
    fn data_that_fits_in_ninety_percent_passes() {
        let masters = [node(4, 3, 10), node(4, 3, 10), node(4, 3, 10), node(4, 3, 10)];
        let check = ScaleInCheck::new(&masters, &masters[..3]);
        assert_eq!(check.dataset, 12 * MIB);
        assert_eq!(check.room, Some(24 * MIB), "3 × (9 MiB − 1 MiB overhead)");
        assert!(check.fits() && check.refusal(4, 3).is_none());
    }

    #[test]
    fn data_that_does_not_fit_is_refused_with_the_fields_to_change() {
        let masters = [node(6, 5, 8), node(6, 5, 8), node(6, 5, 8), node(6, 5, 8)];
        let check = ScaleInCheck::new(&masters, &masters[..3]);
        assert!(!check.fits());
        let message = check.refusal(4, 3).unwrap();
        assert!(message.contains("20.0 MiB") && message.contains("spec.resources.limits.memory"), "{message}");
        assert!(message.contains("spec.masters back to 4"), "{message}");
    }

    #[test]
    fn an_unlimited_master_always_has_room() {
        let masters = [node(6, 5, 0), node(6, 5, 8), node(6, 5, 8), node(600, 500, 8)];
        let check = ScaleInCheck::new(&masters, &masters[..3]);
        assert_eq!(check.room, None);
        assert!(check.fits());
    }
}
