use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, Method};
use tributary_broker::{
    Broker, BrokerConfig, CleanupPolicy, Durability, HubCleanup, HubSpec, SendTarget,
};
use tributary_event::EventData;
use tributary_groups::{GroupCoordinator, JoinRequest, StartPosition};

use super::render::{duration, escape};
use super::snapshot::Sampler;
use super::{Dashboard, admin_token, tick};
use crate::server::{AppState, Shared};
use crate::{AuthConfig, HttpConfig};

async fn state(dir: &std::path::Path, auth: AuthConfig) -> AppState {
    let mut config = BrokerConfig::new(dir);
    config.log.durability = Durability::None;
    let broker = Broker::open(config).await.unwrap();
    let coordinator = GroupCoordinator::open(broker.clone(), Default::default())
        .await
        .unwrap();
    crate::write_key_file(&dir.join("oci-api-keys.json"), b"{}").unwrap();
    let config = HttpConfig::new("127.0.0.1:0".parse().unwrap(), auth);
    Shared::open(broker, coordinator, &config).unwrap()
}

async fn send(broker: &Broker, hub: &str, partition: &str, n: usize) {
    let events = (0..n)
        .map(|i| EventData::new(format!("e{i}").into_bytes()))
        .collect();
    broker
        .send(hub, SendTarget::Partition(partition.into()), events)
        .await
        .unwrap();
}

async fn join(coordinator: &GroupCoordinator, hub: &str, group: &str) {
    coordinator
        .join(JoinRequest {
            stream: hub.into(),
            group: group.into(),
            instance: Some("instance-a".into()),
            start: StartPosition::TrimHorizon,
            commit_on_get: true,
            timeout_ms: 60_000,
        })
        .await
        .unwrap();
}

#[test]
fn names_are_escaped_and_durations_read_well() {
    assert_eq!(
        escape(r#"<a href="x">'&'</a>"#),
        "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
    );
    assert_eq!(duration(999), "999 ms");
    assert_eq!(duration(1_500), "1.5 s");
    assert_eq!(duration(90_000), "1.5 min");
    assert_eq!(duration(86_400_000), "24.0 h");
}

#[tokio::test]
async fn a_sample_has_rates_lag_in_events_and_time_and_renders_it() {
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path(), AuthConfig::DevelopmentUnauthenticated).await;
    state
        .broker
        .create_hub(HubSpec::new("Orders", 2))
        .await
        .unwrap();
    send(&state.broker, "orders", "1", 4).await;
    join(&state.coordinator, "orders", "billing").await;
    let mut sampler = Sampler::default();
    let first = sampler.sample(&state.broker, &state.coordinator);
    assert_eq!(first.hubs.len(), 1);
    assert_eq!(
        first.hubs[0].partitions[1].in_per_s, 0.0,
        "no rate without an earlier sample"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    send(&state.broker, "orders", "1", 6).await;
    let second = sampler.sample(&state.broker, &state.coordinator);
    let hub = &second.hubs[0];
    assert_eq!(hub.partitions[1].last_sequence, 9);
    assert!(hub.partitions[1].in_per_s > 0.0, "{:?}", hub.partitions[1]);
    assert_eq!(hub.partitions[0].in_per_s, 0.0);
    let group = &hub.groups[0];
    assert_eq!(
        (group.name.as_str(), group.kind),
        ("billing", "server-side")
    );
    let row = &group.rows[1];
    assert_eq!(
        (row.checkpoint, row.last_enqueued, row.lag_events),
        (None, 9, 10)
    );
    assert!(
        row.waiting_since_ms
            .is_some_and(|t| t <= second.time_ms - 50),
        "the oldest unprocessed event waited: {row:?}"
    );
    assert_eq!(group.rows[0].lag_events, 0);
    assert_eq!(group.rows[0].waiting_since_ms, None);
    assert_eq!(second.totals().2, 10);
    let html = super::render::hub(hub, second.time_ms);
    assert!(
        html.contains("<h2>Orders</h2>") && html.contains("billing"),
        "{html}"
    );
    assert!(
        html.contains("<td class=\"lagging\">10</td><td data-since="),
        "{html}"
    );
    // A stuck group's hub is not sent again: its rows stay equal as time passes.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let third = sampler.sample(&state.broker, &state.coordinator);
    assert_eq!(third.hubs[0].groups, hub.groups);
}

#[tokio::test]
async fn a_compacted_hub_shows_its_policy_and_each_partitions_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path(), AuthConfig::DevelopmentUnauthenticated).await;
    let cleanup = HubCleanup {
        policy: CleanupPolicy::Compact,
        min_compaction_lag_ms: 90_000,
        ..HubCleanup::default()
    };
    let spec = HubSpec {
        cleanup,
        ..HubSpec::new("prices", 1)
    };
    state.broker.create_hub(spec).await.unwrap();
    for body in ["1", "2"] {
        let target = SendTarget::PartitionKey("AAPL".into());
        let events = vec![EventData::new(body.as_bytes().to_vec())];
        state.broker.send("prices", target, events).await.unwrap();
    }
    let mut sampler = Sampler::default();
    let before = sampler.sample(&state.broker, &state.coordinator);
    let html = super::render::hub(&before.hubs[0], before.time_ms);
    assert!(
        html.contains("compacted by key (min. lag 1.5 min, tombstones kept 24.0 h)"),
        "{html}"
    );
    assert!(
        html.contains("<td>0</td><td>100%</td><td>not yet</td>"),
        "{html}"
    );
    state.broker.compact_hub("prices").await.unwrap();
    let after = sampler.sample(&state.broker, &state.coordinator);
    assert_eq!(after.hubs[0].compaction.len(), 1);
    let run = after.hubs[0].compaction[0];
    assert!(run.last_run_ms.is_some(), "{run:?}");
    let html = super::render::hub(&after.hubs[0], after.time_ms);
    assert!(!html.contains("not yet"), "{html}");
    // A hub that deletes has no compaction table.
    state
        .broker
        .create_hub(HubSpec::new("plain", 1))
        .await
        .unwrap();
    let plain = sampler.sample(&state.broker, &state.coordinator);
    let hub = plain.hubs.iter().find(|h| h.name == "plain").unwrap();
    assert!(!super::render::hub(hub, plain.time_ms).contains("class=\"compaction\""));
}

