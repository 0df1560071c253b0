//! `tributary serve`'s Kafka doors from outside: started with the others, in the banner and in
//! `server.json`, SASL_SSL beside SASL_PLAINTEXT with a certificate, one event store behind
//! both (confluent-kafka, through `crates/testkit/tests/python/kafka_interop.py`), a taken
//! Kafka port reported with its flag, and a clean stop.

mod common;

use std::path::Path;

use common::{ServeGuard, banner_addr, run_ok, shown_connection_string, start_serve, tributary};
use serde_json::{Value, json};

/// Stops the server with SIGTERM and checks it exits cleanly.
fn stop(server: ServeGuard) {
    let mut serve = server.take();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(serve.wait().unwrap().success(), "serve stops cleanly");
}

async fn kafka(command: &str, args: Value) -> Value {
    tributary_testkit::run_python("kafka_interop.py", command, args).await
}

fn make_certificates(d: &Path) -> (String, String, String) {
    let tls = d.join("tls");
    run_ok(d, &["cert", "--dir", tls.to_str().unwrap()]);
    let path = |name: &str| tls.join(name).to_str().unwrap().to_owned();
    (path("ca.pem"), path("server.pem"), path("server-key.pem"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_opens_kafka_beside_amqp_and_http_and_both_kafka_doors_share_the_hub() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (ca, cert, key) = make_certificates(d);
    let ports = [
        "--amqp-port",
        "0",
        "--http-port",
        "0",
        "--amqps-port",
        "0",
        "--https-port",
        "0",
    ];
    let tls = ["--tls-cert", &cert, "--tls-key", &key, "--plain"];
    let flags = [
        &ports[..],
        &tls[..],
        &["--hub", "orders", "--partitions", "2"],
    ]
    .concat();
    let (serve, banner, _stderr) = start_serve(d, &flags);
    let serve = ServeGuard::new(serve);
    let plain = banner_addr(&banner, "kafka:");
    let secure = banner_addr(&banner, "kafka-tls:");
    assert!(
        banner.contains("SASL_SSL") && banner.contains("SASL_PLAINTEXT"),
        "{banner}"
    );
    let recorded: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("server.json")).unwrap()).unwrap();
    assert_eq!(recorded["kafka"], json!(plain), "{recorded}");
    assert_eq!(recorded["kafka_tls"], json!(secure), "{recorded}");
    let conn = shown_connection_string(&banner);

    produce_over_tls_and_consume_in_plain(&secure, &plain, &conn, &ca).await;
    // The settings `connection-string --kafka` prints name the plain door and log in.
    let settings = run_ok(d, &["connection-string", "--kafka"]);
    assert!(
        settings.contains(&format!("bootstrap.servers={plain}\n")),
        "{settings}"
    );
    let extra: serde_json::Map<String, Value> = settings
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.to_owned(), json!(v)))
        .collect();
    let listed = kafka(
        "metadata",
        json!({"bootstrap": "unused:1", "conn": "unused", "topic": "orders", "extra": extra}),
    )
    .await;
    assert_eq!(listed["topics"]["orders"]["partitions"], 2, "{listed}");
    a_taken_kafka_port_is_named_with_its_flag(d, &plain);
    stop(serve);
    assert!(!d.join("server.json").exists());
}

/// Two records produced over SASL_SSL at `secure` come back over SASL_PLAINTEXT at `plain`.
async fn produce_over_tls_and_consume_in_plain(secure: &str, plain: &str, conn: &str, ca: &str) {
    let records = json!([
        {"value": "first", "key": "k1", "partition": 0},
        {"value": "second", "key": "k2", "partition": 1},
    ]);
    let tls_extra = json!({"security.protocol": "SASL_SSL", "ssl.ca.location": ca});
    let produced = kafka(
        "produce",
        json!({"bootstrap": secure, "conn": conn, "topic": "orders", "acks": "all",
               "records": records, "extra": tls_extra}),
    )
    .await;
    assert_eq!(produced["unflushed"], json!(0), "{produced}");
    let reports = produced["reports"].as_array().unwrap();
    assert!(reports.iter().all(|r| r["error"].is_null()), "{produced}");

    let consumed = kafka(
        "consume",
        json!({"bootstrap": plain, "conn": conn, "topic": "orders", "partitions": [0, 1],
               "count": 2}),
    )
    .await;
    let mut values: Vec<(String, String)> = consumed["records"]
        .as_array()
        .unwrap_or_else(|| panic!("{consumed}"))
        .iter()
        .map(|r| {
            let text = |v: &Value| v.as_str().unwrap().to_owned();
            (text(&r["key"]), text(&r["value"]))
        })
        .collect();
    values.sort();
    assert_eq!(
        values,
        [
            ("k1".into(), "first".into()),
            ("k2".into(), "second".into())
        ],
        "{consumed}"
    );
}

/// A second server on the port `plain` holds fails, naming the port and --kafka-port.
fn a_taken_kafka_port_is_named_with_its_flag(d: &Path, plain: &str) {
    let port = plain.rsplit(':').next().unwrap();
    let other = d.join("other");
    let out = tributary(&other, &["serve", "--amqp-port", "0", "--http-port", "0"])
        .env("TRIBUTARY_KAFKA_PORT", port)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("port {port} (--kafka-port) is in use")),
        "{err}"
    );
}
