//! `tributary policy` as a user runs it: on the data directory, and through a running `serve`
//! (its admin API), where a regenerated key is refused at once by the AMQP door (the official
//! Python SDK, `crates/testkit/tests/python/interop.py`) and the Kafka door (confluent-kafka,
//! `kafka_interop.py`) without a restart.

mod common;

use std::path::Path;

use common::{ServeGuard, banner_addr, run_err, run_ok, start_serve};
use serde_json::{Value, json};

/// The value after `label` on a line of `shown` (`primary key:`, …).
fn field(shown: &str, label: &str) -> String {
    shown
        .lines()
        .map(str::trim)
        .find_map(|line| line.strip_prefix(label))
        .unwrap_or_else(|| panic!("no {label:?} in:\n{shown}"))
        .trim()
        .to_owned()
}

/// `tributary policy ARGS… --hub orders` for the hub policy `sender`.
fn on_sender(d: &Path, args: &[&str]) -> String {
    run_ok(
        d,
        &[&["policy"], args, &["sender", "--hub", "orders"]].concat(),
    )
}

#[test]
fn policies_are_created_listed_shown_rotated_and_deleted_on_the_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &["hub", "create", "orders", "-p", "1"]);
    let created = run_ok(d, &["policy", "create", "reader", "--rights", "Listen"]);
    let said = "created the shared access policy \"reader\" (Listen) in the namespace";
    assert!(created.contains(said), "{created}");
    let on_hub = on_sender(d, &["create", "--rights", "send,listen"]);
    assert!(on_hub.contains("in event hub \"orders\""), "{on_hub}");
    assert_eq!(
        run_ok(d, &["policy", "list"]),
        "RootManageSharedAccessKey\tManage\tthe namespace\nreader\tListen\tthe namespace\n"
    );
    assert_eq!(
        run_ok(d, &["policy", "list", "--hub", "ORDERS"]),
        "sender\tSend,Listen\tevent hub \"orders\"\n"
    );
    assert!(
        !on_sender(d, &["show"]).contains("key:"),
        "keys only when asked"
    );
    keys_rotate_one_at_a_time(d);
    refusals_say_what_to_do(d);
    run_ok(d, &["policy", "delete", "reader"]);
    assert!(!run_ok(d, &["policy", "list"]).contains("reader"));
    // A hub's policies go with it: a hub made again under its name has none.
    run_ok(d, &["hub", "delete", "orders"]);
    run_ok(d, &["hub", "create", "orders", "-p", "1"]);
    assert_eq!(run_ok(d, &["policy", "list", "--hub", "orders"]), "");
}

/// `sender`'s keys: two, in its EntityPath connection strings; each regenerated alone.
fn keys_rotate_one_at_a_time(d: &Path) {
    let shown = on_sender(d, &["show", "--keys"]);
    let primary = field(&shown, "primary key:");
    let secondary = field(&shown, "secondary key:");
    assert_ne!(primary, secondary);
    let conn = field(&shown, "primary connection string:");
    let signed = format!("SharedAccessKeyName=sender;SharedAccessKey={primary}");
    assert!(conn.contains(&signed), "{conn}");
    assert!(conn.ends_with(";EntityPath=orders"), "{conn}");
    let rotated = on_sender(d, &["rotate", "--key", "primary"]);
    assert!(rotated.contains("regenerated the primary key"), "{rotated}");
    assert!(!rotated.contains(&primary), "{rotated}");
    let shown = on_sender(d, &["show", "--keys"]);
    assert_ne!(field(&shown, "primary key:"), primary);
    assert_eq!(field(&shown, "secondary key:"), secondary);
    on_sender(d, &["rotate", "--key", "secondary"]);
    let shown = on_sender(d, &["show", "--keys"]);
    assert_ne!(field(&shown, "secondary key:"), secondary);
}

/// A policy that exists, one that does not, a hub that does not: each refused, saying why.
fn refusals_say_what_to_do(d: &Path) {
    let again = run_err(d, &["policy", "create", "reader", "--rights", "Send"]);
    let exists = "the namespace already has a shared access policy \"reader\"";
    assert!(again.contains(exists), "{again}");
    let missing = run_err(d, &["policy", "show", "nobody"]);
    let known = "there is no shared access policy \"nobody\" in the namespace (there are: \
                 RootManageSharedAccessKey, reader)";
    assert!(missing.contains(known), "{missing}");
    let no_hub = [
        "policy", "create", "x", "--hub", "nohub", "--rights", "Send",
    ];
    let no_hub = run_err(d, &no_hub);
    assert!(no_hub.contains("nohub"), "{no_hub}");
}

