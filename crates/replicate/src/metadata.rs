//! The properties a replication task stamps on every event it forwards, and reads back.
//!
//! Two families, both application properties holding strings:
//!
//! - **Service metadata**, exactly as Azure's replication helper writes it
//!   (`Azure.Messaging.Replication`, `Constants.cs`): [`ENQUEUED_TIME`] (the source's enqueued
//!   time in .NET's `"u"` format, `2024-05-01 13:02:03Z`), [`OFFSET`] and [`SEQUENCE`] (decimal).
//!   On a second hop the new value is appended after a `;`, so the oldest hop comes first. The
//!   Microsoft documentation spells the first one [`ENQUEUED_TIME_DOC_SPELLING`]; both are read,
//!   the code's spelling is written.
//! - **Source partition**, Tributary's own: [`PARTITION`], appended per hop like the three
//!   above, so a hop's sequence number and offset say which partition they are of (Azure's
//!   helper records none, and sequence numbers repeat across partitions).
//! - **Origin and path**, Tributary's own: [`ORIGIN`] is the stable, unique id of the hub the
//!   event was first produced to (a Tributary hub's UUID, or `<namespace host>/<hub>` for Azure
//!   Event Hubs) and [`PATH`] the ids of every hub it has been stored in since, `;`-separated,
//!   origin first. A task never forwards an event to a hub already on its path, so mirrored hubs
//!   (any number, any names) never loop. Azure's sample marks events with the target hub's
//!   *name*, which breaks with three hubs or two hubs of one name.
//! - **Fan-out**, Tributary's own: [`FANOUT`] holds the ids of the hubs a hop sent the event to
//!   besides the one holding this copy (one task routing an event to several hubs), appended
//!   per hop. Those hubs receive the event directly, so a task later in the path skips them
//!   ([`reached`]): in a full mesh whose hubs each run one task with every other hub as a
//!   target, every event reaches every hub once, while a chain still relays.
//!
//! A first hop's stamp (the common case: an event without `repl-*` properties, sent to one
//! hub, no Azure marker) need not be held by the event: for a target that encodes AMQP
//! messages itself, a [`FirstHopStamp`] is encoded once per route and source partition and
//! written into each message with the event's own offset, sequence number and enqueued time
//! ([`Undo::deferred`]). The message carries the same properties, in the same order, as an
//! event stamped by [`stamp_with`].
//!
//! Ids never contain `;` (a Tributary id is a UUID; a host name and a hub name cannot hold one),
//! so the lists split unambiguously.

use time::OffsetDateTime;
use time::format_description::FormatItem;
use time::macros::format_description;
use tributary_edit::Position;
use tributary_event::{EventData, PropertyValue, SmolStr};
use tributary_eventhubs::send::{Stamp, StampValue};

/// The source's enqueued time, as Azure's helper names it (code spelling; written).
pub const ENQUEUED_TIME: &str = "repl-enqueued-time";
/// [`ENQUEUED_TIME`] as the Microsoft documentation spells it (read only).
pub const ENQUEUED_TIME_DOC_SPELLING: &str = "repl-enqueue-time";
/// The source offset (decimal).
pub const OFFSET: &str = "repl-offset";
/// The source sequence number (decimal).
pub const SEQUENCE: &str = "repl-sequence";
/// The source partition id.
pub const PARTITION: &str = "repl-partition";
/// The id of the hub the event was first produced to.
pub const ORIGIN: &str = "repl-origin";
/// The ids of the hubs the event has been stored in, origin first.
pub const PATH: &str = "repl-path";
/// The ids of the hubs the event's hops sent other copies of it to directly.
pub const FANOUT: &str = "repl-fanout";

/// The marker Azure's merge sample (`EventHubMerge`) sets on each event it copies: the name of
/// the hub it copied the event into. Read, and written when a task asks for it, so a Tributary
/// task can share a mesh with those functions (`[merge] azure_marker`).
pub const AZURE_MERGE_TARGET: &str = "repl-target";

/// What every property above starts with.
const PREFIX: &str = "repl-";

/// How many properties a first hop's stamp appends.
const FIRST_HOP_PROPERTIES: usize = 6;

/// A first hop's properties whose values differ per event, in the order they are written
/// (before [`PARTITION`], [`ORIGIN`] and [`PATH`], the same for a partition's whole batch).
const FIRST_HOP_VARYING: [&str; 3] = [ENQUEUED_TIME, OFFSET, SEQUENCE];

