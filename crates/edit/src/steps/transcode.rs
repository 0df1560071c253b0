//! `transcode` (Avro ⇄ JSON bodies, with apache-avro), `compress` and `decompress` (gzip and
//! zstd bodies, marked by the application property `content-encoding`).
//!
//! ```toml
//! [[step]]
//! kind = "transcode"
//! from = "avro"                 # or "json"
//! to = "json"                   # or "avro"
//! schema = "reading.avsc"       # the writer schema, relative to the task file
//! container = false             # from = "avro": the body is an object container file
//! single_object = false         # to = "avro": write the single-object encoding
//!
//! [[step]]
//! kind = "compress"
//! algorithm = "zstd"            # or "gzip"
//! level = 3                     # gzip 0..=9 (default 6), zstd 1..=19 (default 3)
//! min_bytes = 256               # smaller bodies pass unchanged
//!
//! [[step]]
//! kind = "decompress"
//! algorithm = "gzip"            # optional: accept only this one (default: both)
//! max_bytes = 1048576           # refuse what would inflate beyond this
//! ```
//!
//! # Avro → JSON
//!
//! The body is a binary datum of the schema, or the single-object encoding (`C3 01`, the
//! schema's 8-byte Rabin fingerprint, the datum; a body that starts so is read as one when the
//! fingerprint is the schema's, or when it does not decode as a plain datum, and then refused
//! naming both fingerprints), or with `container = true` an object container file whose
//! records become one JSON array (the file's own writer schema is resolved to the step's;
//! compressed containers are refused, see below). The whole body must be one datum: bytes
//! left over are a refusal. Values map as: records → objects, arrays, maps → objects, enums →
//! their symbol, unions → the branch's value (no wrapper), bytes and fixed → base64 strings,
//! `timestamp-millis`/`-micros`/`-nanos` → RFC 3339 strings in UTC (years 0000–9999),
//! `date` → `YYYY-MM-DD`, `decimal` → a decimal string (at most 128 bits), `big-decimal` →
//! a decimal string, `uuid` → its hyphenated string, `duration` → `{"months", "days",
//! "millis"}`, `time-*` and `local-timestamp-*` → their numbers. NaN and infinite floats have
//! no JSON form and are refused. The content type becomes `application/json`.
//!
//! # JSON → Avro
//!
//! The JSON body is checked against the schema field by field and written as a binary datum
//! (content type `avro/binary`): the same mapping read backwards (timestamps and dates also
//! as numbers; decimals also as JSON numbers), a union takes the first branch the value fits,
//! a missing field takes its default, and a field the schema does not have is a refusal (it
//! would be lost). Every refusal names the path (`at reading.site.zone: ...`).
//!
//! # Bounds (a body is producer input)
//!
//! - apache-avro allocates at most [`AVRO_ALLOCATION_BYTES_MAX`] for one length (set once
//!   per process, when the first transcode step is compiled).
//! - Schemas are refused when a datum could make the decoder recurse or loop without bound:
//!   recursive named types (decoding recurses once a level, so a body could overflow the
//!   stack) and arrays of items that take no bytes (a few bytes could stand for billions of
//!   items). A container's own writer schema is checked the same way before it is read, and
//!   its records are capped at [`CONTAINER_RECORDS_MAX`]. A compressed container is refused:
//!   apache-avro inflates its blocks without a bound; write it with the `null` codec and use
//!   the `compress` step on the whole event.
//!
//! # compress / decompress
//!
//! `compress` leaves alone bodies under `min_bytes`, events that already carry a
//! `content-encoding`, and bodies that would not get smaller; otherwise it replaces the body
//! and sets `content-encoding` to `gzip` or `zstd` (the content type is left as it is: it
//! names what the body is once decoded, as in HTTP). `decompress` decodes what
//! `content-encoding` names (or, without it, a body that starts with the gzip or zstd magic
//! bytes; other bodies pass unchanged), removes the property, and refuses — without
//! inflating it — a body that would inflate beyond `max_bytes` (read through a reader that
//! stops one byte past the limit).

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use apache_avro::schema::{
    DecimalSchema, EnumSchema, FixedSchema, Name, RecordSchema, ResolvedSchema, SchemaKind,
    UnionSchema,
};
use apache_avro::types::Value as Avro;
use apache_avro::{Schema, headers::HeaderBuilder};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Number, Value as Json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tributary_event::PropertyValue;

use crate::item::Item;
use crate::limits::HUB_EVENT_BYTES_MAX;
use crate::spec::{CompileContext, SpecError};
use crate::step::{Context, Output, Step};

/// The most apache-avro allocates for one string, bytes, fixed or block length read from a
/// body: a body is at most one event, so a larger length is a lie that would only allocate.
pub const AVRO_ALLOCATION_BYTES_MAX: usize = HUB_EVENT_BYTES_MAX;

/// The most records one container body may hold: its JSON array must still fit an event,
/// and records of fewer than 100 bytes of JSON are rare.
pub const CONTAINER_RECORDS_MAX: usize = HUB_EVENT_BYTES_MAX / 100;

/// The largest fixed size a schema may declare (a fixed value is read into a buffer of that
/// size before any check): no fixed value can be larger than the event holding it.
const FIXED_BYTES_MAX: usize = HUB_EVENT_BYTES_MAX;

/// The application property that names a body's compression.
pub const CONTENT_ENCODING: &str = "content-encoding";

/// Bodies smaller than this are not compressed by default: below a few hundred bytes gzip's
/// and zstd's headers eat most of the gain.
const COMPRESS_MIN_BYTES_DEFAULT: usize = 256;

/// gzip's levels, and the default (zlib's own).
const GZIP_LEVELS: std::ops::RangeInclusive<i32> = 0..=9;
const GZIP_LEVEL_DEFAULT: i32 = 6;

/// zstd's levels offered: 20–22 ("ultra") need tens of MiB of memory a call and gain nothing
/// on bodies under 1 MiB. The default is zstd's own.
const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = 1..=19;
const ZSTD_LEVEL_DEFAULT: i32 = 3;

/// `decompress` refuses bodies inflating beyond this by default: the largest event a hub
/// takes, so anything larger could not be forwarded anyway.
pub const DECOMPRESS_BYTES_MAX_DEFAULT: usize = HUB_EVENT_BYTES_MAX;

/// The largest `max_bytes` accepted: 20 MiB, the largest event of Event Hubs' dedicated tier.
const DECOMPRESS_BYTES_MAX_LIMIT: usize = 20 * 1024 * 1024;

/// The largest zstd window (log2) a frame may ask the decoder to allocate: 8 MiB, what zstd's
/// levels 1–19 use at most; frames written with `--long` or ultra levels are refused rather
/// than letting a body make the decoder allocate up to 2 GiB.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
const SINGLE_OBJECT_MAGIC: [u8; 2] = [0xc3, 0x01];
/// The single-object header: the magic and the 8-byte fingerprint.
const SINGLE_OBJECT_HEADER_BYTES: usize = SINGLE_OBJECT_MAGIC.len() + 8;
const CONTAINER_MAGIC: [u8; 4] = *b"Obj\x01";

/// The Julian day of 1970-01-01 (Avro dates count days from it).
const UNIX_EPOCH_JULIAN_DAY: i32 = 2_440_588;

const JSON_CONTENT_TYPE: &str = "application/json";
const AVRO_CONTENT_TYPE: &str = "avro/binary";

// ---------------------------------------------------------------------------------------------
// transcode

/// A body format `transcode` reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Apache Avro binary.
    Avro,
    /// JSON.
    Json,
}

/// The `transcode` step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranscodeSpec {
    /// The body's format now.
    pub from: Format,
    /// The body's format after the step.
    pub to: Format,
    /// The Avro schema file (JSON), relative to the task file.
    pub schema: PathBuf,
    /// `from = "avro"`: the body is an object container file (its records become one array).
    #[serde(default)]
    pub container: bool,
    /// `to = "avro"`: write the single-object encoding (header and fingerprint first).
    #[serde(default)]
    pub single_object: bool,
}

pub(crate) fn compile_transcode(
    name: String,
    spec: TranscodeSpec,
    context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let direction = match (spec.from, spec.to) {
        (Format::Avro, Format::Json) => Direction::AvroToJson {
            container: spec.container,
        },
        (Format::Json, Format::Avro) => Direction::JsonToAvro {
            single_object: spec.single_object,
        },
        (from, _) => {
            return Err(SpecError::table(format!(
                "from = {from:?} and to the same: transcode converts avro to json or json to avro"
            )));
        }
    };
    if spec.container && spec.from != Format::Avro {
        return Err(SpecError::at(
            "container",
            "applies to from = \"avro\" only",
        ));
    }
    if spec.single_object && spec.to != Format::Avro {
        return Err(SpecError::at(
            "single_object",
            "applies to to = \"avro\" only (reading, it is recognised by its header)",
        ));
    }
    bound_avro_allocations();
    let path = context.path(&spec.schema);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| SpecError::at("schema", format!("cannot read {}: {e}", path.display())))?;
    let schema = AvroSchema::parse(&text, spec.container)
        .map_err(|e| SpecError::at("schema", format!("{}: {e}", path.display())))?;
    Ok(Arc::new(Transcode {
        name,
        schema,
        direction,
    }))
}

