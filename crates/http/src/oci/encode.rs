//! The two answers with a field per message — GetMessages (`[Message]`) and PutMessages
//! (`PutMessagesResult`) — written straight into one buffer.
//!
//! They carry up to 10,000 entries each, and serde's generic path cost more than everything
//! else a request does: every base64 value was built as a `String`, then scanned byte by byte
//! for characters to escape (base64 has none), and every timestamp was formatted anew. Here
//! base64 is encoded in place, the stream name is escaped once per answer, and a timestamp is
//! formatted once per run of equal values (a batch shares one). Strings that may need escaping
//! (the stream name, error messages) still go through `serde_json`.
//!
//! The bytes are exactly what `serde_json::to_vec` writes for the models in [`super::model`];
//! the tests check that.

use std::io::Write as _;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::format_time;

/// Base64 (standard alphabet, padded) of `bytes`, appended to `out`.
fn push_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = base64::encoded_len(bytes.len(), true).expect("a value under 1 MiB fits");
    let start = out.len();
    out.resize(start + len, 0);
    let written = STANDARD
        .encode_slice(bytes, &mut out[start..])
        .expect("the space was sized by encoded_len");
    assert_eq!(written, len);
}

/// A JSON string, escaped as `serde_json` escapes it, appended to `out`.
fn push_json_str(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *out, s).expect("writing to a Vec cannot fail");
}

fn push_number(out: &mut Vec<u8>, n: impl std::fmt::Display) {
    write!(out, "{n}").expect("writing to a Vec cannot fail");
}

/// The last few timestamps formatted, reused while they repeat: the messages of one send share
/// one, and a PutMessages answer interleaves the sends of a request's partitions.
#[derive(Default)]
struct TimeCache {
    recent: Vec<(i64, String)>,
    next_slot: usize,
}

/// Timestamps a [`TimeCache`] keeps: a request's sends, one per partition it writes, commonly
/// fit.
const TIME_CACHE_ENTRIES: usize = 16;

impl TimeCache {
    fn format(&mut self, ms: i64) -> &str {
        let at = match self.recent.iter().position(|(t, _)| *t == ms) {
            Some(at) => at,
            None if self.recent.len() < TIME_CACHE_ENTRIES => {
                self.recent.push((ms, format_time(ms)));
                self.recent.len() - 1
            }
            None => {
                let at = self.next_slot;
                self.next_slot = (at + 1) % TIME_CACHE_ENTRIES;
                self.recent[at] = (ms, format_time(ms));
                at
            }
        };
        &self.recent[at].1
    }
}

/// The most bytes of a `Message` besides its stream name, key and value: field names and
/// punctuation with the separating comma (74, with `null` for the key), a partition (10 digits),
/// an offset (20 characters) and a timestamp (24).
const MESSAGE_FIXED_BYTES_MAX: u64 = 128;

/// Writes a GetMessages answer, one message at a time.
pub(crate) struct MessagesWriter {
    out: Vec<u8>,
    stream_json: Vec<u8>,
    times: TimeCache,
    count: usize,
}

impl MessagesWriter {
    /// An answer about `messages` messages of `stream` carrying `bytes` bytes of keys and
    /// values, sized to fit (a wrong guess only costs a reallocation).
    pub(crate) fn new(stream: &str, messages: u64, bytes: u64) -> Self {
        let mut stream_json = Vec::with_capacity(stream.len() + 2);
        push_json_str(&mut stream_json, stream);
        // Base64 takes 4 bytes per 3 (and pads up to 4 per field); the fixed text of a message
        // (field names, partition, offset, timestamp) fits in 128 bytes.
        let per_message = stream_json.len() as u64 + MESSAGE_FIXED_BYTES_MAX + 8;
        let capacity = bytes / 3 * 4 + messages * per_message + 2;
        let mut out = Vec::with_capacity(usize::try_from(capacity).unwrap_or(0));
        out.push(b'[');
        MessagesWriter {
            out,
            stream_json,
            times: TimeCache::default(),
            count: 0,
        }
    }

    /// Appends one `Message`.
    pub(crate) fn push(
        &mut self,
        partition: u32,
        key: Option<&[u8]>,
        value: &[u8],
        offset: i64,
        time_ms: i64,
    ) {
        let out = &mut self.out;
        if self.count > 0 {
            out.push(b',');
        }
        self.count += 1;
        out.extend_from_slice(b"{\"stream\":");
        out.extend_from_slice(&self.stream_json);
        out.extend_from_slice(b",\"partition\":\"");
        push_number(out, partition);
        out.extend_from_slice(b"\",\"key\":");
        match key {
            Some(key) => {
                out.push(b'"');
                push_base64(out, key);
                out.push(b'"');
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"value\":\"");
        push_base64(out, value);
        out.extend_from_slice(b"\",\"offset\":");
        push_number(out, offset);
        out.extend_from_slice(b",\"timestamp\":\"");
        out.extend_from_slice(self.times.format(time_ms).as_bytes());
        out.extend_from_slice(b"\"}");
    }

    /// The JSON array.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.out.push(b']');
        self.out
    }
}

/// What became of one message of a PutMessages request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PutOutcome {
    /// Not answered (cannot happen once every send is done; written as `{}`, as serde writes an
    /// entry with no fields).
    Unanswered,
    /// Stored at this partition and offset, at this time (ms since the epoch).
    Stored {
        partition: u32,
        offset: i64,
        time_ms: i64,
    },
    /// Refused with an OCI error code and message.
    Failed { code: &'static str, message: String },
}

