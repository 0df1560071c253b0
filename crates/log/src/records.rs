//! [`RecordsRead`]: the events of a read kept as the log stores them, each field read in place.
//!
//! A reader that only passes events on (the capture, writing each as an Avro record) has no use
//! for an owned [`ReceivedEvent`] per event: building one moves about two hundred bytes, takes a
//! reference on the read buffer for its body, and drops both again. A [`RecordsRead`] instead
//! keeps the read's verified batches and an index of where each record's fields lie in them
//! (checked once, as strictly as every read is: see `crate::record`); a [`RecordView`] reads a
//! record's fields from the batch. Its memory is reused from read to read.
//!
//! # Guarantees
//! Every record in a [`RecordsRead`] was checked whole when it was read, so no accessor of a
//! [`RecordView`] can fail, and [`RecordView::to_event`] is the event a read of owned events
//! returns.

use std::ops::Range;

use bytes::Bytes;
use tributary_event::{PropertyValueRef, ReceivedEvent};

use crate::record::{
    BatchHeader, DecodeError, IndexedProperty, IndexedRecord, Span, encode_batch, index_batch,
    owned_event, text_at, value_at,
};

/// The records of one read (see the module docs): filled by `PartitionLog::read_records`,
/// cleared by the next read into it.
#[derive(Debug, Clone, Default)]
pub struct RecordsRead {
    /// The batches the records lie in, each checked against its checksum.
    batches: Vec<Bytes>,
    records: Vec<IndexedRecord>,
    properties: Vec<IndexedProperty>,
}

impl RecordsRead {
    /// An empty read.
    pub fn new() -> RecordsRead {
        RecordsRead::default()
    }

    /// An empty read with room for `records` records before it grows.
    pub(crate) fn with_capacity(records: usize) -> RecordsRead {
        RecordsRead {
            records: Vec::with_capacity(records),
            ..RecordsRead::default()
        }
    }

    /// The records of `events`, as if read from a log that holds them: for a writer of records
    /// fed from elsewhere than a log, and for tests.
    pub fn from_events(events: &[ReceivedEvent]) -> RecordsRead {
        let mut read = RecordsRead::new();
        let mut bytes = Vec::new();
        let mut offsets = Vec::new();
        for event in events {
            encode_batch(
                &mut bytes,
                0,
                0,
                0,
                std::slice::from_ref(&event.data),
                false,
                &mut offsets,
            );
            let batch = Bytes::copy_from_slice(&bytes);
            let header = BatchHeader::decode(&batch).expect("a batch encoded here");
            read.take_batch(&batch, &header, 0, usize::MAX)
                .expect("a batch encoded here");
            let record = read.records.last_mut().expect("one record per batch");
            record.sequence_number = event.sequence_number;
            record.offset = event.offset;
            record.enqueued_time_ms = event.enqueued_time_ms;
        }
        read
    }

    /// Forgets every record and gives back its hold on the batches' memory, keeping the index's
    /// own memory for the next read.
    pub fn clear(&mut self) {
        self.batches.clear();
        self.records.clear();
        self.properties.clear();
    }

    /// How many records the read holds.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the read holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The record at `index`, if the read holds one there.
    pub fn get(&self, index: usize) -> Option<RecordView<'_>> {
        self.records
            .get(index)
            .map(|record| RecordView { read: self, record })
    }

    /// The records, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = RecordView<'_>> + DoubleEndedIterator {
        self.range(0..self.len())
    }

    /// The records at `range` of the read, in order.
    pub fn range(
        &self,
        range: Range<usize>,
    ) -> impl ExactSizeIterator<Item = RecordView<'_>> + DoubleEndedIterator {
        self.records[range]
            .iter()
            .map(|record| RecordView { read: self, record })
    }

    /// Drops the last application property of each record whose last property's key is `key`
    /// (a property only the hub itself writes, which no reader is to see).
    pub fn hide_last_property(&mut self, key: &str) {
        for record in &mut self.records {
            if record.properties.is_empty() {
                continue;
            }
            let last = record.properties.end - 1;
            let batch = &self.batches[record.batch as usize];
            if text_at(batch, self.properties[last as usize].key) == key {
                record.properties.end = last;
            }
        }
    }

    /// The last record's sequence number, if the read holds one.
    pub(crate) fn last_sequence(&self) -> Option<i64> {
        self.records.last().map(|record| record.sequence_number)
    }

    /// Indexes the records of a checksummed `batch` from `from_sequence` on, until the read
    /// holds `max_events`; keeps the batch if any of its records was taken.
    pub(crate) fn take_batch(
        &mut self,
        batch: &Bytes,
        header: &BatchHeader,
        from_sequence: i64,
        max_events: usize,
    ) -> Result<(), DecodeError> {
        let index = u32::try_from(self.batches.len()).expect("a read holds few batches");
        let (before, properties_before) = (self.records.len(), self.properties.len());
        let outcome = index_batch(
            batch,
            header,
            index,
            from_sequence,
            max_events,
            &mut self.records,
            &mut self.properties,
        );
        if let Err(e) = outcome {
            // Nothing of a batch that breaks a rule stays in the read.
            self.records.truncate(before);
            self.properties.truncate(properties_before);
            return Err(e);
        }
        if self.records.len() > before {
            self.batches.push(batch.clone());
        }
        Ok(())
    }
}

