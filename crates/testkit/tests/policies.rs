//! Shared access policies per event hub and key rotation without a restart, through the real
//! clients: the official Python SDK (`azure-eventhub`, `tests/python/interop.py`) on the AMQP
//! door, confluent-kafka (`tests/python/kafka_interop.py`) on the Kafka door, and raw HTTP on
//! the admin API — every door over one hub's live policy set, all on 127.0.0.1:0. A missing
//! client FAILS these tests, it never skips them.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tributary_amqp::Right;
use tributary_amqp::policies::{AccessPolicies, KeyType, Scope, policy_connection_string};
use tributary_http::{AdminSas, AuthConfig, HttpConfig};
use tributary_kafka::{KafkaConfig, RunningKafkaServer};
use tributary_testkit::TestHub;
use tributary_testkit::oci::{Answer, Server, request};

async fn python(command: &str, args: Value) -> Value {
    tributary_testkit::run_python("interop.py", command, args).await
}

async fn kafka(command: &str, args: Value) -> Value {
    tributary_testkit::run_python("kafka_interop.py", command, args).await
}

fn now_secs() -> i64 {
    let elapsed = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(elapsed.as_secs()).unwrap()
}

/// Sends one event to partition 0 of `hub` with the Python SDK; whether it was sent.
async fn python_sends(conn: &str, hub: &str) -> Value {
    python(
        "send-expect",
        json!({"conn": conn, "hub": hub, "retry_total": 0}),
    )
    .await
}

/// Asserts the Python SDK was refused, for the reason `why` (a part of the server's words).
fn assert_refused(result: &Value, why: &str) {
    assert_eq!(result["sent"], false, "{result}");
    assert!(
        result.to_string().contains(why),
        "expected {why:?} in {result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hubs_policy_sends_to_its_hub_only_and_a_namespace_listener_reads_both() {
    let hub = TestHub::start(&[("orders", 1), ("payments", 1)]).await;
    let orders = Scope::Hub("orders".into());
    let policy = hub
        .policies
        .create(&orders, "orders-send", vec![Right::Send])
        .unwrap();
    let port = hub.port();
    let scoped =
        policy_connection_string("127.0.0.1", port, false, &policy, &orders, KeyType::Primary)
            .unwrap();
    assert!(scoped.ends_with(";EntityPath=orders"), "{scoped}");

    let sent = python_sends(&scoped, "orders").await;
    assert_eq!(
        sent["sent"], true,
        "its own hub, by its EntityPath connection string: {sent}"
    );
    // Its key asked for another hub: the SDK signs a token for `payments` with it.
    let elsewhere = python_sends(&hub.conn(&policy), "payments").await;
    assert_refused(&elsewhere, "belongs to event hub");
    // A token it signed for the whole namespace.
    let expiry = u64::try_from(now_secs() + 300).unwrap();
    let token =
        tributary_eventhubs::sas::sign("sb://127.0.0.1/", &policy.name, &policy.key, expiry);
    let namespace_token = format!(
        "Endpoint=sb://127.0.0.1:{port};SharedAccessSignature={token};UseDevelopmentEmulator=true"
    );
    assert_refused(
        &python_sends(&namespace_token, "payments").await,
        "belongs to event hub",
    );

    hub.send("payments", "0", "paid").await;
    let read = |name: &str| {
        let args = json!({"conn": hub.conn(&hub.listen), "hub": name, "partition": 0,
                          "position": "earliest", "count": 1});
        python("consume", args)
    };
    let (from_orders, from_payments) = tokio::join!(read("orders"), read("payments"));
    assert_eq!(
        from_orders["events"][0]["body"], "should-not-arrive",
        "{from_orders}"
    );
    assert_eq!(
        from_payments["events"][0]["body"], "paid",
        "{from_payments}"
    );
    assert_eq!(
        hub.read_all("orders", 0).await.len(),
        1,
        "only the authorized send arrived"
    );
    assert_eq!(hub.read_all("payments", 0).await.len(), 1);
    hub.stop().await;
}

/// The Kafka door over `hub`'s broker and live policies.
async fn kafka_door(hub: &TestHub) -> RunningKafkaServer {
    let config = KafkaConfig::new("127.0.0.1:0".parse().unwrap(), hub.policies.clone());
    tributary_kafka::start(hub.broker.clone(), config)
        .await
        .expect("the Kafka door starts")
}

/// The HTTP door over `hub`'s broker with the admin API managing its live policies: request
/// signatures required (no key registered), or a SAS token with Manage over the namespace.
async fn admin_door(hub: &TestHub) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("oci-api-keys.json");
    tributary_http::write_key_file(&keys, b"{}").unwrap();
    let auth = AuthConfig::Signatures {
        keys_file: Some(keys),
        clock_skew_ms_max: 300_000,
    };
    let mut config = HttpConfig::new("127.0.0.1:0".parse().unwrap(), auth);
    let policies: AccessPolicies = hub.policies.clone();
    config.admin_sas = Some(AdminSas::explained(move |token| {
        policies.verify_admin_token(token, now_secs()).map(drop)
    }));
    config.policies = Some(hub.policies.clone());
    let http = tributary_http::start(hub.broker.clone(), config)
        .await
        .unwrap();
    let url = format!("http://{}", http.local_addr());
    Server {
        dir,
        broker: hub.broker.clone(),
        http,
        url,
    }
}