/// What separates the hops of one property.
pub const HOP_SEPARATOR: char = ';';

/// .NET's `"u"` format: `yyyy-MM-dd HH:mm:ssZ`, always UTC, second precision.
const UNIVERSAL_SORTABLE: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day] [hour]:[minute]:[second]Z");

/// The string value of application property `key`, if it is a string.
fn string_property<'a>(event: &'a EventData, key: &str) -> Option<&'a str> {
    match event.property(key) {
        Some(PropertyValue::String(value)) => Some(value),
        _ => None,
    }
}

/// What [`stamp`] changed in an event, so [`Undo::apply`] gives the event back as it was (for
/// a dead letter, which is stamped for the dead-letter hub instead). On a first hop a stamp
/// only appends properties, and the record holds no copy of anything. The empty record
/// (`Undo::default()`, what an event sent without a stamp carries, such as a table's row)
/// changes nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Undo {
    /// How many properties the stamp appended: the event's last ones.
    appended: usize,
    /// The properties the stamp changed in place, with their values before.
    replaced: Vec<(usize, PropertyValue)>,
    /// The event does not hold its first-hop stamp: its [`FirstHopStamp`] is written into
    /// its message as it is sent.
    deferred: bool,
}

impl Undo {
    /// The record of an event whose first-hop stamp is written as it is sent
    /// ([`FirstHopStamp`]), not into the event: nothing to take off.
    pub fn deferred() -> Undo {
        Undo {
            deferred: true,
            ..Undo::default()
        }
    }

    /// Whether the event's first-hop stamp is written as it is sent ([`Undo::deferred`]).
    pub fn is_deferred(&self) -> bool {
        self.deferred
    }

    /// Takes the stamp back off `event` (the event as the stamp left it).
    pub fn apply(self, event: &mut EventData) {
        assert!(
            self.appended <= event.properties.len(),
            "a stamp appended more properties than the event has"
        );
        let kept = event.properties.len() - self.appended;
        event.properties.truncate(kept);
        for (index, value) in self.replaced.into_iter().rev() {
            assert!(index < kept, "a property replaced in place was appended");
            event.properties[index].1 = value;
        }
    }
}

/// Sets `key` to `value`, replacing the value it had (in place, so property order is kept).
fn put(event: &mut EventData, undo: &mut Undo, key: &'static str, value: SmolStr) {
    let value = PropertyValue::String(value);
    match event.properties.iter().position(|(k, _)| k == key) {
        Some(index) => {
            let before = std::mem::replace(&mut event.properties[index].1, value);
            // A property this stamp appended goes with the stamp; one the event had is restored.
            if index < event.properties.len() - undo.appended {
                undo.replaced.push((index, before));
            }
        }
        None => {
            event.properties.push((SmolStr::new_static(key), value));
            undo.appended += 1;
        }
    }
}

/// Appends `hop` to the `;`-list in `key` (starting the list if there is none).
fn append(event: &mut EventData, undo: &mut Undo, key: &'static str, hop: &SmolStr) {
    let value = match string_property(event, key) {
        Some(earlier) if !earlier.is_empty() => {
            SmolStr::from(format!("{earlier}{HOP_SEPARATOR}{hop}"))
        }
        _ => hop.clone(),
    };
    put(event, undo, key, value);
}

/// Formats a time as .NET's `"u"` format does; times outside what it can write (before year 1
/// or after 9999) are clamped to its range. The text of the last second formatted on this
/// thread is kept: a task stamps runs of events enqueued within one second. The text (20
/// bytes) is held inline: no allocation.
pub fn format_enqueued_time(ms: i64) -> SmolStr {
    thread_local! {
        static LAST: std::cell::RefCell<(i64, SmolStr)> =
            const { std::cell::RefCell::new((i64::MIN, SmolStr::new_static(""))) };
    }
    let clamped = ms.clamp(-62_135_596_800_000, 253_402_300_799_000);
    let second = clamped.div_euclid(1000);
    LAST.with_borrow_mut(|(last, text)| {
        if *last != second {
            *text = OffsetDateTime::from_unix_timestamp(second)
                .ok()
                .and_then(|time| time.format(UNIVERSAL_SORTABLE).ok())
                .map(SmolStr::from)
                .unwrap_or_default();
            *last = second;
        }
        text.clone()
    })
}