/// One record of a [`RecordsRead`], its fields read in place.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    read: &'a RecordsRead,
    record: &'a IndexedRecord,
}

impl<'a> RecordView<'a> {
    fn batch(&self) -> &'a Bytes {
        &self.read.batches[self.record.batch as usize]
    }

    fn text(&self, span: Option<Span>) -> Option<&'a str> {
        span.map(|span| text_at(self.batch(), span))
    }

    /// The event's sequence number.
    pub fn sequence_number(&self) -> i64 {
        self.record.sequence_number
    }

    /// The event's offset in its partition.
    pub fn offset(&self) -> u64 {
        self.record.offset
    }

    /// When the event was enqueued, in milliseconds since the Unix epoch.
    pub fn enqueued_time_ms(&self) -> i64 {
        self.record.enqueued_time_ms
    }

    /// The event's partition key, if it was sent with one.
    pub fn partition_key(&self) -> Option<&'a str> {
        self.text(self.record.partition_key)
    }

    /// The event's content type, if it has one.
    pub fn content_type(&self) -> Option<&'a str> {
        self.text(self.record.content_type)
    }

    /// The event's correlation id, if it has one.
    pub fn correlation_id(&self) -> Option<&'a str> {
        self.text(self.record.correlation_id)
    }

    /// The event's message id, if it has one.
    pub fn message_id(&self) -> Option<&'a str> {
        self.text(self.record.message_id)
    }

    /// The AMQP sections the event was sent with, if it kept them
    /// ([`tributary_event::EventData::protocol_sections`]).
    pub fn protocol_sections(&self) -> Option<&'a [u8]> {
        let batch = self.batch();
        self.record
            .protocol_sections
            .map(|span| &batch[span.range()])
    }

    /// The event's body.
    pub fn body(&self) -> &'a [u8] {
        &self.batch()[self.record.body.range()]
    }

    /// The event's body as shared bytes: a slice of the read's buffer, not a copy (for a
    /// writer that keeps bodies after the read is gone).
    pub fn body_bytes(&self) -> Bytes {
        self.batch().slice(self.record.body.range())
    }

    /// The event's application properties, in order.
    pub fn properties(
        &self,
    ) -> impl ExactSizeIterator<Item = (&'a str, PropertyValueRef<'a>)> + use<'a> {
        let batch: &'a [u8] = self.batch();
        let range = self.record.properties.start as usize..self.record.properties.end as usize;
        self.read.properties[range]
            .iter()
            .map(move |p| (text_at(batch, p.key), value_at(batch, p.value_at)))
    }

    /// The event as an owned [`ReceivedEvent`]: texts copied, bytes shared with the read.
    pub fn to_event(&self) -> ReceivedEvent {
        owned_event(self.batch(), self.record, &self.read.properties)
    }
}

#[cfg(test)]
mod tests {
    use tributary_event::{EventData, PropertyValue};

    use super::*;

    fn event(sequence_number: i64, properties: &[(&str, PropertyValue)]) -> ReceivedEvent {
        let mut data = EventData::new(format!("body {sequence_number}"));
        for (key, value) in properties {
            data = data.with_property(*key, value.clone());
        }
        data.partition_key = Some("key".into());
        ReceivedEvent {
            sequence_number,
            offset: 4096 * sequence_number as u64,
            enqueued_time_ms: 1_700_000_000_000 + sequence_number,
            data,
        }
    }

    #[test]
    fn events_read_back_from_their_records_and_a_hidden_property_is_gone() {
        let events = [
            event(5, &[]),
            event(
                6,
                &[
                    ("a", PropertyValue::Int32(1)),
                    ("hidden", PropertyValue::Null),
                ],
            ),
            event(
                9,
                &[
                    ("hidden", PropertyValue::Bytes("x".into())),
                    ("a", PropertyValue::Null),
                ],
            ),
        ];
        let mut read = RecordsRead::from_events(&events);
        let again: Vec<ReceivedEvent> = read.iter().map(|view| view.to_event()).collect();
        assert_eq!(again, events);
        assert_eq!(read.get(2).unwrap().body(), b"body 9");
        assert!(read.get(3).is_none());

        read.hide_last_property("hidden");
        let keys: Vec<Vec<&str>> = read
            .iter()
            .map(|view| view.properties().map(|(key, _)| key).collect())
            .collect();
        assert_eq!(keys, [vec![], vec!["a"], vec!["hidden", "a"]]);

        read.clear();
        assert!(read.is_empty() && read.batches.is_empty());
    }
}
