//! [`ReadyRecords`]: every record librdkafka already holds for a consumer, taken in one call.
//!
//! Written by hand because the `rdkafka` crate hands out one message per poll (a consumer's
//! stream, `BaseConsumer::poll`), and each poll reads the clock three times, wraps the message
//! in a shared event of its own and takes the queue's lock: a large share of what a replication
//! task spends per copied record (`BENCHMARKS.md` has the figures). librdkafka's batch call, `rd_kafka_consume_batch_queue` (what
//! confluent-kafka-python's `Consumer.consume(n)` uses), takes every ready record under one lock;
//! the crate does not wrap it. This module is `unsafe` code (the workspace's one other place is
//! the log's read into spare capacity): it makes that call, reads the messages through the
//! fields and accessors librdkafka documents, and destroys each message once.
//!
//! What it guarantees:
//! - records come in the consumer queue's order (offset order for a consumer assigned one
//!   partition), and nothing is taken that is not returned: every record the call handed over
//!   becomes an event, and every message is destroyed before [`ReadyRecords::take`] returns —
//!   also when mapping a record panics;
//! - librdkafka returns a consumer's errors as messages carrying an error code: the first one is
//!   returned beside the records, which are all kept (those after the error too, in order).
//!   An error of the client as a whole (a broker's connection lost) that the call meets between
//!   records goes to librdkafka's log instead, as the call serves such errors by the client's
//!   error callback, which the `rdkafka` crate does not set; one met while a receive waits for
//!   its first record comes back from that receive, as before. The call meets no other kind of
//!   event that matters: these consumers are assigned partitions (no rebalances) and commit
//!   nothing through librdkafka (no commit results); a statistics report, which only extra
//!   options can ask for, is dropped;
//! - a header name that is not UTF-8 (a broker passes any bytes on) is read lossily rather than
//!   refused or panicked on (the crate's header accessor panics), as a property name must be a
//!   string. A batch's first record, which comes through the crate's message stream, is read
//!   by the same code ([`event_of_message`]).
#![allow(unsafe_code)]

use std::borrow::Cow;
use std::ffi::CStr;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdkafka::bindings as rdsys;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Timestamp};
use rdkafka::types::RDKafkaRespErr;
use tributary_event::ReceivedEvent;

use crate::mapping::{RecordParts, event_from_record};

/// A handle on a consumer's queue for taking its ready records in one call; see the
/// [module docs](self).
pub(crate) struct ReadyRecords {
    queue: NonNull<rdsys::rd_kafka_queue_t>,
    /// Held so the client outlives the queue handle (dropped after it: fields drop in order).
    _consumer: Arc<StreamConsumer>,
    /// The call's array of message pointers, kept between calls.
    messages: Vec<*mut rdsys::rd_kafka_message_t>,
}

// SAFETY: librdkafka's queues are thread-safe (every queue operation takes the queue's lock),
// and the message pointers in `messages` never outlive a `take`, which needs `&mut self`.
unsafe impl Send for ReadyRecords {}

impl std::fmt::Debug for ReadyRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadyRecords").finish_non_exhaustive()
    }
}

impl Drop for ReadyRecords {
    fn drop(&mut self) {
        // SAFETY: the handle came from `rd_kafka_queue_get_consumer` and is destroyed once,
        // while `_consumer` (dropped after this) still holds the client.
        unsafe { rdsys::rd_kafka_queue_destroy(self.queue.as_ptr()) }
    }
}

impl ReadyRecords {
    /// A handle on `consumer`'s queue (a consumer with a group id has one: every consumer of
    /// this crate sets one).
    pub(crate) fn new(consumer: Arc<StreamConsumer>) -> ReadyRecords {
        // SAFETY: `native_ptr` is the live client of `consumer`, which the handle keeps alive.
        let queue = unsafe { rdsys::rd_kafka_queue_get_consumer(consumer.client().native_ptr()) };
        ReadyRecords {
            queue: NonNull::new(queue).expect("a consumer with a group id has a consumer queue"),
            _consumer: consumer,
            messages: Vec::new(),
        }
    }