/// Parses a time written in .NET's `"u"` format or RFC 3339, to the nanosecond it gives.
pub fn parse_time(text: &str) -> Option<OffsetDateTime> {
    let text = text.trim();
    time::PrimitiveDateTime::parse(text, UNIVERSAL_SORTABLE)
        .map(|t| t.assume_utc())
        .or_else(|_| OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339))
        .ok()
}

/// Parses one hop of [`ENQUEUED_TIME`] (as [`parse_time`] does); ms since the epoch.
pub fn parse_enqueued_time(text: &str) -> Option<i64> {
    i64::try_from(parse_time(text)?.unix_timestamp_nanos() / 1_000_000).ok()
}

/// The origin of `event`, if a replication task recorded one.
pub fn origin(event: &EventData) -> Option<&str> {
    string_property(event, ORIGIN).filter(|origin| !origin.is_empty())
}

/// Whether `hub_id` is on `event`'s path (or is its origin).
pub fn has_passed_through(event: &EventData, hub_id: &str) -> bool {
    origin(event) == Some(hub_id)
        || string_property(event, PATH)
            .is_some_and(|path| path.split(HOP_SEPARATOR).any(|hop| hop == hub_id))
}

/// Whether `hub_id` has the event or is getting it directly: it is on the path (or is the
/// origin), or a hop sent a copy of the event there ([`FANOUT`]). A task skips such a target:
/// forwarding would make a loop or a second copy.
pub fn reached(event: &EventData, hub_id: &str) -> bool {
    has_passed_through(event, hub_id)
        || string_property(event, FANOUT)
            .is_some_and(|sent| sent.split(HOP_SEPARATOR).any(|hub| hub == hub_id))
}

/// Records in `event`'s [`FANOUT`] that this hop also sends a copy to the hub `ids.target()`.
/// Recorded in `undo` like the rest of the stamp.
pub fn mark_fanout(event: &mut EventData, undo: &mut Undo, ids: &HopIds) {
    append(event, undo, FANOUT, &ids.target);
}

/// Whether Azure's merge sample copied `event` into the hub named `hub_name`: its
/// [`AZURE_MERGE_TARGET`] names that hub (event hub names compare case-insensitively). Such an
/// event must not be copied back out, as the sample's own rule says.
pub fn azure_merge_copied_into(event: &EventData, hub_name: &str) -> bool {
    string_property(event, AZURE_MERGE_TARGET)
        .is_some_and(|target| target.eq_ignore_ascii_case(hub_name))
}

/// Sets Azure's merge marker [`AZURE_MERGE_TARGET`] to `target_hub_name`, as the sample does
/// when it copies an event, so its function on the other side does not copy the event back.
/// Recorded in `undo` like the rest of the stamp.
pub fn mark_azure_merge_target(event: &mut EventData, undo: &mut Undo, target_hub_name: &SmolStr) {
    put(event, undo, AZURE_MERGE_TARGET, target_hub_name.clone());
}

/// The hub ids one route's stamps write, built once per route: every event then holds a shared
/// copy of each (the ids are longer than a string held inline), not a string of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HopIds {
    /// The hub the task reads.
    source: SmolStr,
    /// The hub the route writes.
    target: SmolStr,
    /// A first hop's path: `<source>;<target>`.
    first_path: SmolStr,
}

impl HopIds {
    /// The ids for forwarding from the hub `source_id` to the hub `target_id`.
    pub fn new(source_id: &str, target_id: &str) -> HopIds {
        debug_assert!(!source_id.contains(HOP_SEPARATOR));
        debug_assert!(!target_id.contains(HOP_SEPARATOR));
        HopIds {
            source: SmolStr::new(source_id),
            target: SmolStr::new(target_id),
            first_path: SmolStr::from(format!("{source_id}{HOP_SEPARATOR}{target_id}")),
        }
    }

    /// The same ids in strings of their own, not shared with `self`: for one partition's
    /// processor. A clone shares each id's reference count, and every stamped event takes and
    /// later drops a reference to two of them; processors of several partitions on several
    /// threads counting on one shared count would contend for its cache line on every event.
    pub fn own_copy(&self) -> HopIds {
        HopIds {
            source: SmolStr::new(self.source.as_str()),
            target: SmolStr::new(self.target.as_str()),
            first_path: SmolStr::new(self.first_path.as_str()),
        }
    }