#[tokio::test]
async fn a_captured_hub_shows_its_capture_and_its_failures() {
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path(), AuthConfig::DevelopmentUnauthenticated).await;
    let spec = HubSpec {
        capture: Some(tributary_capture::spec::with_defaults("file:/var/capture")),
        ..HubSpec::new("clicks", 1)
    };
    state.broker.create_hub(spec).await.unwrap();
    send(&state.broker, "clicks", "0", 3).await;
    let mut sampler = Sampler::default();
    let html = |sampler: &mut Sampler| {
        let snapshot = sampler.sample(&state.broker, &state.coordinator);
        super::render::hub(&snapshot.hubs[0], snapshot.time_ms)
    };
    let starting = html(&mut sampler);
    assert!(
        starting.contains("capture on, to file:/var/capture"),
        "{starting}"
    );
    assert!(
        starting.contains("<td>0</td><td>-</td><td>3</td>"),
        "{starting}"
    );
    state.broker.report_capture("clicks", 0, |s| {
        s.captured_to = Some(1);
        s.last_error = Some("disk full".into());
    });
    let failing = html(&mut sampler);
    assert!(
        failing.contains("<td>0</td><td>1</td><td>2</td>"),
        "{failing}"
    );
    assert!(failing.contains("failing: disk full"), "{failing}");
    state
        .broker
        .create_hub(HubSpec::new("plain", 1))
        .await
        .unwrap();
    let snapshot = sampler.sample(&state.broker, &state.coordinator);
    let plain = snapshot.hubs.iter().find(|h| h.name == "plain").unwrap();
    assert!(!super::render::hub(plain, snapshot.time_ms).contains("class=\"capture\""));
}

#[tokio::test]
async fn ticks_send_every_section_first_then_only_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path(), AuthConfig::DevelopmentUnauthenticated).await;
    for hub in ["a", "b"] {
        state.broker.create_hub(HubSpec::new(hub, 2)).await.unwrap();
    }
    let first = tick(&state, 1);
    let full: serde_json::Value = serde_json::from_str(&first.full).unwrap();
    assert_eq!(full["hubs"], serde_json::json!(["a", "b"]));
    assert!(full["sections"]["hub:a"].is_string() && full["sections"]["hub:b"].is_string());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _ = tick(&state, 2); // rates over the idle interval: 0, as before
    send(&state.broker, "b", "0", 3).await;
    let third = tick(&state, 3);
    let delta: serde_json::Value = serde_json::from_str(&third.delta).unwrap();
    let sections = delta["sections"].as_object().unwrap();
    assert!(sections.contains_key("hub:b"), "{delta}");
    assert!(
        !sections.contains_key("hub:a"),
        "an unchanged hub is not sent again: {delta}"
    );
    assert_eq!(third.seq, 3);
}

