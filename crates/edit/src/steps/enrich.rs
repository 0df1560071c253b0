//! `enrich`: looks each event's key up in a table (CSV or JSON) read from a file, and adds the
//! row's columns to the event: as an object in the body, or as application properties.
//!
//! ```toml
//! [[step]]
//! kind = "enrich"
//! table = "homes.csv"          # or homes.json; relative to the task file
//! key_column = "home_id"       # the table's key column (CSV, and JSON arrays of rows)
//! key = "body.home_id"         # the event field to look up: body.<path>, user.<name>, sys.<name>
//! columns = ["region", "tier"] # default: every column but the key
//! into = "body.home"           # or "body" (top level) or "user" (one property per column)
//! prefix = "home_"             # with into = "user": property names are prefix + column
//! missing = "pass"             # no key or no row: "pass" (default), "drop" or "dead-letter"
//! reload_interval = "10s"      # how often the file's modification time is checked
//! types = { tier = "integer" } # CSV only: "string" (default), "integer", "number", "boolean"
//! ```
//!
//! A JSON table is either an object keyed by the key (`{"h1": {"region": "north"}}`) or an
//! array of row objects holding `key_column` (`[{"home_id": "h1", "region": "north"}]`); its
//! values keep their JSON types. CSV cells are strings unless `types` says otherwise (an empty
//! cell of a typed column is null).
//!
//! # Guarantees
//!
//! - The table is read and checked when the step is compiled: a missing or malformed file, a
//!   duplicate key (named, with the line, entry or row of both), an unknown column, or a
//!   table over [`TABLE_BYTES_MAX`] bytes or [`TABLE_ROWS_MAX`] rows stops the task starting.
//! - Keys are compared as text ([`FieldValue::to_key`]): `42` and `"42"` find the same row.
//! - The file is re-read when its modification time or size changes, checked at most every
//!   `reload_interval` (by the editor's clock); the reload happens on the partition that
//!   notices it, between two batches, and is checked like the first load. A reload that fails
//!   keeps the old table and is logged at warn level.
//! - An event whose key field is absent (including a body field of a body that is not JSON)
//!   or has no row follows `missing`. An event whose body cannot take the columns (into the
//!   body, but the body is not JSON, or the path runs through a value that is not an object)
//!   is refused, unchanged.
//! - With `into = "user"` the body is neither parsed nor rewritten (unless the key is a body
//!   field, which parses it once). Column values become properties: strings, booleans,
//!   64-bit integers and doubles as such, null as null, arrays and objects as JSON text.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock, TryLockError};
use std::time::{Duration, SystemTime};

use serde::Deserialize;
use serde::de::{Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use tributary_event::PropertyValue;

use super::dedupe::{key_text, parse_duration};
use crate::field::{Field, FieldPath, FieldValue, Segment};
use crate::item::Item;
use crate::spec::{CompileContext, SpecError};
use crate::step::{Context, Output, Step};

/// The largest table file read: a lookup table lives in memory in every process running the
/// task; beyond this it belongs in a database.
pub const TABLE_BYTES_MAX: u64 = 256 * 1024 * 1024;

/// The most rows a table may have: a million rows of a few columns is a few hundred MB in
/// memory, and a reload of it takes about a second.
pub const TABLE_ROWS_MAX: usize = 1_000_000;

/// How often the file is checked for changes when `reload_interval` is not given: a lookup
/// table changes by hand or by a nightly job, so seconds of delay are fine, and a `stat` every
/// ten seconds costs nothing.
pub const RELOAD_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnrichSpec {
    /// The table file (`.csv` or `.json`), relative to the task file's directory.
    pub table: PathBuf,
    /// The table's key column (required for CSV and for a JSON array of rows).
    #[serde(default)]
    pub key_column: Option<String>,
    /// The event field whose value is looked up.
    pub key: String,
    /// The columns to add (default: all but the key column).
    #[serde(default)]
    pub columns: Option<Vec<String>>,
    /// Where the columns go: `body.<path>`, `body` or `user`.
    pub into: String,
    /// With `into = "user"`, what property names start with.
    #[serde(default)]
    pub prefix: Option<String>,
    /// What happens to an event without the key or without a row.
    #[serde(default)]
    pub missing: MissingRow,
    /// How often the file is checked for changes (default [`RELOAD_INTERVAL_DEFAULT`]).
    #[serde(default)]
    pub reload_interval: Option<String>,
    /// CSV only: the type of a column's cells (default string).
    #[serde(default)]
    pub types: BTreeMap<String, ColumnType>,
}

/// What happens to an event without the key field or whose key has no row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MissingRow {
    /// Passed on unchanged.
    #[default]
    Pass,
    /// Dropped and counted.
    Drop,
    /// Refused with the reason, for the dead-letter target.
    DeadLetter,
}

/// The type of a CSV column's cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ColumnType {
    /// Text, as written.
    String,
    /// A 64-bit integer.
    #[serde(alias = "int")]
    Integer,
    /// A finite number.
    #[serde(alias = "float")]
    Number,
    /// `true` or `false`.
    #[serde(alias = "bool")]
    Boolean,
}

/// Where the columns go.
#[derive(Debug, Clone)]
enum Target {
    /// Into the body: at a path as one object, or (empty path) each at the top level.
    Body(FieldPath),
    /// Each an application property named prefix + column.
    User { prefix: String },
}

