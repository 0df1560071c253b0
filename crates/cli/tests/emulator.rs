//! `tributary serve` standing in for Microsoft's Event Hubs emulator (issue 34, point 1): the
//! emulator's Config.json creates the hubs and groups, and with --emulator-compat the
//! emulator's own connection string (its publicly known key, `UseDevelopmentEmulator=true`)
//! works from the official Python and JavaScript SDKs. The servers listen on free ports (port 0)
//! so a test never takes 5672 or 5300.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::{Value, json};

mod common;
use common::{run_ok, start_serve, tributary};

/// A Config.json as the emulator's sample writes it (a string partition count, a consumer
/// group, logging settings), with a second entity as Aspire writes them (a number, no groups).
const CONFIG: &str = r#"{
    "UserConfig": {
        "NamespaceConfig": [
        {
            "Type": "EventHub",
            "Name": "emulatorNs1",
            "Entities": [
            {
                "Name": "eh1",
                "PartitionCount": "2",
                "ConsumerGroups": [ { "Name": "cg1" } ]
            },
            {
                "Name": "eh2",
                "PartitionCount": 3,
                "ConsumerGroups": []
            }
            ]
        }
        ],
        "LoggingConfig": { "Type": "File" }
    }
}"#;

/// The emulator's documented connection string, on the test server's port.
fn emulator_connection_string(port: u16) -> String {
    format!(
        "Endpoint=sb://localhost:{port};SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("Config.json");
    std::fs::write(&path, text).unwrap();
    path
}

/// A `tributary serve`, killed when dropped.
struct Server {
    child: Child,
    /// Its standard output up to the banner's end.
    banner: String,
    /// Its standard error until then.
    warnings: String,
}

impl Server {
    fn start(data: &Path, extra: &[&str]) -> Server {
        let args = [&["--amqp-port", "0", "--http-port", "0"], extra].concat();
        let (child, banner, errors) = start_serve(data, &args);
        // What it wrote to stderr before the banner was out (the warning comes first thing).
        let warnings: String =
            std::iter::from_fn(|| errors.recv_timeout(Duration::from_millis(200)).ok())
                .map(|line| line + "\n")
                .collect();
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in errors {});
        Server {
            child,
            banner,
            warnings,
        }
    }

    /// The port of the banner's `scheme://127.0.0.1:PORT`.
    fn port(&self, scheme: &str) -> u16 {
        let marker = format!("{scheme}://");
        let rest = self
            .banner
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{scheme}: ")))
            .and_then(|l| l.strip_prefix(&marker))
            .unwrap_or_else(|| panic!("no {scheme} door in the banner:\n{}", self.banner));
        let addr = rest.split(['/', ' ']).next().unwrap();
        addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// Ctrl-C, as a person stops it.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-INT", &pid])
                .status()
                .unwrap()
                .success()
        );
        let exit = self.child.wait().unwrap();
        assert!(exit.success(), "serve stopped with {exit}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET /health` on the HTTP door: the status line and body.
fn health(port: u16) -> String {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    conn.write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    reply
}

fn bodies(result: &Value) -> Vec<String> {
    result["events"]
        .as_array()
        .unwrap_or_else(|| panic!("no events: {result}"))
        .iter()
        .map(|e| e["body"].as_str().unwrap().to_owned())
        .collect()
}

/// What `serve --emulator-config CONFIG --emulator-compat` prints: the warning first on
/// stderr, the config's hubs (not the default one) and where the health check is in the
/// banner, and never the key.
fn assert_compat_banner(server: &Server) {
    let (banner, warnings) = (&server.banner, &server.warnings);
    assert!(
        warnings.starts_with("WARNING: --emulator-compat: FOR DEVELOPMENT ONLY"),
        "the warning comes first:\n{warnings}"
    );
    assert!(
        !banner.contains("SAS_KEY_VALUE") && !warnings.contains("SAS_KEY_VALUE"),
        "never print a key:\n{banner}\n{warnings}"
    );
    assert!(
        banner.contains("hub \"eh1\": 2 partitions, consumer groups $Default, cg1")
            && banner.contains("hub \"eh2\": 3 partitions, consumer groups $Default")
            && !banner.contains("hub \"events\""),
        "the config's hubs, not the default one:\n{banner}"
    );
    assert!(
        banner.contains("emulator health check: http://"),
        "{banner}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulators_connection_string_and_config_work_from_python_and_javascript() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), CONFIG);
    let data = dir.path().join("data");
    let server = Server::start(
        &data,
        &[
            "--emulator-config",
            config.to_str().unwrap(),
            "--emulator-compat",
        ],
    );
    assert_compat_banner(&server);
    assert!(health(server.port("http")).starts_with("HTTP/1.1 200"));

    let conn = emulator_connection_string(server.port("amqp"));
    // Python sends to eh1's partition 1; JavaScript reads it in the config's group cg1.
    let sent = tributary_testkit::run_python(
        "interop.py",
        "send-batch",
        json!({"conn": conn, "hub": "eh1", "partition": 1, "count": 3, "prefix": "py"}),
    )
    .await;
    assert_eq!(sent["sent"], true, "{sent}");
    let read = tributary_testkit::run_node(
        "receive",
        json!({"conn": conn, "hub": "eh1", "group": "cg1", "partition": 1, "count": 3}),
    )
    .await;
    assert_eq!(read["errors"], json!([]), "{read}");
    assert_eq!(bodies(&read), ["py-0", "py-1", "py-2"]);

    // JavaScript sends to eh1's partition 0; Python reads it in cg1.
    let sent = tributary_testkit::run_node(
        "send-batch",
        json!({"conn": conn, "hub": "eh1", "partition": 0, "count": 2, "prefix": "js"}),
    )
    .await;
    assert_eq!(sent["sent"], true, "{sent}");
    let read = tributary_testkit::run_python(
        "interop.py",
        "consume",
        json!({"conn": conn, "hub": "eh1", "group": "cg1", "partition": 0, "count": 2,
               "position": "earliest"}),
    )
    .await;
    assert_eq!(read["errors"], json!([]), "{read}");
    // The JavaScript SDK sends a string body JSON-encoded; Python hands back those bytes.
    assert_eq!(bodies(&read), ["\"js-0\"", "\"js-1\""]);

    // The key is a Manage policy: the admin API takes it too.
    let admin_url = format!("http://127.0.0.1:{}", server.port("http"));
    let elsewhere = dir.path().join("elsewhere");
    let args = [
        "hub",
        "list",
        "--connection-string",
        &conn,
        "--admin-url",
        &admin_url,
    ];
    let listed = run_ok(&elsewhere, &args);
    assert!(
        listed.starts_with("eh1\t2 partitions") && listed.contains("eh2"),
        "{listed}"
    );
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_emulator_compat_the_well_known_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), CONFIG);
    let data = dir.path().join("data");
    let server = Server::start(&data, &["--emulator-config", config.to_str().unwrap()]);
    assert!(!server.warnings.contains("WARNING"), "{}", server.warnings);
    let refused = tributary_testkit::run_python(
        "interop.py",
        "send-expect",
        json!({"conn": emulator_connection_string(server.port("amqp")), "hub": "eh1",
               "retry_total": 0}),
    )
    .await;
    assert_eq!(refused["sent"], false, "{refused}");
    let text = refused.to_string().to_lowercase();
    assert!(
        text.contains("unauthorized") || text.contains("authentication") || text.contains("401"),
        "refused for its key: {refused}"
    );
    server.stop();
    // Nor was the key written anywhere a later start would read it.
    let policies = std::fs::read_to_string(data.join("access-policies.json")).unwrap();
    assert!(!policies.contains("SAS_KEY_VALUE"));
}

#[test]
fn a_config_is_checked_whole_and_applied_again_without_change() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let serve_with = |text: &str| {
        let config = write_config(dir.path(), text);
        let args = [
            "serve",
            "--amqp-port",
            "0",
            "--http-port",
            "0",
            "--emulator-config",
            config.to_str().unwrap(),
        ];
        tributary(&data, &args).output().unwrap()
    };
    // A bad third entity: nothing is created, the error names the file and the JSON path.
    let bad = CONFIG.replace(
        "\"ConsumerGroups\": []",
        "\"ConsumerGroups\": []}, {\"Name\": \"eh3\", \"PartitionCount\": \"many\"",
    );
    let out = serve_with(&bad);
    assert_eq!(out.status.code(), Some(1));
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains("Config.json")
            && error.contains("UserConfig.NamespaceConfig[0].Entities[2].PartitionCount"),
        "{error}"
    );
    assert_eq!(run_ok(&data, &["hub", "list"]), "", "nothing was created");

    // Applied, then applied again: the same hubs, their events kept.
    let config = write_config(dir.path(), CONFIG);
    let args = ["--emulator-config", config.to_str().unwrap()];
    Server::start(&data, &args).stop();
    common::run_with_stdin(&data, &["send", "eh1"], "kept\n");
    let again = Server::start(&data, &args);
    assert!(
        again
            .banner
            .contains("event hubs created: none; already there: eh1, eh2"),
        "{}",
        again.banner
    );
    again.stop();
    assert_eq!(run_ok(&data, &["receive", "eh1"]), "kept\n");

    // Another partition count for eh1: refused, naming the hub and both counts.
    let out = serve_with(&CONFIG.replace("\"2\"", "\"4\""));
    assert_eq!(out.status.code(), Some(1));
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(
        error.contains("\"eh1\" already has 2 partitions") && error.contains("the file gives 4"),
        "{error}"
    );
    let listed = run_ok(&data, &["hub", "list"]);
    assert!(
        listed.starts_with("eh1") && listed.contains("eh2") && !listed.contains("events"),
        "{listed}"
    );
}