/// The live view's cost: one tick for 32 hubs × 32 partitions and 50 server-side groups. It
/// runs once a second for all viewers, so its time per second is its share of a core.
#[tokio::test]
async fn a_tick_of_32_hubs_by_32_partitions_and_50_groups_is_cheap() {
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path(), AuthConfig::DevelopmentUnauthenticated).await;
    for h in 0..32 {
        let hub = format!("hub-{h:02}");
        state
            .broker
            .create_hub(HubSpec::new(&hub, 32))
            .await
            .unwrap();
        send(&state.broker, &hub, "0", 10).await;
    }
    for g in 0..50 {
        join(
            &state.coordinator,
            &format!("hub-{:02}", g % 32),
            &format!("g{g}"),
        )
        .await;
    }
    let _ = tick(&state, 1);
    let runs = 5u32;
    let started = Instant::now();
    for seq in 2..2 + u64::from(runs) {
        let _ = tick(&state, seq);
    }
    let per_tick = started.elapsed() / runs;
    let mut sampler = Sampler::default();
    let started = Instant::now();
    for _ in 0..runs {
        let _ = sampler.sample(&state.broker, &state.coordinator);
    }
    println!("of which sampling: {:?}", started.elapsed() / runs);
    println!(
        "dashboard tick, 32 hubs × 32 partitions, 50 groups: {per_tick:?} per tick (once a second)"
    );
    // Generous for an unoptimised build on a shared machine; a release build takes far less.
    assert!(per_tick < Duration::from_millis(250), "{per_tick:?}");
}

#[test]
fn only_admin_and_update_group_requests_are_authorised_by_a_session() {
    let dashboard = Dashboard::new();
    let id = dashboard.sessions.open(Duration::from_secs(60));
    let mut headers = HeaderMap::new();
    headers.insert(
        axum::http::header::COOKIE,
        HeaderValue::from_str(&format!("tributary_session={id}")).unwrap(),
    );
    let csrf = dashboard.sessions.csrf(&headers).unwrap();
    headers.insert(
        super::session::CSRF_HEADER,
        HeaderValue::from_str(&csrf).unwrap(),
    );
    assert!(dashboard.authorises(&Method::POST, "/admin/v1/hubs", &headers));
    assert!(dashboard.authorises(&Method::PUT, "/20180418/streams/orders/groups/g", &headers));
    assert!(!dashboard.authorises(&Method::GET, "/20180418/streams/orders/groups/g", &headers));
    assert!(!dashboard.authorises(&Method::POST, "/20180418/streams/orders/messages", &headers));
    assert!(!dashboard.authorises(&Method::GET, "/20180418/streams", &headers));
}

#[test]
fn a_login_takes_a_connection_string_or_a_sas_token() {
    let conn = "Endpoint=sb://localhost:5672;SharedAccessKeyName=Root;SharedAccessKey=k;UseDevelopmentEmulator=true";
    let (token, expiry) = admin_token(conn).unwrap();
    assert!(
        token.starts_with("SharedAccessSignature ") && token.contains("skn=Root"),
        "{token}"
    );
    assert_eq!(
        expiry, None,
        "signed here: the session's own lifetime applies"
    );
    let given = "SharedAccessSignature sr=x&sig=y&se=123&skn=Root";
    assert_eq!(admin_token(given).unwrap(), (given.to_owned(), Some(123)));
    let err = admin_token("not a credential").unwrap_err();
    assert!(
        err.starts_with("not a connection string or SAS token"),
        "{err}"
    );
}

#[tokio::test]
async fn without_a_session_the_page_is_the_login_form_and_the_stream_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path(), crate::AuthConfig::signatures()).await;
    let page = super::page(axum::extract::State(Arc::clone(&state)), HeaderMap::new()).await;
    assert_eq!(page.status(), axum::http::StatusCode::UNAUTHORIZED);
    let events = super::events(axum::extract::State(state), HeaderMap::new()).await;
    assert_eq!(events.status(), axum::http::StatusCode::UNAUTHORIZED);
}

/// A processor fleet checkpointing in the hub's own store shows as a group table: owner,
/// checkpoint and lag per partition.
#[tokio::test]
async fn processor_groups_come_from_the_hub_hosted_store() {
    use tributary_broker::{CheckpointRecord, OwnershipClaim};
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path(), AuthConfig::DevelopmentUnauthenticated).await;
    state
        .broker
        .create_hub(HubSpec::new("Orders", 2))
        .await
        .unwrap();
    send(&state.broker, "orders", "0", 5).await;
    let claim = OwnershipClaim {
        partition_id: "0".to_owned(),
        owner_id: "host-a".to_owned(),
        etag: None,
    };
    let claimed = state
        .broker
        .claim_ownership("orders", "$Default", vec![claim])
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let checkpoint = CheckpointRecord {
        partition_id: "0".to_owned(),
        offset: None,
        sequence_number: Some(2),
    };
    state
        .broker
        .update_checkpoint("orders", "$Default", checkpoint, "host-a")
        .await
        .unwrap();
    let snapshot = Sampler::default().sample(&state.broker, &state.coordinator);
    let group = snapshot.hubs[0]
        .groups
        .iter()
        .find(|g| g.kind == "processor")
        .expect("the processor group is shown");
    assert_eq!(group.name, "$Default");
    let row = &group.rows[0];
    assert_eq!(row.owner.as_deref(), Some("host-a"));
    assert_eq!((row.last_enqueued, row.lag_events), (4, 2));
}