/// Sets apache-avro's process-wide allocation bound (it keeps the first value it is given).
fn bound_avro_allocations() {
    let bound = apache_avro::util::max_allocation_bytes(AVRO_ALLOCATION_BYTES_MAX);
    if bound != AVRO_ALLOCATION_BYTES_MAX {
        tracing::warn!(
            bound,
            wanted = AVRO_ALLOCATION_BYTES_MAX,
            "apache-avro's allocation bound was set before the first transcode step"
        );
    }
}

#[derive(Debug, Clone, Copy)]
enum Direction {
    AvroToJson { container: bool },
    JsonToAvro { single_object: bool },
}

#[derive(Debug)]
struct Transcode {
    name: String,
    schema: AvroSchema,
    direction: Direction,
}

impl Step for Transcode {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, _context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        for mut item in items {
            let result = match self.direction {
                Direction::AvroToJson { container } => {
                    let body = item.body().clone();
                    self.schema.decode(&body, container).map(|json| {
                        item.event_mut().content_type = Some(JSON_CONTENT_TYPE.to_owned());
                        item.set_json(json);
                    })
                }
                Direction::JsonToAvro { single_object } => match item.json() {
                    None => Err("the body is not JSON".to_owned()),
                    Some(json) => self.schema.encode(json, single_object).map(|avro| {
                        item.set_body(Bytes::from(avro));
                        item.event_mut().content_type = Some(AVRO_CONTENT_TYPE.to_owned());
                    }),
                },
            };
            match result {
                Ok(()) => out.pass(item),
                Err(reason) => out.reject(item, reason),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Avro schemas

/// A schema compiled for transcoding: the schema, its named types, its single-object header.
#[derive(Debug)]
struct AvroSchema {
    schema: Schema,
    names: Names,
    header: Vec<u8>,
}

type Names = HashMap<Name, Schema>;

impl AvroSchema {
    fn parse(text: &str, container: bool) -> Result<AvroSchema, String> {
        let schema = Schema::parse_str(text).map_err(|e| format!("not an Avro schema: {e}"))?;
        let names = named_types(&schema)?;
        let zero_width = Vetting::new(&names).vet(&schema)?;
        if zero_width && container {
            return Err(
                "a record of this schema takes no bytes, so a container could hold any number"
                    .to_owned(),
            );
        }
        let header =
            apache_avro::headers::RabinFingerprintHeader::from_schema(&schema).build_header();
        Ok(AvroSchema {
            schema,
            names,
            header,
        })
    }

    fn decode(&self, body: &[u8], container: bool) -> Result<Json, String> {
        if container {
            return self.decode_container(body);
        }
        if body.len() >= SINGLE_OBJECT_HEADER_BYTES && body.starts_with(&SINGLE_OBJECT_MAGIC) {
            let (header, datum) = body.split_at(SINGLE_OBJECT_HEADER_BYTES);
            if header == self.header.as_slice() {
                return self.decode_datum(datum);
            }
            // Perhaps a plain datum that happens to start with the magic bytes.
            return self.decode_datum(body).map_err(|_| {
                format!(
                    "the body is Avro single-object encoded with schema fingerprint {}, but the \
                     schema's is {}: it was written with another schema",
                    hex(&header[SINGLE_OBJECT_MAGIC.len()..]),
                    hex(&self.header[SINGLE_OBJECT_MAGIC.len()..])
                )
            });
        }
        self.decode_datum(body)
    }

    fn decode_datum(&self, bytes: &[u8]) -> Result<Json, String> {
        let mut rest = bytes;
        let value = apache_avro::from_avro_datum(&self.schema, &mut rest, None)
            .map_err(|e| format!("not an Avro datum of the schema: {e}"))?;
        if !rest.is_empty() {
            return Err(format!(
                "{} bytes are left after the Avro datum: it was written with another schema",
                rest.len()
            ));
        }
        to_json(value, &self.schema, &self.names).map_err(Mismatch::describe)
    }

    fn decode_container(&self, body: &[u8]) -> Result<Json, String> {
        let writer = container_writer_schema(body)?;
        let writer_names =
            named_types(&writer).map_err(|e| format!("the container's writer schema: {e}"))?;
        if Vetting::new(&writer_names)
            .vet(&writer)
            .map_err(|e| format!("the container's writer schema: {e}"))?
        {
            return Err("the container's records take no bytes; refused".to_owned());
        }
        let reader = apache_avro::Reader::with_schema(&self.schema, body)
            .map_err(|e| format!("not an Avro object container of the schema: {e}"))?;
        let mut records = Vec::new();
        for (index, record) in reader.enumerate() {
            if index >= CONTAINER_RECORDS_MAX {
                return Err(format!(
                    "the container holds more than {CONTAINER_RECORDS_MAX} records"
                ));
            }
            let record = record.map_err(|e| format!("container record {index}: {e}"))?;
            let json = to_json(record, &self.schema, &self.names)
                .map_err(|m| m.at(format!("[{index}]")).describe())?;
            records.push(json);
        }
        Ok(Json::Array(records))
    }

    fn encode(&self, json: &Json, single_object: bool) -> Result<Vec<u8>, String> {
        let value = from_json(json, &self.schema, &self.names).map_err(Mismatch::describe)?;
        let datum = apache_avro::to_avro_datum(&self.schema, value)
            .map_err(|e| format!("the JSON does not fit the Avro schema: {e}"))?;
        if !single_object {
            return Ok(datum);
        }
        let mut framed = Vec::with_capacity(self.header.len() + datum.len());
        framed.extend_from_slice(&self.header);
        framed.extend_from_slice(&datum);
        Ok(framed)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn named_types(schema: &Schema) -> Result<Names, String> {
    let resolved = ResolvedSchema::try_from(schema).map_err(|e| e.to_string())?;
    Ok(resolved
        .get_names()
        .iter()
        .map(|(name, schema)| (name.clone(), (*schema).clone()))
        .collect())
}

/// Reads a container's header (its metadata is itself an Avro map, read with apache-avro) and
/// returns its writer schema, refusing compressed containers.
fn container_writer_schema(body: &[u8]) -> Result<Schema, String> {
    let Some(mut header) = body.strip_prefix(&CONTAINER_MAGIC) else {
        return Err("not an Avro object container file (it does not start with Obj 01)".to_owned());
    };
    let metadata = apache_avro::from_avro_datum(&Schema::map(Schema::Bytes), &mut header, None)
        .map_err(|e| format!("the Avro container header is malformed: {e}"))?;
    let Avro::Map(metadata) = metadata else {
        return Err("the Avro container header is malformed".to_owned());
    };
    match metadata.get("avro.codec") {
        None => {}
        Some(Avro::Bytes(codec)) if codec == b"null" => {}
        Some(Avro::Bytes(codec)) => {
            return Err(format!(
                "the Avro container's blocks are compressed ({}); only the null codec is read, \
                 since compressed blocks inflate without a bound (compress the whole event \
                 with the compress step instead)",
                String::from_utf8_lossy(codec)
            ));
        }
        Some(_) => return Err("the Avro container's codec is not bytes".to_owned()),
    }
    let Some(Avro::Bytes(text)) = metadata.get("avro.schema") else {
        return Err("the Avro container has no writer schema".to_owned());
    };
    let text = std::str::from_utf8(text)
        .map_err(|_| "the Avro container's writer schema is not UTF-8".to_owned())?;
    Schema::parse_str(text).map_err(|e| format!("the Avro container's writer schema: {e}"))
}

/// Walks a schema refusing what would let a body make the decoder recurse or loop without
/// bound; answers whether a datum of the schema can take no bytes at all.
struct Vetting<'a> {
    names: &'a Names,
    open: Vec<Name>,
    done: HashMap<Name, bool>,
}

impl<'a> Vetting<'a> {
    fn new(names: &'a Names) -> Vetting<'a> {
        Vetting {
            names,
            open: Vec::new(),
            done: HashMap::new(),
        }
    }

    fn vet(&mut self, schema: &Schema) -> Result<bool, String> {
        Ok(match schema {
            Schema::Null => true,
            Schema::Record(record) => self.vet_record(record)?,
            Schema::Ref { name } => self.vet_ref(name)?,
            Schema::Array(array) => {
                if self.vet(&array.items)? {
                    return Err(
                        "an array of items that take no bytes could stand for billions of \
                         items in a few bytes; refused"
                            .to_owned(),
                    );
                }
                false
            }
            Schema::Map(map) => {
                self.vet(&map.types)?;
                false
            }
            Schema::Union(union) => {
                for variant in union.variants() {
                    self.vet(variant)?;
                }
                false
            }
            Schema::Fixed(fixed) if fixed.size > FIXED_BYTES_MAX => {
                return Err(format!(
                    "fixed {} is {} bytes, more than an event holds ({FIXED_BYTES_MAX})",
                    fixed.name, fixed.size
                ));
            }
            Schema::Fixed(fixed) => fixed.size == 0,
            Schema::Decimal(decimal) => self.vet(&decimal.inner)?,
            _ => false,
        })
    }

    fn vet_record(&mut self, record: &RecordSchema) -> Result<bool, String> {
        if let Some(zero_width) = self.done.get(&record.name) {
            return Ok(*zero_width);
        }
        self.open.push(record.name.clone());
        let mut zero_width = true;
        for field in &record.fields {
            zero_width &= self.vet(&field.schema)?;
        }
        self.open.pop();
        self.done.insert(record.name.clone(), zero_width);
        Ok(zero_width)
    }

    fn vet_ref(&mut self, name: &Name) -> Result<bool, String> {
        if let Some(zero_width) = self.done.get(name) {
            return Ok(*zero_width);
        }
        if self.open.contains(name) {
            return Err(format!(
                "{name} contains itself; recursive schemas are refused, since decoding one \
                 recurses once a level and a body could nest deep enough to overflow the stack"
            ));
        }
        let schema = self
            .names
            .get(name)
            .ok_or_else(|| format!("{name} is not defined"))?;
        let zero_width = self.vet(schema)?;
        self.done.insert(name.clone(), zero_width);
        Ok(zero_width)
    }
}

// ---------------------------------------------------------------------------------------------
// Avro ⇄ JSON values

/// Why a value does not fit the schema, and where (innermost segment first while unwinding).
#[derive(Debug)]
struct Mismatch {
    path: Vec<String>,
    message: String,
}

impl Mismatch {
    fn new(message: impl Into<String>) -> Mismatch {
        Mismatch {
            path: Vec::new(),
            message: message.into(),
        }
    }

    fn at(mut self, segment: impl Into<String>) -> Mismatch {
        self.path.push(segment.into());
        self
    }

    fn describe(self) -> String {
        if self.path.is_empty() {
            return self.message;
        }
        let mut path = String::new();
        for segment in self.path.iter().rev() {
            if !path.is_empty() && !segment.starts_with('[') {
                path.push('.');
            }
            path.push_str(segment);
        }
        format!("at {path}: {}", self.message)
    }
}

fn schema_kind(schema: &Schema) -> String {
    format!("{:?}", SchemaKind::from(schema)).to_lowercase()
}

fn lookup<'s>(names: &'s Names, name: &Name) -> Result<&'s Schema, Mismatch> {
    names
        .get(name)
        .ok_or_else(|| Mismatch::new(format!("{name} is not defined")))
}

/// The JSON form of a decoded value of `schema`.
fn to_json(value: Avro, schema: &Schema, names: &Names) -> Result<Json, Mismatch> {
    Ok(match (schema, value) {
        (Schema::Ref { name }, value) => return to_json(value, lookup(names, name)?, names),
        (Schema::Null, Avro::Null) => Json::Null,
        (Schema::Boolean, Avro::Boolean(b)) => Json::Bool(b),
        (Schema::Int, Avro::Int(n)) => Json::from(n),
        (Schema::Long, Avro::Long(n)) => Json::from(n),
        (Schema::Float, Avro::Float(f)) => float_json(widen(f))?,
        (Schema::Double, Avro::Double(f)) => float_json(f)?,
        (Schema::Bytes, Avro::Bytes(b)) | (Schema::Fixed(_), Avro::Fixed(_, b)) => {
            Json::String(BASE64.encode(b))
        }
        (Schema::String, Avro::String(s)) | (Schema::Enum(_), Avro::Enum(_, s)) => Json::String(s),
        (Schema::Union(union), Avro::Union(index, value)) => {
            let branch = usize::try_from(index)
                .ok()
                .and_then(|i| union.variants().get(i))
                .ok_or_else(|| Mismatch::new(format!("union branch {index} does not exist")))?;
            return to_json(*value, branch, names);
        }
        (Schema::Array(array), Avro::Array(items)) => Json::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| {
                    to_json(item, &array.items, names).map_err(|m| m.at(format!("[{i}]")))
                })
                .collect::<Result<_, _>>()?,
        ),
        (Schema::Map(map), Avro::Map(entries)) => Json::Object(
            entries
                .into_iter()
                .map(|(key, item)| match to_json(item, &map.types, names) {
                    Ok(json) => Ok((key, json)),
                    Err(m) => Err(m.at(format!("[{key:?}]"))),
                })
                .collect::<Result<_, _>>()?,
        ),
        (Schema::Record(record), Avro::Record(fields)) => record_json(record, fields, names)?,
        (schema, value) => return logical_json(schema, value),
    })
}

/// An f32 as the f64 of its shortest decimal form, so 0.1f32 reads 0.1 in JSON, not
/// 0.10000000149011612.
fn widen(f: f32) -> f64 {
    f.to_string().parse().unwrap_or(f64::from(f))
}

fn float_json(f: f64) -> Result<Json, Mismatch> {
    Number::from_f64(f)
        .map(Json::Number)
        .ok_or_else(|| Mismatch::new(format!("{f} has no JSON form (JSON numbers are finite)")))
}

fn record_json(
    record: &RecordSchema,
    fields: Vec<(String, Avro)>,
    names: &Names,
) -> Result<Json, Mismatch> {
    if fields.len() != record.fields.len() {
        return Err(Mismatch::new(format!(
            "the datum has {} fields, the schema's {} has {}",
            fields.len(),
            record.name,
            record.fields.len()
        )));
    }
    let mut object = Map::new();
    for (field, (name, value)) in record.fields.iter().zip(fields) {
        let json = to_json(value, &field.schema, names).map_err(|m| m.at(name.clone()))?;
        object.insert(name, json);
    }
    Ok(Json::Object(object))
}

/// Logical types, and the mismatches (a datum that ended early decodes as nulls).
fn logical_json(schema: &Schema, value: Avro) -> Result<Json, Mismatch> {
    Ok(match (schema, value) {
        (Schema::Date, Avro::Date(days)) => Json::String(date_text(days)?),
        (Schema::TimeMillis, Avro::TimeMillis(n)) => Json::from(n),
        (Schema::TimeMicros, Avro::TimeMicros(n))
        | (Schema::LocalTimestampMillis, Avro::LocalTimestampMillis(n))
        | (Schema::LocalTimestampMicros, Avro::LocalTimestampMicros(n))
        | (Schema::LocalTimestampNanos, Avro::LocalTimestampNanos(n)) => Json::from(n),
        (Schema::TimestampMillis, Avro::TimestampMillis(n)) => timestamp_json(n, 1_000_000)?,
        (Schema::TimestampMicros, Avro::TimestampMicros(n)) => timestamp_json(n, 1_000)?,
        (Schema::TimestampNanos, Avro::TimestampNanos(n)) => timestamp_json(n, 1)?,
        (Schema::Decimal(decimal), Avro::Decimal(value)) => {
            let bytes = Vec::<u8>::try_from(&value).map_err(|e| Mismatch::new(e.to_string()))?;
            Json::String(decimal_text(&bytes, decimal.scale)?)
        }
        (Schema::BigDecimal, Avro::BigDecimal(value)) => Json::String(value.to_string()),
        (Schema::Uuid, Avro::Uuid(uuid)) => Json::String(uuid.hyphenated().to_string()),
        (Schema::Duration, Avro::Duration(duration)) => {
            let mut object = Map::new();
            object.insert("months".into(), u32::from(duration.months()).into());
            object.insert("days".into(), u32::from(duration.days()).into());
            object.insert("millis".into(), u32::from(duration.millis()).into());
            Json::Object(object)
        }
        (schema, _) => {
            return Err(Mismatch::new(format!(
                "expected {}, but the datum ended early or was written with another schema",
                schema_kind(schema)
            )));
        }
    })
}

fn timestamp_json(count: i64, nanos_per_unit: i128) -> Result<Json, Mismatch> {
    let nanos = i128::from(count) * nanos_per_unit;
    OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .map(Json::String)
        .ok_or_else(|| Mismatch::new(format!("timestamp {count} is outside the years 0000–9999")))
}

fn date_text(days: i32) -> Result<String, Mismatch> {
    days.checked_add(UNIX_EPOCH_JULIAN_DAY)
        .and_then(|julian| time::Date::from_julian_day(julian).ok())
        .map(|date| date.to_string())
        .ok_or_else(|| Mismatch::new(format!("date {days} is outside the years -9999–9999")))
}

/// A big-endian two's complement unscaled value (at most 128 bits) as decimal text.
fn decimal_text(bytes: &[u8], scale: usize) -> Result<String, Mismatch> {
    if bytes.len() > 16 {
        return Err(Mismatch::new(format!(
            "a decimal of {} bytes is wider than the 128 bits transcode reads",
            bytes.len()
        )));
    }
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    let mut wide = [if negative { 0xff } else { 0 }; 16];
    wide[16 - bytes.len()..].copy_from_slice(bytes);
    let unscaled = i128::from_be_bytes(wide);
    let digits = unscaled.unsigned_abs().to_string();
    let sign = if unscaled < 0 { "-" } else { "" };
    if scale == 0 {
        return Ok(format!("{sign}{digits}"));
    }
    if digits.len() > scale {
        let (whole, fraction) = digits.split_at(digits.len() - scale);
        return Ok(format!("{sign}{whole}.{fraction}"));
    }
    Ok(format!(
        "{sign}0.{}{digits}",
        "0".repeat(scale - digits.len())
    ))
}

fn json_kind(json: &Json) -> &'static str {
    match json {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

fn expected(what: &str, json: &Json) -> Mismatch {
    match json {
        Json::Number(n) => Mismatch::new(format!("expected {what}, found the number {n}")),
        other => Mismatch::new(format!("expected {what}, found {}", json_kind(other))),
    }
}

fn int(json: &Json) -> Result<i32, Mismatch> {
    json.as_i64()
        .and_then(|n| i32::try_from(n).ok())
        .ok_or_else(|| expected("a 32-bit integer", json))
}

fn long(json: &Json) -> Result<i64, Mismatch> {
    json.as_i64()
        .ok_or_else(|| expected("a 64-bit integer", json))
}

fn text(json: &Json) -> Result<&str, Mismatch> {
    json.as_str().ok_or_else(|| expected("a string", json))
}

fn base64_bytes(json: &Json) -> Result<Vec<u8>, Mismatch> {
    BASE64
        .decode(text(json)?)
        .map_err(|e| Mismatch::new(format!("expected base64 bytes: {e}")))
}

fn float32(json: &Json) -> Result<f32, Mismatch> {
    let wide = json.as_f64().ok_or_else(|| expected("a number", json))?;
    // The nearest f32; a finite number beyond f32's range becomes infinite.
    let narrow = wide as f32;
    if !narrow.is_finite() {
        return Err(expected("a number within a float's range", json));
    }
    Ok(narrow)
}

fn fixed_from_json(json: &Json, fixed: &FixedSchema) -> Result<Avro, Mismatch> {
    let bytes = base64_bytes(json)?;
    if bytes.len() != fixed.size {
        return Err(Mismatch::new(format!(
            "expected {} bytes (fixed {}), found {}",
            fixed.size,
            fixed.name,
            bytes.len()
        )));
    }
    Ok(Avro::Fixed(fixed.size, bytes))
}

fn enum_from_json(json: &Json, symbols: &EnumSchema) -> Result<Avro, Mismatch> {
    let symbol = text(json)?;
    let index = symbols
        .symbols
        .iter()
        .position(|s| s == symbol)
        .and_then(|i| u32::try_from(i).ok())
        .ok_or_else(|| {
            Mismatch::new(format!(
                "{symbol:?} is not a symbol of {} ({})",
                symbols.name,
                symbols.symbols.join(", ")
            ))
        })?;
    Ok(Avro::Enum(index, symbol.to_owned()))
}

/// The Avro value of `schema` that a JSON value stands for.
fn from_json(json: &Json, schema: &Schema, names: &Names) -> Result<Avro, Mismatch> {
    Ok(match schema {
        Schema::Ref { name } => return from_json(json, lookup(names, name)?, names),
        Schema::Null if json.is_null() => Avro::Null,
        Schema::Boolean => {
            Avro::Boolean(json.as_bool().ok_or_else(|| expected("a boolean", json))?)
        }
        Schema::Int => Avro::Int(int(json)?),
        Schema::Long => Avro::Long(long(json)?),
        Schema::Float => Avro::Float(float32(json)?),
        Schema::Double => Avro::Double(json.as_f64().ok_or_else(|| expected("a number", json))?),
        Schema::Bytes => Avro::Bytes(base64_bytes(json)?),
        Schema::Fixed(fixed) => fixed_from_json(json, fixed)?,
        Schema::String => Avro::String(text(json)?.to_owned()),
        Schema::Enum(symbols) => enum_from_json(json, symbols)?,
        Schema::Union(union) => union_from_json(json, union, names)?,
        Schema::Array(array) => {
            let items = json.as_array().ok_or_else(|| expected("an array", json))?;
            let items = items.iter().enumerate().map(|(i, item)| {
                from_json(item, &array.items, names).map_err(|m| m.at(format!("[{i}]")))
            });
            Avro::Array(items.collect::<Result<_, _>>()?)
        }
        Schema::Map(map) => {
            let entries = json
                .as_object()
                .ok_or_else(|| expected("an object (a map)", json))?;
            let entries =
                entries
                    .iter()
                    .map(|(key, item)| match from_json(item, &map.types, names) {
                        Ok(value) => Ok((key.clone(), value)),
                        Err(m) => Err(m.at(format!("[{key:?}]"))),
                    });
            Avro::Map(entries.collect::<Result<_, _>>()?)
        }
        Schema::Record(record) => record_from_json(json, record, names)?,
        schema => logical_from_json(json, schema, names)?,
    })
}

/// Whether a JSON value could be of `schema` at all (so a union tries only likely branches).
fn could_match(json: &Json, schema: &Schema, names: &Names) -> bool {
    match schema {
        Schema::Ref { name } => names.get(name).is_some_and(|s| could_match(json, s, names)),
        Schema::Null => json.is_null(),
        Schema::Boolean => json.is_boolean(),
        Schema::Int
        | Schema::Long
        | Schema::Float
        | Schema::Double
        | Schema::TimeMillis
        | Schema::TimeMicros
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => json.is_number(),
        Schema::Bytes
        | Schema::String
        | Schema::Fixed(_)
        | Schema::Enum(_)
        | Schema::Uuid
        | Schema::BigDecimal => json.is_string(),
        Schema::Decimal(_)
        | Schema::Date
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos => json.is_string() || json.is_number(),
        Schema::Array(_) => json.is_array(),
        Schema::Map(_) | Schema::Record(_) | Schema::Duration => json.is_object(),
        Schema::Union(_) => true,
    }
}

fn union_from_json(json: &Json, union: &UnionSchema, names: &Names) -> Result<Avro, Mismatch> {
    let branch = |index: usize, value: Avro| {
        u32::try_from(index)
            .map(|index| Avro::Union(index, Box::new(value)))
            .map_err(|_| Mismatch::new("the union has too many branches"))
    };
    let candidates: Vec<(usize, &Schema)> = union
        .variants()
        .iter()
        .enumerate()
        .filter(|(_, schema)| could_match(json, schema, names))
        .collect();
    if let [(index, schema)] = candidates.as_slice() {
        // One branch fits the JSON kind: its own reason says more than "no branch".
        return branch(*index, from_json(json, schema, names)?);
    }
    for (index, schema) in candidates {
        if let Ok(value) = from_json(json, schema, names) {
            return branch(index, value);
        }
    }
    let kinds: Vec<String> = union.variants().iter().map(schema_kind).collect();
    Err(Mismatch::new(format!(
        "{} fits none of the union's branches ({})",
        json_kind(json),
        kinds.join(", ")
    )))
}

fn record_from_json(json: &Json, record: &RecordSchema, names: &Names) -> Result<Avro, Mismatch> {
    let object = json
        .as_object()
        .ok_or_else(|| expected(&format!("an object (record {})", record.name), json))?;
    if let Some(key) = object.keys().find(|k| !record.lookup.contains_key(*k)) {
        return Err(Mismatch::new(format!(
            "{key:?} is not a field of {} and would be lost",
            record.name
        )));
    }
    let mut fields = Vec::with_capacity(record.fields.len());
    for field in &record.fields {
        let value = match (object.get(&field.name), &field.default) {
            (Some(json), _) | (None, Some(json)) => from_json(json, &field.schema, names),
            (None, None) => Err(Mismatch::new("missing, and the schema gives no default")),
        }
        .map_err(|m| m.at(field.name.clone()))?;
        fields.push((field.name.clone(), value));
    }
    Ok(Avro::Record(fields))
}

fn logical_from_json(json: &Json, schema: &Schema, names: &Names) -> Result<Avro, Mismatch> {
    Ok(match schema {
        Schema::Date => Avro::Date(match json {
            Json::String(text) => date_days(text)?,
            _ => int(json)?,
        }),
        Schema::TimeMillis => Avro::TimeMillis(int(json)?),
        Schema::TimeMicros => Avro::TimeMicros(long(json)?),
        Schema::TimestampMillis => Avro::TimestampMillis(timestamp(json, 1_000_000)?),
        Schema::TimestampMicros => Avro::TimestampMicros(timestamp(json, 1_000)?),
        Schema::TimestampNanos => Avro::TimestampNanos(timestamp(json, 1)?),
        Schema::LocalTimestampMillis => Avro::LocalTimestampMillis(long(json)?),
        Schema::LocalTimestampMicros => Avro::LocalTimestampMicros(long(json)?),
        Schema::LocalTimestampNanos => Avro::LocalTimestampNanos(long(json)?),
        Schema::Decimal(decimal) => Avro::Decimal(decimal_from_json(json, decimal, names)?),
        Schema::BigDecimal => Avro::BigDecimal(
            apache_avro::BigDecimal::from_str(&number_text(json)?)
                .map_err(|e| Mismatch::new(format!("expected a decimal number: {e}")))?,
        ),
        Schema::Uuid => Avro::Uuid(
            apache_avro::Uuid::parse_str(text(json)?)
                .map_err(|e| Mismatch::new(format!("expected a UUID: {e}")))?,
        ),
        Schema::Duration => duration_from_json(json)?,
        schema => return Err(expected(&schema_kind(schema), json)),
    })
}

fn number_text(json: &Json) -> Result<String, Mismatch> {
    match json {
        Json::String(text) => Ok(text.clone()),
        Json::Number(n) => Ok(n.to_string()),
        other => Err(expected(
            "a decimal number (a string such as \"12.34\")",
            other,
        )),
    }
}

fn date_days(text: &str) -> Result<i32, Mismatch> {
    let format = time::macros::format_description!("[year]-[month]-[day]");
    time::Date::parse(text, format)
        .map(|date| date.to_julian_day() - UNIX_EPOCH_JULIAN_DAY)
        .map_err(|e| Mismatch::new(format!("expected a date such as 2024-05-01: {e}")))
}

fn timestamp(json: &Json, nanos_per_unit: i128) -> Result<i64, Mismatch> {
    let Json::String(text) = json else {
        return long(json);
    };
    let nanos = OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|e| Mismatch::new(format!("expected an RFC 3339 timestamp: {e}")))?
        .unix_timestamp_nanos();
    if nanos % nanos_per_unit != 0 {
        return Err(Mismatch::new(format!(
            "{text} is more precise than the schema's timestamp unit"
        )));
    }
    i64::try_from(nanos / nanos_per_unit)
        .map_err(|_| Mismatch::new(format!("{text} does not fit the schema's timestamp")))
}

fn duration_from_json(json: &Json) -> Result<Avro, Mismatch> {
    let part = |key: &str| {
        json.get(key)
            .and_then(Json::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                Mismatch::new(format!(
                    "expected a duration {{\"months\", \"days\", \"millis\"}} of 32-bit \
                     unsigned integers; {key} is missing or out of range"
                ))
            })
    };
    Ok(Avro::Duration(apache_avro::Duration::new(
        apache_avro::Months::new(part("months")?),
        apache_avro::Days::new(part("days")?),
        apache_avro::Millis::new(part("millis")?),
    )))
}

