//! Events as rows: the values of one row in the binary `COPY` format, and the rules that turn an
//! event into them (or refuse it with a reason, before anything reaches the database).
//!
//! - The body is `body_json` (jsonb) when it is JSON that jsonb can hold, else `body_bytes`
//!   (bytea); the other is NULL. jsonb cannot hold the escape `\u0000`, so a body holding that
//!   text is kept as bytes.
//! - Application properties are one jsonb object, each value in
//!   [`tributary_edit::steps::batch::property_json`]'s form.
//! - A mapped column whose field is absent or JSON `null` (or whose body is not JSON) is NULL;
//!   a field of the wrong type refuses the event, naming the column and the field.
//! - A `timestamptz` field keeps the microseconds it was written with (PostgreSQL's precision);
//!   finer digits are rounded to the nearest microsecond.

use std::error::Error;

use bytes::BytesMut;
use serde_json::Value;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};
use tributary_edit::Position;
use tributary_edit::steps::batch::property_json;
use tributary_event::EventData;

use super::config::{ColumnMap, ColumnType};

/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const POSTGRES_EPOCH_US: i64 = 946_684_800_000_000;

/// One value of a row, written in PostgreSQL's binary format for its column's type.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// NULL.
    Null,
    /// text.
    Text(String),
    /// bigint.
    Bigint(i64),
    /// integer.
    Int(i32),
    /// double precision.
    Double(f64),
    /// boolean.
    Bool(bool),
    /// timestamptz, in microseconds since the Unix epoch.
    Time(i64),
    /// jsonb, as JSON text.
    Json(Vec<u8>),
    /// bytea.
    Bytes(Vec<u8>),
}

// Hand-written rather than the driver's serde_json/time features: the body is already JSON
// text (jsonb's binary input is a version byte and the text), so nothing is parsed twice.
impl ToSql for Cell {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        match self {
            Cell::Null => return Ok(IsNull::Yes),
            Cell::Text(text) => out.extend_from_slice(text.as_bytes()),
            Cell::Bigint(n) => out.extend_from_slice(&n.to_be_bytes()),
            Cell::Int(n) => out.extend_from_slice(&n.to_be_bytes()),
            Cell::Double(f) => out.extend_from_slice(&f.to_be_bytes()),
            Cell::Bool(b) => out.extend_from_slice(&[u8::from(*b)]),
            Cell::Time(us) => {
                out.extend_from_slice(&us.saturating_sub(POSTGRES_EPOCH_US).to_be_bytes());
            }
            Cell::Json(text) => {
                out.extend_from_slice(&[1]);
                out.extend_from_slice(text);
            }
            Cell::Bytes(bytes) => out.extend_from_slice(bytes),
        }
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        [
            Type::TEXT,
            Type::INT8,
            Type::INT4,
            Type::FLOAT8,
            Type::BOOL,
            Type::TIMESTAMPTZ,
            Type::JSONB,
            Type::BYTEA,
        ]
        .contains(ty)
    }

    to_sql_checked!();
}

/// The index of `partition_key` among the fixed columns.
pub const KEY_COLUMN: usize = 6;

/// The SQL types of the fixed columns, in [`super::config::FIXED_COLUMNS`] order.
pub const FIXED_TYPES: [Type; 10] = [
    Type::TEXT,
    Type::TEXT,
    Type::INT8,
    Type::INT4,
    Type::INT8,
    Type::TIMESTAMPTZ,
    Type::TEXT,
    Type::JSONB,
    Type::BYTEA,
    Type::JSONB,
];

/// A column type's driver type.
pub fn column_type(kind: ColumnType) -> Type {
    match kind {
        ColumnType::Text => Type::TEXT,
        ColumnType::Bigint => Type::INT8,
        ColumnType::Double => Type::FLOAT8,
        ColumnType::Boolean => Type::BOOL,
        ColumnType::Timestamptz => Type::TIMESTAMPTZ,
        ColumnType::Jsonb => Type::JSONB,
    }
}

