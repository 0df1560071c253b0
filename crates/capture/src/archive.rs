//! Archive names: where a window's file goes, rendered from Azure's archive name format.
//!
//! A format is static text and the nine placeholders `{Namespace}`, `{EventHub}`,
//! `{PartitionId}`, `{Year}`, `{Month}`, `{Day}`, `{Hour}`, `{Minute}` and `{Second}`. As Azure
//! requires, every one of the nine must appear, in any order, with or without delimiters
//! (`Prod_{EventHub}/{Namespace}\{PartitionId}_{Year}_{Month}/{Day}/{Hour}/{Minute}/{Second}`
//! is Azure's own example); `.avro` is appended. Because every field is in the name, one
//! partition's windows that start in different seconds never share a name.
//!
//! Refused, with an error naming the reason: a missing placeholder, an unknown one (`{Date}`),
//! an unclosed `{` or a stray `}`, and — so that a name stays a relative path below the
//! destination — a leading `/`, an empty path segment (`//`), a `.` or `..` segment, or a NUL.

use crate::error::CaptureError;
use crate::limits::ARCHIVE_NAME_FORMAT_BYTES_MAX;
use crate::time_text::UtcFields;

/// Azure's default archive name format.
pub const DEFAULT_ARCHIVE_NAME_FORMAT: &str =
    "{Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}";

/// What every archive name ends with.
pub const ARCHIVE_EXTENSION: &str = ".avro";

/// One of the nine placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Namespace,
    EventHub,
    PartitionId,
    Year,
    Month,
    Day,
    Hour,
    Minute,
    Second,
}

const FIELDS: [(Field, &str); 9] = [
    (Field::Namespace, "Namespace"),
    (Field::EventHub, "EventHub"),
    (Field::PartitionId, "PartitionId"),
    (Field::Year, "Year"),
    (Field::Month, "Month"),
    (Field::Day, "Day"),
    (Field::Hour, "Hour"),
    (Field::Minute, "Minute"),
    (Field::Second, "Second"),
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Field(Field),
}

/// A validated archive name format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveNameFormat {
    format: String,
    pieces: Vec<Piece>,
}

impl Default for ArchiveNameFormat {
    fn default() -> Self {
        ArchiveNameFormat::parse(DEFAULT_ARCHIVE_NAME_FORMAT).expect("the default format is valid")
    }
}

impl std::fmt::Display for ArchiveNameFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.format)
    }
}

impl ArchiveNameFormat {
    /// Parses and validates `format` as Azure does (see the module docs).
    pub fn parse(format: &str) -> Result<ArchiveNameFormat, CaptureError> {
        let refuse = |reason: String| CaptureError::InvalidArchiveNameFormat {
            format: format.to_owned(),
            reason,
        };
        if format.len() > ARCHIVE_NAME_FORMAT_BYTES_MAX {
            return Err(refuse(format!(
                "it has {} bytes; at most {ARCHIVE_NAME_FORMAT_BYTES_MAX} are allowed",
                format.len()
            )));
        }
        let pieces = split_pieces(format).map_err(refuse)?;
        let missing: Vec<String> = FIELDS
            .iter()
            .filter(|(field, _)| !pieces.contains(&Piece::Field(*field)))
            .map(|(_, name)| format!("{{{name}}}"))
            .collect();
        if !missing.is_empty() {
            return Err(refuse(format!(
                "it must contain all of {{Namespace}}, {{EventHub}}, {{PartitionId}}, {{Year}}, \
                 {{Month}}, {{Day}}, {{Hour}}, {{Minute}} and {{Second}}; missing {}",
                missing.join(", ")
            )));
        }
        check_path_shape(format).map_err(refuse)?;
        Ok(ArchiveNameFormat {
            format: format.to_owned(),
            pieces,
        })
    }

    /// The format as given.
    pub fn as_str(&self) -> &str {
        &self.format
    }

    /// The archive name (with `.avro`) of the window of (`namespace`, `hub`, `partition`) that
    /// started at `window_start_ms` (UTC, whole seconds).
    pub fn render(
        &self,
        namespace: &str,
        hub: &str,
        partition: &str,
        window_start_ms: i64,
    ) -> String {
        self.render_with_extension(
            namespace,
            hub,
            partition,
            window_start_ms,
            ARCHIVE_EXTENSION,
        )
    }

    /// [`render`](Self::render) with `extension` (`.parquet`) in place of `.avro`.
    pub fn render_with_extension(
        &self,
        namespace: &str,
        hub: &str,
        partition: &str,
        window_start_ms: i64,
        extension: &str,
    ) -> String {
        let t = UtcFields::from_ms(window_start_ms);
        let mut name = String::with_capacity(self.format.len() + extension.len() + 32);
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => name.push_str(text),
                Piece::Field(Field::Namespace) => name.push_str(namespace),
                Piece::Field(Field::EventHub) => name.push_str(hub),
                Piece::Field(Field::PartitionId) => name.push_str(partition),
                Piece::Field(Field::Year) => name.push_str(&format!("{:04}", t.year)),
                Piece::Field(Field::Month) => name.push_str(&format!("{:02}", t.month)),
                Piece::Field(Field::Day) => name.push_str(&format!("{:02}", t.day)),
                Piece::Field(Field::Hour) => name.push_str(&format!("{:02}", t.hour)),
                Piece::Field(Field::Minute) => name.push_str(&format!("{:02}", t.minute)),
                Piece::Field(Field::Second) => name.push_str(&format!("{:02}", t.second)),
            }
        }
        name.push_str(extension);
        name
    }
}