fn decimal_from_json(
    json: &Json,
    decimal: &DecimalSchema,
    names: &Names,
) -> Result<apache_avro::Decimal, Mismatch> {
    let text = number_text(json)?;
    let unscaled = unscaled_decimal(&text, decimal.scale, decimal.precision)?;
    let bytes = unscaled.to_be_bytes();
    // The shortest two's complement form: drop sign-extension bytes.
    let mut start = 0;
    while start + 1 < bytes.len()
        && ((bytes[start] == 0 && bytes[start + 1] & 0x80 == 0)
            || (bytes[start] == 0xff && bytes[start + 1] & 0x80 != 0))
    {
        start += 1;
    }
    let minimal = &bytes[start..];
    let inner = match decimal.inner.as_ref() {
        Schema::Ref { name } => lookup(names, name)?,
        inner => inner,
    };
    let Schema::Fixed(fixed) = inner else {
        return Ok(apache_avro::Decimal::from(minimal.to_vec()));
    };
    if minimal.len() > fixed.size {
        return Err(Mismatch::new(format!(
            "{text} does not fit the {} bytes of fixed {}",
            fixed.size, fixed.name
        )));
    }
    let sign = if unscaled < 0 { 0xff } else { 0 };
    let mut extended = vec![sign; fixed.size - minimal.len()];
    extended.extend_from_slice(minimal);
    Ok(apache_avro::Decimal::from(extended))
}

