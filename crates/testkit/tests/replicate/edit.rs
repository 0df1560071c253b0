//! The editor and routing in a running task: a chain of filter, de-duplication, schema
//! validation, transform, a library user's own step and a signature between a source and two
//! routed targets, with every refusal on the dead-letter hub; and the task file's errors for
//! steps and conditions.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tributary_broker::SendTarget;
use tributary_event::{EventData, PropertyValue, ReceivedEvent};
use tributary_replicate::edit::{self, CompileContext, Context, Item, Output, Step};
use tributary_replicate::metrics::FilterReason;
use tributary_replicate::{
    DEAD_LETTER_REASON, DEAD_LETTER_STEP, Replicator, StartOptions, TaskConfig, metadata,
};
use tributary_testkit::{TestHub, within};

use super::{string, task};

/// A library user's step: marks every event it sees.
#[derive(Debug)]
struct Audit;

impl Step for Audit {
    fn name(&self) -> &str {
        "audit"
    }

    fn apply(&self, context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        for mut item in items {
            let by = format!("audit/{}", context.partition);
            item.set_property("audited-by", PropertyValue::String(by.into()));
            out.pass(item);
        }
    }
}

/// A reading from `home`'s `sensor`, with message id `id`.
fn reading(id: &str, home: &str, body: Value) -> (String, EventData) {
    let mut event = EventData::new(body.to_string())
        .with_property("kind", PropertyValue::String("reading".into()));
    event.message_id = Some(id.to_owned());
    event.content_type = Some("application/json".into());
    (home.to_owned(), event)
}

/// What the source receives, in order: 2 alarms, 1 thermometer reading, a test event, an
/// event the schema refuses, a repeat of the first alarm, a motion event no route takes, and a
/// body that is not JSON.
fn readings() -> Vec<(String, EventData)> {
    let debug = json!({"rssi": -61, "trace": "x".repeat(40)});
    let mut not_json = reading("m6", "home-3", json!(null));
    not_json.1.body = "battery low".into();
    vec![
        reading(
            "m0",
            "home-1",
            json!({"sensor": "door", "state": "open", "debug": debug}),
        ),
        reading(
            "m1",
            "home-1",
            json!({"sensor": "thermo", "state": "ok", "temp_c": 21.5}),
        ),
        reading("m2", "home-2", json!({"sensor": "test", "state": "open"})),
        reading("m3", "home-2", json!({"sensor": "door"})),
        reading(
            "m0",
            "home-1",
            json!({"sensor": "door", "state": "open", "debug": debug}),
        ),
        reading(
            "m5",
            "home-3",
            json!({"sensor": "motion", "state": "closed"}),
        ),
        not_json,
        reading(
            "m7",
            "home-2",
            json!({"sensor": "glass", "state": "open", "debug": debug}),
        ),
    ]
}

const SCHEMA: &str = r#"{
  "type": "object",
  "required": ["sensor", "state"],
  "properties": {"sensor": {"type": "string"}, "state": {"type": "string"}}
}"#;

/// Writes the schema and an HMAC key (mode 0600) beside the task file.
fn write_files(dir: &Path) -> String {
    std::fs::write(dir.join("reading.schema.json"), SCHEMA).unwrap();
    let key = "c2lnbmluZy1rZXktb2YtdGhlLWVkaXRvci10ZXN0LTMyYnl0ZXM=";
    let key_file = dir.join("sign.key");
    std::fs::write(&key_file, key).unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    key_file.display().to_string()
}

