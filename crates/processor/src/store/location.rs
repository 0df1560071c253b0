//! Checkpoint stores named by URL: the one place a URL turns into a store.
//!
//! Accepted: `memory:` (this process only), `sqlite:PATH` or a bare path (a SQLite file),
//! `postgres://…` / `postgresql://…` (a PostgreSQL database; see `PostgresCheckpointStore` for
//! its `schema` parameter), `https://…` / `http://…` (an Azure Storage blob container, or
//! Azurite's; see `BlobCheckpointStore` for its credentials). Anything else with a scheme is refused with the list above, before
//! anything is opened. A store whose feature this build lacks is refused by name.
//! Parsing never prints a password: [`StoreLocation`]'s `Display` leaves it out.

use std::path::PathBuf;
use std::sync::Arc;

use super::{CheckpointStore, InMemoryCheckpointStore, StoreError};

/// Where a checkpoint store is, parsed from its URL.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreLocation {
    /// `memory:`: a fresh in-memory store, seen by this process only.
    Memory,
    /// `sqlite:PATH` or a bare path: a SQLite file.
    Sqlite(PathBuf),
    /// `postgres://…` or `postgresql://…`: the URL as given (it may hold a password).
    Postgres(String),
    /// `https://…` or `http://…`: a blob container's URL as given (it may hold a SAS).
    Blob(String),
}

impl std::fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Display, which leaves the password out.
        write!(f, "StoreLocation({self})")
    }
}

impl std::fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreLocation::Memory => f.write_str("memory:"),
            StoreLocation::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreLocation::Postgres(url) | StoreLocation::Blob(url) => {
                f.write_str(&without_password(url))
            }
        }
    }
}

/// `url` with the password of its user-info part replaced by `***`, and with any query
/// (which may carry `password=`) dropped.
fn without_password(url: &str) -> String {
    let url = url.split_once('?').map_or(url, |(base, _)| base);
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info
                .split_once(':')
                .map_or(user_info, |(user, _)| user);
            format!("{scheme}://{user}:***@{host}{path}")
        }
        _ => url.to_owned(),
    }
}

impl StoreLocation {
    /// Parses a store URL; a string without a scheme is a SQLite file's path.
    pub fn parse(url: &str) -> Result<StoreLocation, StoreError> {
        let invalid = |reason: String| StoreError::Invalid {
            what: "checkpoint store URL",
            reason,
        };
        if url.is_empty() {
            return Err(invalid("it is empty".to_owned()));
        }
        let Some((scheme, rest)) = scheme_of(url) else {
            return Ok(StoreLocation::Sqlite(PathBuf::from(url)));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "memory" if rest.is_empty() => Ok(StoreLocation::Memory),
            "memory" => Err(invalid(format!(
                "memory: takes nothing after the colon, not {rest:?}"
            ))),
            "sqlite" => {
                // `sqlite:///abs/path` and `sqlite:path` both name a path.
                let path = rest.strip_prefix("//").unwrap_or(rest);
                if path.is_empty() {
                    return Err(invalid(
                        "sqlite: needs a file path after the colon".to_owned(),
                    ));
                }
                Ok(StoreLocation::Sqlite(PathBuf::from(path)))
            }
            "postgres" | "postgresql" => Ok(StoreLocation::Postgres(url.to_owned())),
            "https" | "http" => Ok(StoreLocation::Blob(url.to_owned())),
            other => Err(invalid(format!(
                "unknown scheme {other:?}; use sqlite:PATH (or a bare path), \
                 postgres://USER:PASSWORD@HOST:PORT/DATABASE, \
                 https://ACCOUNT.blob.core.windows.net/CONTAINER, or memory:"
            ))),
        }
    }

    /// Opens the store (creating a SQLite file or PostgreSQL tables if absent).
    pub async fn open(&self) -> Result<Arc<dyn CheckpointStore>, StoreError> {
        match self {
            StoreLocation::Memory => Ok(Arc::new(InMemoryCheckpointStore::new())),
            StoreLocation::Sqlite(path) => open_sqlite(path).await,
            StoreLocation::Postgres(url) => open_postgres(url).await,
            StoreLocation::Blob(url) => open_blob(url).await,
        }
    }
}