/// `-12.34` with scale 3 → -12340; refuses more fraction digits than the scale (unless they are
/// zeros) and more digits than the precision.
fn unscaled_decimal(text: &str, scale: usize, precision: usize) -> Result<i128, Mismatch> {
    let bad = || {
        Mismatch::new(format!(
            "{text:?} is not a decimal number such as \"-12.34\""
        ))
    };
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (whole, mut fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let digits_only = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && fraction.is_empty()) || !digits_only(whole) || !digits_only(fraction) {
        return Err(bad());
    }
    if fraction.len() > scale {
        if fraction[scale..].bytes().any(|b| b != b'0') {
            return Err(Mismatch::new(format!(
                "{text} has more than the schema's {scale} digits after the point"
            )));
        }
        fraction = &fraction[..scale];
    }
    let mut digits = String::with_capacity(whole.len() + scale);
    digits.push_str(whole);
    digits.push_str(fraction);
    digits.extend(std::iter::repeat_n('0', scale - fraction.len()));
    let significant = digits.trim_start_matches('0');
    if significant.len() > precision {
        return Err(Mismatch::new(format!(
            "{text} has more than the schema's {precision} digits"
        )));
    }
    if significant.is_empty() {
        return Ok(0);
    }
    let magnitude: i128 = significant.parse().map_err(|_| {
        Mismatch::new(format!(
            "{text} is wider than the 128 bits transcode writes"
        ))
    })?;
    Ok(if negative { -magnitude } else { magnitude })
}