/// One row, shaped for where it goes.
#[derive(Debug)]
enum Row {
    Json(Map<String, Value>),
    Properties(Vec<(String, PropertyValue)>),
}

/// A row as read, before it is shaped: its key, where it was (line, entry or row number) and
/// the chosen columns.
struct RawRow {
    key: String,
    at: u64,
    values: Map<String, Value>,
}

/// A CSV column to add: its place in a record, its name and its cells' type.
struct CsvColumn {
    index: usize,
    name: String,
    kind: ColumnType,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Csv,
    Json,
}

/// The file's identity for change detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
}

/// How to read the table file, kept for reloads.
#[derive(Debug)]
struct Source {
    path: PathBuf,
    /// The file as the task names it, for reasons.
    shown: String,
    format: Format,
    key_column: Option<String>,
    columns: Option<Vec<String>>,
    types: BTreeMap<String, ColumnType>,
    target: Target,
}

/// When the file was last checked and what it was.
#[derive(Debug)]
struct ReloadState {
    next_check_ms: Option<i64>,
    stamp: Stamp,
}

/// The compiled step.
struct Enrich {
    name: String,
    key: Field,
    source: Source,
    missing: MissingRow,
    interval_ms: i64,
    table: RwLock<Arc<HashMap<String, Row>>>,
    reload: Mutex<ReloadState>,
}

impl fmt::Debug for Enrich {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows = self.table.read().map_or(0, |table| table.len());
        f.debug_struct("Enrich")
            .field("name", &self.name)
            .field("key", &self.key)
            .field("source", &self.source)
            .field("missing", &self.missing)
            .field("rows", &rows)
            .finish_non_exhaustive()
    }
}

pub(crate) fn compile(
    name: String,
    spec: EnrichSpec,
    context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let key = Field::parse(&spec.key).map_err(|e| SpecError::at("key", e.to_string()))?;
    let target = target(&spec.into, spec.prefix)?;
    let format = match spec.table.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("csv") => Format::Csv,
        Some(e) if e.eq_ignore_ascii_case("json") => Format::Json,
        _ => {
            return Err(SpecError::at(
                "table",
                format!("{}: name a .csv or .json file", spec.table.display()),
            ));
        }
    };
    if format == Format::Json && !spec.types.is_empty() {
        return Err(SpecError::at(
            "types",
            "types applies to CSV tables; JSON table values keep their JSON types",
        ));
    }
    if spec.columns.as_ref().is_some_and(Vec::is_empty) {
        return Err(SpecError::at(
            "columns",
            "name at least one column, or leave columns out for all",
        ));
    }
    let interval = match spec.reload_interval.as_deref() {
        Some(text) => parse_duration(text).map_err(|e| SpecError::at("reload_interval", e))?,
        None => RELOAD_INTERVAL_DEFAULT,
    };
    let interval_ms = i64::try_from(interval.as_millis())
        .ok()
        .filter(|ms| *ms > 0)
        .ok_or_else(|| SpecError::at("reload_interval", "write at least 1ms, such as \"10s\""))?;
    let source = Source {
        path: context.path(&spec.table),
        shown: spec.table.display().to_string(),
        format,
        key_column: spec.key_column,
        columns: spec.columns,
        types: spec.types,
        target,
    };
    let (table, stamp) = source.load()?;
    Ok(Arc::new(Enrich {
        name,
        key,
        source,
        missing: spec.missing,
        interval_ms,
        table: RwLock::new(Arc::new(table)),
        reload: Mutex::new(ReloadState {
            next_check_ms: None,
            stamp,
        }),
    }))
}

/// Reads `into` (and `prefix`, which only `user` takes).
fn target(into: &str, prefix: Option<String>) -> Result<Target, SpecError> {
    if into == "user" {
        return Ok(Target::User {
            prefix: prefix.unwrap_or_default(),
        });
    }
    let accepted = "write body.<path> (such as body.home) for one object at that path, body \
                    for each column at the body's top level, or user for one application \
                    property per column";
    match Field::parse(into) {
        Ok(Field::Body(path)) => {
            if prefix.is_some() {
                return Err(SpecError::at(
                    "prefix",
                    "prefix applies to into = \"user\" only",
                ));
            }
            if path
                .segments()
                .iter()
                .any(|s| matches!(s, Segment::Index(_)))
            {
                return Err(SpecError::at(
                    "into",
                    format!("{into:?} has an array index; {accepted}"),
                ));
            }
            Ok(Target::Body(path))
        }
        _ => Err(SpecError::at("into", format!("{into:?}: {accepted}"))),
    }
}

impl Source {
    /// Reads, checks and shapes the table.
    fn load(&self) -> Result<(HashMap<String, Row>, Stamp), SpecError> {
        let (bytes, stamp) = read_bounded(&self.path)?;
        let (label, rows) = match self.format {
            Format::Csv => ("line", self.csv_rows(&bytes)?),
            Format::Json => self.json_rows(&bytes)?,
        };
        Ok((self.shape(label, rows)?, stamp))
    }

    fn error(&self, message: impl fmt::Display) -> SpecError {
        SpecError::at("table", format!("{}: {message}", self.path.display()))
    }

