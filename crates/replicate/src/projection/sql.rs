//! The SQL of one projection target, written once when the task starts. Every name in it is a
//! checked identifier ([`super::config`]) and quoted, so no value reaches SQL text; values
//! travel as parameters or through `COPY`.

use super::config::{ColumnType, FIXED_COLUMNS, Keyless, ProjectionConfig, Shape};

/// The progress table, in the URL's schema.
pub const PROGRESS_TABLE: &str = "tributary_projection_progress";

/// The SQL types of the fixed columns, in [`FIXED_COLUMNS`] order.
const FIXED_SQL_TYPES: [&str; 10] = [
    "text",
    "text",
    "bigint",
    "integer",
    "bigint",
    "timestamptz",
    "text",
    "jsonb",
    "bytea",
    "jsonb",
];

/// One merge statement, and which rows of a batch it takes.
#[derive(Debug, Clone)]
pub struct Merge {
    /// `INSERT … SELECT … FROM unnest($1::text[], …)`: one array parameter per column.
    pub sql: String,
    /// The rows it is given.
    pub rows: Rows,
}

/// Which rows of a batch a [`Merge`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// Every row.
    All,
    /// The rows with a partition key.
    Keyed,
    /// The rows without one.
    Keyless,
}

/// The statements of one projection target.
#[derive(Debug, Clone)]
pub struct Sql {
    /// The table as the progress table records it: `schema.table`.
    pub table: String,
    /// Creates the schema, the tables and the progress table if absent.
    pub create: String,
    /// Selects every column the task writes from every table it writes (no rows).
    pub probe: String,
    /// `COPY` straight into a history table (`None` for a compacted one).
    pub copy_direct: Option<String>,
    /// Merges rows, passed as one array per column, into the tables.
    pub merges: Vec<Merge>,
    /// Creates the progress row if absent, locks it and returns its sequence number.
    pub lock_progress: String,
    /// Reads the progress.
    pub read_progress: String,
    /// Moves the progress.
    pub save_progress: String,
}

/// A column's definition in the history or compacted table.
fn fixed_definition(column: &str, shape: Shape) -> String {
    let kind = match column {
        "sequence_number" | "source_offset" => "bigint NOT NULL",
        "part" => "integer NOT NULL",
        "enqueued_time" => "timestamptz NOT NULL",
        "partition_key" if shape == Shape::Compacted => "text NOT NULL PRIMARY KEY",
        "partition_key" => "text",
        "body_json" => "jsonb",
        "body_bytes" => "bytea",
        "properties" => "jsonb NOT NULL",
        _ => "text NOT NULL",
    };
    format!("{column} {kind}")
}

fn create_table(name: &str, shape: Shape, mapped: &[(String, ColumnType)]) -> String {
    let mut columns: Vec<String> = FIXED_COLUMNS
        .iter()
        .map(|c| fixed_definition(c, shape))
        .collect();
    columns.extend(
        mapped
            .iter()
            .map(|(name, kind)| format!("{name} {}", kind.sql())),
    );
    if shape == Shape::History {
        columns
            .push("PRIMARY KEY (source_hub, source_partition, sequence_number, part)".to_owned());
    }
    format!(
        "CREATE TABLE IF NOT EXISTS {name} (\n    {}\n);\n",
        columns.join(",\n    ")
    )
}