// ---------------------------------------------------------------------------------------------
// compress / decompress

/// A compression `compress` writes and `decompress` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// gzip (RFC 1952), with flate2.
    Gzip,
    /// Zstandard (RFC 8878), with zstd.
    Zstd,
}

impl Algorithm {
    /// The `content-encoding` value naming it.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Gzip => "gzip",
            Algorithm::Zstd => "zstd",
        }
    }

    /// The algorithm a `content-encoding` value names (`x-gzip` is gzip's old name).
    fn named(name: &str) -> Option<Algorithm> {
        match name.trim().to_ascii_lowercase().as_str() {
            "gzip" | "x-gzip" => Some(Algorithm::Gzip),
            "zstd" => Some(Algorithm::Zstd),
            _ => None,
        }
    }

    /// The algorithm whose magic bytes start `body`.
    fn sniffed(body: &[u8]) -> Option<Algorithm> {
        if body.starts_with(&GZIP_MAGIC) {
            Some(Algorithm::Gzip)
        } else if body.starts_with(&ZSTD_MAGIC) {
            Some(Algorithm::Zstd)
        } else {
            None
        }
    }
}

/// The `compress` step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressSpec {
    /// gzip or zstd.
    pub algorithm: Algorithm,
    /// The level: gzip 0..=9 (default 6), zstd 1..=19 (default 3).
    #[serde(default)]
    pub level: Option<i32>,
    /// Bodies smaller than this pass unchanged (default 256).
    #[serde(default)]
    pub min_bytes: Option<usize>,
}

pub(crate) fn compile_compress(
    name: String,
    spec: CompressSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let (levels, default) = match spec.algorithm {
        Algorithm::Gzip => (GZIP_LEVELS, GZIP_LEVEL_DEFAULT),
        Algorithm::Zstd => (ZSTD_LEVELS, ZSTD_LEVEL_DEFAULT),
    };
    let level = spec.level.unwrap_or(default);
    if !levels.contains(&level) {
        return Err(SpecError::at(
            "level",
            format!(
                "{level} is not a {} level; use {}..={}",
                spec.algorithm.name(),
                levels.start(),
                levels.end()
            ),
        ));
    }
    Ok(Arc::new(Compress {
        name,
        algorithm: spec.algorithm,
        level,
        min_bytes: spec.min_bytes.unwrap_or(COMPRESS_MIN_BYTES_DEFAULT),
    }))
}

#[derive(Debug)]
struct Compress {
    name: String,
    algorithm: Algorithm,
    level: i32,
    min_bytes: usize,
}

impl Compress {
    fn compress(&self, body: &[u8]) -> std::io::Result<Vec<u8>> {
        match self.algorithm {
            Algorithm::Gzip => {
                use std::io::Write as _;
                let level = flate2::Compression::new(self.level.unsigned_abs());
                let mut encoder =
                    flate2::write::GzEncoder::new(Vec::with_capacity(body.len() / 2), level);
                encoder.write_all(body)?;
                encoder.finish()
            }
            Algorithm::Zstd => zstd::bulk::compress(body, self.level),
        }
    }
}

impl Step for Compress {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, _context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        for mut item in items {
            if item.property(CONTENT_ENCODING).is_some() {
                out.pass(item);
                continue;
            }
            let body = item.body().clone();
            if body.len() < self.min_bytes {
                out.pass(item);
                continue;
            }
            match self.compress(&body) {
                Ok(compressed) if compressed.len() < body.len() => {
                    item.set_body(Bytes::from(compressed));
                    let encoding = PropertyValue::String(self.algorithm.name().into());
                    item.set_property(CONTENT_ENCODING, encoding);
                    out.pass(item);
                }
                // Incompressible (already compressed or encrypted): sent as it is.
                Ok(_) => out.pass(item),
                Err(e) => {
                    let reason = format!("{} compression failed: {e}", self.algorithm.name());
                    out.reject(item, reason);
                }
            }
        }
    }
}

/// The `decompress` step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecompressSpec {
    /// Accept only this algorithm (default: gzip and zstd).
    #[serde(default)]
    pub algorithm: Option<Algorithm>,
    /// The most bytes a body may inflate to (default 1 MiB).
    #[serde(default)]
    pub max_bytes: Option<usize>,
}

