//! The front door over raw HTTP in development mode: health, metrics, the admin API, request
//! ids, error shapes, limits, and that no request can break it.

use tributary_testkit::oci::{Server, Setup, request, start};

async fn dev_server() -> Server {
    start(Setup {
        signed: false,
        ..Setup::default()
    })
    .await
}

fn b64(s: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[tokio::test]
async fn health_and_the_admin_api() {
    let s = dev_server().await;
    assert_ne!(s.http.local_addr().port(), 0, "port 0 picks a real port");
    let health = request(&s, "GET", "/health", &[], b"").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "ok");
    let body = br#"{"name": "orders", "partitionCount": 3, "retentionMs": 3600000}"#;
    let created = request(&s, "POST", "/admin/v1/hubs", &[], body).await;
    assert_eq!(created.status, 201, "{}", created.text());
    assert_eq!(created.json()["partitionCount"], 3);
    let again = request(&s, "POST", "/admin/v1/hubs", &[], body).await;
    again.assert_error(409, "Conflict");
    let listed = request(&s, "GET", "/admin/v1/hubs", &[], b"").await;
    assert_eq!(listed.json()["hubs"][0]["name"], "orders");
    let path = "/admin/v1/hubs/orders/consumergroups";
    let group = request(&s, "POST", path, &[], br#"{"name": "billing"}"#).await;
    assert_eq!(group.status, 201, "{}", group.text());
    let groups = request(&s, "GET", path, &[], b"").await;
    assert_eq!(groups.json()["consumerGroups"][1]["name"], "billing");
    let described = request(&s, "GET", "/admin/v1/hubs/orders", &[], b"").await;
    assert_eq!(described.json()["partitions"].as_array().unwrap().len(), 3);
    let deleted = request(&s, "DELETE", &format!("{path}/billing"), &[], b"").await;
    assert_eq!(deleted.status, 204);
    let deleted = request(&s, "DELETE", "/admin/v1/hubs/orders", &[], b"").await;
    assert_eq!(deleted.status, 204);
    let gone = request(&s, "GET", "/admin/v1/hubs/orders", &[], b"").await;
    gone.assert_error(404, "NotAuthorizedOrNotFound");
    s.http.shutdown().await.unwrap();
}

#[tokio::test]
async fn metrics_cover_traffic_groups_and_partitions() {
    let s = start(Setup {
        signed: false,
        durability: tributary_broker::Durability::Fsync,
        ..Setup::default()
    })
    .await;
    s.broker
        .create_hub(tributary_broker::HubSpec::new("orders", 3))
        .await
        .unwrap();
    let put = format!(
        r#"{{"messages": [{{"key": "{}", "value": "{}"}}]}}"#,
        b64(b"k"),
        b64(b"hello")
    );
    let answer = request(
        &s,
        "POST",
        "/20180418/streams/orders/messages",
        &[],
        put.as_bytes(),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let join = br#"{"groupName": "g", "type": "TRIM_HORIZON"}"#;
    let cursor = request(
        &s,
        "POST",
        "/20180418/streams/orders/groupCursors",
        &[],
        join,
    )
    .await;
    let value = cursor.json()["value"].as_str().unwrap().to_owned();
    let target = format!("/20180418/streams/orders/messages?cursor={value}");
    let got = request(&s, "GET", &target, &[], b"").await;
    assert_eq!(got.json().as_array().unwrap().len(), 1);
    let oci_groups = request(&s, "GET", "/admin/v1/hubs/orders/groups", &[], b"").await;
    assert_eq!(oci_groups.json()["groups"][0]["groupName"], "g");
    let text = request(&s, "GET", "/metrics", &[], b"").await.text();
    assert_traffic_group_and_sync_metrics(&text);
    let deleted = request(&s, "DELETE", "/admin/v1/hubs/orders/groups/g", &[], b"").await;
    assert_eq!(deleted.status, 204);
    let text = request(&s, "GET", "/metrics", &[], b"").await.text();
    assert!(
        !text.contains("tributary_group_lag_events{"),
        "a deleted group's lag goes"
    );
    s.http.shutdown().await.unwrap();
}

/// `text` (a `/metrics` page after one put, one group read) has the traffic, group and
/// partition series, and the put's sync in the log's histograms.
fn assert_traffic_group_and_sync_metrics(text: &str) {
    for name in [
        "tributary_http_requests_total",
        "tributary_http_request_duration_seconds_bucket",
        "tributary_http_events_in_total{hub=\"orders\"",
        "tributary_http_event_bytes_out_total{hub=\"orders\"",
        "tributary_partition_next_sequence_number{hub=\"orders\"",
        "tributary_group_lag_events{hub=\"orders\",group=\"g\"",
        "tributary_hub_open_receivers{hub=\"orders\"}",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    // The put was synced: one fdatasync, one append waiting for it, each in some bucket.
    let value = |line: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(line)?.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{line} missing from:\n{text}"))
    };
    for histogram in [
        "tributary_log_sync_duration_seconds",
        "tributary_log_append_sync_wait_seconds",
    ] {
        let count = value(&format!("{histogram}_count "));
        assert!(count >= 1, "{histogram}: {count}");
        assert_eq!(value(&format!("{histogram}_bucket{{le=\"+Inf\"}} ")), count);
        assert!(text.contains(&format!("{histogram}_bucket{{le=\"0.001\"}} ")));
    }
}

#[tokio::test]
async fn request_ids_are_echoed_or_made_and_errors_are_oci_shaped() {
    let s = dev_server().await;
    let echoed = request(&s, "GET", "/nope", &[("opc-request-id", "my-id-1")], b"").await;
    echoed.assert_error(404, "NotFound");
    assert_eq!(echoed.header("opc-request-id"), Some("my-id-1"));
    let made = request(&s, "GET", "/health", &[], b"").await;
    assert_eq!(made.header("opc-request-id").map(str::len), Some(32));
    request(&s, "DELETE", "/20180418/streams/x/messages", &[], b"")
        .await
        .assert_error(405, "MethodNotAllowed");
    request(&s, "GET", "/20180418/streams/x/messages", &[], b"")
        .await
        .assert_error(400, "MissingParameter");
    request(
        &s,
        "GET",
        "/20180418/streams/x/messages?cursor=abc&cursor=def",
        &[],
        b"",
    )
    .await
    .assert_error(400, "InvalidParameter");
    request(&s, "GET", "/20180418/streams/x/groups/g", &[], b"")
        .await
        .assert_error(404, "NotAuthorizedOrNotFound");
    let huge = vec![b'x'; 3 * 1024 * 1024];
    request(&s, "POST", "/20180418/streams/x/messages", &[], &huge)
        .await
        .assert_error(413, "RequestEntityTooLarge");
    s.http.shutdown().await.unwrap();
}

#[tokio::test]
async fn garbage_never_breaks_the_server() {
    let s = dev_server().await;
    s.broker
        .create_hub(tributary_broker::HubSpec::new("s", 2))
        .await
        .unwrap();
    let bodies: [&[u8]; 8] = [
        b"",
        b"null",
        b"[]",
        b"\xff\xfe\x00",
        br#"{"messages": null}"#,
        br#"{"partition": "-1", "type": "LATEST"}"#,
        br#"{"partition": "99999999999999999999", "type": "AT_OFFSET", "offset": -5}"#,
        br#"{"groupName": "g", "type": "AT_TIME", "time": "9999-99-99T00:00:00Z", "timeoutInMs": -1}"#,
    ];
    let paths = [
        "/20180418/streams/s/messages",
        "/20180418/streams/s/cursors",
        "/20180418/streams/s/groupCursors",
        "/20180418/streams/s/groups/g",
        "/20180418/streams/s/commit?cursor=%00",
        "/20180418/streams/s/heartbeat",
        "/20180418/streams/%ff/messages?cursor=x&limit=-1",
        "/admin/v1/hubs/%ff/consumergroups",
        "/admin/v1/hubs",
    ];
    for path in paths {
        for body in bodies {
            for method in ["GET", "POST", "PUT"] {
                let a = request(&s, method, path, &[], body).await;
                if method == "GET" && path == "/admin/v1/hubs" {
                    assert_eq!(a.status, 200);
                    continue;
                }
                assert!(
                    (400..500).contains(&a.status),
                    "{method} {path} {body:?}: {} {}",
                    a.status,
                    a.text()
                );
                assert!(
                    a.json()["code"].is_string(),
                    "{method} {path}: {}",
                    a.text()
                );
            }
        }
    }
    assert_eq!(request(&s, "GET", "/health", &[], b"").await.status, 200);
    for p in ["0", "1"] {
        let props = s.broker.partition_properties("s", p).unwrap();
        assert!(props.is_empty, "nothing was written");
    }
    s.http.shutdown().await.unwrap();
}

/// A processor group's checkpoints (the hub-hosted store) reset through the admin API: refused
/// with 409 naming the owner while it runs, then to earliest and to latest once it let go.
#[tokio::test]
async fn a_processor_group_is_reset_through_the_admin_api() {
    use tributary_broker::{HubSpec, OwnershipClaim};
    use tributary_event::{EventData, SendTarget};
    let s = dev_server().await;
    s.broker
        .create_hub(HubSpec::new("meters", 2))
        .await
        .unwrap();
    let events = (0..3)
        .map(|i| EventData::new(format!("m{i}").into_bytes()))
        .collect();
    s.broker
        .send("meters", SendTarget::Partition("1".into()), events)
        .await
        .unwrap();
    let claim = |owner: &str, etag: Option<String>| OwnershipClaim {
        partition_id: "1".into(),
        owner_id: owner.into(),
        etag,
    };
    let won = s
        .broker
        .claim_ownership("meters", "$Default", vec![claim("meter-reader", None)])
        .await
        .unwrap();
    let path = "/admin/v1/hubs/meters/consumergroups/$Default/reset";
    let refused = request(&s, "POST", path, &[], br#"{"type": "TRIM_HORIZON"}"#).await;
    refused.assert_error(409, "Conflict");
    assert!(
        refused.text().contains("meter-reader on partitions 1"),
        "{}",
        refused.text()
    );
    s.broker
        .claim_ownership(
            "meters",
            "$Default",
            vec![claim("", Some(won[0].etag.clone()))],
        )
        .await
        .unwrap();
    let earliest = request(&s, "POST", path, &[], br#"{"type": "TRIM_HORIZON"}"#).await;
    assert_eq!(earliest.status, 200, "{}", earliest.text());
    assert_eq!(earliest.json()["checkpoints"][1]["sequenceNumber"], -1);
    let latest = request(&s, "POST", path, &[], br#"{"type": "LATEST"}"#).await;
    assert_eq!(
        latest.json()["checkpoints"][0]["sequenceNumber"],
        -1,
        "an empty partition"
    );
    assert_eq!(latest.json()["checkpoints"][1]["sequenceNumber"], 2);
    let stored = s
        .broker
        .list_checkpoints("meters", "$Default")
        .await
        .unwrap();
    assert_eq!(stored[1].sequence_number, Some(2));
    request(&s, "POST", path, &[], br#"{"type": "AT_OFFSET"}"#)
        .await
        .assert_error(400, "InvalidParameter");
    request(
        &s,
        "POST",
        "/admin/v1/hubs/meters/consumergroups/none/reset",
        &[],
        br#"{"type": "LATEST"}"#,
    )
    .await
    .assert_error(404, "NotAuthorizedOrNotFound");
    s.http.shutdown().await.unwrap();
}
