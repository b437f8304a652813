//! The version catalog: which Redis versions Slotkeeper runs, and the image
//! for each. `spec.version` must name one of these (the CRD enforces it).

/// A supported Redis release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogEntry {
    pub version: &'static str,
    pub image: &'static str,
    /// Redis 7.0 added CLUSTER ADDSLOTSRANGE; older versions take slot lists.
    pub has_addslotsrange: bool,
}

pub const CATALOG: &[CatalogEntry] = &[
    CatalogEntry { version: "6.2.14", image: "redis:6.2.14", has_addslotsrange: false },
    CatalogEntry { version: "7.0.15", image: "redis:7.0.15", has_addslotsrange: true },
];

pub fn lookup(version: &str) -> Option<&'static CatalogEntry> {
    CATALOG.iter().find(|e| e.version == version)
}

/// The CEL list literal of catalog versions, for the CRD's validation rule.
pub fn cel_version_list() -> String {
    let quoted: Vec<String> = CATALOG.iter().map(|e| format!("'{}'", e.version)).collect();
    format!("[{}]", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_has_the_promised_versions() {
        assert_eq!(lookup("7.0.15").map(|e| e.image), Some("redis:7.0.15"));
        assert!(!lookup("6.2.14").unwrap().has_addslotsrange);
        assert!(lookup("7.2.0").is_none());
        assert_eq!(cel_version_list(), "['6.2.14', '7.0.15']");
    }
}