pub(crate) fn compile_decompress(
    name: String,
    spec: DecompressSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let max_bytes = spec.max_bytes.unwrap_or(DECOMPRESS_BYTES_MAX_DEFAULT);
    if !(1..=DECOMPRESS_BYTES_MAX_LIMIT).contains(&max_bytes) {
        return Err(SpecError::at(
            "max_bytes",
            format!("{max_bytes} is out of range; use 1..={DECOMPRESS_BYTES_MAX_LIMIT}"),
        ));
    }
    Ok(Arc::new(Decompress {
        name,
        algorithm: spec.algorithm,
        max_bytes,
    }))
}

#[derive(Debug)]
struct Decompress {
    name: String,
    algorithm: Option<Algorithm>,
    max_bytes: usize,
}

/// What `decompress` makes of an event's encoding.
enum Encoding {
    /// Not compressed (or not by an algorithm this step takes): pass unchanged.
    Plain,
    /// `content-encoding: identity`: remove the property, keep the body.
    Identity,
    /// Compressed with this.
    Compressed(Algorithm),
}

impl Decompress {
    fn encoding(&self, item: &Item, body: &[u8]) -> Result<Encoding, String> {
        let algorithm = match item.property(CONTENT_ENCODING) {
            None => match Algorithm::sniffed(body) {
                Some(algorithm) if self.algorithm.is_none_or(|a| a == algorithm) => algorithm,
                _ => return Ok(Encoding::Plain),
            },
            Some(PropertyValue::String(name)) if name.trim().eq_ignore_ascii_case("identity") => {
                return Ok(Encoding::Identity);
            }
            Some(PropertyValue::String(name)) => Algorithm::named(name).ok_or_else(|| {
                format!("{CONTENT_ENCODING} {name:?} is not one this step decodes (gzip, zstd)")
            })?,
            Some(other) => {
                return Err(format!(
                    "{CONTENT_ENCODING} is a {}, not a string such as \"gzip\"",
                    other.type_name()
                ));
            }
        };
        match self.algorithm {
            Some(only) if only != algorithm => Err(format!(
                "{CONTENT_ENCODING} is {}; this step decodes {} only",
                algorithm.name(),
                only.name()
            )),
            _ => Ok(Encoding::Compressed(algorithm)),
        }
    }

    /// Inflates `body`, reading at most one byte past `max_bytes`.
    fn inflate(&self, algorithm: Algorithm, body: &[u8]) -> Result<Vec<u8>, String> {
        let limit = u64::try_from(self.max_bytes)
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let mut inflated = Vec::with_capacity(body.len().saturating_mul(4).min(self.max_bytes));
        let invalid = |e: std::io::Error| format!("not valid {} data: {e}", algorithm.name());
        match algorithm {
            Algorithm::Gzip => flate2::bufread::MultiGzDecoder::new(body)
                .take(limit)
                .read_to_end(&mut inflated)
                .map_err(invalid)?,
            Algorithm::Zstd => {
                let mut decoder =
                    zstd::stream::read::Decoder::with_buffer(body).map_err(invalid)?;
                decoder
                    .window_log_max(ZSTD_WINDOW_LOG_MAX)
                    .map_err(invalid)?;
                decoder
                    .take(limit)
                    .read_to_end(&mut inflated)
                    .map_err(invalid)?
            }
        };
        if inflated.len() > self.max_bytes {
            return Err(format!(
                "the {} body inflates to more than max_bytes = {} bytes; refused without \
                 inflating it further (raise max_bytes if such events are expected)",
                algorithm.name(),
                self.max_bytes
            ));
        }
        Ok(inflated)
    }
}

impl Step for Decompress {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, _context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        for mut item in items {
            let body = item.body().clone();
            match self.encoding(&item, &body) {
                Err(reason) => out.reject(item, reason),
                Ok(Encoding::Plain) => out.pass(item),
                Ok(Encoding::Identity) => {
                    item.remove_property(CONTENT_ENCODING);
                    out.pass(item);
                }
                Ok(Encoding::Compressed(algorithm)) => match self.inflate(algorithm, &body) {
                    Ok(inflated) => {
                        item.set_body(Bytes::from(inflated));
                        item.remove_property(CONTENT_ENCODING);
                        out.pass(item);
                    }
                    Err(reason) => out.reject(item, reason),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use proptest::prelude::*;
    use serde_json::json;
    use tributary_event::EventData;

    use super::*;
    use crate::item::Position;
    use crate::step::{Edited, Editor};

    const READING_SCHEMA: &str = r#"{
      "type": "record", "name": "Reading", "namespace": "tributary.test",
      "fields": [
        {"name": "id", "type": "string"},
        {"name": "site", "type": {"type": "record", "name": "Site", "fields": [
          {"name": "name", "type": "string"},
          {"name": "zone", "type": {"type": "enum", "name": "Zone", "symbols": ["NORTH", "SOUTH"]}}
        ]}},
        {"name": "backup", "type": ["null", "Site"], "default": null},
        {"name": "note", "type": ["null", "string"], "default": null},
        {"name": "samples", "type": {"type": "array", "items": "double"}},
        {"name": "labels", "type": {"type": "map", "values": "string"}},
        {"name": "raw", "type": "bytes"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "reading_id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "checksum", "type": {"type": "fixed", "name": "Crc", "size": 4}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "level", "type": "float"}
      ]
    }"#;

    fn schema() -> Schema {
        Schema::parse_str(READING_SCHEMA).expect("the test schema parses")
    }

    fn site(name: &str, zone: u32, symbol: &str) -> Avro {
        Avro::Record(vec![
            ("name".into(), Avro::String(name.into())),
            ("zone".into(), Avro::Enum(zone, symbol.into())),
        ])
    }

    fn reading() -> Avro {
        Avro::Record(vec![
            ("id".into(), Avro::String("d-17".into())),
            ("site".into(), site("north-1", 0, "NORTH")),
            (
                "backup".into(),
                Avro::Union(1, Box::new(site("south-2", 1, "SOUTH"))),
            ),
            ("note".into(), Avro::Union(0, Box::new(Avro::Null))),
            (
                "samples".into(),
                Avro::Array(vec![Avro::Double(21.5), Avro::Double(-3.25)]),
            ),
            (
                "labels".into(),
                Avro::Map([("unit".to_owned(), Avro::String("C".into()))].into()),
            ),
            ("raw".into(), Avro::Bytes(vec![0, 1, 2, 255])),
            ("at".into(), Avro::TimestampMillis(1_714_564_800_123)),
            (
                "price".into(),
                Avro::Decimal(apache_avro::Decimal::from(vec![0x04, 0xd2])),
            ),
            (
                "reading_id".into(),
                Avro::Uuid(
                    apache_avro::Uuid::parse_str("67e55044-10b1-426f-9247-bb680e5fe0c8")
                        .expect("uuid"),
                ),
            ),
            (
                "checksum".into(),
                Avro::Fixed(4, vec![0xde, 0xad, 0xbe, 0xef]),
            ),
            ("day".into(), Avro::Date(19_844)),
            ("level".into(), Avro::Float(0.1)),
        ])
    }

    fn reading_json() -> Json {
        json!({
            "id": "d-17",
            "site": {"name": "north-1", "zone": "NORTH"},
            "backup": {"name": "south-2", "zone": "SOUTH"},
            "note": null,
            "samples": [21.5, -3.25],
            "labels": {"unit": "C"},
            "raw": "AAEC/w==",
            "at": "2024-05-01T12:00:00.123Z",
            "price": "12.34",
            "reading_id": "67e55044-10b1-426f-9247-bb680e5fe0c8",
            "checksum": "3q2+7w==",
            "day": "2024-05-01",
            "level": 0.1
        })
    }

    fn datum() -> Vec<u8> {
        apache_avro::to_avro_datum(&schema(), reading()).expect("the test datum writes")
    }

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write");
        }
        dir
    }

    fn compile_in(kind: &str, dir: &Path, keys: Json) -> Result<Arc<dyn Step>, SpecError> {
        crate::spec::compile(kind, None, keys, &CompileContext::new(dir))
    }

    fn run(step: Arc<dyn Step>, events: Vec<EventData>) -> Edited {
        let items = events
            .into_iter()
            .enumerate()
            .map(|(i, event)| {
                let position = Position {
                    sequence_number: i as i64,
                    offset: i as u64,
                    enqueued_time_ms: 0,
                };
                Item::new(event, position)
            })
            .collect();
        let context = Context {
            partition: "0",
            now_ms: 0,
        };
        Editor::new(vec![step]).apply(&context, items)
    }

    fn avro_to_json(dir: &Path) -> Arc<dyn Step> {
        let keys = json!({"from": "avro", "to": "json", "schema": "reading.avsc"});
        compile_in("transcode", dir, keys).expect("compiles")
    }

    fn json_to_avro(dir: &Path) -> Arc<dyn Step> {
        let keys = json!({"from": "json", "to": "avro", "schema": "reading.avsc"});
        compile_in("transcode", dir, keys).expect("compiles")
    }

    fn only_passed(mut edited: Edited) -> EventData {
        assert!(edited.rejected.is_empty(), "{:?}", edited.rejected);
        assert_eq!(edited.passed.len(), 1);
        edited.passed.remove(0).into_event()
    }

