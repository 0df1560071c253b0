//! The texts of times in Azure's capture files, names and notifications, all in UTC.
//!
//! - A record's `EnqueuedTimeUtc` is .NET's invariant-culture general format
//!   `M/d/yyyy h:mm:ss tt` (`12/2/2021 2:58:24 PM`): no leading zeros on month, day and hour,
//!   a 12-hour clock, whole seconds.
//! - An archive name's `{Year}` is four digits, `{Month}` to `{Second}` two.
//! - A notification's times are ISO 8601 with milliseconds and `Z` (`2017-08-31T19:12:14.674Z`).
//!
//! Times outside what .NET can write (before year 1 or after 9999) are clamped to its range.

use time::OffsetDateTime;

/// The first millisecond .NET's `DateTime` can hold (0001-01-01T00:00:00Z).
const MS_MIN: i64 = -62_135_596_800_000;
/// The last whole second .NET's `DateTime` can hold (9999-12-31T23:59:59Z).
const MS_MAX: i64 = 253_402_300_799_000;

/// A UTC time split into the fields an archive name uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcFields {
    /// 1 to 9999.
    pub year: i32,
    /// 1 to 12.
    pub month: u8,
    /// 1 to 31.
    pub day: u8,
    /// 0 to 23.
    pub hour: u8,
    /// 0 to 59.
    pub minute: u8,
    /// 0 to 59.
    pub second: u8,
    /// 0 to 999.
    pub millisecond: u16,
}

impl UtcFields {
    /// The fields of `ms` milliseconds since the Unix epoch (clamped to years 1..=9999).
    pub fn from_ms(ms: i64) -> UtcFields {
        let clamped = ms.clamp(MS_MIN, MS_MAX);
        let time = OffsetDateTime::from_unix_timestamp(clamped.div_euclid(1000))
            .expect("the clamped range is within what `time` holds");
        let millisecond = u16::try_from(clamped.rem_euclid(1000)).expect("below 1000");
        UtcFields {
            year: time.year(),
            month: u8::from(time.month()),
            day: time.day(),
            hour: time.hour(),
            minute: time.minute(),
            second: time.second(),
            millisecond,
        }
    }
}

/// `EnqueuedTimeUtc` as Azure writes it: `M/d/yyyy h:mm:ss tt`, e.g. `9/15/2023 2:42:31 PM`.
pub fn enqueued_time_utc(ms: i64) -> String {
    let t = UtcFields::from_ms(ms);
    let (hour, half) = match t.hour {
        0 => (12, "AM"),
        1..=11 => (t.hour, "AM"),
        12 => (12, "PM"),
        _ => (t.hour - 12, "PM"),
    };
    format!(
        "{}/{}/{} {}:{:02}:{:02} {}",
        t.month, t.day, t.year, hour, t.minute, t.second, half
    )
}

/// ISO 8601 with milliseconds, as Event Grid's capture notifications write times:
/// `2017-08-31T19:12:14.674Z`.
pub fn iso_millis(ms: i64) -> String {
    let t = UtcFields::from_ms(ms);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second, t.millisecond
    )
}

/// What Azure's notification of an empty file says for its first and last enqueue time: .NET's
/// `DateTime.MinValue`.
pub const NO_ENQUEUE_TIME: &str = "0001-01-01T00:00:00";

#[cfg(test)]
mod tests {
    use super::*;

    /// 2021-12-02T14:58:24.816Z, the enqueued time of a record in a file Azure wrote, whose
    /// `EnqueuedTimeUtc` reads `12/2/2021 2:58:24 PM` (`x-opt-enqueued-time` 1638457104816).
    const AZURE_SAMPLE_MS: i64 = 1_638_457_104_816;

    #[test]
    fn enqueued_time_is_dotnets_invariant_general_format() {
        assert_eq!(enqueued_time_utc(AZURE_SAMPLE_MS), "12/2/2021 2:58:24 PM");
        // Midnight and noon are 12 on a 12-hour clock; no leading zeros on month, day, hour.
        assert_eq!(
            enqueued_time_utc(1_694_736_000_000),
            "9/15/2023 12:00:00 AM"
        );
        assert_eq!(
            enqueued_time_utc(1_694_779_351_000),
            "9/15/2023 12:02:31 PM"
        );
        assert_eq!(enqueued_time_utc(1_694_788_951_999), "9/15/2023 2:42:31 PM");
        assert_eq!(enqueued_time_utc(0), "1/1/1970 12:00:00 AM");
    }

    #[test]
    fn times_out_of_dotnets_range_are_clamped() {
        assert_eq!(enqueued_time_utc(i64::MIN), "1/1/1 12:00:00 AM");
        assert_eq!(enqueued_time_utc(i64::MAX), "12/31/9999 11:59:59 PM");
        assert_eq!(iso_millis(i64::MIN), "0001-01-01T00:00:00.000Z");
    }

    #[test]
    fn notification_times_are_iso_with_milliseconds() {
        assert_eq!(iso_millis(AZURE_SAMPLE_MS), "2021-12-02T14:58:24.816Z");
        assert_eq!(iso_millis(-1), "1969-12-31T23:59:59.999Z");
    }
}
