//! What the editor costs per event: a chain of filter + transform + validate on 1 KiB JSON
//! events (the replication issue's target is 2 µs an event), and each part alone.
//!
//! `cargo bench -p tributary-edit --bench chain` prints nanoseconds per event, wall clock and
//! CPU time (which a busy machine inflates less), for: the bench's own cost (events cloned
//! into items and out again, no step), parsing and writing the body alone (the floor every
//! JSON-editing chain pays once), the filter, the transform and the validate step alone, and
//! the whole chain — each from the event's bytes to the edited event's bytes, over batches of
//! 1,000 events as a replication task hands them over.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde_json::{Value, json};
use tributary_edit::{CompileContext, Context, Editor, Item, Position, Step};
use tributary_event::EventData;

const BATCH_EVENTS: usize = 1000;

// The allocator the `tributary` binary runs the editor with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this without it: then a
    // few batches only, a smoke test (the figures are not measurements).
    let batches = if std::env::args().any(|a| a == "--bench") {
        500
    } else {
        2
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("reading.schema.json"), schema().to_string())
        .expect("schema written");
    let context = CompileContext::new(dir.path());
    let events = events();
    let bytes = events[0].body.len();
    assert!((1000..1100).contains(&bytes), "a 1 KiB event, not {bytes}");
    let filter = step(&context, "filter", json!({"when": FILTER}));
    let transform = step(&context, "transform", transform_keys());
    let validate = step(
        &context,
        "validate",
        json!({"schema": "reading.schema.json"}),
    );
    let runs = [
        (
            "no step: events in and out, the bench's own cost",
            Editor::new(Vec::new()),
        ),
        (
            "JSON parsed and written back, no step",
            Editor::new(vec![touch()]),
        ),
        ("filter", Editor::new(vec![Arc::clone(&filter)])),
        ("transform", Editor::new(vec![Arc::clone(&transform)])),
        ("validate", Editor::new(vec![Arc::clone(&validate)])),
        (
            "filter + transform + validate",
            Editor::new(vec![filter, transform, validate]),
        ),
    ];
    // `TRIBUTARY_BENCH_ROW=transform` runs only the row of that name (to profile or time one
    // row alone).
    let only = std::env::var("TRIBUTARY_BENCH_ROW").ok();
    for (what, editor) in runs {
        if only.as_deref().is_some_and(|only| what != only) {
            continue;
        }
        let cpu_before = cpu_ms();
        let ns = measure(&editor, &events, batches);
        let cpu_ns = (cpu_ms() - cpu_before) as f64 * 1e6 / (batches * BATCH_EVENTS) as f64;
        println!(
            "editor, {what}: {ns:.0} ns per {bytes}-byte JSON event, {cpu_ns:.0} ns of CPU ({} events, batches of {BATCH_EVENTS})",
            batches * BATCH_EVENTS
        );
    }
}

const FILTER: &str = "body.sensor IN ('door', 'window', 'glass') AND body.reading.battery > 10 AND user.kind = 'reading'";

fn step(context: &CompileContext, kind: &str, keys: Value) -> Arc<dyn Step> {
    tributary_edit::compile(kind, None, keys, context).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

fn transform_keys() -> Value {
    json!({
        "drop": ["debug", "radio.history"],
        "rename": {"reading.temp_c": "temperature"},
        "set": {"site": "eu-west", "schema_version": 2},
    })
}

/// Parses the body and marks it edited, so the chain's one write-out is paid too.
fn touch() -> Arc<dyn Step> {
    #[derive(Debug)]
    struct Touch;
    impl Step for Touch {
        fn name(&self) -> &str {
            "touch"
        }
        fn apply(&self, _: &Context<'_>, items: Vec<Item>, out: &mut tributary_edit::Output) {
            for mut item in items {
                item.json_mut();
                out.pass(item);
            }
        }
    }
    Arc::new(Touch)
}

/// Nanoseconds per event to edit `events` `batches` times over, bytes in to bytes out.
fn measure(editor: &Editor, events: &[EventData], batches: usize) -> f64 {
    let context = Context {
        partition: "0",
        now_ms: 0,
    };
    let start = Instant::now();
    let mut out = 0usize;
    for _ in 0..batches {
        let items = events
            .iter()
            .enumerate()
            .map(|(i, event)| Item::new(event.clone(), position(i)))
            .collect();
        let edited = editor.apply(&context, items);
        for item in edited.passed {
            out += item.into_event().body.len();
        }
        assert!(edited.rejected.is_empty(), "every event is valid");
    }
    black_box(out);
    start.elapsed().as_nanos() as f64 / (batches * events.len()) as f64
}

/// The CPU time this process has used, in ms (user and system, from `/proc/self/stat`, in
/// ticks of 10 ms; 0 where that file is missing). On a busy machine the wall-clock figure
/// counts the time other processes hold the cores; this one does not.
fn cpu_ms() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which may hold spaces) start at its closing ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 of the file, 12 and 13 after the name.
    let ticks: u64 = fields
        .iter()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    ticks * 10
}

fn position(i: usize) -> Position {
    Position {
        sequence_number: i as i64,
        offset: i as u64 * 1024,
        enqueued_time_ms: 1_790_000_000_000 + i as i64,
    }
}

/// A batch of sensor readings of about 1 KiB each, every one passing the filter.
fn events() -> Vec<EventData> {
    (0..BATCH_EVENTS)
        .map(|i| {
            let sensor = ["door", "window", "glass"][i % 3];
            let state = if i % 7 == 0 { "open" } else { "closed" };
            let body = json!({
                "home": format!("home-{:06}", i % 100_000),
                "sensor": sensor,
                "state": state,
                "at": "2026-11-24T22:00:00.000Z",
                "reading": {"temp_c": 20.5 + (i % 10) as f64, "battery": 50 + i % 50,
                            "humidity": 41, "lux": 300, "tamper": false},
                "firmware": {"version": "4.2.17", "build": "2026-10-01T08:00:00Z",
                             "channel": "stable"},
                "radio": {"rssi": -61, "snr": 7.5, "channel": 11,
                          "history": [-60, -61, -59, -62, -61, -60, -58, -63]},
                "debug": {"trace": "a".repeat(220), "counters": [1, 2, 3, 4, 5, 6, 7, 8]},
                "labels": ["hall", "ground-floor", "front"],
                "installer": {"name": "Alarmtech GmbH", "contact": "support@alarmtech.example"},
                "note": "b".repeat(294),
            });
            let mut event = EventData::new(Bytes::from(body.to_string())).with_property(
                "kind",
                tributary_event::PropertyValue::String("reading".into()),
            );
            event.content_type = Some("application/json".into());
            event.partition_key = Some(format!("home-{:06}", i % 100_000));
            event
        })
        .collect()
}

fn schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["home", "sensor", "state", "reading"],
        "properties": {
            "home": {"type": "string", "pattern": "^home-[0-9]{6}$"},
            "sensor": {"enum": ["door", "window", "glass", "motion", "co"]},
            "state": {"type": "string"},
            "reading": {
                "type": "object",
                "required": ["battery"],
                "properties": {"battery": {"type": "integer", "minimum": 0, "maximum": 100}}
            }
        }
    })
}