/// The scheme and what follows its colon, when `url` starts with one (RFC 3986 letters; two
/// or more, so `C:\…` stays a path).
fn scheme_of(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once(':')?;
    let is_scheme = scheme.len() >= 2
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    is_scheme.then_some((scheme, rest))
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(path: &std::path::Path) -> Result<Arc<dyn CheckpointStore>, StoreError> {
    Ok(Arc::new(super::SqliteCheckpointStore::open(path).await?))
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(_: &std::path::Path) -> Result<Arc<dyn CheckpointStore>, StoreError> {
    Err(missing_feature("sqlite"))
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str) -> Result<Arc<dyn CheckpointStore>, StoreError> {
    Ok(Arc::new(
        super::PostgresCheckpointStore::connect(url).await?,
    ))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_: &str) -> Result<Arc<dyn CheckpointStore>, StoreError> {
    Err(missing_feature("postgres"))
}

#[cfg(feature = "blob")]
async fn open_blob(url: &str) -> Result<Arc<dyn CheckpointStore>, StoreError> {
    Ok(Arc::new(
        super::BlobCheckpointStore::from_url_and_environment(url).await?,
    ))
}

#[cfg(not(feature = "blob"))]
async fn open_blob(_: &str) -> Result<Arc<dyn CheckpointStore>, StoreError> {
    Err(missing_feature("blob"))
}

#[cfg(not(all(feature = "sqlite", feature = "postgres", feature = "blob")))]
fn missing_feature(feature: &str) -> StoreError {
    StoreError::Invalid {
        what: "checkpoint store URL",
        reason: format!(
            "this build has no {feature} store (tributary-processor's `{feature}` feature is off)"
        ),
    }
}

/// Opens the checkpoint store `url` names; see [`StoreLocation::parse`] for the forms.
pub async fn open_url(url: &str) -> Result<Arc<dyn CheckpointStore>, StoreError> {
    StoreLocation::parse(url)?.open().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_their_store() {
        let sqlite = |path: &str| StoreLocation::Sqlite(PathBuf::from(path));
        for (url, expected) in [
            ("memory:", StoreLocation::Memory),
            ("sqlite:/tmp/c.db", sqlite("/tmp/c.db")),
            ("sqlite:///tmp/c.db", sqlite("/tmp/c.db")),
            ("SQLite:rel/c.db", sqlite("rel/c.db")),
            ("checkpoints.sqlite", sqlite("checkpoints.sqlite")),
            ("/abs/checkpoints.sqlite", sqlite("/abs/checkpoints.sqlite")),
            ("C:\\store.db", sqlite("C:\\store.db")),
            (
                "postgres://u:p@h/db",
                StoreLocation::Postgres("postgres://u:p@h/db".into()),
            ),
            (
                "postgresql://h/db",
                StoreLocation::Postgres("postgresql://h/db".into()),
            ),
            (
                "https://acct.blob.core.windows.net/c",
                StoreLocation::Blob("https://acct.blob.core.windows.net/c".into()),
            ),
        ] {
            assert_eq!(StoreLocation::parse(url).unwrap(), expected, "{url}");
        }
    }

    #[test]
    fn unknown_schemes_and_empty_urls_are_refused_with_the_choices() {
        for url in ["ftp://x/y", "redis:", "", "memory:x", "sqlite:"] {
            let error = StoreLocation::parse(url).unwrap_err();
            assert!(
                matches!(error, StoreError::Invalid { .. }),
                "{url}: {error}"
            );
        }
        let error = StoreLocation::parse("ftp://x/y").unwrap_err().to_string();
        assert!(
            error.contains("\"ftp\"") && error.contains("postgres://"),
            "{error}"
        );
    }

    #[test]
    fn passwords_never_show() {
        let shown =
            StoreLocation::parse("postgres://app:s3cret@db:5432/fleet?password=other").unwrap();
        let text = format!("{shown} {shown:?}");
        assert!(
            !text.contains("s3cret") && !text.contains("other"),
            "{text}"
        );
        assert!(text.contains("postgres://app:***@db:5432/fleet"), "{text}");
        let sas = StoreLocation::parse("https://acct.blob.core.windows.net/c?sv=1&sig=s3cret")
            .unwrap()
            .to_string();
        assert_eq!(sas, "https://acct.blob.core.windows.net/c", "no SAS shown");
        let no_password = StoreLocation::parse("postgres://app@db/fleet").unwrap();
        assert_eq!(no_password.to_string(), "postgres://app@db/fleet");
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn memory_and_sqlite_open() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("opened.db");
        open_url("memory:").await.unwrap();
        open_url(&format!("sqlite:{}", path.display()))
            .await
            .unwrap();
        assert!(path.exists());
    }
}