    /// The rows keyed by key, each shaped for the target; a key twice is an error naming both
    /// places.
    fn shape(&self, label: &str, raw: Vec<RawRow>) -> Result<HashMap<String, Row>, SpecError> {
        if let Some(columns) = &self.columns
            && !raw.is_empty()
            && let Some(unused) = columns
                .iter()
                .find(|c| !raw.iter().any(|row| row.values.contains_key(*c)))
        {
            return Err(SpecError::at(
                "columns",
                format!("no row of {} has a column {unused:?}", self.path.display()),
            ));
        }
        let mut rows: HashMap<String, (u64, Row)> = HashMap::with_capacity(raw.len());
        for RawRow { key, at, values } in raw {
            if key.is_empty() {
                return Err(self.error(format_args!("{label} {at}: the key is empty")));
            }
            match rows.entry(key) {
                Entry::Occupied(first) => {
                    return Err(self.error(format_args!(
                        "the key {:?} is on {label} {} and again on {label} {at}; keys must be \
                         unique",
                        first.key(),
                        first.get().0
                    )));
                }
                Entry::Vacant(slot) => {
                    slot.insert((at, self.target.row(values)));
                }
            }
        }
        Ok(rows.into_iter().map(|(key, (_, row))| (key, row)).collect())
    }

    /// The CSV rows (`at` is the line).
    fn csv_rows(&self, bytes: &[u8]) -> Result<Vec<RawRow>, SpecError> {
        let mut reader = csv::Reader::from_reader(bytes);
        let headers = reader
            .headers()
            .map_err(|e| self.error(format_args!("not a CSV table with a header row: {e}")))?
            .clone();
        let (key_at, columns) = self.csv_layout(&headers)?;
        let mut rows = Vec::new();
        for record in reader.records() {
            let record = record.map_err(|e| self.error(e))?;
            let line = record.position().map_or(0, csv::Position::line);
            if rows.len() >= TABLE_ROWS_MAX {
                return Err(self.error(format_args!(
                    "more than {TABLE_ROWS_MAX} rows; a lookup table holds at most that many"
                )));
            }
            let mut values = Map::new();
            for CsvColumn { index, name, kind } in &columns {
                let cell = record.get(*index).unwrap_or_default();
                let value = typed(cell, *kind)
                    .map_err(|m| self.error(format_args!("line {line}, column {name:?}: {m}")))?;
                values.insert(name.clone(), value);
            }
            rows.push(RawRow {
                key: record.get(key_at).unwrap_or_default().to_owned(),
                at: line,
                values,
            });
        }
        Ok(rows)
    }

    /// Where the key is in a CSV row, and each chosen column's place, name and type.
    fn csv_layout(
        &self,
        headers: &csv::StringRecord,
    ) -> Result<(usize, Vec<CsvColumn>), SpecError> {
        let names: Vec<&str> = headers.iter().collect();
        let listed = || format!("the header row has {}", names.join(", "));
        if let Some(twice) = names
            .iter()
            .enumerate()
            .find(|(i, n)| names[..*i].contains(n))
        {
            return Err(self.error(format_args!("the column {:?} is named twice", twice.1)));
        }
        let key_column = self.key_column.as_deref().ok_or_else(|| {
            SpecError::at(
                "key_column",
                format!("a CSV table needs key_column; {}", listed()),
            )
        })?;
        let find = |name: &str| names.iter().position(|n| *n == name);
        let key_at = find(key_column).ok_or_else(|| {
            SpecError::at(
                "key_column",
                format!("no column {key_column:?}; {}", listed()),
            )
        })?;
        let chosen: Vec<&str> = match &self.columns {
            Some(columns) => columns.iter().map(String::as_str).collect(),
            None => names.iter().copied().filter(|n| *n != key_column).collect(),
        };
        let mut layout = Vec::with_capacity(chosen.len());
        for name in chosen {
            let index = find(name).ok_or_else(|| {
                SpecError::at("columns", format!("no column {name:?}; {}", listed()))
            })?;
            let kind = self.types.get(name).copied().unwrap_or(ColumnType::String);
            layout.push(CsvColumn {
                index,
                name: name.to_owned(),
                kind,
            });
        }
        if let Some(name) = self
            .types
            .keys()
            .find(|t| !layout.iter().any(|c| &c.name == *t))
        {
            return Err(SpecError::at(
                "types",
                format!("{name:?} is not one of the columns added"),
            ));
        }
        Ok((key_at, layout))
    }

    /// The JSON rows, and what their places are called.
    fn json_rows(&self, bytes: &[u8]) -> Result<(&'static str, Vec<RawRow>), SpecError> {
        let table: JsonTable = serde_json::from_slice(bytes).map_err(|e| self.error(e))?;
        let mut rows = Vec::new();
        match table {
            JsonTable::Object(entries) => {
                for (at, (key, row)) in (1..).zip(entries) {
                    let Value::Object(row) = row else {
                        return Err(self.error(format_args!(
                            "entry {at} ({key:?}) is not an object of columns"
                        )));
                    };
                    let values = self.pick(row);
                    rows.push(RawRow { key, at, values });
                }
                Ok(("entry", rows))
            }
            JsonTable::Array(elements) => {
                let key_column = self.key_column.as_deref().ok_or_else(|| {
                    SpecError::at("key_column", "a JSON array of rows needs key_column")
                })?;
                for (at, row) in (1..).zip(elements) {
                    let key = row
                        .get(key_column)
                        .and_then(|k| FieldValue::Json(k).to_key());
                    let (Value::Object(row), Some(key)) = (row, key) else {
                        return Err(self.error(format_args!(
                            "row {at} is not an object with a {key_column:?}"
                        )));
                    };
                    let values = self.pick(row);
                    rows.push(RawRow { key, at, values });
                }
                Ok(("row", rows))
            }
        }
    }