    fn only_reason(edited: Edited) -> String {
        assert!(edited.passed.is_empty());
        assert_eq!(edited.rejected.len(), 1);
        edited.rejected[0].reason.clone()
    }

    #[test]
    fn an_avro_datum_becomes_json_and_back() {
        let dir = dir_with(&[("reading.avsc", READING_SCHEMA)]);
        let event = only_passed(run(avro_to_json(dir.path()), vec![EventData::new(datum())]));
        assert_eq!(event.content_type.as_deref(), Some("application/json"));
        let json: Json = serde_json::from_slice(&event.body).expect("JSON");
        assert_eq!(json, reading_json());
        let event = only_passed(run(json_to_avro(dir.path()), vec![event]));
        assert_eq!(event.content_type.as_deref(), Some("avro/binary"));
        let back = apache_avro::from_avro_datum(&schema(), &mut event.body.as_ref(), None)
            .expect("a datum of the schema");
        assert_eq!(back, reading());
    }

    #[test]
    fn single_object_encoding_is_read_when_the_fingerprint_is_the_schemas() {
        let dir = dir_with(&[("reading.avsc", READING_SCHEMA)]);
        let mut writer =
            apache_avro::GenericSingleObjectWriter::new_with_capacity(&schema(), 256).expect("w");
        let mut framed = Vec::new();
        writer.write_value(reading(), &mut framed).expect("writes");
        let event = only_passed(run(
            avro_to_json(dir.path()),
            vec![EventData::new(framed.clone())],
        ));
        let json: Json = serde_json::from_slice(&event.body).expect("JSON");
        assert_eq!(json, reading_json());
        framed[5] ^= 0xff;
        let reason = only_reason(run(avro_to_json(dir.path()), vec![EventData::new(framed)]));
        assert!(reason.contains("fingerprint"), "{reason}");
        let keys = json!({"from": "json", "to": "avro", "schema": "reading.avsc",
                          "single_object": true});
        let step = compile_in("transcode", dir.path(), keys).expect("compiles");
        let written = only_passed(run(step, vec![EventData::new(reading_json().to_string())]));
        let mut expected = Vec::new();
        writer
            .write_value(reading(), &mut expected)
            .expect("writes");
        assert_eq!(written.body.as_ref(), expected.as_slice());
    }

    #[test]
    fn a_container_becomes_one_array_and_a_compressed_one_is_refused() {
        let dir = dir_with(&[("reading.avsc", READING_SCHEMA)]);
        let schema = schema();
        let mut writer = apache_avro::Writer::new(&schema, Vec::new());
        writer.append(reading()).expect("append");
        writer.append(reading()).expect("append");
        let file = writer.into_inner().expect("container");
        let keys =
            json!({"from": "avro", "to": "json", "schema": "reading.avsc", "container": true});
        let step = compile_in("transcode", dir.path(), keys).expect("compiles");
        let event = only_passed(run(step.clone(), vec![EventData::new(file)]));
        let json: Json = serde_json::from_slice(&event.body).expect("JSON");
        assert_eq!(json, json!([reading_json(), reading_json()]));
        let deflate = apache_avro::Codec::Deflate(apache_avro::DeflateSettings::default());
        let mut writer = apache_avro::Writer::with_codec(&schema, Vec::new(), deflate);
        writer.append(reading()).expect("append");
        let file = writer.into_inner().expect("container");
        let reason = only_reason(run(step.clone(), vec![EventData::new(file)]));
        assert!(reason.contains("compressed (deflate)"), "{reason}");
        let reason = only_reason(run(step, vec![EventData::new(datum())]));
        assert!(reason.contains("not an Avro object container"), "{reason}");
    }

    #[test]
    fn malformed_or_foreign_datums_are_refused_with_the_reason() {
        let dir = dir_with(&[("reading.avsc", READING_SCHEMA)]);
        let datum = datum();
        let truncated = datum[..datum.len() - 6].to_vec();
        let mut longer = datum.clone();
        longer.extend_from_slice(b"xyz");
        let events = vec![
            EventData::new(truncated),
            EventData::new(longer),
            EventData::new(Bytes::from_static(b"{\"id\":1}")),
        ];
        let edited = run(avro_to_json(dir.path()), events);
        assert!(edited.passed.is_empty());
        let reasons: Vec<&str> = edited.rejected.iter().map(|r| r.reason.as_str()).collect();
        assert!(reasons[0].contains("datum"), "{}", reasons[0]);
        assert!(reasons[1].starts_with("3 bytes are left"), "{}", reasons[1]);
        assert!(
            reasons[2].starts_with("not an Avro datum") || reasons[2].starts_with("at "),
            "{}",
            reasons[2]
        );
    }

    #[test]
    fn json_that_does_not_fit_the_schema_is_refused_naming_the_path() {
        let dir = dir_with(&[("reading.avsc", READING_SCHEMA)]);
        let cases = [
            (
                "/site/zone",
                json!("EAST"),
                "at site.zone: \"EAST\" is not a symbol",
            ),
            (
                "/samples/1",
                json!("x"),
                "at samples[1]: expected a number, found a string",
            ),
            (
                "/price",
                json!("1.234"),
                "at price: 1.234 has more than the schema's 2 digits",
            ),
            ("/at", json!("2024-05-01T12:00:00.1234Z"), "at at: "),
            ("/checksum", json!("AAE="), "at checksum: expected 4 bytes"),
            (
                "/level",
                json!(1e300),
                "at level: expected a number within a float's range",
            ),
            (
                "/backup",
                json!({"name": "x", "zone": "WEST"}),
                "at backup.zone:",
            ),
        ];
        for (pointer, value, wanted) in cases {
            let mut body = reading_json();
            *body.pointer_mut(pointer).expect(pointer) = value;
            let reason = only_reason(run(
                json_to_avro(dir.path()),
                vec![EventData::new(body.to_string())],
            ));
            assert!(reason.starts_with(wanted), "{pointer}: {reason}");
        }
        let mut body = reading_json();
        body.as_object_mut().expect("object").remove("id");
        body["extra"] = json!(1);
        let reason = only_reason(run(
            json_to_avro(dir.path()),
            vec![EventData::new(body.to_string())],
        ));
        assert!(
            reason.contains("\"extra\" is not a field of tributary.test.Reading"),
            "{reason}"
        );
        let mut body = reading_json();
        body.as_object_mut().expect("object").remove("id");
        body.as_object_mut().expect("object").remove("note");
        let reason = only_reason(run(
            json_to_avro(dir.path()),
            vec![EventData::new(body.to_string())],
        ));
        assert_eq!(reason, "at id: missing, and the schema gives no default");
        let reason = only_reason(run(
            json_to_avro(dir.path()),
            vec![EventData::new("not json")],
        ));
        assert_eq!(reason, "the body is not JSON");
    }

    #[test]
    fn decimals_and_timestamps_read_both_ways() {
        assert_eq!(decimal_text(&[0xfb, 0x2e], 2).expect("ok"), "-12.34");
        assert_eq!(decimal_text(&[0x05], 3).expect("ok"), "0.005");
        assert_eq!(decimal_text(&[], 0).expect("ok"), "0");
        assert_eq!(unscaled_decimal("-12.34", 2, 9).expect("ok"), -1234);
        assert_eq!(unscaled_decimal("7", 3, 9).expect("ok"), 7000);
        assert_eq!(unscaled_decimal("0.500", 1, 9).expect("ok"), 5);
        assert!(unscaled_decimal("1e5", 2, 9).is_err());
        assert!(unscaled_decimal("12345678.9", 2, 9).is_err());
        let millis = timestamp(&json!("2024-05-01T12:00:00.123Z"), 1_000_000).expect("ok");
        assert_eq!(millis, 1_714_564_800_123);
        assert_eq!(timestamp(&json!(5), 1_000).expect("ok"), 5);
        assert!(timestamp_json(i64::MAX, 1_000).is_err());
        assert_eq!(date_days("1970-01-02").expect("ok"), 1);
    }

    #[test]
    fn non_finite_floats_are_refused() {
        let text =
            r#"{"type": "record", "name": "M", "fields": [{"name": "v", "type": "double"}]}"#;
        let dir = dir_with(&[("m.avsc", text)]);
        let keys = json!({"from": "avro", "to": "json", "schema": "m.avsc"});
        let step = compile_in("transcode", dir.path(), keys).expect("compiles");
        let reason = only_reason(run(
            step,
            vec![EventData::new(f64::NAN.to_le_bytes().to_vec())],
        ));
        assert!(reason.starts_with("at v: NaN has no JSON form"), "{reason}");
    }