/// A `PutMessagesResult`.
pub(crate) fn put_result(failures: u32, entries: &[PutOutcome]) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + entries.len() * 64);
    let mut times = TimeCache::default();
    out.extend_from_slice(b"{\"failures\":");
    push_number(&mut out, failures);
    out.extend_from_slice(b",\"entries\":[");
    for (n, entry) in entries.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        match entry {
            PutOutcome::Unanswered => out.extend_from_slice(b"{}"),
            PutOutcome::Stored {
                partition,
                offset,
                time_ms,
            } => {
                out.extend_from_slice(b"{\"partition\":\"");
                push_number(&mut out, partition);
                out.extend_from_slice(b"\",\"offset\":");
                push_number(&mut out, offset);
                out.extend_from_slice(b",\"timestamp\":\"");
                out.extend_from_slice(times.format(*time_ms).as_bytes());
                out.extend_from_slice(b"\"}");
            }
            PutOutcome::Failed { code, message } => {
                out.extend_from_slice(b"{\"error\":");
                push_json_str(&mut out, code);
                out.extend_from_slice(b",\"errorMessage\":");
                push_json_str(&mut out, message);
                out.push(b'}');
            }
        }
    }
    out.extend_from_slice(b"]}");
    out
}

#[cfg(test)]
mod tests {
    use super::super::model::{Message, PutMessagesResult, PutMessagesResultEntry};
    use super::super::{encode_base64, format_time};
    use super::*;

    #[test]
    fn messages_are_what_serde_writes() {
        /// Partition, key, value, offset, time.
        type Case<'a> = (u32, Option<&'a [u8]>, &'a [u8], i64, i64);
        let cases: Vec<Case<'_>> = vec![
            (0, None, b"", 0, 0),
            (7, Some(b"k\x00\xff"), b"hello", 41, 1_700_000_000_123),
            (1023, Some(b""), &[0xfb; 1000], i64::MAX, 1_700_000_000_123),
            (3, None, b"x", 5, 1_700_000_000_124),
        ];
        let bytes: usize = cases
            .iter()
            .map(|c| c.1.map_or(0, <[u8]>::len) + c.2.len())
            .sum();
        for stream in ["orders", "we\"ird\\ \u{7} name \u{e9}"] {
            let mut writer = MessagesWriter::new(stream, cases.len() as u64, bytes as u64);
            let capacity = writer.out.capacity();
            let mut models = Vec::new();
            for &(partition, key, value, offset, time_ms) in &cases {
                writer.push(partition, key, value, offset, time_ms);
                models.push(Message {
                    stream: stream.to_owned(),
                    partition: partition.to_string(),
                    key: key.map(encode_base64),
                    value: encode_base64(value),
                    offset,
                    timestamp: format_time(time_ms),
                });
            }
            let written = writer.finish();
            assert!(written.len() <= capacity, "sized to fit, no reallocation");
            assert_eq!(
                String::from_utf8(written).unwrap(),
                serde_json::to_string(&models).unwrap()
            );
        }
        let empty = MessagesWriter::new("s", 0, 0).finish();
        assert_eq!(empty, b"[]");
    }

    #[test]
    fn put_results_are_what_serde_writes() {
        let outcomes = vec![
            PutOutcome::Stored {
                partition: 2,
                offset: 10,
                time_ms: 1_700_000_000_123,
            },
            PutOutcome::Failed {
                code: "InternalServerError",
                message: "disk \"full\"\n".to_owned(),
            },
            PutOutcome::Stored {
                partition: 0,
                offset: 0,
                time_ms: 1_700_000_000_999,
            },
            PutOutcome::Unanswered,
        ];
        let entries = outcomes
            .iter()
            .map(|o| match o {
                PutOutcome::Unanswered => PutMessagesResultEntry::default(),
                PutOutcome::Stored {
                    partition,
                    offset,
                    time_ms,
                } => PutMessagesResultEntry {
                    partition: Some(partition.to_string()),
                    offset: Some(*offset),
                    timestamp: Some(format_time(*time_ms)),
                    ..Default::default()
                },
                PutOutcome::Failed { code, message } => PutMessagesResultEntry {
                    error: Some((*code).to_owned()),
                    error_message: Some(message.clone()),
                    ..Default::default()
                },
            })
            .collect();
        let model = PutMessagesResult {
            failures: 1,
            entries,
        };
        assert_eq!(
            String::from_utf8(put_result(1, &outcomes)).unwrap(),
            serde_json::to_string(&model).unwrap()
        );
    }

    #[test]
    fn times_beyond_the_cache_are_formatted_anew() {
        let mut cache = TimeCache::default();
        let times: Vec<i64> = (0..3 * TIME_CACHE_ENTRIES as i64)
            .map(|n| 1_700_000_000_000 + n * 7)
            .collect();
        for round in 0..2 {
            for (n, &t) in times.iter().enumerate() {
                assert_eq!(cache.format(t), format_time(t), "round {round}, time {n}");
                // Interleave an early time so the cache holds a mix of old and new.
                assert_eq!(cache.format(times[0]), format_time(times[0]));
            }
        }
        assert!(cache.recent.len() <= TIME_CACHE_ENTRIES);
    }
}
