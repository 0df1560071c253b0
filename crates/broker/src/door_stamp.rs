//! A front door's private stamp on a stored batch: bytes a door keeps with the first event of a
//! batch it appended, durable exactly as the events are (the same append writes both), which no
//! reader ever sees.
//!
//! The Kafka door stamps an idempotent producer's batch with its producer id, epoch and
//! sequence numbers, so that after a restart it recognises a retry of a batch that was stored
//! but whose acknowledgement was lost (see `tributary_kafka`'s `producers` module).
//!
//! # How it is kept
//! The stamp is the event's last application property, named [`DOOR_STAMP_PROPERTY`], with a
//! bytes value: the log stores it as it stores any property, so no format changes. The broker
//! owns the name:
//! - only [`crate::Broker::send_to_partition_stamped`] writes one, from its argument; a
//!   property of that name a client put last on an event sent any other way is dropped, so a
//!   client cannot forge a stamp;
//! - every read ([`crate::Broker::read`], [`crate::Broker::read_records_from`], receivers)
//!   removes it, so no consumer (AMQP, HTTP,
//!   Kafka, an in-process copy) sees it and a replication task never carries it to another
//!   hub; [`crate::Broker::read_door_stamps`] is the one read that returns stamps.

use std::borrow::Cow;

use tributary_event::{EventData, PropertyValue, ReceivedEvent};
use tributary_log::RecordsRead;

/// The name of the property holding a door's stamp (always an event's last property).
pub const DOOR_STAMP_PROPERTY: &str = "x-opt-tributary-door-stamp";

/// What [`crate::Broker::read_door_stamps`] found in a stretch of a partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DoorStamps {
    /// Each stamped event's sequence number and its stamp, in order.
    pub stamps: Vec<(i64, Vec<u8>)>,
    /// The sequence number to read on from (where the read started, at the partition's end).
    pub next_sequence: i64,
}

/// The stamp `event` carries, if its last property is one.
pub(crate) fn stamp_of(event: &EventData) -> Option<&[u8]> {
    match event.properties.last() {
        Some((name, PropertyValue::Bytes(stamp))) if name == DOOR_STAMP_PROPERTY => Some(stamp),
        _ => None,
    }
}

fn is_stamped(event: &EventData) -> bool {
    event
        .properties
        .last()
        .is_some_and(|(name, _)| name == DOOR_STAMP_PROPERTY)
}

/// Removes the stamp from events a reader gets.
pub(crate) fn hide(events: &mut [ReceivedEvent]) {
    for event in events {
        if is_stamped(&event.data) {
            event.data.properties.pop();
        }
    }
}

/// Removes the stamp from records a reader gets in place.
pub(crate) fn hide_in_records(records: &mut RecordsRead) {
    records.hide_last_property(DOOR_STAMP_PROPERTY);
}

/// Drops a stamp a client put on events sent through a path that does not stamp.
pub(crate) fn drop_forged(events: &mut Cow<'_, [EventData]>) {
    if events.iter().any(is_stamped) {
        for event in events.to_mut() {
            if is_stamped(event) {
                event.properties.pop();
            }
        }
    }
    debug_assert!(!events.iter().any(is_stamped));
}

/// Stamps the first of `events` with `stamp` (after dropping any forged stamp).
pub(crate) fn stamp(events: &mut [EventData], stamp: &[u8]) {
    for event in events.iter_mut() {
        if is_stamped(event) {
            event.properties.pop();
        }
    }
    if let Some(first) = events.first_mut() {
        first.properties.push((
            DOOR_STAMP_PROPERTY.into(),
            PropertyValue::Bytes(stamp.to_vec().into()),
        ));
        assert!(stamp_of(first).is_some());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_is_kept_last_found_and_hidden_and_a_forged_one_dropped() {
        let forged = EventData::new("x").with_property(
            DOOR_STAMP_PROPERTY,
            PropertyValue::Bytes(b"forged".to_vec().into()),
        );
        let mut sent = Cow::Owned(vec![forged.clone()]);
        drop_forged(&mut sent);
        assert!(sent[0].properties.is_empty());
        let mut events = vec![forged, EventData::new("y")];
        stamp(&mut events, b"door");
        assert_eq!(stamp_of(&events[0]), Some(&b"door"[..]));
        assert_eq!(events[0].properties.len(), 1);
        assert_eq!(stamp_of(&events[1]), None);
        let mut read = vec![ReceivedEvent {
            sequence_number: 0,
            offset: 0,
            enqueued_time_ms: 0,
            data: events[0].clone(),
        }];
        hide(&mut read);
        assert!(read[0].data.properties.is_empty());
    }
}
