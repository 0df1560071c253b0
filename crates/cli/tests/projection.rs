//! `tributary replicate` projecting a hub into PostgreSQL tables (this test binary's private
//! PostgreSQL; `scripts/setup-postgres` installs it): both table shapes, typed columns, keyless
//! events, and exactly-once across a `kill -9`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use tributary_broker::SendTarget;
use tributary_event::EventData;
use tributary_testkit::{PostgresServer, TestHub, within};

mod common;
use common::replicator;

const PARTITIONS: u32 = 4;

/// The database name at the end of `url`.
fn database(url: &str) -> &str {
    url.rsplit('/').next().unwrap()
}

/// `sql`'s rows, each a list of `|`-separated fields.
fn rows(server: &PostgresServer, url: &str, sql: &str) -> Vec<Vec<String>> {
    let out = server
        .sql(database(url), sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    out.lines()
        .filter(|line| !line.is_empty())
        .map(|line| line.split('|').map(str::to_owned).collect())
        .collect()
}

fn count(server: &PostgresServer, url: &str, table: &str) -> usize {
    match server.sql(database(url), &format!("SELECT count(*) FROM {table}")) {
        Ok(text) => text.trim().parse().unwrap(),
        Err(_) => 0, // not created yet
    }
}

async fn wait_for_rows(server: &PostgresServer, url: &str, table: &str, expected: usize) {
    within(&format!("{expected} rows in {table}"), async {
        while count(server, url, table) < expected {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
}

const COMMON: &str = "[retry]\nbackoff_min = \"50ms\"\nbackoff_max = \"1s\"\n[processor]\nload_balancing_interval = \"200ms\"\nownership_expiration = \"2s\"\n";

/// 40 keyed JSON orders over 5 keys, 5 keyless JSON events and one keyed non-JSON event;
/// returns the newest `n` of each key.
async fn send_orders(hub: &TestHub) -> BTreeMap<String, i64> {
    let mut latest: BTreeMap<String, i64> = BTreeMap::new();
    for n in 0..40_i64 {
        let key = format!("k{}", n % 5);
        let body = format!(
            r#"{{"n": {n}, "order": {{"total": {}.5}}, "placed": "2026-01-0{}T10:00:00Z", "paid": {}}}"#,
            n * 2,
            1 + n % 5,
            n % 2 == 0
        );
        let to = SendTarget::PartitionKey(key.clone());
        hub.broker
            .send("orders", to, vec![EventData::new(body)])
            .await
            .unwrap();
        latest.insert(key, n);
    }
    for n in 0..5 {
        let body = format!(r#"{{"keyless": {n}}}"#);
        hub.broker
            .send("orders", SendTarget::RoundRobin, vec![EventData::new(body)])
            .await
            .unwrap();
    }
    let raw = SendTarget::PartitionKey("raw".into());
    let mut event = EventData::new("not json at all");
    event.properties.push((
        "kind".into(),
        tributary_event::PropertyValue::String("raw".into()),
    ));
    hub.broker.send("orders", raw, vec![event]).await.unwrap();

    latest
}

/// The task file of the shapes test: three tables, a dead-letter hub.
fn shapes_task(dir: &Path, cs: &str, url: &str) -> std::path::PathBuf {
    let task = dir.join("project.toml");
    std::fs::write(
        &task,
        format!(
            "name = \"project\"\n[source]\nconnection_string = \"{cs}\"\nevent_hub = \"orders\"\n\
             [[target]]\nname = \"all\"\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"events\"\nshape = \"history\"\n\
             [[target]]\nname = \"latest\"\nkind = \"postgres\"\nurl = \"{url}?schema=app\"\ntable = \"orders\"\nshape = \"compacted\"\n\
             [target.columns]\nn = {{ path = \"body.n\", type = \"bigint\" }}\ntotal = {{ path = \"body.order.total\", type = \"double precision\" }}\n\
             placed = {{ path = \"body.placed\", type = \"timestamptz\" }}\npaid = {{ path = \"body.paid\", type = \"boolean\" }}\n\
             [[target]]\nname = \"strict\"\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"strict\"\nshape = \"compacted\"\nkeyless = \"refuse\"\n\
             [dead_letter]\nconnection_string = \"{cs}\"\nevent_hub = \"dead\"\n{COMMON}",
        ),
    )
    .unwrap();
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_become_history_rows_and_compacted_rows_with_typed_columns() {
    let server = PostgresServer::shared();
    let url = server.create_database("shapes");
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&[("orders", PARTITIONS), ("dead", 1)]).await;
    let task = shapes_task(dir.path(), &hub.connection_string, &url);
    let mut process = replicator(&task, "only");
    let latest = send_orders(&hub).await;
    wait_for_rows(server, &url, "public.events", 46).await;
    wait_for_rows(server, &url, "app.orders_keyless", 5).await;
    wait_for_rows(server, &url, "public.strict", 6).await;
    let mut dead = 0;
    within(
        "5 keyless events dead-lettered by the strict table",
        async {
            while dead < 5 {
                dead = hub.read_all("dead", 0).await.len();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        },
    )
    .await;

    // History: one row per event; a non-JSON body in body_bytes, properties as JSON.
    let history = rows(
        server,
        &url,
        "SELECT count(DISTINCT (source_partition, sequence_number)), count(body_json), count(body_bytes) FROM events",
    );
    assert_eq!(history, vec![vec!["46", "45", "1"]]);
    let raw_row = rows(
        server,
        &url,
        "SELECT convert_from(body_bytes, 'UTF8'), properties->>'kind', partition_key FROM events WHERE body_bytes IS NOT NULL",
    );
    assert_eq!(raw_row, vec![vec!["not json at all", "raw", "raw"]]);

    // Compacted: the newest event of each key, its fields typed.
    let compacted = rows(
        server,
        &url,
        "SELECT partition_key, n, total, to_char(placed AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24'), paid, body_json->>'n' FROM app.orders WHERE partition_key LIKE 'k%' ORDER BY partition_key",
    );
    let expected: Vec<Vec<String>> = latest
        .iter()
        .map(|(key, n)| {
            vec![
                key.clone(),
                n.to_string(),
                format!("{}.5", n * 2),
                format!("2026-01-0{} 10", 1 + n % 5),
                if n % 2 == 0 { "t" } else { "f" }.to_owned(),
                n.to_string(),
            ]
        })
        .collect();
    assert_eq!(compacted, expected);
    let raw_latest = rows(
        server,
        &url,
        "SELECT n IS NULL, body_json IS NULL FROM app.orders WHERE partition_key = 'raw'",
    );
    assert_eq!(raw_latest, vec![vec!["t", "t"]]);
    assert_eq!(count(server, &url, "app.orders"), 6);

    // The strict table refused the keyless events: they are dead letters with the reason.
    for letter in hub.read_all("dead", 0).await {
        let reason = letter
            .data
            .property(tributary_replicate::DEAD_LETTER_REASON);
        let Some(tributary_event::PropertyValue::String(reason)) = reason else {
            panic!("a dead letter without a reason: {letter:?}");
        };
        assert!(reason.contains("refuses keyless events"), "{reason}");
    }
    process.start_kill().unwrap();
    process.wait().await.unwrap();
}

/// Every sequence number of each source partition the table holds.
fn projected(server: &PostgresServer, url: &str, table: &str) -> Vec<(String, i64)> {
    rows(
        server,
        url,
        &format!("SELECT source_partition, sequence_number FROM {table} ORDER BY 1, 2"),
    )
    .into_iter()
    .map(|row| (row[0].clone(), row[1].parse().unwrap()))
    .collect()
}

/// The history table holds `sent` exactly, and the progress each partition's last event.
fn assert_exactly_once(server: &PostgresServer, url: &str, sent: &[(String, i64)]) {
    assert_eq!(projected(server, url, "history"), sent, "every event once");
    // The progress the database keeps is each partition's last event, for both tables.
    let progress = rows(
        server,
        url,
        "SELECT table_name, source_partition, sequence_number FROM tributary_projection_progress ORDER BY 1, 2",
    );
    let partitions: BTreeSet<&String> = sent.iter().map(|(p, _)| p).collect();
    assert_eq!(progress.len(), 2 * partitions.len(), "{progress:?}");
    for row in progress {
        let last = sent
            .iter()
            .filter(|(p, _)| *p == row[1])
            .map(|(_, s)| *s)
            .max()
            .unwrap();
        assert_eq!(row[2], last.to_string(), "{row:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicator_killed_mid_batch_and_restarted_projects_every_event_exactly_once() {
    let server = PostgresServer::shared();
    let url = server.create_database("kill9");
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&[("orders", PARTITIONS)]).await;
    let task = dir.path().join("project.toml");
    std::fs::write(
        &task,
        format!(
            "name = \"project\"\n[source]\nconnection_string = \"{}\"\nevent_hub = \"orders\"\nbatch_events_max = 40\n\
             [[target]]\nname = \"all\"\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"history\"\nshape = \"history\"\n\
             [[target]]\nname = \"latest\"\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"latest\"\nshape = \"compacted\"\n{COMMON}",
            hub.connection_string
        ),
    )
    .unwrap();
    let mut first = replicator(&task, "first");
    let mut sent: Vec<(String, i64)> = Vec::new();
    let mut latest: BTreeMap<String, (String, i64)> = BTreeMap::new();
    for round in 0..80 {
        for key in 0..12 {
            let key = format!("k{key}");
            let events: Vec<EventData> = (0..4)
                .map(|i| EventData::new(format!(r#"{{"round": {round}, "i": {i}}}"#)))
                .collect();
            let to = SendTarget::PartitionKey(key.clone());
            let receipt = hub.broker.send("orders", to, events).await.unwrap();
            let partition = receipt.partition.to_string();
            for i in 0..4 {
                sent.push((partition.clone(), receipt.base_sequence + i));
            }
            latest.insert(key, (partition, receipt.base_sequence + 3));
        }
        if round == 40 {
            first.start_kill().expect("SIGKILL");
            first.wait().await.unwrap();
            // A new process, while events keep coming; the dead one's partitions expire.
            first = replicator(&task, "second");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sent.sort();
    wait_for_rows(server, &url, "history", sent.len()).await;
    let expected_latest: BTreeSet<(String, String, i64)> = latest
        .into_iter()
        .map(|(key, (partition, sequence))| (key, partition, sequence))
        .collect();
    within(
        "the compacted table to hold the newest event of every key",
        async {
            loop {
                let held: BTreeSet<(String, String, i64)> = rows(
                    server,
                    &url,
                    "SELECT partition_key, source_partition, sequence_number FROM latest",
                )
                .into_iter()
                .map(|row| (row[0].clone(), row[1].clone(), row[2].parse().unwrap()))
                .collect();
                if held == expected_latest {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        },
    )
    .await;
    assert_exactly_once(server, &url, &sent);
    first.start_kill().unwrap();
    first.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_projecting_one_hub_into_one_history_table_write_each_event_once() {
    let server = PostgresServer::shared();
    let url = server.create_database("shared");
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&[("orders", PARTITIONS)]).await;
    let tasks: Vec<_> = ["one", "two"]
        .into_iter()
        .map(|name| {
            let task = dir.path().join(format!("{name}.toml"));
            std::fs::write(
                &task,
                format!(
                    "name = \"{name}\"\n[source]\nconnection_string = \"{}\"\nevent_hub = \"orders\"\nbatch_events_max = 25\n\
                     [[target]]\nname = \"all\"\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"history\"\nshape = \"history\"\n{COMMON}",
                    hub.connection_string
                ),
            )
            .unwrap();
            task
        })
        .collect();
    let mut processes: Vec<_> = tasks.iter().map(|task| replicator(task, "only")).collect();
    let mut sent: Vec<(String, i64)> = Vec::new();
    for round in 0..50 {
        let to = SendTarget::PartitionKey(format!("k{}", round % 7));
        let events: Vec<EventData> = (0..4)
            .map(|i| EventData::new(format!(r#"{{"round": {round}, "i": {i}}}"#)))
            .collect();
        let receipt = hub.broker.send("orders", to, events).await.unwrap();
        for i in 0..4 {
            sent.push((receipt.partition.to_string(), receipt.base_sequence + i));
        }
    }
    sent.sort();
    // Both tasks get to the end (the later writer of a batch meets the other's rows, and
    // merges instead of copying), and the table holds each event once.
    wait_for_rows(server, &url, "history", sent.len()).await;
    let partitions: BTreeSet<&String> = sent.iter().map(|(p, _)| p).collect();
    within(
        "both tasks' progress to reach every partition's end",
        async {
            loop {
                let done = rows(
                server,
                &url,
                "SELECT task, source_partition, sequence_number FROM tributary_projection_progress",
            )
            .into_iter()
            .filter(|row| {
                let last = sent.iter().filter(|(p, _)| *p == row[1]).map(|(_, s)| *s).max();
                last.is_some_and(|last| row[2] == last.to_string())
            })
            .count();
                if done == 2 * partitions.len() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        },
    )
    .await;
    assert_eq!(projected(server, &url, "history"), sent, "every event once");
    for process in &mut processes {
        process.start_kill().unwrap();
        process.wait().await.unwrap();
    }
}

/// Application properties of every type, and the body of an order whose `n` is `n`.
fn order_with_properties(n: &str) -> EventData {
    use tributary_event::PropertyValue as V;
    let mut event = EventData::new(format!(r#"{{"n": {n}}}"#));
    event.properties = vec![
        ("site".into(), V::String("north".into())),
        (
            "long-text".into(),
            V::String("a string longer than one held inline".into()),
        ),
        ("count".into(), V::Int64(-7)),
        ("small".into(), V::Int32(12)),
        ("unsigned".into(), V::UInt32(40_000)),
        ("big".into(), V::UInt64(u64::MAX)),
        ("ratio".into(), V::Float64(0.25)),
        ("single".into(), V::Float32(1.5)),
        ("urgent".into(), V::Bool(true)),
        ("raw".into(), V::Bytes(vec![0, 1, 254, 255].into())),
        ("at".into(), V::Timestamp(1_795_860_000_123)),
        ("id".into(), V::Uuid([7; 16])),
        ("empty".into(), V::Null),
    ];
    event
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_table_refuses_is_dead_lettered_with_all_its_own_properties() {
    let server = PostgresServer::shared();
    let url = server.create_database("refused");
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&[("orders", 1), ("dead", 1)]).await;
    let task = dir.path().join("project.toml");
    std::fs::write(
        &task,
        format!(
            "name = \"project\"\n[source]\nconnection_string = \"{cs}\"\nevent_hub = \"orders\"\n\
             [[target]]\nname = \"all\"\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"orders\"\nshape = \"history\"\n\
             [target.columns]\nn = {{ path = \"body.n\", type = \"bigint\" }}\n\
             [dead_letter]\nconnection_string = \"{cs}\"\nevent_hub = \"dead\"\n{COMMON}",
            cs = hub.connection_string
        ),
    )
    .unwrap();
    let mut process = replicator(&task, "only");
    let (good, refused) = (
        order_with_properties("1"),
        order_with_properties("\"five\""),
    );
    hub.broker
        .send(
            "orders",
            SendTarget::RoundRobin,
            vec![good, refused.clone()],
        )
        .await
        .unwrap();
    wait_for_rows(server, &url, "orders", 1).await;
    let letters = within("the refused row dead-lettered", async {
        loop {
            let letters = hub.read_all("dead", 0).await;
            if !letters.is_empty() {
                return letters;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert_eq!(letters.len(), 1);
    let letter = &letters[0].data;

    // Every property the event had, in its order, then the dead-letter hub's stamp and marks.
    let own: Vec<_> = letter
        .properties
        .iter()
        .filter(|(key, _)| !key.starts_with("repl-") && !key.starts_with("dead-letter-"))
        .cloned()
        .collect();
    assert_eq!(own, refused.properties, "the event's own properties");
    assert_eq!(
        &letter.properties[..refused.properties.len()],
        refused.properties.as_slice()
    );
    let text = |key: &str| match letter.property(key) {
        Some(tributary_event::PropertyValue::String(text)) => text.to_string(),
        other => panic!("{key}: {other:?}"),
    };
    assert!(text(tributary_replicate::DEAD_LETTER_REASON).contains("column n (bigint)"));
    assert_eq!(text(tributary_replicate::DEAD_LETTER_ROUTE), "all");
    assert_eq!(text(tributary_replicate::DEAD_LETTER_TASK), "project");
    assert_eq!(letter.body, refused.body);

    // The row of the event the table took keeps them too.
    let kept = rows(
        server,
        &url,
        "SELECT n, (SELECT count(*) FROM jsonb_object_keys(properties)) FROM orders",
    );
    assert_eq!(kept, vec![vec!["1", "13"]]);
    process.start_kill().unwrap();
    process.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mapped_columns_are_created_in_file_order_and_times_keep_microseconds() {
    let server = PostgresServer::shared();
    let url = server.create_database("columns");
    let dir = tempfile::tempdir().unwrap();
    let hub = TestHub::start(&[("readings", 1)]).await;
    let task = dir.path().join("project.toml");
    std::fs::write(
        &task,
        format!(
            "name = \"project\"\n[source]\nconnection_string = \"{}\"\nevent_hub = \"readings\"\n\
             [[target]]\nname = \"all\"\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"readings\"\nshape = \"history\"\n\
             [target.columns]\nzone = {{ path = \"body.zone\", type = \"text\" }}\n\
             placed = {{ path = \"body.placed\", type = \"timestamptz\" }}\namount = {{ path = \"body.amount\", type = \"double precision\" }}\n{COMMON}",
            hub.connection_string
        ),
    )
    .unwrap();
    let mut process = replicator(&task, "only");
    let events = [
        r#"{"zone": "a", "placed": "2026-11-28T10:00:00.123456Z", "amount": 1}"#,
        r#"{"zone": "b", "placed": "2026-11-28T10:00:00.9999996Z", "amount": 2}"#,
    ]
    .map(EventData::new)
    .to_vec();
    hub.broker
        .send("readings", SendTarget::RoundRobin, events)
        .await
        .unwrap();
    wait_for_rows(server, &url, "readings", 2).await;

    let columns: Vec<String> = rows(
        server,
        &url,
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'readings' ORDER BY ordinal_position",
    )
    .into_iter()
    .map(|row| row[0].clone())
    .collect();
    let fixed = tributary_replicate::projection::config::FIXED_COLUMNS;
    assert_eq!(columns[..fixed.len()], fixed);
    assert_eq!(columns[fixed.len()..], ["zone", "placed", "amount"]);

    let times = rows(
        server,
        &url,
        "SELECT zone, to_char(placed AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US') FROM readings ORDER BY zone",
    );
    assert_eq!(
        times,
        vec![
            vec!["a", "2026-11-28T10:00:00.123456"],
            vec!["b", "2026-11-28T10:00:01.000000"],
        ],
        "microseconds kept, nanoseconds rounded"
    );
    process.start_kill().unwrap();
    process.wait().await.unwrap();
}