    /// Appends up to `max` records that are ready now to `events`, without waiting. An error
    /// librdkafka reported among them comes back after the records are appended.
    pub(crate) fn take(
        &mut self,
        max: usize,
        events: &mut Vec<ReceivedEvent>,
    ) -> Result<(), KafkaError> {
        if max == 0 {
            return Ok(());
        }
        self.messages.clear();
        self.messages.reserve(max);
        // SAFETY: the array has room for `max` pointers; the queue handle is alive.
        let taken = unsafe {
            rdsys::rd_kafka_consume_batch_queue(
                self.queue.as_ptr(),
                0,
                self.messages.as_mut_ptr(),
                max,
            )
        };
        let Ok(taken) = usize::try_from(taken) else {
            // SAFETY: reads this thread's last librdkafka error; no pointer involved.
            let code = unsafe { rdsys::rd_kafka_last_error() };
            return Err(KafkaError::MessageConsumption(RDKafkaErrorCode::from(code)));
        };
        assert!(taken <= max, "librdkafka wrote at most the array's length");
        // SAFETY: the call wrote `taken` message pointers into the reserved room.
        unsafe { self.messages.set_len(taken) };
        let taken = Taken(&mut self.messages);
        let mut first_error = None;
        for &message in taken.0.iter() {
            // SAFETY: a message the call returned, destroyed only when `taken` drops.
            let message = unsafe { &*message };
            if message.err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
                events.push(event_of(message));
            } else if first_error.is_none() {
                first_error = Some(KafkaError::MessageConsumption(message.err.into()));
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// The messages of one call, destroyed when it drops.
struct Taken<'a>(&'a mut Vec<*mut rdsys::rd_kafka_message_t>);

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        for message in self.0.drain(..) {
            // SAFETY: each pointer is a message the call returned, destroyed here once.
            unsafe { rdsys::rd_kafka_message_destroy(message) }
        }
    }
}

/// The event a message the `rdkafka` crate delivered becomes (a batch's first, awaited through
/// a message stream), read as the batch's other records are.
pub(crate) fn event_of_message(message: &BorrowedMessage<'_>) -> ReceivedEvent {
    // SAFETY: the crate's message is live while borrowed.
    event_of(unsafe { &*message.ptr() })
}

/// The event a record becomes, by the same rule as every Kafka path (`mapping`).
fn event_of(message: &rdsys::rd_kafka_message_t) -> ReceivedEvent {
    let parts = RecordParts {
        offset: message.offset,
        // SAFETY: librdkafka's key and payload pointers hold `key_len` and `len` bytes while
        // the message lives, or are null.
        key: unsafe { bytes_at(message.key, message.key_len) },
        value: unsafe { bytes_at(message.payload, message.len) },
        timestamp: timestamp_of(message),
    };
    let mut headers = ptr::null_mut();
    // SAFETY: a live message; librdkafka parses its headers into memory the message owns.
    let found = unsafe { rdsys::rd_kafka_message_headers(message, &mut headers) };
    if found != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR || headers.is_null() {
        return event_from_record(parts, std::iter::empty());
    }
    // SAFETY: `headers` belongs to the live message.
    let headers = unsafe { headers_of(headers) };
    event_from_record(
        parts,
        headers.iter().map(|(name, value)| (name.as_ref(), *value)),
    )
}

/// `len` bytes at `at`, or `None` for a null pointer.
///
/// # Safety
/// `at` is null or points at `len` readable bytes that outlive `'a`.
unsafe fn bytes_at<'a>(at: *const std::ffi::c_void, len: usize) -> Option<&'a [u8]> {
    // SAFETY: as the caller promises.
    (!at.is_null()).then(|| unsafe { std::slice::from_raw_parts(at.cast::<u8>(), len) })
}

fn timestamp_of(message: &rdsys::rd_kafka_message_t) -> Timestamp {
    let mut kind = rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
    // SAFETY: a live message and a place for the kind.
    let ms = unsafe { rdsys::rd_kafka_message_timestamp(message, &mut kind) };
    match kind {
        _ if ms == -1 => Timestamp::NotAvailable,
        rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_CREATE_TIME => {
            Timestamp::CreateTime(ms)
        }
        rdsys::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME => {
            Timestamp::LogAppendTime(ms)
        }
        _ => Timestamp::NotAvailable,
    }
}

/// A message's headers in record order.
///
/// # Safety
/// `headers` is a live message's header list, which outlives `'a`.
unsafe fn headers_of<'a>(
    headers: *const rdsys::rd_kafka_headers_t,
) -> Vec<(Cow<'a, str>, Option<&'a [u8]>)> {
    // SAFETY: as the caller promises.
    let count = unsafe { rdsys::rd_kafka_header_cnt(headers) };
    let mut all = Vec::with_capacity(count);
    for index in 0..count {
        let (mut name, mut value, mut len) = (ptr::null(), ptr::null(), 0);
        // SAFETY: `index` < `count`; the out-pointers are ours.
        let got = unsafe {
            rdsys::rd_kafka_header_get_all(headers, index, &mut name, &mut value, &mut len)
        };
        if got != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: librdkafka's header names are NUL-terminated, values `len` bytes or null,
        // both owned by the header list.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        all.push((name, unsafe { bytes_at(value, len) }));
    }
    all
}