    #[test]
    fn schemas_that_would_let_a_body_run_away_are_refused() {
        let recursive = r#"{"type": "record", "name": "Node", "fields": [
            {"name": "next", "type": ["null", "Node"]}]}"#;
        let nulls = r#"{"type": "array", "items": "null"}"#;
        let empty = r#"{"type": "record", "name": "E", "fields": []}"#;
        let dir = dir_with(&[
            ("r.avsc", recursive),
            ("n.avsc", nulls),
            ("e.avsc", empty),
            ("bad.avsc", "{"),
        ]);
        let error = |file: &str, container: bool| {
            let keys =
                json!({"from": "avro", "to": "json", "schema": file, "container": container});
            compile_in("transcode", dir.path(), keys)
                .expect_err("refused")
                .to_string()
        };
        assert!(error("r.avsc", false).contains("Node contains itself"));
        assert!(error("n.avsc", false).contains("take no bytes"));
        assert!(error("e.avsc", true).contains("takes no bytes"));
        assert!(
            compile_in(
                "transcode",
                dir.path(),
                json!({"from": "avro", "to": "json", "schema": "e.avsc"})
            )
            .is_ok()
        );
        assert!(error("bad.avsc", false).starts_with("schema: "));
        assert!(error("missing.avsc", false).contains("cannot read"));
        let keys = json!({"from": "json", "to": "json", "schema": "e.avsc"});
        assert!(compile_in("transcode", dir.path(), keys).is_err());
        let keys = json!({"from": "json", "to": "avro", "schema": "e.avsc", "container": true});
        let error = compile_in("transcode", dir.path(), keys).expect_err("refused");
        assert_eq!(error.key.as_deref(), Some("container"));
    }

    fn compress(algorithm: &str) -> Arc<dyn Step> {
        let keys = json!({"algorithm": algorithm});
        compile_in("compress", Path::new("."), keys).expect("compiles")
    }

    fn decompress(keys: Json) -> Arc<dyn Step> {
        compile_in("decompress", Path::new("."), keys).expect("compiles")
    }

    fn encoding(event: &EventData) -> Option<&PropertyValue> {
        event.property(CONTENT_ENCODING)
    }

    #[test]
    fn gzip_and_zstd_round_trip_and_mark_the_encoding() {
        let body: String = (0..40)
            .map(|i| format!(r#"{{"id":{i},"site":"north-1","temperature":21.5}}"#))
            .collect::<Vec<_>>()
            .join("\n");
        for algorithm in ["gzip", "zstd"] {
            let event = EventData::new(body.clone()).with_property("kind", PropertyValue::Int64(1));
            let packed = only_passed(run(compress(algorithm), vec![event]));
            assert!(
                packed.body.len() < body.len() / 4,
                "{algorithm}: {}",
                packed.body.len()
            );
            assert_eq!(
                encoding(&packed),
                Some(&PropertyValue::String(algorithm.into()))
            );
            let unpacked = only_passed(run(decompress(json!({})), vec![packed.clone()]));
            assert_eq!(unpacked.body.as_ref(), body.as_bytes());
            assert_eq!(encoding(&unpacked), None);
            assert_eq!(unpacked.property("kind"), Some(&PropertyValue::Int64(1)));
            // Without the property the magic bytes tell.
            let mut bare = packed;
            bare.properties.retain(|(k, _)| k != CONTENT_ENCODING);
            let unpacked = only_passed(run(decompress(json!({})), vec![bare]));
            assert_eq!(unpacked.body.as_ref(), body.as_bytes());
        }
    }

    #[test]
    fn small_incompressible_and_encoded_bodies_are_left_alone() {
        let small = only_passed(run(compress("gzip"), vec![EventData::new("{\"a\":1}")]));
        assert_eq!(small.body.as_ref(), b"{\"a\":1}");
        assert_eq!(encoding(&small), None);
        // xorshift64: bytes no compressor can shrink.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect();
        let noisy = only_passed(run(compress("zstd"), vec![EventData::new(noise.clone())]));
        assert!(
            noisy.body.as_ref() == noise.as_slice(),
            "the noise was compressed"
        );
        assert_eq!(encoding(&noisy), None);
        let marked = EventData::new(vec![b'a'; 4096])
            .with_property(CONTENT_ENCODING, PropertyValue::String("br".into()));
        let kept = only_passed(run(compress("gzip"), vec![marked.clone()]));
        assert_eq!(kept.body.len(), 4096);
        let reason = only_reason(run(decompress(json!({})), vec![marked]));
        assert!(
            reason.contains("\"br\" is not one this step decodes"),
            "{reason}"
        );
        let plain = only_passed(run(
            decompress(json!({})),
            vec![EventData::new("plain text")],
        ));
        assert_eq!(plain.body.as_ref(), b"plain text");
    }

    #[test]
    fn a_decompression_bomb_is_refused_without_inflating_it() {
        use std::io::Write as _;
        let zeros = vec![0u8; 1024 * 1024];
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let mut zstd = zstd::stream::write::Encoder::new(Vec::new(), 1).expect("encoder");
        for _ in 0..50 {
            gzip.write_all(&zeros).expect("gzip");
            zstd.write_all(&zeros).expect("zstd");
        }
        let bombs = [gzip.finish().expect("gzip"), zstd.finish().expect("zstd")];
        for (bomb, algorithm) in bombs.into_iter().zip(["gzip", "zstd"]) {
            assert!(bomb.len() < 256 * 1024, "{algorithm}: {}", bomb.len());
            let event = EventData::new(bomb)
                .with_property(CONTENT_ENCODING, PropertyValue::String(algorithm.into()));
            let reason = only_reason(run(decompress(json!({})), vec![event]));
            assert!(
                reason.contains("inflates to more than max_bytes = 1048576"),
                "{reason}"
            );
        }
    }

    #[test]
    fn decompress_refuses_what_it_cannot_decode() {
        let gzip_marked = EventData::new("not gzip at all")
            .with_property(CONTENT_ENCODING, PropertyValue::String("gzip".into()));
        let reason = only_reason(run(decompress(json!({})), vec![gzip_marked]));
        assert!(reason.starts_with("not valid gzip data"), "{reason}");
        let zstd_body = zstd::bulk::compress(&[b'x'; 1000], 3).expect("zstd");
        let event = EventData::new(zstd_body.clone())
            .with_property(CONTENT_ENCODING, PropertyValue::String("zstd".into()));
        let reason = only_reason(run(decompress(json!({"algorithm": "gzip"})), vec![event]));
        assert!(reason.contains("decodes gzip only"), "{reason}");
        // Unmarked and another algorithm's magic: not this step's business.
        let kept = only_passed(run(
            decompress(json!({"algorithm": "gzip"})),
            vec![EventData::new(zstd_body)],
        ));
        assert_eq!(
            kept.body.len(),
            zstd::bulk::compress(&[b'x'; 1000], 3).expect("zstd").len()
        );
        let event = EventData::new("x").with_property(CONTENT_ENCODING, PropertyValue::Int64(1));
        assert!(only_reason(run(decompress(json!({})), vec![event])).contains("int64"));
        let error = |kind: &str, keys: Json| {
            compile_in(kind, Path::new("."), keys)
                .expect_err("refused")
                .to_string()
        };
        assert!(
            error("compress", json!({"algorithm": "zstd", "level": 22})).starts_with("level: 22")
        );
        assert!(error("compress", json!({"algorithm": "gzip", "level": 10})).contains("0..=9"));
        assert!(error("compress", json!({"algorithm": "lz4"})).contains("unknown variant"));
        assert!(error("decompress", json!({"max_bytes": 0})).starts_with("max_bytes: "));
    }

    /// The Avro steps of the property tests, compiled once (the schema file is read then).
    fn fuzzed_steps() -> &'static [Arc<dyn Step>] {
        static STEPS: std::sync::OnceLock<Vec<Arc<dyn Step>>> = std::sync::OnceLock::new();
        STEPS.get_or_init(|| {
            let dir = dir_with(&[("reading.avsc", READING_SCHEMA)]);
            let container =
                json!({"from": "avro", "to": "json", "schema": "reading.avsc", "container": true});
            vec![
                avro_to_json(dir.path()),
                compile_in("transcode", dir.path(), container).expect("compiles"),
                json_to_avro(dir.path()),
                decompress(json!({})),
            ]
        })
    }

    proptest! {
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut framed = SINGLE_OBJECT_MAGIC.to_vec();
            framed.extend_from_slice(&body);
            let mut contained = CONTAINER_MAGIC.to_vec();
            contained.extend_from_slice(&body);
            for step in fuzzed_steps() {
                for bytes in [&body, &framed, &contained] {
                    for encoding in [None, Some("gzip"), Some("zstd")] {
                        let mut event = EventData::new(bytes.clone());
                        if let Some(encoding) = encoding {
                            let encoding = PropertyValue::String(encoding.into());
                            event = event.with_property(CONTENT_ENCODING, encoding);
                        }
                        let edited = run(step.clone(), vec![event]);
                        prop_assert_eq!(edited.passed.len() + edited.rejected.len(), 1);
                    }
                }
            }
        }

        #[test]
        fn a_datum_cut_or_changed_anywhere_never_panics(at in 0usize..200, byte in any::<u8>()) {
            let mut datum = datum();
            let at = at % datum.len();
            let mut changed = datum.clone();
            changed[at] = byte;
            datum.truncate(at);
            for body in [datum, changed] {
                let edited = run(fuzzed_steps()[0].clone(), vec![EventData::new(body)]);
                prop_assert_eq!(edited.passed.len() + edited.rejected.len(), 1);
            }
        }
    }
}