/// Where a row comes from.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    /// The source hub's id.
    pub source_hub: &'a str,
    /// The source partition.
    pub partition: &'a str,
    /// The event's source position.
    pub position: Position,
    /// Its index among the events of one source event (an editor may split one).
    pub part: i32,
}

/// Whether `body` is JSON that jsonb can store.
fn is_storable_json(body: &[u8]) -> bool {
    // jsonb refuses the escape \u0000; a JSON text holding it is kept as bytes.
    !body.windows(6).any(|w| w.eq_ignore_ascii_case(b"\\u0000"))
        && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

/// The row of `event`, or why it cannot be one.
pub fn row(
    event: &EventData,
    origin: Origin<'_>,
    columns: &[ColumnMap],
) -> Result<Vec<Cell>, String> {
    let offset = i64::try_from(origin.position.offset)
        .map_err(|_| format!("offset {} is above bigint's range", origin.position.offset))?;
    let json = is_storable_json(&event.body);
    let mut properties = serde_json::Map::with_capacity(event.properties.len());
    for (key, value) in &event.properties {
        properties.insert(key.to_string(), property_json(value));
    }
    let properties = serde_json::to_vec(&Value::Object(properties)).map_err(|e| e.to_string())?;
    let mut cells = Vec::with_capacity(10 + columns.len());
    cells.extend([
        Cell::Text(origin.source_hub.to_owned()),
        Cell::Text(origin.partition.to_owned()),
        Cell::Bigint(origin.position.sequence_number),
        Cell::Int(origin.part),
        Cell::Bigint(offset),
        Cell::Time(origin.position.enqueued_time_ms.saturating_mul(1000)),
        event.partition_key.clone().map_or(Cell::Null, Cell::Text),
        if json {
            Cell::Json(event.body.to_vec())
        } else {
            Cell::Null
        },
        if json {
            Cell::Null
        } else {
            Cell::Bytes(event.body.to_vec())
        },
        Cell::Json(properties),
    ]);
    if columns.is_empty() {
        return Ok(cells);
    }
    let body: Option<Value> = if json {
        serde_json::from_slice(&event.body).ok()
    } else {
        None
    };
    for column in columns {
        let value = body.as_ref().and_then(|body| column.path.get(body));
        cells.push(cell(value, column)?);
    }
    Ok(cells)
}

/// The time `text` (RFC 3339, or .NET's `"u"` format) in microseconds since the Unix epoch:
/// PostgreSQL's precision, so a time with microseconds is stored as the event wrote it. Finer
/// digits are rounded to the nearest microsecond, as PostgreSQL rounds a time it reads as text
/// (a tie, exactly half of one, goes to the later microsecond here; PostgreSQL's `rint` takes
/// the even one).
fn time_us(text: &str) -> Option<i64> {
    let ns = crate::metadata::parse_time(text)?.unix_timestamp_nanos();
    i64::try_from((ns + 500).div_euclid(1000)).ok()
}

/// A mapped column's cell from the body field's `value`.
fn cell(value: Option<&Value>, column: &ColumnMap) -> Result<Cell, String> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(Cell::Null);
    };
    let cell = match (column.kind, value) {
        (ColumnType::Text, Value::String(text)) => Some(Cell::Text(text.clone())),
        (ColumnType::Text, other) => Some(Cell::Text(other.to_string())),
        (ColumnType::Bigint, Value::Number(n)) => n.as_i64().map(Cell::Bigint),
        (ColumnType::Double, Value::Number(n)) => n.as_f64().map(Cell::Double),
        (ColumnType::Boolean, Value::Bool(b)) => Some(Cell::Bool(*b)),
        (ColumnType::Timestamptz, Value::String(text)) => time_us(text).map(Cell::Time),
        (ColumnType::Timestamptz, Value::Number(n)) => {
            n.as_i64().map(|ms| Cell::Time(ms.saturating_mul(1000)))
        }
        (ColumnType::Jsonb, other) => serde_json::to_vec(other).ok().map(Cell::Json),
        _ => None,
    };
    cell.ok_or_else(|| {
        let shown: String = value.to_string().chars().take(64).collect();
        format!(
            "column {} ({}): the field {} holds {shown}, which is not a {}",
            column.name,
            column.kind.sql(),
            column.path_text,
            match column.kind {
                ColumnType::Bigint => "64-bit integer",
                ColumnType::Double => "number",
                ColumnType::Boolean => "boolean",
                ColumnType::Timestamptz => "RFC 3339 time or milliseconds since the Unix epoch",
                _ => "value",
            }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::config::ColumnType;
    use tributary_edit::FieldPath;

    fn column(kind: ColumnType) -> ColumnMap {
        ColumnMap {
            name: "c".into(),
            path_text: "body.x".into(),
            path: FieldPath::parse("x").unwrap(),
            kind,
        }
    }

    #[test]
    fn fields_convert_by_type_and_a_mismatch_is_refused_with_the_column() {
        let get = |json: &str, kind| {
            let body: Value = serde_json::from_str(json).unwrap();
            let column = column(kind);
            cell(column.path.get(&body), &column)
        };
        assert_eq!(get(r#"{"x": 5}"#, ColumnType::Bigint), Ok(Cell::Bigint(5)));
        assert_eq!(
            get(r#"{"x": 2.5}"#, ColumnType::Double),
            Ok(Cell::Double(2.5))
        );
        assert_eq!(
            get(r#"{"x": 5}"#, ColumnType::Text),
            Ok(Cell::Text("5".into()))
        );
        assert_eq!(get(r#"{"y": 5}"#, ColumnType::Bigint), Ok(Cell::Null));
        assert_eq!(get(r#"{"x": null}"#, ColumnType::Boolean), Ok(Cell::Null));
        assert_eq!(
            get(r#"{"x": "1970-01-01T00:00:01Z"}"#, ColumnType::Timestamptz),
            Ok(Cell::Time(1_000_000))
        );
        assert_eq!(
            get(r#"{"x": 1000}"#, ColumnType::Timestamptz),
            Ok(Cell::Time(1_000_000)),
            "a number is milliseconds"
        );
        let refused = get(r#"{"x": "five"}"#, ColumnType::Bigint).unwrap_err();
        assert!(
            refused.contains("column c (bigint)") && refused.contains("body.x"),
            "{refused}"
        );
        assert!(get(r#"{"x": 2.5}"#, ColumnType::Bigint).is_err());
    }

    #[test]
    fn times_keep_their_microseconds_and_round_finer_digits() {
        // 2026-11-28T10:00:00Z in microseconds since the Unix epoch.
        let whole_us = 1_795_860_000_000_000;
        assert_eq!(
            time_us("2026-11-28T10:00:00.123456Z"),
            Some(whole_us + 123_456)
        );
        assert_eq!(
            time_us("2026-11-28T10:00:00.1234564Z"),
            Some(whole_us + 123_456)
        );
        assert_eq!(
            time_us("2026-11-28T10:00:00.1234565Z"),
            Some(whole_us + 123_457)
        );
        assert_eq!(
            time_us("2026-11-28T10:00:00.9999996Z"),
            Some(whole_us + 1_000_000)
        );
        assert_eq!(time_us("2026-11-28 10:00:00Z"), Some(whole_us));
        assert_eq!(time_us("1969-12-31T23:59:59.9999994Z"), Some(-1));
        assert_eq!(time_us("1969-12-31T23:59:59.9999995Z"), Some(0));
        assert_eq!(time_us("tomorrow"), None);
    }

    #[test]
    fn only_json_that_jsonb_can_hold_is_stored_as_json() {
        assert!(is_storable_json(br#"{"a": [1, "b"]}"#));
        assert!(is_storable_json(b"42"));
        assert!(!is_storable_json(b"plain text"));
        assert!(!is_storable_json(br#"{"a": "\u0000"}"#));
        assert!(!is_storable_json(b"{\"a\": 1"));
    }
}
