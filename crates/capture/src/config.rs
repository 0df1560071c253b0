//! How a capture is configured: its windows, its file format and its archive names.

use std::time::Duration;

use crate::archive::ArchiveNameFormat;
use crate::error::CaptureError;
use crate::limits::{
    INTERVAL_DEFAULT, INTERVAL_MAX, INTERVAL_MIN, SIZE_BYTES_DEFAULT, SIZE_BYTES_MAX,
    SIZE_BYTES_MIN,
};

/// The encoding of a window's file: Azure's `Avro` and `AvroDeflate`, and `Parquet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaptureFormat {
    /// An Avro object container file with the `null` codec (Azure's default).
    #[default]
    Avro,
    /// An Avro object container file whose blocks are compressed with the `deflate` codec.
    AvroDeflate,
    /// A Parquet file with one column per field of Azure's record (see [`crate::window`]);
    /// needs the `parquet` feature.
    Parquet,
}

impl CaptureFormat {
    /// Azure's name of the encoding (`Avro`, `AvroDeflate`).
    pub fn as_str(self) -> &'static str {
        match self {
            CaptureFormat::Avro => "Avro",
            CaptureFormat::AvroDeflate => "AvroDeflate",
            CaptureFormat::Parquet => "Parquet",
        }
    }

    /// What the archive names of files in this format end with.
    pub fn extension(self) -> &'static str {
        match self {
            CaptureFormat::Avro | CaptureFormat::AvroDeflate => crate::archive::ARCHIVE_EXTENSION,
            CaptureFormat::Parquet => ".parquet",
        }
    }

    /// Parses Azure's name of an encoding, in any case.
    pub fn parse(text: &str) -> Result<CaptureFormat, CaptureError> {
        if text.eq_ignore_ascii_case("avro") {
            Ok(CaptureFormat::Avro)
        } else if text.eq_ignore_ascii_case("avrodeflate")
            || text.eq_ignore_ascii_case("avro-deflate")
        {
            Ok(CaptureFormat::AvroDeflate)
        } else if text.eq_ignore_ascii_case("parquet") {
            Ok(CaptureFormat::Parquet)
        } else {
            Err(CaptureError::InvalidConfig {
                setting: "capture-format",
                reason: format!(
                    "{text:?} is not a capture encoding; use Avro, AvroDeflate or Parquet"
                ),
            })
        }
    }
}

/// The configuration of a capture; [`CaptureConfig::validate`] checks it against Azure's ranges.
///
/// A window closes at whichever comes first: `interval` after it opened, or once it holds
/// `size_bytes_max` bytes of events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureConfig {
    /// The time window, 60 s to 900 s (`--capture-interval`).
    pub interval: Duration,
    /// The size window, 10 MiB to 500 MiB (`--capture-size`): the bytes of the events' Avro
    /// records (before compression) at which a window closes.
    pub size_bytes_max: u64,
    /// Whether a window without events writes no file (`--capture-skip-empty`). Azure's default
    /// (false) writes an empty file: a header and no records.
    pub skip_empty: bool,
    /// The file encoding.
    pub format: CaptureFormat,
    /// Where each window's file goes.
    pub archive_name_format: ArchiveNameFormat,
}

impl Default for CaptureConfig {
    /// Azure's defaults: 300 s, 300 MiB, empty files written, Avro, the default name format.
    fn default() -> Self {
        CaptureConfig {
            interval: INTERVAL_DEFAULT,
            size_bytes_max: SIZE_BYTES_DEFAULT,
            skip_empty: false,
            format: CaptureFormat::Avro,
            archive_name_format: ArchiveNameFormat::default(),
        }
    }
}

impl CaptureConfig {
    /// Checks the windows against Azure's ranges (the name format was checked when parsed).
    pub fn validate(&self) -> Result<(), CaptureError> {
        if self.format == CaptureFormat::Parquet && !cfg!(feature = "parquet") {
            return Err(CaptureError::InvalidConfig {
                setting: "capture-format",
                reason: "this build has no Parquet (tributary-capture's `parquet` feature)".into(),
            });
        }
        if !(INTERVAL_MIN..=INTERVAL_MAX).contains(&self.interval) {
            return Err(CaptureError::InvalidConfig {
                setting: "capture-interval",
                reason: format!(
                    "{} s is outside {} s..={} s",
                    self.interval.as_secs_f64(),
                    INTERVAL_MIN.as_secs(),
                    INTERVAL_MAX.as_secs()
                ),
            });
        }
        if !(SIZE_BYTES_MIN..=SIZE_BYTES_MAX).contains(&self.size_bytes_max) {
            return Err(CaptureError::InvalidConfig {
                setting: "capture-size",
                reason: format!(
                    "{} bytes is outside {SIZE_BYTES_MIN}..={SIZE_BYTES_MAX} (10 MiB to 500 MiB)",
                    self.size_bytes_max
                ),
            });
        }
        Ok(())
    }

    /// The time window in milliseconds.
    pub(crate) fn interval_ms(&self) -> i64 {
        i64::try_from(self.interval.as_millis()).unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn azures_ranges_are_accepted_and_nothing_outside() {
        let mut config = CaptureConfig::default();
        config.validate().unwrap();
        for (interval, ok) in [(59, false), (60, true), (900, true), (901, false)] {
            config.interval = Duration::from_secs(interval);
            assert_eq!(config.validate().is_ok(), ok, "{interval} s");
        }
        config.interval = INTERVAL_DEFAULT;
        for (size, ok) in [
            (SIZE_BYTES_MIN - 1, false),
            (SIZE_BYTES_MIN, true),
            (SIZE_BYTES_MAX, true),
            (SIZE_BYTES_MAX + 1, false),
        ] {
            config.size_bytes_max = size;
            assert_eq!(config.validate().is_ok(), ok, "{size} bytes");
        }
        config.size_bytes_max = 1;
        let message = config.validate().unwrap_err().to_string();
        assert!(message.contains("capture-size"), "{message}");
    }

    #[test]
    fn encodings_parse_by_azures_names() {
        assert_eq!(CaptureFormat::parse("Avro").unwrap(), CaptureFormat::Avro);
        assert_eq!(
            CaptureFormat::parse("avrodeflate").unwrap(),
            CaptureFormat::AvroDeflate
        );
        assert_eq!(
            CaptureFormat::parse("PARQUET").unwrap(),
            CaptureFormat::Parquet
        );
        assert_eq!(CaptureFormat::Parquet.extension(), ".parquet");
        assert!(
            CaptureFormat::parse("orc")
                .unwrap_err()
                .to_string()
                .contains("capture-format")
        );
    }
}