    /// The chosen columns of a JSON row (those it has).
    fn pick(&self, mut row: Map<String, Value>) -> Map<String, Value> {
        match &self.columns {
            Some(columns) => columns
                .iter()
                .filter_map(|c| row.remove(c).map(|v| (c.clone(), v)))
                .collect(),
            None => {
                if let Some(key_column) = &self.key_column {
                    row.remove(key_column);
                }
                row
            }
        }
    }
}

/// Reads `path` whole if it is at most [`TABLE_BYTES_MAX`] bytes.
fn read_bounded(path: &Path) -> Result<(Vec<u8>, Stamp), SpecError> {
    let error = |message: String| SpecError::at("table", message);
    let stamp =
        stamp_of(path).map_err(|e| error(format!("cannot read {}: {e}", path.display())))?;
    if stamp.len > TABLE_BYTES_MAX {
        return Err(error(format!(
            "{} is {} bytes; a lookup table is at most {TABLE_BYTES_MAX}",
            path.display(),
            stamp.len
        )));
    }
    let bytes =
        std::fs::read(path).map_err(|e| error(format!("cannot read {}: {e}", path.display())))?;
    Ok((bytes, stamp))
}

fn stamp_of(path: &Path) -> std::io::Result<Stamp> {
    let metadata = std::fs::metadata(path)?;
    Ok(Stamp {
        modified: metadata.modified().ok(),
        len: metadata.len(),
    })
}

/// A CSV cell as a JSON value of its column's type.
fn typed(cell: &str, kind: ColumnType) -> Result<Value, String> {
    let trimmed = cell.trim();
    if kind != ColumnType::String && trimmed.is_empty() {
        return Ok(Value::Null);
    }
    match kind {
        ColumnType::String => Ok(Value::String(cell.to_owned())),
        ColumnType::Integer => trimmed
            .parse::<i64>()
            .map(Value::from)
            .map_err(|_| format!("{cell:?} is not an integer")),
        ColumnType::Number => trimmed
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .ok_or_else(|| format!("{cell:?} is not a finite number")),
        ColumnType::Boolean => match trimmed.to_ascii_lowercase().as_str() {
            "true" => Ok(Value::Bool(true)),
            "false" => Ok(Value::Bool(false)),
            _ => Err(format!("{cell:?} is not true or false")),
        },
    }
}

impl Target {
    /// A row shaped for this target.
    fn row(&self, values: Map<String, Value>) -> Row {
        match self {
            Target::Body(_) => Row::Json(values),
            Target::User { prefix } => Row::Properties(
                values
                    .into_iter()
                    .map(|(name, value)| (format!("{prefix}{name}"), property(value)))
                    .collect(),
            ),
        }
    }
}

