//! A `kind = "postgres"` target of a task file, checked: where the database is, the table, its
//! shape, what keyless events do, and the body fields mapped to typed columns.
//!
//! ```toml
//! [[target]]
//! name = "orders-table"
//! kind = "postgres"
//! url_env = "ORDERS_DB"            # or url = "postgres://user@host:5432/db?schema=app"
//! table = "orders"                 # created if absent, in the URL's schema
//! shape = "compacted"              # one row per partition key (latest wins) | "history"
//! keyless = "history"              # compacted only: keyless events go to <table>_keyless
//!                                  # (history shape) | "refuse" (dead-lettered)
//! backoff_max = "30s"              # a failed write (the database down) is retried without
//!                                  # end, the pause doubling from [retry] backoff_min up to
//!                                  # this (default: [retry] backoff_max, itself 5 minutes)
//! [target.columns]                 # optional: JSON body fields as typed columns, created
//!                                  # in this order
//! total = { path = "body.order.total", type = "double precision" }
//! placed = { path = "body.placed_at", type = "timestamptz" }
//! ```
//!
//! Everything is checked when the file is read; errors carry the file, line and key. The URL's
//! password never appears in an error.

use std::ops::Range;
use std::time::Duration;

use tributary_edit::FieldPath;
use tributary_processor::store::PostgresUrl;

use crate::task::{Checker, EndpointSpec, TaskError};

/// The longest table name: PostgreSQL's 63-byte identifiers less `_keyless`.
pub const TABLE_CHARS_MAX: usize = 55;

/// The columns every projected table has, in the order rows are copied.
pub const FIXED_COLUMNS: [&str; 10] = [
    "source_hub",
    "source_partition",
    "sequence_number",
    "part",
    "source_offset",
    "enqueued_time",
    "partition_key",
    "body_json",
    "body_bytes",
    "properties",
];

/// How events become rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One row per event, unique on (source hub, partition, sequence number, part).
    History,
    /// One row per partition key: the newest event of the key.
    Compacted,
}

/// What a compacted table does with events without a partition key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keyless {
    /// They go to `<table>_keyless`, a history-shaped table.
    History,
    /// They are refused, so the dead-letter target gets them.
    Refuse,
}

/// A mapped column's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    /// `text`: a string as it is; another value as its JSON text.
    Text,
    /// `bigint`: an integer that fits 64 bits.
    Bigint,
    /// `double precision`: any JSON number.
    Double,
    /// `boolean`: `true` or `false`.
    Boolean,
    /// `timestamptz`: an RFC 3339 string or milliseconds since the Unix epoch.
    Timestamptz,
    /// `jsonb`: any JSON value.
    Jsonb,
}

impl ColumnType {
    /// Every type, as the task file and SQL write it.
    pub const ALL: [(&'static str, ColumnType); 6] = [
        ("text", ColumnType::Text),
        ("bigint", ColumnType::Bigint),
        ("double precision", ColumnType::Double),
        ("boolean", ColumnType::Boolean),
        ("timestamptz", ColumnType::Timestamptz),
        ("jsonb", ColumnType::Jsonb),
    ];

    /// Its SQL name.
    pub fn sql(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, t)| *t == self)
            .map_or("text", |(name, _)| name)
    }
}

/// A JSON body field mapped to a typed column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnMap {
    /// The column.
    pub name: String,
    /// Where in the body (as written: `body.order.total`).
    pub path_text: String,
    /// The path after `body.`.
    pub path: FieldPath,
    /// The column's type.
    pub kind: ColumnType,
}

/// A checked `kind = "postgres"` target.
#[derive(Debug, Clone)]
pub struct ProjectionConfig {
    /// The database (holds the password: its Debug shows only where it is).
    pub url: PostgresUrl,
    /// The table, in the URL's schema.
    pub table: String,
    /// Its shape.
    pub shape: Shape,
    /// What keyless events do (compacted tables).
    pub keyless: Keyless,
    /// Mapped columns, in file order.
    pub columns: Vec<ColumnMap>,
    /// The longest pause between tries of a failed write (`None`: the task's).
    pub backoff_max: Option<Duration>,
}