fn edit_task(dir: &Path, source: &TestHub, target: &TestHub) -> TaskConfig {
    write_files(dir);
    let text = format!(
        r#"
name = "homes"
[source]
connection_string = "{source}"
event_hub = "readings"
consumer_group = "replication"
batch_events_max = 100
[[step]]
kind = "filter"
when = "body.sensor IS NULL OR body.sensor <> 'test'"
[[step]]
kind = "dedupe"
[[step]]
kind = "validate"
name = "schema"
schema = "reading.schema.json"
[[step]]
kind = "transform"
drop = ["debug"]
set = {{ site = "eu-west" }}
[[step]]
kind = "custom"
name = "audit"
[[step]]
kind = "sign"
algorithm = "hmac-sha256"
key_file = "sign.key"
properties = ["kind", "audited-by"]
[[target]]
name = "alarms"
connection_string = "{target}"
event_hub = "alarms"
when = "body.state = 'open' AND body.sensor IN ('door', 'window', 'glass')"
[[target]]
name = "telemetry"
connection_string = "{target}"
event_hub = "telemetry"
when = "body.sensor = 'thermo'"
[routing]
unmatched = "dead-letter"
[dead_letter]
connection_string = "{target}"
event_hub = "dead"
[processor]
load_balancing_interval = "100ms"
ownership_expiration = "1s"
"#,
        source = source.connection_string,
        target = target.connection_string,
    );
    task(dir, "homes", &text)
}