    /// The id of the hub the task reads.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The id of the hub the route writes.
    pub fn target(&self) -> &str {
        &self.target
    }
}

/// Whether `event` carries no stamp yet: stamping it is a first hop.
pub fn is_first_hop(event: &EventData) -> bool {
    !event
        .properties
        .iter()
        .any(|(key, _)| key.starts_with(PREFIX))
}

/// One route's first-hop stamp for one source partition, its AMQP bytes encoded once: the
/// stamp a first hop's event is sent with instead of holding it ([`Undo::deferred`]). A
/// target that encodes messages itself writes it into each message with the event's values;
/// one that stores events as they are ([`FirstHopStamp::apply`]) has each event hold it.
/// Either way the message carries what [`stamp_with`] writes, in its order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstHopStamp {
    encoded: Stamp,
    partition: SmolStr,
    ids: HopIds,
}

impl FirstHopStamp {
    /// The most bytes one of the stamp's values takes: an enqueued time (always 20:
    /// `yyyy-MM-dd HH:mm:ssZ`, the year clamped to 1–9999) or a decimal of 64 bits.
    pub const VALUE_BYTES_MAX: usize = StampValue::INTEGER_BYTES_MAX;
    /// The stamp of events read from partition `partition` of the hub `ids.source()`, sent to
    /// the hub `ids.target()`; `None` for ids too long for AMQP (their events then hold their
    /// stamps).
    pub fn new(partition: &SmolStr, ids: &HopIds) -> Option<FirstHopStamp> {
        let fixed = [
            (PARTITION, partition.as_str()),
            (ORIGIN, ids.source()),
            (PATH, ids.first_path.as_str()),
        ];
        let encoded = Stamp::new(&FIRST_HOP_VARYING, &fixed).ok()?;
        Some(FirstHopStamp {
            encoded,
            partition: partition.clone(),
            ids: ids.clone(),
        })
    }

    /// The stamp's bytes.
    pub fn encoded(&self) -> &Stamp {
        &self.encoded
    }

    /// Writes the values of [`FIRST_HOP_VARYING`] for an event read at `position` into
    /// `values` (as many as [`Stamp::varying_len`]): its enqueued time, offset and sequence
    /// number.
    pub fn values(position: Position, values: &mut [StampValue]) {
        if let [time, offset, sequence] = values {
            *time = StampValue::Text(format_enqueued_time(position.enqueued_time_ms));
            *offset = StampValue::Unsigned(position.offset);
            *sequence = StampValue::Signed(position.sequence_number);
        }
    }

    /// Has `event`, read at `position`, hold the stamp itself, as [`stamp_with`] writes it.
    pub fn apply(&self, event: &mut EventData, position: Position) {
        stamp_with(event, &self.partition, position, &self.ids);
    }
}

/// Stamps `event`, read at `position` from the hub `source_id`, for forwarding to the hub
/// `target_id` (see [`stamp_with`], which takes the ids built once).
pub fn stamp(
    event: &mut EventData,
    partition_id: &str,
    position: Position,
    source_id: &str,
    target_id: &str,
) -> Undo {
    stamp_with(
        event,
        &SmolStr::new(partition_id),
        position,
        &HopIds::new(source_id, target_id),
    )
}