async fn python_sends(conn: &str) -> Value {
    let args = json!({"conn": conn, "hub": "orders", "retry_total": 0});
    tributary_testkit::run_python("interop.py", "send-expect", args).await
}

async fn kafka_logs_in(bootstrap: &str, conn: &str) -> Value {
    let args = json!({"bootstrap": bootstrap, "conn": conn, "timeout": 5});
    tributary_testkit::run_python("kafka_interop.py", "metadata", args).await
}

/// The primary and secondary connection strings `policy show --keys` prints.
fn connection_strings(d: &Path) -> (String, String) {
    let shown = run_ok(
        d,
        &["policy", "show", "sender", "--hub", "orders", "--keys"],
    );
    (
        field(&shown, "primary connection string:"),
        field(&shown, "secondary connection string:"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_rotated_while_serve_runs_is_refused_at_once_on_every_door() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let flags = [
        "--amqp-port",
        "0",
        "--http-port",
        "0",
        "--hub",
        "orders",
        "--partitions",
        "1",
    ];
    let (serve, banner, _stderr) = start_serve(d, &flags);
    let serve = ServeGuard::new(serve);
    let kafka = banner_addr(&banner, "kafka:");
    run_ok(
        d,
        &[
            "policy", "create", "sender", "--hub", "orders", "--rights", "Send",
        ],
    );
    let (old, secondary) = connection_strings(d);
    let amqp = banner_addr(&banner, "amqp:");
    let amqp_port = amqp.rsplit(':').next().unwrap();
    assert!(
        old.contains(&format!(":{amqp_port};")),
        "the running server's door: {old}"
    );
    assert_eq!(python_sends(&old).await["sent"], true);
    assert!(kafka_logs_in(&kafka, &old).await["error"].is_null());

    run_ok(
        d,
        &[
            "policy", "rotate", "sender", "--hub", "orders", "--key", "primary",
        ],
    );
    let refused = python_sends(&old).await;
    assert_eq!(refused["sent"], false, "{refused}");
    assert!(refused.to_string().contains("regenerated"), "{refused}");
    let kafka_refused = kafka_logs_in(&kafka, &old).await;
    assert!(kafka_refused["error"].is_string(), "{kafka_refused}");
    let (new, still) = connection_strings(d);
    assert_eq!(still, secondary);
    assert_eq!(python_sends(&new).await["sent"], true);
    assert_eq!(python_sends(&secondary).await["sent"], true);
    assert!(kafka_logs_in(&kafka, &new).await["error"].is_null());

    the_server_saves_keys_and_follows_hubs(d, &new).await;
    let mut serve = serve.take();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status();
    assert!(serve.wait().unwrap().success());
}

/// While serve runs: the rotated key `new` of `sender` is in the data directory's file; the
/// root policy's own key (which the CLI signs its admin requests with) rotated, the next command
/// still gets in; the hub deleted through the server takes its policies along.
async fn the_server_saves_keys_and_follows_hubs(d: &Path, new: &str) {
    let file = std::fs::read_to_string(d.join("access-policies.json")).unwrap();
    let key = new
        .split(';')
        .find_map(|part| part.strip_prefix("SharedAccessKey="))
        .unwrap();
    assert!(file.contains(key), "the server saved the new key");
    let root = "RootManageSharedAccessKey";
    run_ok(d, &["policy", "rotate", root, "--key", "primary"]);
    assert!(run_ok(d, &["hub", "list"]).starts_with("orders"));
    run_ok(d, &["hub", "delete", "orders"]);
    run_ok(d, &["hub", "create", "orders", "-p", "1"]);
    assert_eq!(run_ok(d, &["policy", "list", "--hub", "orders"]), "");
    let gone = python_sends(new).await;
    assert_eq!(
        gone["sent"], false,
        "the deleted hub's key signs nothing: {gone}"
    );
}