/// Waits until `hub` holds at least `count` events in `partitions` partitions.
async fn wait_for_events(
    target: &TestHub,
    hub: &str,
    partitions: u32,
    count: usize,
) -> Vec<ReceivedEvent> {
    within(&format!("{count} events on {hub}"), async {
        loop {
            let mut all = Vec::new();
            for partition in 0..partitions {
                all.extend(target.read_all(hub, partition).await);
            }
            if all.len() >= count {
                return all;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

fn json_body(event: &ReceivedEvent) -> Value {
    serde_json::from_slice(&event.data.body).expect("a JSON body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_edits_routes_and_dead_letters_what_it_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let source = TestHub::start(&[("readings", 2)]).await;
    let target = TestHub::start(&[("alarms", 2), ("telemetry", 2), ("dead", 1)]).await;
    source
        .broker
        .create_consumer_group("readings", "replication")
        .await
        .unwrap();
    for (home, event) in readings() {
        let to = SendTarget::PartitionKey(home);
        source
            .broker
            .send("readings", to, vec![event])
            .await
            .unwrap();
    }
    let config = edit_task(dir.path(), &source, &target);
    let options = StartOptions {
        steps: vec![("audit".to_owned(), Arc::new(Audit) as Arc<dyn Step>)],
        ..StartOptions::default()
    };
    let replicator = Replicator::start(&config, options).await.expect("starts");
    let alarms = wait_for_events(&target, "alarms", 2, 2).await;
    let telemetry = wait_for_events(&target, "telemetry", 2, 1).await;
    let dead = wait_for_events(&target, "dead", 1, 3).await;
    assert_alarms(&alarms, dir.path());
    let ids: Vec<_> = telemetry
        .iter()
        .map(|e| e.data.message_id.clone())
        .collect();
    assert_eq!(ids, [Some("m1".to_owned())]);
    assert_dead_letters(&dead);
    let snapshot = replicator.metrics().snapshot();
    let edited_out: u64 = snapshot
        .partitions
        .values()
        .map(|p| p.filtered.get(&FilterReason::Editor).copied().unwrap_or(0))
        .sum();
    assert_eq!(
        edited_out, 2,
        "the test event and the repeat are dropped and counted"
    );
    assert_eq!(snapshot.totals().0, 8);
    assert_eq!(snapshot.totals().2, 3);
    replicator.shutdown().await.unwrap();
}

/// The alarms arrived edited, marked by the custom step, signed, stamped — and the signature
/// holds for a consumer's `verify` step and breaks when the body changes.
fn assert_alarms(alarms: &[ReceivedEvent], dir: &Path) {
    let mut ids: Vec<_> = alarms
        .iter()
        .filter_map(|e| e.data.message_id.clone())
        .collect();
    ids.sort();
    assert_eq!(ids, ["m0", "m7"], "the repeat of m0 was dropped");
    let verify = edit::compile(
        "verify",
        None,
        json!({"algorithm": "hmac-sha256", "key_file": "sign.key", "properties": ["kind", "audited-by"]}),
        &CompileContext::new(dir),
    )
    .expect("a verify step");
    for alarm in alarms {
        let body = json_body(alarm);
        assert!(body.get("debug").is_none(), "{body}");
        assert_eq!(body["site"], "eu-west");
        assert_eq!(body["state"], "open");
        assert!(
            string(&alarm.data, "audited-by")
                .unwrap()
                .starts_with("audit/")
        );
        assert!(string(&alarm.data, metadata::SEQUENCE).is_some());
        let verified = run_step(&verify, alarm.clone());
        assert_eq!((verified.0, verified.1), (1, 0), "the signature holds");
        let mut tampered = alarm.clone();
        tampered.data.body = alarm.data.body.slice(..alarm.data.body.len() - 1);
        assert_eq!(
            run_step(&verify, tampered).1,
            1,
            "a changed body is refused"
        );
    }
}

/// (passed, refused) of one event through `step`.
fn run_step(step: &Arc<dyn Step>, event: ReceivedEvent) -> (usize, usize) {
    let editor = edit::Editor::new(vec![Arc::clone(step)]);
    let context = Context {
        partition: "0",
        now_ms: 0,
    };
    let edited = editor.apply(&context, vec![Item::received(event)]);
    (edited.passed.len(), edited.rejected.len())
}

/// The schema's refusal, the body that is not JSON (also the schema's), and the motion event
/// no route takes, each with its reason.
fn assert_dead_letters(dead: &[ReceivedEvent]) {
    let by_id: BTreeMap<String, &ReceivedEvent> = dead
        .iter()
        .map(|e| (e.data.message_id.clone().unwrap(), e))
        .collect();
    assert_eq!(by_id.keys().collect::<Vec<_>>(), ["m3", "m5", "m6"]);
    let reason = |id: &str| string(&by_id[id].data, DEAD_LETTER_REASON).unwrap();
    assert_eq!(
        string(&by_id["m3"].data, DEAD_LETTER_STEP).as_deref(),
        Some("schema")
    );
    assert!(reason("m3").contains("state"), "{}", reason("m3"));
    assert_eq!(
        string(&by_id["m6"].data, DEAD_LETTER_STEP).as_deref(),
        Some("schema")
    );
    assert_eq!(by_id["m6"].data.body.as_ref(), b"battery low");
    assert_eq!(reason("m5"), "no route matched the event");
    assert!(string(&by_id["m5"].data, DEAD_LETTER_STEP).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_step_the_task_names_must_be_registered() {
    let dir = tempfile::tempdir().unwrap();
    let source = TestHub::start(&[("readings", 2)]).await;
    let target = TestHub::start(&[("alarms", 2), ("telemetry", 2), ("dead", 1)]).await;
    let config = edit_task(dir.path(), &source, &target);
    let error = Replicator::start(&config, StartOptions::default())
        .await
        .expect_err("audit is not registered")
        .to_string();
    assert!(error.contains("step \"audit\".name"), "{error}");
    assert!(error.contains("StartOptions::steps"), "{error}");
}

#[test]
fn a_step_or_condition_error_names_the_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path());
    let head = "name = \"x\"\n[source]\ndata_dir = \".\"\nevent_hub = \"o\"\n";
    let target = "[[target]]\nname = \"t\"\ndata_dir = \".\"\nevent_hub = \"o\"\n";
    let cases = [
        (
            format!("{head}{target}when = \"body.x >\"\n"),
            ":9",
            "target \"t\".when",
        ),
        (
            format!("{head}{target}when = \"sys.nope = 1\"\n"),
            ":9",
            "sequence_number",
        ),
        (
            format!("{head}[[step]]\nkind = \"bogus\"\n{target}"),
            ":5",
            "filter, transform",
        ),
        (
            format!("{head}[[step]]\nwhen = \"true\"\n{target}"),
            ":5",
            "step[0].kind",
        ),
        (
            format!("{head}[[step]]\nkind = \"validate\"\nschema = \"missing.json\"\n{target}"),
            ":5",
            "missing.json",
        ),
        (
            format!(
                "{head}[[step]]\nkind = \"filter\"\nname = \"f\"\nwhen = \"x\"\nextra = 1\n{target}"
            ),
            ":5",
            "extra",
        ),
    ];
    for (text, line, needle) in cases {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, &text).unwrap();
        let error = TaskConfig::load(&file).expect_err(&text).to_string();
        assert!(
            error.starts_with(&format!("{}{line}:", file.display())),
            "{error}"
        );
        assert!(error.contains(needle), "{needle}: {error}");
    }
}