/// A JSON value as an application property.
fn property(value: Value) -> PropertyValue {
    match value {
        Value::Null => PropertyValue::Null,
        Value::Bool(b) => PropertyValue::Bool(b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => PropertyValue::Int64(i),
            (None, Some(u)) => PropertyValue::UInt64(u),
            _ => PropertyValue::Float64(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => PropertyValue::String(s.into()),
        other @ (Value::Array(_) | Value::Object(_)) => {
            PropertyValue::String(other.to_string().into())
        }
    }
}

/// A JSON table's top level as written: object entries in order (so duplicate keys, which a
/// JSON object would silently collapse, can be named) or array elements; at most
/// [`TABLE_ROWS_MAX`] either way, checked while parsing.
enum JsonTable {
    Object(Vec<(String, Value)>),
    Array(Vec<Value>),
}

impl<'de> Deserialize<'de> for JsonTable {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<JsonTable, D::Error> {
        deserializer.deserialize_any(JsonTableVisitor)
    }
}

struct JsonTableVisitor;

impl<'de> Visitor<'de> for JsonTableVisitor {
    type Value = JsonTable;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of rows keyed by the key, or an array of row objects")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonTable, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry::<String, Value>()? {
            if entries.len() >= TABLE_ROWS_MAX {
                return Err(A::Error::custom(too_many_rows()));
            }
            entries.push(entry);
        }
        Ok(JsonTable::Object(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonTable, A::Error> {
        let mut elements = Vec::new();
        while let Some(element) = seq.next_element::<Value>()? {
            if elements.len() >= TABLE_ROWS_MAX {
                return Err(A::Error::custom(too_many_rows()));
            }
            elements.push(element);
        }
        Ok(JsonTable::Array(elements))
    }
}

fn too_many_rows() -> String {
    format!("more than {TABLE_ROWS_MAX} rows; a lookup table holds at most that many")
}

/// What looking an event up found.
enum Lookup<'t> {
    Found(&'t Row),
    /// The event has no key field.
    NoKey,
    /// No row has the key (the key, kept only when a reason needs it).
    NoRow(String),
}

impl Enrich {
    /// Re-reads the table if the file changed, at most every interval; one partition at a
    /// time checks, the others carry on with the table they have.
    fn maybe_reload(&self, now_ms: i64) {
        let mut state = match self.reload.try_lock() {
            Ok(state) => state,
            Err(TryLockError::WouldBlock) => return,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        };
        if state.next_check_ms.is_some_and(|next| now_ms < next) {
            return;
        }
        state.next_check_ms = Some(now_ms.saturating_add(self.interval_ms));
        let stamp = match stamp_of(&self.source.path) {
            Ok(stamp) => stamp,
            Err(error) => {
                tracing::warn!(step = %self.name, table = %self.source.path.display(), %error,
                    "cannot check the lookup table for changes; keeping the one loaded");
                return;
            }
        };
        if stamp == state.stamp {
            return;
        }
        // Remember this version even if it fails to load: it is retried when it changes again,
        // not logged every interval.
        state.stamp = stamp;
        match self.source.load() {
            Ok((table, _)) => {
                tracing::info!(step = %self.name, table = %self.source.path.display(),
                    rows = table.len(), "lookup table reloaded");
                *self.table.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(table);
            }
            Err(error) => {
                tracing::warn!(step = %self.name, table = %self.source.path.display(), %error,
                    "the changed lookup table cannot be used; keeping the one loaded");
            }
        }
    }

    fn lookup<'t>(
        &self,
        context: &Context<'_>,
        item: &Item,
        table: &'t HashMap<String, Row>,
    ) -> Lookup<'t> {
        let Some(key) = self.key.get(context, item).and_then(key_text) else {
            return Lookup::NoKey;
        };
        match table.get(key.as_ref()) {
            Some(row) => Lookup::Found(row),
            None if self.missing == MissingRow::DeadLetter => Lookup::NoRow(key.into_owned()),
            None => Lookup::NoRow(String::new()),
        }
    }

    /// Adds `row` to `item`, or says why the body cannot take it.
    fn add(&self, item: &mut Item, row: &Row) -> Result<(), String> {
        match (&self.source.target, row) {
            (Target::User { .. }, Row::Properties(properties)) => {
                for (name, value) in properties {
                    item.set_property(name, value.clone());
                }
                Ok(())
            }
            (Target::Body(path), Row::Json(columns)) => add_to_body(item, path, columns),
            _ => Err("the table was shaped for another target".to_owned()),
        }
    }
}

/// Puts `columns` into the body at `path` (one object) or, for the empty path, each at the
/// top level; the body is left untouched when it cannot take them.
fn add_to_body(
    item: &mut Item,
    path: &FieldPath,
    columns: &Map<String, Value>,
) -> Result<(), String> {
    let fits = match item.json() {
        None => return Err("the body is not JSON, so the columns cannot be added to it".to_owned()),
        Some(body) => fits(path, body),
    };
    let shown = if path.is_empty() {
        "body".to_owned()
    } else {
        format!("body.{path}")
    };
    let cannot = || format!("{shown} runs through a value that is not an object");
    if !fits {
        return Err(cannot());
    }
    let Some(body) = item.json_mut() else {
        return Err(cannot());
    };
    if path.is_empty() {
        let top = body.as_object_mut().ok_or_else(cannot)?;
        top.extend(columns.iter().map(|(k, v)| (k.clone(), v.clone())));
        return Ok(());
    }
    path.set(body, Value::Object(columns.clone()))
        .map_err(|_| cannot())
}

/// Whether `path` (object keys only) can be set in `body`: every existing value it runs
/// through, up to the last key's parent, is an object.
fn fits(path: &FieldPath, body: &Value) -> bool {
    let mut at = body;
    for segment in path.segments() {
        let (Value::Object(map), Segment::Key(key)) = (at, segment) else {
            return false;
        };
        match map.get(key) {
            Some(next) => at = next,
            None => return true,
        }
    }
    // The whole path exists: its last value is replaced, or (the empty path) the top level,
    // which must be an object, is merged into.
    !path.is_empty() || body.is_object()
}

impl Step for Enrich {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        self.maybe_reload(context.now_ms);
        let table = Arc::clone(&self.table.read().unwrap_or_else(PoisonError::into_inner));
        for mut item in items {
            match self.lookup(context, &item, &table) {
                Lookup::Found(row) => match self.add(&mut item, row) {
                    Ok(()) => out.pass(item),
                    Err(reason) => out.reject(item, reason),
                },
                Lookup::NoKey => self.miss(item, out, || {
                    format!(
                        "the event has no {} to look up in {}",
                        self.key, self.source.shown
                    )
                }),
                Lookup::NoRow(key) => self.miss(item, out, || {
                    format!("{} has no row for {} {key:?}", self.source.shown, self.key)
                }),
            }
        }
    }
}