/// Stamps `event`, read at `position` from partition `partition` of the hub `ids.source()`,
/// for forwarding to the hub `ids.target()`: appends the service metadata and the target to the
/// path, and records the source as origin (and first hop) when the event has none yet. Returns
/// what to take back off to have the event as it was.
pub fn stamp_with(
    event: &mut EventData,
    partition: &SmolStr,
    position: Position,
    ids: &HopIds,
) -> Undo {
    let mut undo = Undo::default();
    let time = format_enqueued_time(position.enqueued_time_ms);
    let offset = decimal(position.offset);
    // A Kafka record's sequence number is its offset: one number, written once.
    let sequence = if i64::try_from(position.offset) == Ok(position.sequence_number) {
        offset.clone()
    } else {
        decimal(position.sequence_number)
    };
    let partition = partition.clone();
    if is_first_hop(event) {
        // A first hop (the common case): nothing to find or extend, six appends of strings
        // held inline or shared, each written where it stays.
        let properties = &mut event.properties;
        properties.reserve(FIRST_HOP_PROPERTIES);
        let mut string = |key: &'static str, value: SmolStr| {
            properties.push((SmolStr::new_static(key), PropertyValue::String(value)));
        };
        let [time_key, offset_key, sequence_key] = FIRST_HOP_VARYING;
        string(time_key, time);
        string(offset_key, offset);
        string(sequence_key, sequence);
        string(PARTITION, partition);
        string(ORIGIN, ids.source.clone());
        string(PATH, ids.first_path.clone());
        undo.appended = FIRST_HOP_PROPERTIES;
        return undo;
    }
    append(event, &mut undo, ENQUEUED_TIME, &time);
    append(event, &mut undo, OFFSET, &offset);
    append(event, &mut undo, SEQUENCE, &sequence);
    append(event, &mut undo, PARTITION, &partition);
    if origin(event).is_none() {
        put(event, &mut undo, ORIGIN, ids.source.clone());
        put(event, &mut undo, PATH, ids.source.clone());
    }
    append(event, &mut undo, PATH, &ids.target);
    undo
}

/// `n` in decimal, held inline: an integer of 64 bits at most (the `Into<i128>` bound keeps the
/// 128-bit ones out) takes at most 20 characters, within the 23 a `SmolStr` holds inline.
fn decimal(n: impl itoa::Integer + Into<i128>) -> SmolStr {
    SmolStr::new_inline(itoa::Buffer::new().format(n))
}

/// One hop of the service metadata, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// The enqueued time in the hub the event was read from, if it parsed.
    pub enqueued_time_ms: Option<i64>,
    /// The offset there (kept as text: offsets are opaque strings in newer SDKs).
    pub offset: Option<String>,
    /// The sequence number there, if it parsed.
    pub sequence_number: Option<i64>,
    /// The partition there, when a Tributary task recorded it.
    pub partition_id: Option<String>,
}