/// Splits a format into static text and placeholders.
fn split_pieces(format: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = format;
    while !rest.is_empty() {
        let brace = rest.find(['{', '}']).unwrap_or(rest.len());
        if brace > 0 {
            pieces.push(Piece::Text(rest[..brace].to_owned()));
            rest = &rest[brace..];
            continue;
        }
        if rest.starts_with('}') {
            return Err("a '}' closes no placeholder".to_owned());
        }
        let Some(close) = rest.find('}') else {
            return Err("a '{' is not closed".to_owned());
        };
        let name = &rest[1..close];
        let field = FIELDS
            .iter()
            .find(|(_, known)| *known == name)
            .map(|(field, _)| *field)
            .ok_or_else(|| {
                format!(
                    "unknown placeholder {{{name}}}; the placeholders are {{Namespace}}, \
                     {{EventHub}}, {{PartitionId}}, {{Year}}, {{Month}}, {{Day}}, {{Hour}}, \
                     {{Minute}} and {{Second}}"
                )
            })?;
        pieces.push(Piece::Field(field));
        rest = &rest[close + 1..];
    }
    Ok(pieces)
}

/// Refuses formats whose names would not stay relative paths below the destination.
fn check_path_shape(format: &str) -> Result<(), String> {
    if format.contains('\0') {
        return Err("it contains a NUL character".to_owned());
    }
    if format.starts_with('/') {
        return Err("it starts with '/': names are relative to the destination".to_owned());
    }
    for segment in format.split('/') {
        match segment {
            "" => return Err("it has an empty path segment ('//' or a trailing '/')".to_owned()),
            "." | ".." => {
                return Err(format!("it has a {segment:?} path segment"));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2023-09-15T14:42:31.250Z.
    const WINDOW_MS: i64 = 1_694_788_951_250;

    #[test]
    fn the_default_format_renders_azures_default_names() {
        let name = ArchiveNameFormat::default().render("ns", "orders", "3", WINDOW_MS);
        assert_eq!(name, "ns/orders/3/2023/09/15/14/42/31.avro");
        let early = ArchiveNameFormat::default().render("ns", "orders", "0", 0);
        assert_eq!(early, "ns/orders/0/1970/01/01/00/00/00.avro");
    }

    #[test]
    fn a_custom_format_in_any_order_with_any_delimiters_renders() {
        let format = ArchiveNameFormat::parse(
            "Prod_{EventHub}/{Namespace}\\{PartitionId}_{Year}_{Month}/{Day}/{Hour}/{Minute}/{Second}",
        )
        .unwrap();
        assert_eq!(
            format.render("ns", "orders", "12", WINDOW_MS),
            "Prod_orders/ns\\12_2023_09/15/14/42/31.avro"
        );
        let flat = ArchiveNameFormat::parse(
            "{Second}{Minute}{Hour}{Day}{Month}{Year}{PartitionId}{EventHub}{Namespace}",
        )
        .unwrap();
        assert_eq!(
            flat.render("n", "h", "1", WINDOW_MS),
            "314214150920231hn.avro"
        );
    }

    fn refusal(format: &str) -> String {
        ArchiveNameFormat::parse(format).unwrap_err().to_string()
    }

    #[test]
    fn formats_azure_refuses_are_refused_with_the_reason() {
        let missing = refusal("{Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}");
        assert!(missing.contains("missing {Minute}, {Second}"), "{missing}");
        let unknown = refusal(
            "{Namespace}/{EventHub}/{PartitionId}/{Date}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}",
        );
        assert!(unknown.contains("unknown placeholder {Date}"), "{unknown}");
        let case = refusal(
            "{namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}",
        );
        assert!(case.contains("unknown placeholder {namespace}"), "{case}");
        assert!(refusal("{Namespace").contains("not closed"));
        assert!(refusal("Namespace}").contains("closes no placeholder"));
        assert!(refusal("").contains("missing {Namespace}"));
    }

    #[test]
    fn formats_that_would_leave_the_destination_are_refused() {
        let all =
            "{Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}";
        assert!(refusal(&format!("/{all}")).contains("starts with '/'"));
        assert!(refusal(&format!("../{all}")).contains("\"..\" path segment"));
        assert!(refusal(&format!("a//{all}")).contains("empty path segment"));
        assert!(refusal(&format!("{all}/")).contains("empty path segment"));
        assert!(refusal(&format!("{all}\0")).contains("NUL"));
        assert!(refusal(&"x".repeat(2000)).contains("at most 1024"));
    }
}