impl Enrich {
    /// An event without a key or a row, as `missing` says.
    fn miss(&self, item: Item, out: &mut Output, reason: impl FnOnce() -> String) {
        match self.missing {
            MissingRow::Pass => out.pass(item),
            MissingRow::Drop => out.drop_item(item),
            MissingRow::DeadLetter => out.reject(item, reason()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use proptest::prelude::*;
    use serde_json::json;
    use tributary_event::EventData;

    use super::*;
    use crate::item::Position;
    use crate::spec;

    const HOMES_CSV: &str = "home_id,region,tier,floor_area,heat_pump\n\
                             h1,north,gold,120.5,true\n\
                             h2,south,silver,,false\n\
                             \"h,3\",\"east, coast\",bronze,80,TRUE\n";

    const HOMES_JSON: &str = r#"{
        "h1": {"region": "north", "tier": 2, "tags": ["roof", "solar"], "owner": null},
        "h2": {"region": "south", "tier": 1}
    }"#;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write");
        }
        dir
    }

    fn build(dir: &Path, keys: Value) -> Result<Arc<dyn Step>, SpecError> {
        spec::compile("enrich", None, keys, &CompileContext::new(dir))
    }

    fn item(event: EventData) -> Item {
        let position = Position {
            sequence_number: 1,
            offset: 0,
            enqueued_time_ms: 0,
        };
        Item::new(event, position)
    }

    fn body(text: &str) -> Item {
        item(EventData::new(text.to_owned()))
    }

    /// Runs `items` through `step` at `now_ms`.
    fn run(step: &Arc<dyn Step>, now_ms: i64, items: Vec<Item>) -> crate::step::Edited {
        let editor = crate::step::Editor::new(vec![Arc::clone(step)]);
        let context = Context {
            partition: "0",
            now_ms,
        };
        editor.apply(&context, items)
    }

    fn json_of(item: Item) -> Value {
        serde_json::from_slice(&item.into_event().body).expect("JSON body")
    }

    #[test]
    fn a_csv_row_goes_into_the_body_as_an_object() {
        let dir = dir_with(&[("homes.csv", HOMES_CSV)]);
        let keys = json!({"table": "homes.csv", "key_column": "home_id", "key": "body.home_id",
                          "columns": ["region", "tier"], "into": "body.home"});
        let step = build(dir.path(), keys).expect("compiles");
        let edited = run(
            &step,
            0,
            vec![
                body(r#"{"home_id":"h1","temperature":20.5}"#),
                body(r#"{"home_id":"h,3","home":{"floor":2}}"#),
            ],
        );
        let mut passed = edited.passed.into_iter();
        assert_eq!(
            json_of(passed.next().expect("first")),
            json!({"home_id": "h1", "temperature": 20.5,
                   "home": {"region": "north", "tier": "gold"}})
        );
        assert_eq!(
            json_of(passed.next().expect("second")),
            json!({"home_id": "h,3", "home": {"region": "east, coast", "tier": "bronze"}})
        );
    }

    #[test]
    fn typed_csv_columns_are_numbers_and_booleans_and_empty_cells_null() {
        let dir = dir_with(&[("homes.csv", HOMES_CSV)]);
        let keys = json!({"table": "homes.csv", "key_column": "home_id", "key": "user.home",
                          "into": "body",
                          "types": {"floor_area": "number", "heat_pump": "boolean"}});
        let step = build(dir.path(), keys).expect("compiles");
        let events = ["h2", "h,3"].map(|home| {
            item(
                EventData::new(r#"{"t":1}"#)
                    .with_property("home", PropertyValue::String(home.into())),
            )
        });
        let edited = run(&step, 0, events.into());
        let bodies: Vec<Value> = edited.passed.into_iter().map(json_of).collect();
        assert_eq!(
            bodies,
            [
                json!({"t": 1, "region": "south", "tier": "silver", "floor_area": null,
                       "heat_pump": false}),
                json!({"t": 1, "region": "east, coast", "tier": "bronze", "floor_area": 80.0,
                       "heat_pump": true}),
            ]
        );
    }

    #[test]
    fn a_json_table_fills_application_properties_with_their_types() {
        let dir = dir_with(&[("homes.json", HOMES_JSON)]);
        let keys = json!({"table": "homes.json", "key": "body.home.id", "into": "user",
                          "prefix": "home_"});
        let step = build(dir.path(), keys).expect("compiles");
        let text = r#"{"home": {"id": "h1"}, "t": 3}"#;
        let edited = run(&step, 0, vec![body(text)]);
        let mut event = edited
            .passed
            .into_iter()
            .next()
            .expect("passed")
            .into_event();
        assert_eq!(
            event.body.as_ref(),
            text.as_bytes(),
            "the body is untouched"
        );
        event.properties.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            event.properties,
            [
                ("home_owner".into(), PropertyValue::Null),
                ("home_region".into(), PropertyValue::String("north".into())),
                (
                    "home_tags".into(),
                    PropertyValue::String(r#"["roof","solar"]"#.into())
                ),
                ("home_tier".into(), PropertyValue::Int64(2)),
            ]
        );
    }

    #[test]
    fn a_json_array_table_is_keyed_by_its_key_column_as_text() {
        let table = r#"[{"device": 42, "site": "plant-a", "limit": 7.5},
                        {"device": "d-9", "site": "plant-b", "limit": 3}]"#;
        let dir = dir_with(&[("devices.json", table)]);
        let keys = json!({"table": "devices.json", "key_column": "device",
                          "key": "user.device", "into": "user"});
        let step = build(dir.path(), keys).expect("compiles");
        let with =
            |device: PropertyValue| item(EventData::new("binary").with_property("device", device));
        let edited = run(
            &step,
            0,
            vec![
                with(PropertyValue::Int32(42)),
                with(PropertyValue::String("d-9".into())),
            ],
        );
        let events: Vec<EventData> = edited.passed.into_iter().map(Item::into_event).collect();
        assert_eq!(
            events[0].property("site"),
            Some(&PropertyValue::String("plant-a".into()))
        );
        assert_eq!(
            events[0].property("limit"),
            Some(&PropertyValue::Float64(7.5))
        );
        assert_eq!(
            events[0].property("device"),
            Some(&PropertyValue::Int32(42)),
            "key kept"
        );
        assert_eq!(events[1].property("limit"), Some(&PropertyValue::Int64(3)));
    }

    #[test]
    fn missing_keys_and_rows_follow_the_missing_mode() {
        let dir = dir_with(&[("homes.csv", HOMES_CSV)]);
        let events = || {
            vec![
                body(r#"{"home_id":"h9"}"#),
                body(r#"{"other":1}"#),
                body("not json"),
                body(r#"{"home_id":"h1"}"#),
            ]
        };
        let step = |missing: &str| {
            let keys = json!({"table": "homes.csv", "key_column": "home_id",
                              "key": "body.home_id", "into": "body.home", "missing": missing});
            build(dir.path(), keys).expect("compiles")
        };
        let edited = run(&step("pass"), 0, events());
        assert_eq!(edited.passed.len(), 4);
        assert_eq!(
            json_of(edited.passed.into_iter().next().expect("one")),
            json!({"home_id": "h9"})
        );

        let edited = run(&step("drop"), 0, events());
        assert_eq!(edited.passed.len(), 1);
        assert_eq!(edited.dropped, [("enrich".to_owned(), 3)]);

        let edited = run(&step("dead-letter"), 0, events());
        assert_eq!(edited.passed.len(), 1);
        let reasons: Vec<&str> = edited.rejected.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "homes.csv has no row for body.home_id \"h9\"",
                "the event has no body.home_id to look up in homes.csv",
                "the event has no body.home_id to look up in homes.csv",
            ]
        );
    }

    #[test]
    fn a_body_that_cannot_take_the_columns_is_refused_unchanged() {
        let dir = dir_with(&[("homes.csv", HOMES_CSV)]);
        let keys = json!({"table": "homes.csv", "key_column": "home_id", "key": "user.home",
                          "into": "body.site.home"});
        let step = build(dir.path(), keys).expect("compiles");
        let with = |text: &str| {
            item(
                EventData::new(text.to_owned())
                    .with_property("home", PropertyValue::String("h1".into())),
            )
        };
        let unchanged = r#"{ "site" : "not an object" }"#;
        let edited = run(
            &step,
            0,
            vec![with(unchanged), with("[1, 2]"), with("plain"), with("{}")],
        );
        assert_eq!(edited.rejected.len(), 3);
        assert!(
            edited.rejected[0]
                .reason
                .contains("body.site.home runs through"),
            "{}",
            edited.rejected[0].reason
        );
        assert!(edited.rejected[2].reason.contains("not JSON"));
        let first = edited
            .rejected
            .into_iter()
            .next()
            .expect("one")
            .item
            .into_event();
        assert_eq!(first.body.as_ref(), unchanged.as_bytes());
        assert_eq!(
            json_of(edited.passed.into_iter().next().expect("{} takes it")),
            json!({"site": {"home": {"region": "north", "tier": "gold", "floor_area": "120.5",
                                     "heat_pump": "true"}}})
        );
    }

    fn rewrite(path: &Path, text: &str, modified_s: u64) {
        std::fs::write(path, text).expect("write");
        let file = std::fs::File::options()
            .write(true)
            .open(path)
            .expect("open");
        file.set_modified(UNIX_EPOCH + Duration::from_secs(modified_s))
            .expect("set mtime");
    }

    #[test]
    fn the_table_is_reloaded_when_the_file_changes_at_most_every_interval() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("homes.json");
        rewrite(&path, r#"{"h1": {"region": "north"}}"#, 1_000);
        let keys = json!({"table": "homes.json", "key": "body.id", "into": "user",
                          "reload_interval": "5s"});
        let step = build(dir.path(), keys).expect("compiles");
        let region = |now_ms: i64| {
            let edited = run(&step, now_ms, vec![body(r#"{"id":"h1"}"#)]);
            let event = edited
                .passed
                .into_iter()
                .next()
                .expect("passed")
                .into_event();
            event.property("region").cloned()
        };
        let text = |s: &str| Some(PropertyValue::String(s.into()));
        assert_eq!(region(0), text("north"));
        rewrite(&path, r#"{"h1": {"region": "south"}}"#, 2_000);
        assert_eq!(
            region(4_999),
            text("north"),
            "not checked within the interval"
        );
        assert_eq!(
            region(5_000),
            text("south"),
            "reloaded once the interval passed"
        );
        // A broken file keeps the table in use.
        rewrite(
            &path,
            r#"{"h1": {"region": "east"}, "h1": {"region": "west"}}"#,
            3_000,
        );
        assert_eq!(region(10_000), text("south"));
        rewrite(&path, "{", 4_000);
        assert_eq!(region(15_000), text("south"));
        std::fs::remove_file(&path).expect("remove");
        assert_eq!(region(20_000), text("south"));
        rewrite(&path, r#"{"h1": {"region": "west"}}"#, 5_000);
        assert_eq!(
            region(25_000),
            text("west"),
            "a good file is picked up again"
        );
    }

    #[test]
    fn duplicate_keys_are_refused_naming_the_key_and_both_places() {
        let dir = dir_with(&[
            ("dup.csv", "home_id,region\nh1,north\nh2,south\nh1,east\n"),
            (
                "dup.json",
                r#"{"h1": {"r": 1}, "h2": {"r": 2}, "h1": {"r": 3}}"#,
            ),
            (
                "dup-rows.json",
                r#"[{"id": 7, "r": 1}, {"id": "7", "r": 2}]"#,
            ),
        ]);
        let error = |table: &str| {
            let keys =
                json!({"table": table, "key_column": "id", "key": "body.id", "into": "user"});
            let keys = if table.ends_with("csv") {
                json!({"table": table, "key_column": "home_id", "key": "body.id", "into": "user"})
            } else {
                keys
            };
            build(dir.path(), keys).expect_err("duplicate").to_string()
        };
        let csv = error("dup.csv");
        assert!(
            csv.contains("\"h1\" is on line 2 and again on line 4"),
            "{csv}"
        );
        let object = error("dup.json");
        assert!(
            object.contains("\"h1\" is on entry 1 and again on entry 3"),
            "{object}"
        );
        let rows = error("dup-rows.json");
        assert!(
            rows.contains("\"7\" is on row 1 and again on row 2"),
            "{rows}"
        );
    }

    /// Compiles the homes step with `extra` keys over the defaults; the error it gives.
    fn refused(extra: Value) -> SpecError {
        let dir = dir_with(&[
            ("homes.csv", HOMES_CSV),
            ("homes.json", HOMES_JSON),
            ("ragged.csv", "home_id,region\nh1,north,extra\n"),
            ("scalar.json", "42"),
            ("homes.txt", "x"),
        ]);
        let mut keys = json!({"table": "homes.csv", "key_column": "home_id", "key": "body.id",
                              "into": "user"});
        let keys_map = keys.as_object_mut().expect("object");
        keys_map.extend(extra.as_object().expect("object").clone());
        build(dir.path(), keys).expect_err("refused")
    }

    #[test]
    fn bad_keys_are_refused_with_what_would_do() {
        let e = refused(json!({"key_column": "id"}));
        assert_eq!(e.key.as_deref(), Some("key_column"));
        assert!(e.message.contains("home_id, region, tier"), "{e}");
        let e = refused(json!({"columns": ["region", "zone"]}));
        assert_eq!(e.key.as_deref(), Some("columns"));
        assert!(e.message.contains("\"zone\""), "{e}");
        let e = refused(json!({"types": {"colour": "integer"}}));
        assert_eq!(e.key.as_deref(), Some("types"));
        for (extra, key) in [
            (json!({"into": "user.home"}), "into"),
            (json!({"into": "body.a[0]"}), "into"),
            (json!({"into": "body.home", "prefix": "p_"}), "prefix"),
            (json!({"key": "home_id"}), "key"),
            (json!({"reload_interval": "soon"}), "reload_interval"),
            (json!({"columns": []}), "columns"),
            (
                json!({"table": "homes.json", "types": {"tier": "integer"}}),
                "types",
            ),
            (
                json!({"table": "homes.json", "columns": ["regio"]}),
                "columns",
            ),
        ] {
            assert_eq!(refused(extra.clone()).key.as_deref(), Some(key), "{extra}");
        }
        assert!(
            refused(json!({"missing": "skip"}))
                .message
                .contains("dead-letter")
        );
    }

    #[test]
    fn bad_table_files_are_refused_saying_where() {
        let e = refused(json!({"types": {"tier": "integer"}}));
        let expected = "line 2, column \"tier\": \"gold\" is not an integer";
        assert!(e.message.contains(expected), "{e}");
        let e = refused(json!({"table": "ragged.csv"}));
        assert!(
            e.message.contains("line: 2") && e.message.contains("3 fields"),
            "{e}"
        );
        let e = refused(json!({"table": "absent.csv"}));
        assert!(e.message.contains("cannot read"), "{e}");
        let e = refused(json!({"table": "homes.txt"}));
        assert!(e.message.contains(".csv or .json"), "{e}");
        let e = refused(json!({"table": "scalar.json"}));
        assert!(
            e.message.contains("an object of rows keyed by the key"),
            "{e}"
        );
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bodies_and_properties(
            events in proptest::collection::vec(
                (any::<Vec<u8>>(), "[\\[\\]{}\",:0-9a-z ]{0,30}",
                 proptest::option::of("h[0-9]|[a-z]{0,3}"), any::<i64>()),
                1..16),
            into in prop_oneof![Just("body"), Just("body.home"), Just("body.a.b"), Just("user")],
            missing in prop_oneof![Just("pass"), Just("drop"), Just("dead-letter")],
        ) {
            let dir = dir_with(&[("homes.csv", HOMES_CSV)]);
            let keys = json!({"table": "homes.csv", "key_column": "home_id", "key": "user.home",
                              "into": into, "missing": missing});
            let step = build(dir.path(), keys).expect("compiles");
            let count = events.len();
            let items = events
                .into_iter()
                .enumerate()
                .map(|(i, (raw, text, home, number))| {
                    let mut e = EventData::new(if i % 2 == 0 { raw } else { text.into_bytes() });
                    e = match home {
                        Some(home) => e.with_property("home", PropertyValue::String(home.into())),
                        None => e.with_property("home", PropertyValue::Int64(number)),
                    };
                    item(e)
                })
                .collect();
            let edited = run(&step, 0, items);
            let dropped: u64 = edited.dropped.iter().map(|(_, n)| n).sum();
            prop_assert_eq!(
                edited.passed.len() + edited.rejected.len() + dropped as usize,
                count
            );
        }
    }
}