/// Whether `name` is an identifier PostgreSQL takes unquoted (so no quoting surprises):
/// lowercase letters, digits and underscores, not starting with a digit, 1 to `max` chars.
fn is_identifier(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The keys a postgres target takes.
pub const KEYS: [&str; 10] = [
    "name",
    "kind",
    "url",
    "url_env",
    "table",
    "shape",
    "keyless",
    "columns",
    "backoff_max",
    "when",
];

impl Checker<'_> {
    /// Checks the postgres target `spec` (at `span`) named by `key`.
    pub(crate) fn projection(
        &self,
        spec: &EndpointSpec,
        span: Range<usize>,
        key: &str,
    ) -> Result<ProjectionConfig, TaskError> {
        let error =
            |sub: &str, message: String| self.error(span.clone(), &format!("{key}.{sub}"), message);
        let url = match (&spec.url, &spec.url_env) {
            (Some(url), None) => url.clone(),
            (None, Some(variable)) => std::env::var(variable).map_err(|_| {
                error(
                    "url_env",
                    format!("the environment variable {variable:?} is not set (or not UTF-8)"),
                )
            })?,
            _ => {
                return Err(error(
                    "url",
                    "give exactly one of url and url_env".to_owned(),
                ));
            }
        };
        let url = PostgresUrl::parse(&url).map_err(|e| error("url", e.to_string()))?;
        let table = spec.table.clone().unwrap_or_default();
        if !is_identifier(&table, TABLE_CHARS_MAX) {
            return Err(error(
                "table",
                format!(
                    "{table:?} is not a table name: use 1 to {TABLE_CHARS_MAX} lowercase letters, digits or '_', not starting with a digit"
                ),
            ));
        }
        let shape = match spec.shape.as_deref() {
            Some("history") => Shape::History,
            Some("compacted") => Shape::Compacted,
            other => {
                return Err(error(
                    "shape",
                    format!("{other:?} is not \"history\" or \"compacted\""),
                ));
            }
        };
        let keyless = match (shape, spec.keyless.as_deref()) {
            (Shape::Compacted, None | Some("history")) => Keyless::History,
            (Shape::Compacted, Some("refuse")) => Keyless::Refuse,
            (Shape::Compacted, Some(other)) => {
                return Err(error(
                    "keyless",
                    format!("{other:?} is not \"history\" or \"refuse\""),
                ));
            }
            (Shape::History, None) => Keyless::History,
            (Shape::History, Some(_)) => {
                return Err(error(
                    "keyless",
                    "only a compacted table has keyless events to place; a history table keeps every event".to_owned(),
                ));
            }
        };
        let columns = match &spec.columns {
            Some(table) => self.columns(table, span.clone(), key)?,
            None => Vec::new(),
        };
        Ok(ProjectionConfig {
            url,
            table,
            shape,
            keyless,
            columns,
            backoff_max: self.backoff_max(spec, key)?,
        })
    }

    /// The target's `backoff_max`, if it sets one: a duration above zero.
    fn backoff_max(&self, spec: &EndpointSpec, key: &str) -> Result<Option<Duration>, TaskError> {
        let key = format!("{key}.backoff_max");
        let backoff_max = self.duration(&spec.backoff_max, &key)?;
        match (backoff_max, &spec.backoff_max) {
            (Some(pause), Some(text)) if pause.is_zero() => Err(self.error(
                text.span(),
                &key,
                format!(
                    "must be above zero, not {:?}: it caps the pause between tries of a failed write",
                    text.get_ref()
                ),
            )),
            _ => Ok(backoff_max),
        }
    }

    fn columns(
        &self,
        table: &toml::Table,
        span: Range<usize>,
        key: &str,
    ) -> Result<Vec<ColumnMap>, TaskError> {
        let mut columns = Vec::with_capacity(table.len());
        for (name, value) in table {
            let error = |message: String| {
                self.error(span.clone(), &format!("{key}.columns.{name}"), message)
            };
            if !is_identifier(name, 63) || FIXED_COLUMNS.contains(&name.as_str()) {
                return Err(error(format!(
                    "{name:?} is not a column name: use 1 to 63 lowercase letters, digits or '_', other than {}",
                    FIXED_COLUMNS.join(", ")
                )));
            }
            let fields = value
                .as_table()
                .ok_or_else(|| error("write { path = \"body.x\", type = \"text\" }".to_owned()))?;
            if let Some(other) = fields
                .keys()
                .find(|k| !matches!(k.as_str(), "path" | "type"))
            {
                return Err(error(format!(
                    "{other:?} is not a key of a column; it takes path and type"
                )));
            }
            let path_text = fields
                .get("path")
                .and_then(toml::Value::as_str)
                .ok_or_else(|| {
                    error(
                        "missing path: name the body field, e.g. path = \"body.order.total\""
                            .to_owned(),
                    )
                })?;
            let path = path_text
                .strip_prefix("body.")
                .ok_or_else(|| "a column's path starts with \"body.\"".to_owned())
                .and_then(FieldPath::parse)
                .map_err(|e| error(format!("path {path_text:?}: {e}")))?;
            let type_text = fields
                .get("type")
                .and_then(toml::Value::as_str)
                .unwrap_or("");
            let kind = ColumnType::ALL
                .iter()
                .find(|(t, _)| *t == type_text)
                .map(|(_, kind)| *kind)
                .ok_or_else(|| {
                    let names: Vec<&str> = ColumnType::ALL.iter().map(|(t, _)| *t).collect();
                    error(format!(
                        "type {type_text:?} is not one of {}",
                        names.join(", ")
                    ))
                })?;
            columns.push(ColumnMap {
                name: name.clone(),
                path_text: path_text.to_owned(),
                path,
                kind,
            });
        }
        Ok(columns)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::TaskConfig;
    use crate::task::TargetKind;

    const SOURCE: &str = "name = \"t\"\n[source]\ndata_dir = \"d\"\nevent_hub = \"h\"\n[[target]]\nname = \"db\"\nkind = \"postgres\"\n";

    fn parse(target: &str) -> Result<ProjectionConfig, crate::TaskError> {
        let config = TaskConfig::parse(Path::new("task.toml"), &format!("{SOURCE}{target}"))?;
        match &config.targets[0].kind {
            TargetKind::Postgres(projection) => Ok((**projection).clone()),
            TargetKind::Hub { .. } => panic!("a postgres target"),
        }
    }

    fn refused(target: &str) -> crate::TaskError {
        parse(target).expect_err(target)
    }

    #[test]
    fn a_postgres_target_reads_its_shape_keyless_rule_and_columns() {
        let config = parse(
            "url = \"postgres://u:secret@h/db?schema=app\"\ntable = \"orders\"\nshape = \"compacted\"\nkeyless = \"refuse\"\n[target.columns]\ntotal = { path = \"body.order.total\", type = \"double precision\" }\n",
        )
        .unwrap();
        assert_eq!(config.table, "orders");
        assert_eq!(config.url.schema(), "app");
        assert_eq!(
            (config.shape, config.keyless),
            (Shape::Compacted, Keyless::Refuse)
        );
        assert_eq!(config.columns.len(), 1);
        assert_eq!(config.columns[0].kind, ColumnType::Double);
        let history =
            parse("url = \"postgres://h/db\"\ntable = \"t\"\nshape = \"history\"\n").unwrap();
        assert_eq!(history.shape, Shape::History);
    }

    #[test]
    fn mapped_columns_keep_the_task_files_order() {
        let config = parse(
            "url = \"postgres://h/db\"\ntable = \"t\"\nshape = \"history\"\n[target.columns]\nzone = { path = \"body.zone\", type = \"text\" }\nplaced = { path = \"body.placed\", type = \"timestamptz\" }\namount = { path = \"body.amount\", type = \"double precision\" }\n",
        )
        .unwrap();
        let names: Vec<&str> = config.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["zone", "placed", "amount"]);
    }

    #[test]
    fn a_postgres_target_may_cap_its_retry_pause() {
        let target = "url = \"postgres://h/db\"\ntable = \"t\"\nshape = \"history\"\n";
        assert_eq!(
            parse(target).unwrap().backoff_max,
            None,
            "the task's by default"
        );
        let capped = parse(&format!("{target}backoff_max = \"30s\"\n")).unwrap();
        assert_eq!(capped.backoff_max, Some(Duration::from_secs(30)));
        for bad in ["soon", "0s"] {
            let error = refused(&format!("{target}backoff_max = \"{bad}\"\n"));
            assert_eq!(error.key, "target \"db\".backoff_max", "{error}");
            assert_eq!(error.line, Some(11), "{error}");
            assert!(error.message.contains(bad), "{error}");
        }
        let hub_with_backoff = TaskConfig::parse(
            Path::new("task.toml"),
            "name = \"t\"\n[source]\ndata_dir = \"d\"\nevent_hub = \"h\"\n[[target]]\nname = \"x\"\ndata_dir = \"d\"\nevent_hub = \"h\"\nbackoff_max = \"1s\"\n",
        )
        .unwrap_err();
        assert_eq!(hub_with_backoff.key, "target \"x\".backoff_max");
    }

    #[test]
    fn bad_postgres_targets_are_refused_with_the_line_and_key_and_no_password() {
        let url = "url = \"postgres://u:secret@h/db\"\n";
        let cases = [
            (
                format!("{url}table = \"t\"\nshape = \"sideways\"\n"),
                "target \"db\".shape",
            ),
            (
                format!("{url}table = \"Bad-Name\"\nshape = \"history\"\n"),
                "target \"db\".table",
            ),
            (
                format!("{url}table = \"t\"\nshape = \"history\"\nkeyless = \"refuse\"\n"),
                "target \"db\".keyless",
            ),
            (
                format!("{url}table = \"t\"\nshape = \"compacted\"\nkeyless = \"drop\"\n"),
                "target \"db\".keyless",
            ),
            (
                format!("{url}table = \"t\"\nshape = \"history\"\nevent_hub = \"h\"\n"),
                "target \"db\".event_hub",
            ),
            (
                "table = \"t\"\nshape = \"history\"\n".to_owned(),
                "target \"db\".url",
            ),
            (
                "url = \"mysql://u:secret@h/db?schema=BAD\"\ntable = \"t\"\nshape = \"history\"\n"
                    .to_owned(),
                "target \"db\".url",
            ),
            (
                format!(
                    "{url}table = \"t\"\nshape = \"history\"\n[target.columns]\nx = {{ path = \"order.total\", type = \"text\" }}\n"
                ),
                "target \"db\".columns.x",
            ),
            (
                format!(
                    "{url}table = \"t\"\nshape = \"history\"\n[target.columns]\nx = {{ path = \"body.a\", type = \"money\" }}\n"
                ),
                "target \"db\".columns.x",
            ),
            (
                format!(
                    "{url}table = \"t\"\nshape = \"history\"\n[target.columns]\nbody_json = {{ path = \"body.a\", type = \"text\" }}\n"
                ),
                "target \"db\".columns.body_json",
            ),
        ];
        for (target, key) in cases {
            let error = refused(&target);
            assert_eq!(error.key, key, "{target}: {error}");
            assert_eq!(error.line, Some(5), "{target}: {error}");
            assert!(!error.to_string().contains("secret"), "{error}");
        }
        let hub_with_table = TaskConfig::parse(
            Path::new("task.toml"),
            "name = \"t\"\n[source]\ndata_dir = \"d\"\nevent_hub = \"h\"\n[[target]]\nname = \"x\"\ndata_dir = \"d\"\nevent_hub = \"h\"\ntable = \"t\"\n",
        )
        .unwrap_err();
        assert_eq!(hub_with_table.key, "target \"x\".table");
    }
}