/// The service metadata of `event`, oldest hop first; either spelling of the enqueued time.
/// Lists of unequal length (a hop written by a tool that wrote only some) are read up to the
/// longest, with the missing entries `None`.
pub fn hops(event: &EventData) -> Vec<Hop> {
    let split = |key: &str| -> Vec<&str> {
        string_property(event, key)
            .map(|v| v.split(HOP_SEPARATOR).collect())
            .unwrap_or_default()
    };
    let mut times = split(ENQUEUED_TIME);
    if times.is_empty() {
        times = split(ENQUEUED_TIME_DOC_SPELLING);
    }
    let (offsets, sequences, partitions) = (split(OFFSET), split(SEQUENCE), split(PARTITION));
    let count = times.len().max(offsets.len()).max(sequences.len());
    (0..count)
        .map(|i| Hop {
            enqueued_time_ms: times.get(i).and_then(|t| parse_enqueued_time(t)),
            offset: offsets.get(i).map(|o| o.trim().to_owned()),
            sequence_number: sequences.get(i).and_then(|s| s.trim().parse().ok()),
            partition_id: partitions.get(i).map(|p| p.trim().to_owned()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const POSITION: Position = Position {
        sequence_number: 42,
        offset: 8192,
        enqueued_time_ms: 1_714_568_523_456,
    };

    #[test]
    fn the_enqueued_time_is_written_in_the_dotnet_universal_format() {
        assert_eq!(
            format_enqueued_time(1_714_568_523_456),
            "2024-05-01 13:02:03Z"
        );
        assert_eq!(
            parse_enqueued_time("2024-05-01 13:02:03Z"),
            Some(1_714_568_523_000)
        );
        assert_eq!(
            parse_enqueued_time("2024-05-01T13:02:03.456Z"),
            Some(1_714_568_523_456)
        );
        assert_eq!(parse_enqueued_time("yesterday"), None);
    }

    #[test]
    fn a_first_hop_records_origin_path_and_metadata_as_strings() {
        let mut event = EventData::new("x").with_property("kind", PropertyValue::Int64(1));
        stamp(&mut event, "3", POSITION, "hub-a", "hub-b");
        let get = |k| string_property(&event, k).map(str::to_owned);
        assert_eq!(get(ENQUEUED_TIME).as_deref(), Some("2024-05-01 13:02:03Z"));
        assert_eq!(get(OFFSET).as_deref(), Some("8192"));
        assert_eq!(get(SEQUENCE).as_deref(), Some("42"));
        assert_eq!(get(ORIGIN).as_deref(), Some("hub-a"));
        assert_eq!(get(PATH).as_deref(), Some("hub-a;hub-b"));
        assert_eq!(
            event.properties[0].0, "kind",
            "the event's own properties stay first"
        );
        assert!(has_passed_through(&event, "hub-a"));
        assert!(has_passed_through(&event, "hub-b"));
        assert!(!has_passed_through(&event, "hub-c"));
    }

    #[test]
    fn a_kafka_records_offset_is_written_as_both_offset_and_sequence_number() {
        let kafka = Position {
            sequence_number: 1_234_567,
            offset: 1_234_567,
            enqueued_time_ms: 0,
        };
        let mut event = EventData::new("x");
        stamp(&mut event, "0", kafka, "topic-a", "hub-b");
        assert_eq!(string_property(&event, OFFSET), Some("1234567"));
        assert_eq!(string_property(&event, SEQUENCE), Some("1234567"));
        let mut extreme = EventData::new("x");
        let widest = Position {
            sequence_number: i64::MIN,
            offset: u64::MAX,
            enqueued_time_ms: 0,
        };
        stamp(&mut extreme, "0", widest, "topic-a", "hub-b");
        assert_eq!(
            string_property(&extreme, OFFSET),
            Some("18446744073709551615")
        );
        assert_eq!(
            string_property(&extreme, SEQUENCE),
            Some("-9223372036854775808")
        );
    }

    #[test]
    fn a_first_hop_holds_short_values_inline_and_shares_the_hub_ids() {
        let source = "0f8fad5b-d9cb-469f-a165-70867728950e";
        let target = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
        let ids = HopIds::new(source, target);
        let mut one = EventData::new("1");
        let mut two = EventData::new("2");
        stamp_with(&mut one, &"3".into(), POSITION, &ids);
        stamp_with(&mut two, &"3".into(), POSITION, &ids);
        assert_eq!(string_property(&one, ORIGIN), Some(source));
        assert_eq!(
            string_property(&one, PATH),
            Some(format!("{source};{target}").as_str())
        );
        let value = |event: &EventData, key: &str| match event.property(key) {
            Some(PropertyValue::String(value)) => value.clone(),
            other => panic!("{key}: {other:?}"),
        };
        for key in [ENQUEUED_TIME, OFFSET, SEQUENCE, PARTITION] {
            assert!(!value(&one, key).is_heap_allocated(), "{key} is inline");
        }
        for (key, _) in &one.properties {
            assert!(!key.is_heap_allocated(), "{key} is inline");
        }
        for key in [ORIGIN, PATH] {
            assert_eq!(
                value(&one, key).as_ptr(),
                value(&two, key).as_ptr(),
                "{key} is one shared string"
            );
        }
    }

    #[test]
    fn a_second_hop_appends_after_a_semicolon_and_keeps_the_origin() {
        let mut event = EventData::new("x");
        stamp(&mut event, "3", POSITION, "hub-a", "hub-b");
        let second = Position {
            sequence_number: 7,
            offset: 64,
            enqueued_time_ms: 1_714_568_600_000,
        };
        stamp(&mut event, "0", second, "hub-b", "hub-c");
        assert_eq!(string_property(&event, SEQUENCE), Some("42;7"));
        assert_eq!(string_property(&event, OFFSET), Some("8192;64"));
        assert_eq!(
            string_property(&event, ENQUEUED_TIME),
            Some("2024-05-01 13:02:03Z;2024-05-01 13:03:20Z")
        );
        assert_eq!(string_property(&event, ORIGIN), Some("hub-a"));
        assert_eq!(string_property(&event, PATH), Some("hub-a;hub-b;hub-c"));
        let read = hops(&event);
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].sequence_number, Some(42));
        assert_eq!(read[1].offset.as_deref(), Some("64"));
        assert_eq!(read[1].enqueued_time_ms, Some(1_714_568_600_000));
        assert_eq!(read[0].partition_id.as_deref(), Some("3"));
        assert_eq!(string_property(&event, PARTITION), Some("3;0"));
    }

    #[test]
    fn undoing_a_stamp_gives_the_event_back_as_it_was() {
        let first = EventData::new("x").with_property("kind", PropertyValue::Int64(1));
        let mut event = first.clone();
        let undo = stamp(&mut event, "3", POSITION, "hub-a", "hub-b");
        assert_ne!(event, first);
        let mut undone = event.clone();
        undo.apply(&mut undone);
        assert_eq!(undone, first, "a first hop's stamp comes off");

        let second = event.clone();
        let undo = stamp(&mut event, "0", POSITION, "hub-b", "hub-c");
        undo.apply(&mut event);
        assert_eq!(event, second, "a second hop's stamp comes off");

        // An origin left empty by another tool, and a path without one: both replaced, both
        // given back.
        let odd = EventData::new("x")
            .with_property(ORIGIN, PropertyValue::String("".into()))
            .with_property(PATH, PropertyValue::String("stray".into()));
        let mut event = odd.clone();
        let undo = stamp(&mut event, "1", POSITION, "hub-a", "hub-b");
        assert_eq!(string_property(&event, PATH), Some("hub-a;hub-b"));
        undo.apply(&mut event);
        assert_eq!(event, odd);
    }

    #[test]
    fn a_fanout_marks_the_hubs_other_copies_went_to() {
        let mut event = EventData::new("x");
        let before = event.clone();
        let mut undo = stamp(&mut event, "0", POSITION, "hub-a", "hub-b");
        mark_fanout(&mut event, &mut undo, &HopIds::new("hub-a", "hub-c"));
        assert!(reached(&event, "hub-a"), "the origin");
        assert!(reached(&event, "hub-b"), "on the path");
        assert!(reached(&event, "hub-c"), "a sibling copy went there");
        assert!(!reached(&event, "hub-d"));
        assert!(!has_passed_through(&event, "hub-c"), "not stored there yet");
        let second = event.clone();
        let mut again = stamp(&mut event, "1", POSITION, "hub-b", "hub-d");
        mark_fanout(&mut event, &mut again, &HopIds::new("hub-b", "hub-e"));
        assert_eq!(string_property(&event, FANOUT), Some("hub-c;hub-e"));
        again.apply(&mut event);
        assert_eq!(event, second, "a second hop's fan-out comes off");
        undo.apply(&mut event);
        assert_eq!(event, before, "a first hop's fan-out comes off");
    }

    #[test]
    fn the_empty_undo_of_an_unstamped_event_changes_nothing() {
        // What a table's row carries: it is sent without a stamp, and a refused row is
        // dead-lettered with every property it had.
        let sent = EventData::new("x")
            .with_property("kind", PropertyValue::Int64(1))
            .with_property("site", PropertyValue::String("north".into()));
        let mut event = sent.clone();
        Undo::default().apply(&mut event);
        assert_eq!(event, sent);
    }

    #[test]
    fn azure_merge_markers_are_read_and_written_and_undone() {
        let mut event = EventData::new("x").with_property(
            AZURE_MERGE_TARGET,
            PropertyValue::String("Telemetry-West".into()),
        );
        let before = event.clone();
        assert!(azure_merge_copied_into(&event, "telemetry-west"));
        assert!(!azure_merge_copied_into(&event, "telemetry-east"));

        let mut undo = stamp(&mut event, "0", POSITION, "hub-a", "hub-b");
        mark_azure_merge_target(&mut event, &mut undo, &"telemetry-east".into());
        assert!(azure_merge_copied_into(&event, "telemetry-east"));
        assert_eq!(
            event
                .properties
                .iter()
                .filter(|(k, _)| k == AZURE_MERGE_TARGET)
                .count(),
            1,
            "the marker is replaced in place, not repeated"
        );
        undo.apply(&mut event);
        assert_eq!(event, before);
    }

    #[test]
    fn the_documentation_spelling_is_read_too() {
        let event = EventData::new("x")
            .with_property(
                ENQUEUED_TIME_DOC_SPELLING,
                PropertyValue::String("2024-05-01T13:02:03Z".into()),
            )
            .with_property(SEQUENCE, PropertyValue::String("5".into()));
        let read = hops(&event);
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].enqueued_time_ms, Some(1_714_568_523_000));
        assert_eq!(read[0].sequence_number, Some(5));
        assert_eq!(read[0].offset, None);
    }
}
