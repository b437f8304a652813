//! Which certificate step the leader takes in one round, as a pure function
//! of what it observed.
//!
//! A CA replacement needs the CRDs' `caBundle` changed, and the apiserver
//! re-initializes a CRD's storage on any change, so no CA replacement starts
//! while a storage migration of our group runs: the CA the CRDs trust keeps
//! signing renewed serving certificates meanwhile. That is safe while the
//! migration is shorter than a CA's last third of life (its renewal point),
//! 121 days with the default lifetime.

use super::certs::Renewal;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Keep,
    /// Step (1) of a CA replacement: a new CA into the Secret.
    ReplaceAuthority,
    /// A new serving certificate from the Secret's CA.
    ReplaceServing,
    /// A serving certificate from a new CA waits until the CRDs trust it.
    WaitForBundle,
    /// A CA replacement is due and waits for the storage migration to end.
    AuthorityWaitsForMigration,
}

/// `renewal` is what the certificates need; `serving_due` whether the
/// serving certificate itself is due (a due CA hides it); `bundled` whether
/// every CRD trusts the Secret's CA; `migrating` whether a storage migration
/// of our group runs.
pub fn step(renewal: Renewal, serving_due: bool, bundled: bool, migrating: bool) -> Step {
    match renewal {
        Renewal::Keep => Step::Keep,
        Renewal::NewAuthority if !migrating => Step::ReplaceAuthority,
        Renewal::NewAuthority if serving_due && bundled => Step::ReplaceServing,
        Renewal::NewAuthority => Step::AuthorityWaitsForMigration,
        Renewal::NewServing if bundled => Step::ReplaceServing,
        Renewal::NewServing => Step::WaitForBundle,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_due_ca_is_replaced_when_no_migration_runs() {
        assert_eq!(step(Renewal::NewAuthority, false, true, false), Step::ReplaceAuthority);
        assert_eq!(step(Renewal::NewAuthority, true, false, false), Step::ReplaceAuthority);
    }

    #[test]
    fn during_a_migration_a_due_ca_waits_and_serving_certificates_renew_from_the_trusted_one() {
        assert_eq!(step(Renewal::NewAuthority, false, true, true), Step::AuthorityWaitsForMigration);
        assert_eq!(step(Renewal::NewAuthority, true, true, true), Step::ReplaceServing);
        // Mid-replacement (the CRDs do not trust the Secret's CA yet): nothing to sign with.
        assert_eq!(step(Renewal::NewAuthority, true, false, true), Step::AuthorityWaitsForMigration);
    }

    #[test]
    fn a_serving_certificate_waits_for_the_crds_to_trust_its_ca_migration_or_not() {
        for migrating in [false, true] {
            assert_eq!(step(Renewal::NewServing, true, true, migrating), Step::ReplaceServing);
            assert_eq!(step(Renewal::NewServing, true, false, migrating), Step::WaitForBundle);
            assert_eq!(step(Renewal::Keep, false, true, migrating), Step::Keep);
        }
    }
}
