//! Format versions of what Tributary keeps on disk: one check and one refusal for every format.
//!
//! Every file and database Tributary writes carries the version of its format (log segments and
//! their indexes, the catalog, the hub-hosted ownership and checkpoint records, the access
//! policies, the SQLite stores). A build reads every version up to the newest it writes —
//! upgrading an older one in place where the layout changed — and refuses a newer one with
//! [`FormatTooNew`], whose message names both versions, rather than misreading it. Each format
//! calls [`check_format_version`] with what it found before it looks at anything else the file
//! holds, so a newer layout is refused even where it would not parse.

use std::fmt;

/// A file or database written by a newer format than this build reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} was written by format {found}; this binary reads up to format {newest} (a newer \
     Tributary wrote it: open it with that version, or restore a copy this one wrote)"
)]
pub struct FormatTooNew {
    /// What was refused, e.g. `catalog /data/catalog.json`.
    pub what: String,
    /// The format version found.
    pub found: u64,
    /// The newest format version this build reads.
    pub newest: u64,
}

/// Refuses `found` when it is newer than `newest`, the newest format this build reads;
/// `what` names the file for the message.
pub fn check_format_version(
    what: impl fmt::Display,
    found: u64,
    newest: u64,
) -> Result<(), FormatTooNew> {
    if found <= newest {
        return Ok(());
    }
    Err(FormatTooNew {
        what: what.to_string(),
        found,
        newest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_format_is_refused_naming_both_versions_and_older_ones_pass() {
        assert_eq!(check_format_version("catalog x", 1, 2), Ok(()));
        assert_eq!(check_format_version("catalog x", 2, 2), Ok(()));
        let refused = check_format_version("catalog x", 3, 2).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "catalog x was written by format 3; this binary reads up to format 2 (a newer \
             Tributary wrote it: open it with that version, or restore a copy this one wrote)"
        );
    }
}