/// The admin API as a caller with one policy's key sees it.
struct Caller<'a> {
    server: &'a Server,
    name: &'a str,
    key: &'a str,
}

impl Caller<'_> {
    /// A request with a token for the whole namespace signed by the caller's key.
    async fn call(&self, method: &str, path: &str, body: &str) -> Answer {
        let expiry = u64::try_from(now_secs() + 300).unwrap();
        let token = tributary_eventhubs::sas::sign("sb://127.0.0.1/", self.name, self.key, expiry);
        let headers = [
            ("authorization", token.as_str()),
            ("content-type", "application/json"),
        ];
        request(self.server, method, path, &headers, body.as_bytes()).await
    }
}

/// Whether confluent-kafka lists the hub's topics with `conn` as its password.
async fn kafka_logs_in(door: &RunningKafkaServer, conn: &str) -> Value {
    let args = json!({"bootstrap": door.local_addr().to_string(), "conn": conn, "timeout": 5});
    kafka("metadata", args).await
}

/// Creates the namespace policy `producer` (Send) through the admin API, as `root`, after
/// checking that a caller without Manage is refused; its primary and secondary keys.
async fn create_producer(root: &Caller<'_>, listener: &Caller<'_>) -> (String, String) {
    let body = r#"{"name": "producer", "rights": ["Send"]}"#;
    let refused = listener.call("POST", "/admin/v1/policies", body).await;
    refused.assert_error(401, "NotAuthenticated");
    let reason = refused.text();
    assert!(
        reason.contains("does not have the Manage right"),
        "{reason}"
    );
    let created = root.call("POST", "/admin/v1/policies", body).await;
    assert_eq!(created.status, 201, "{}", created.text());
    assert_eq!(created.json()["rights"], json!(["Send"]));
    let keys = root
        .call("POST", "/admin/v1/policies/producer/keys", "")
        .await
        .json();
    let key = |name: &str| keys[name].as_str().unwrap().to_owned();
    (key("primaryKey"), key("secondaryKey"))
}

/// A hub's policies are managed under the hub's path, which must name a hub.
async fn a_hubs_policies_are_under_its_path(root: &Caller<'_>) {
    let unknown = root
        .call("GET", "/admin/v1/hubs/nowhere/policies", "")
        .await;
    unknown.assert_error(404, "NotAuthorizedOrNotFound");
    let on_hub = r#"{"name": "orders-send", "rights": ["Send"]}"#;
    let hub_policy = root
        .call("POST", "/admin/v1/hubs/ORDERS/policies", on_hub)
        .await;
    assert_eq!(hub_policy.status, 201, "{}", hub_policy.text());
    assert_eq!(
        hub_policy.json()["hub"],
        "orders",
        "the hub as it spells itself"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regenerated_key_is_refused_at_once_on_every_door_while_the_others_work() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    let server = admin_door(&hub).await;
    let door = kafka_door(&hub).await;
    let caller = |policy: &'static str| {
        let policy = if policy == "root" {
            &hub.root
        } else {
            &hub.listen
        };
        Caller {
            server: &server,
            name: &policy.name,
            key: &policy.key,
        }
    };
    let root = caller("root");
    let (primary, secondary) = create_producer(&root, &caller("listen")).await;
    let conn = |key: &str| {
        hub.connection_string
            .replace(&hub.root.name, "producer")
            .replace(&hub.root.key, key)
    };
    assert_eq!(python_sends(&conn(&primary), "orders").await["sent"], true);
    assert!(kafka_logs_in(&door, &conn(&primary)).await["error"].is_null());

    let regenerate = r#"{"keyType": "PrimaryKey"}"#;
    let path = "/admin/v1/policies/producer/regenerate";
    let renewed = root.call("POST", path, regenerate).await.json();
    let new_primary = renewed["primaryKey"].as_str().unwrap();
    assert_ne!(new_primary, primary);
    assert_eq!(renewed["secondaryKey"], secondary, "the other key stays");

    // No restart: the old key is refused on both doors, the new one and the secondary work.
    assert_refused(
        &python_sends(&conn(&primary), "orders").await,
        "regenerated",
    );
    let old_kafka = kafka_logs_in(&door, &conn(&primary)).await;
    assert!(
        old_kafka["error"].is_string(),
        "the old key on the Kafka door: {old_kafka}"
    );
    let sent = python_sends(&conn(new_primary), "orders").await;
    assert_eq!(sent["sent"], true, "{sent}");
    assert_eq!(
        python_sends(&conn(&secondary), "orders").await["sent"],
        true
    );
    assert!(kafka_logs_in(&door, &conn(new_primary)).await["error"].is_null());

    let listed = root.call("GET", "/admin/v1/policies", "").await.text();
    assert!(
        !listed.contains(new_primary),
        "a list never shows keys: {listed}"
    );
    let deleted = root.call("DELETE", "/admin/v1/policies/producer", "").await;
    assert_eq!(deleted.status, 204);
    assert_refused(&python_sends(&conn(&secondary), "orders").await, "producer");
    a_hubs_policies_are_under_its_path(&root).await;
    door.shutdown().await;
    server.http.shutdown().await.unwrap();
    hub.stop().await;
}