impl Sql {
    /// The statements for `config`.
    pub fn new(config: &ProjectionConfig) -> Sql {
        let schema = config.url.schema();
        let table = format!("\"{schema}\".\"{}\"", config.table);
        let keyless_table = format!("\"{schema}\".\"{}_keyless\"", config.table);
        let progress = format!("\"{schema}\".{PROGRESS_TABLE}");
        let mapped: Vec<(String, ColumnType)> = config
            .columns
            .iter()
            .map(|c| (c.name.clone(), c.kind))
            .collect();
        let mut names: Vec<String> = FIXED_COLUMNS.iter().map(|c| (*c).to_owned()).collect();
        names.extend(mapped.iter().map(|(name, _)| name.clone()));
        let list = names.join(", ");
        let with_keyless = config.shape == Shape::Compacted && config.keyless == Keyless::History;
        let mut create = format!(
            "BEGIN;\nSELECT pg_advisory_xact_lock(hashtext('tributary projection {schema}'));\nCREATE SCHEMA IF NOT EXISTS \"{schema}\";\n"
        );
        create.push_str(&create_table(&table, config.shape, &mapped));
        if with_keyless {
            create.push_str(&create_table(&keyless_table, Shape::History, &mapped));
        }
        create.push_str(&format!(
            "CREATE TABLE IF NOT EXISTS {progress} (
    task text NOT NULL,
    table_name text NOT NULL,
    source_hub text NOT NULL,
    source_partition text NOT NULL,
    sequence_number bigint NOT NULL,
    source_offset bigint,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task, table_name, source_hub, source_partition)
);
COMMIT;"
        ));
        let mut probe = format!("SELECT {list} FROM {table} LIMIT 0;");
        if with_keyless {
            probe.push_str(&format!("SELECT {list} FROM {keyless_table} LIMIT 0;"));
        }
        let merges = Self::merges(config, &table, &keyless_table, &names);
        let key = "task = $1 AND table_name = $2 AND source_hub = $3 AND source_partition = $4";
        Sql {
            table: format!("{schema}.{}", config.table),
            create,
            probe,
            copy_direct: (config.shape == Shape::History)
                .then(|| format!("COPY {table} ({list}) FROM STDIN (FORMAT binary)")),
            merges,
            lock_progress: format!(
                "INSERT INTO {progress} (task, table_name, source_hub, source_partition, sequence_number) \
                 VALUES ($1, $2, $3, $4, -1) \
                 ON CONFLICT (task, table_name, source_hub, source_partition) DO UPDATE SET task = EXCLUDED.task \
                 RETURNING sequence_number"
            ),
            read_progress: format!("SELECT sequence_number FROM {progress} WHERE {key}"),
            save_progress: format!(
                "UPDATE {progress} SET sequence_number = $5, source_offset = $6, updated_at = now() WHERE {key}"
            ),
        }
    }

    /// The `INSERT … SELECT … FROM unnest(…)` statements that merge rows into the tables.
    fn merges(
        config: &ProjectionConfig,
        table: &str,
        keyless_table: &str,
        names: &[String],
    ) -> Vec<Merge> {
        let list = names.join(", ");
        let arrays: Vec<String> = FIXED_SQL_TYPES
            .iter()
            .map(|kind| (*kind).to_owned())
            .chain(config.columns.iter().map(|c| c.kind.sql().to_owned()))
            .enumerate()
            .map(|(index, kind)| format!("${}::{kind}[]", index + 1))
            .collect();
        let source = format!("unnest({}) AS r({list})", arrays.join(", "));
        let history = |into: &str, filter: &str| {
            format!(
                "INSERT INTO {into} ({list}) SELECT {list} FROM {source} {filter} ON CONFLICT DO NOTHING"
            )
        };
        match (config.shape, config.keyless) {
            (Shape::History, _) => vec![Merge {
                sql: history(table, ""),
                rows: Rows::All,
            }],
            (Shape::Compacted, keyless) => {
                let updates: Vec<String> = names
                    .iter()
                    .filter(|name| *name != "partition_key")
                    .map(|name| format!("{name} = EXCLUDED.{name}"))
                    .collect();
                let compacted = format!(
                    "INSERT INTO {table} AS t ({list}) \
                     SELECT DISTINCT ON (partition_key) {list} FROM {source} \
                     WHERE partition_key IS NOT NULL \
                     ORDER BY partition_key, sequence_number DESC, part DESC \
                     ON CONFLICT (partition_key) DO UPDATE SET {} \
                     WHERE (t.source_hub = EXCLUDED.source_hub AND t.source_partition = EXCLUDED.source_partition \
                            AND (t.sequence_number, t.part) < (EXCLUDED.sequence_number, EXCLUDED.part)) \
                        OR ((t.source_hub, t.source_partition) IS DISTINCT FROM (EXCLUDED.source_hub, EXCLUDED.source_partition) \
                            AND t.enqueued_time < EXCLUDED.enqueued_time)",
                    updates.join(", ")
                );
                let compacted = Merge {
                    sql: compacted,
                    rows: Rows::Keyed,
                };
                match keyless {
                    Keyless::History => vec![
                        compacted,
                        Merge {
                            sql: history(keyless_table, "WHERE partition_key IS NULL"),
                            rows: Rows::Keyless,
                        },
                    ],
                    Keyless::Refuse => vec![compacted],
                }
            }
        }
    }
}
