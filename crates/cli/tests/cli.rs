//! The `tributary` binary as a user runs it.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

mod common;
use common::{lines_of, run, run_err, run_ok, run_with_stdin, tributary, wait_for_line};

#[test]
fn hubs_and_groups_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert!(run_ok(d, &["hub", "create", "orders", "--partitions", "3"]).contains("3 partitions"));
    assert!(run_ok(d, &["hub", "list"]).starts_with("orders\t3 partitions"));
    run_ok(d, &["group", "create", "orders", "billing"]);
    assert_eq!(
        run_ok(d, &["group", "list", "orders"]),
        "$Default\nbilling\n"
    );
    let show = run_ok(d, &["hub", "show", "ORDERS"]);
    assert!(
        show.contains("consumer groups: $Default, billing"),
        "{show}"
    );
    run_ok(d, &["group", "delete", "orders", "billing"]);
    run_ok(d, &["hub", "delete", "orders"]);
    assert_eq!(run_ok(d, &["hub", "list"]), "");
}

#[test]
fn a_processor_group_is_reset_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &["hub", "create", "meters", "--partitions", "2"]);
    run_with_stdin(d, &["send", "meters", "--partition", "1"], "a\nb\nc\n");
    let latest = run_ok(
        d,
        &["group", "reset", "meters", "$Default", "--to", "latest"],
    );
    assert_eq!(
        latest,
        "meters/$Default partition 0: processors resume after sequence number -1\n\
         meters/$Default partition 1: processors resume after sequence number 2\n"
    );
    let earliest = run_ok(
        d,
        &["group", "reset", "meters", "$Default", "--to", "earliest"],
    );
    assert!(
        earliest.ends_with("partition 1: processors resume after sequence number -1\n"),
        "{earliest}"
    );
    let later = run_ok(
        d,
        &[
            "group",
            "reset",
            "meters",
            "$Default",
            "--to",
            "time:4102444800000",
        ],
    );
    assert!(
        later.ends_with("partition 1: processors resume after sequence number 2\n"),
        "{later}"
    );
    let refused = run_err(
        d,
        &["group", "reset", "meters", "$Default", "--to", "seq:1"],
    );
    assert!(refused.contains("earliest, latest or time"), "{refused}");
}

#[test]
fn lines_sent_are_lines_received() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &["hub", "create", "h", "-p", "1"]);
    let out = run_with_stdin(d, &["send", "h"], "alpha\nbeta\ngamma\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("sent 3 events"));
    assert_eq!(run_ok(d, &["receive", "h"]), "alpha\nbeta\ngamma\n");
    assert_eq!(
        run_ok(d, &["receive", "h", "--from", "seq:1"]),
        "beta\ngamma\n"
    );
    assert_eq!(
        run_ok(d, &["receive", "h", "--from", "seq:1", "--exclusive"]),
        "gamma\n"
    );
    assert_eq!(run_ok(d, &["receive", "h", "-n", "2"]), "alpha\nbeta\n");
    assert_eq!(run_ok(d, &["receive", "h", "--from", "latest"]), "");
}

#[test]
fn json_lines_carry_keys_and_properties_through() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &["hub", "create", "h", "-p", "4"]);
    let key_partition = tributary_event::partition_for_key("dev-1", 4).to_string();
    let other = ((tributary_event::partition_for_key("dev-1", 4) + 1) % 4).to_string();
    let input = format!(
        "{}\n{}\n",
        r#"{"body": "one", "partition_key": "dev-1", "properties": {"n": 1}}"#,
        format_args!(r#"{{"body": {{"temp": 20}}, "partition": "{other}"}}"#)
    );
    let out = run_with_stdin(
        d,
        &[
            "send",
            "h",
            "--format",
            "json",
            "--property",
            "src=test",
            "--receipts",
        ],
        &input,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let receipts: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(receipts.len(), 2);
    assert_eq!(receipts[1]["partition"], other.as_str());
    assert_eq!(receipts[0]["partition"], key_partition.as_str());
    let received = run_ok(
        d,
        &[
            "receive",
            "h",
            "--format",
            "json",
            "--partition",
            &key_partition,
        ],
    );
    let event: Value = serde_json::from_str(received.lines().next().unwrap()).unwrap();
    assert_eq!(event["body"], "one");
    assert_eq!(event["partition_key"], "dev-1");
    assert_eq!(event["properties"]["n"], 1);
    assert_eq!(event["properties"]["src"], "test");
    assert_eq!(event["sequence_number"], 0);
    assert_eq!(event["offset"], receipts[0]["offsets"][0]);
    let received = run_ok(
        d,
        &["receive", "h", "--format", "json", "--partition", &other],
    );
    let event: Value = serde_json::from_str(received.trim()).unwrap();
    assert_eq!(event["body"], serde_json::json!({"temp": 20}));
}

#[test]
fn a_compacted_hub_from_the_command_line_and_through_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let compacted = [
        "hub",
        "create",
        "table",
        "-p",
        "1",
        "--cleanup-policy",
        "compact",
        "--tombstone-retention",
        "2h",
    ];
    run_ok(d, &compacted);
    let show = run_ok(d, &["hub", "show", "table"]);
    let line = "cleanup:        compact (min compaction lag 0 s, tombstone retention 2 h)";
    assert!(show.contains(line), "{show}");
    let keyless = run_with_stdin(d, &["send", "table"], "no key\n");
    assert_eq!(keyless.status.code(), Some(1));
    let err = String::from_utf8_lossy(&keyless.stderr);
    assert!(err.contains("no partition key"), "{err}");
    run_with_stdin(d, &["send", "table", "--key", "k"], "v1\n");
    assert!(run_err(d, &["hub", "update", "table"]).contains("nothing to change"));
    let bad = run(d, &["hub", "update", "table", "--cleanup-policy", "shred"]);
    assert_eq!(bad.status.code(), Some(2));

    // Through the server running on the data directory (its admin API).
    let (_server, _) = serve_on_free_ports(d);
    let update = [
        "hub",
        "update",
        "table",
        "--cleanup-policy",
        "delete",
        "--retention",
        "forever",
    ];
    run_ok(d, &update);
    let show = run_ok(d, &["hub", "show", "table"]);
    assert!(show.contains("cleanup:        delete\n"), "{show}");
    assert!(show.contains("retention:      forever"), "{show}");
    let update = [
        "hub",
        "update",
        "table",
        "--cleanup-policy",
        "delete,compact",
        "--min-compaction-lag",
        "90s",
    ];
    run_ok(d, &update);
    let show = run_ok(d, &["hub", "show", "table"]);
    let line = "cleanup:        delete,compact (min compaction lag 90 s, tombstone retention 2 h)";
    assert!(show.contains(line), "{show}");
}

#[test]
fn mistakes_get_readable_errors_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &["hub", "create", "h", "-p", "2"]);
    assert!(run_err(d, &["hub", "create", "bad name"]).contains("invalid event hub name"));
    assert!(run_err(d, &["hub", "create", "x", "-p", "2000"]).contains("1 to 1024 partitions"));
    assert!(run_err(d, &["receive", "nope"]).contains("event hub \"nope\" does not exist"));
    assert!(run_err(d, &["receive", "h", "-p", "5"]).contains("no partition \"5\""));
    let err = run_err(d, &["receive", "h", "-p", "0", "--from", "seq:10"]);
    assert!(
        err.contains("sequence number 10 is not in the partition"),
        "{err}"
    );
    assert!(run_err(d, &["group", "delete", "h", "$Default"]).contains("cannot be deleted"));
    // A bad line in a file: nothing is sent.
    let file = d.join("events.jsonl");
    std::fs::write(&file, "{\"body\": \"ok\"}\n{\"body\": \"ok\"}\nnot json\n").unwrap();
    let err = run_err(
        d,
        &[
            "send",
            "h",
            "--format",
            "json",
            "--file",
            file.to_str().unwrap(),
        ],
    );
    assert!(err.contains("line 3: invalid JSON"), "{err}");
    assert!(err.contains("nothing was sent"), "{err}");
    let out = run_with_stdin(d, &["send", "h", "-p", "9"], "x\n");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(run_ok(d, &["receive", "h"]), "", "nothing was written");
    // Usage errors come from the argument parser with status 2.
    assert_eq!(
        run(d, &["receive", "h", "--from", "middle"]).status.code(),
        Some(2)
    );
}

/// `ownership` refuses a hub that does not exist, a store it cannot read and an unknown store
/// URL, saying which; a PostgreSQL password never shows.
#[test]
fn ownership_and_process_refuse_what_they_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &["hub", "create", "h", "-p", "2"]);
    let err = run_err(d, &["ownership", "nosuchhub"]);
    assert!(
        err.contains("event hub \"nosuchhub\" does not exist"),
        "{err}"
    );
    let err = run_err(d, &["ownership", "h", "--store", "memory:"]);
    assert!(err.contains("memory: is one process's own store"), "{err}");
    for command in ["ownership", "process"] {
        let err = run_err(d, &[command, "h", "--store", "ftp://x/y"]);
        assert!(err.contains("unknown scheme \"ftp\""), "{command}: {err}");
    }
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://app:s3cret@127.0.0.1:{closed_port}/db");
    let err = run_err(d, &["ownership", "h", "--store", &url]);
    assert!(
        err.contains("cannot open the checkpoint store")
            && err.contains(&format!("127.0.0.1:{closed_port}"))
            && !err.contains("s3cret"),
        "{err}"
    );
}

#[test]
fn an_oversize_event_refuses_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &["hub", "create", "h", "-p", "1"]);
    let big = "x".repeat(2000);
    let out = run_with_stdin(
        d,
        &["--event-bytes-max", "1000", "send", "h"],
        &format!("small\n{big}\n"),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("over the limit of 1000 bytes"), "{err}");
    assert_eq!(
        run_ok(d, &["receive", "h"]),
        "",
        "the whole batch was refused"
    );
}

#[test]
fn a_running_hub_holds_its_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut serve = tributary(
        d,
        &[
            "serve",
            "--hub",
            "events",
            "--partitions",
            "2",
            "--amqp-port",
            "0",
            "--http-port",
            "0",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdout = BufReader::new(serve.stdout.take().unwrap());
    let mut banner = String::new();
    while !banner.contains("press Ctrl-C") {
        assert!(
            stdout.read_line(&mut banner).unwrap() > 0,
            "serve exited: {banner}"
        );
    }
    assert!(banner.contains("hub \"events\": 2 partitions"), "{banner}");
    // The HTTP front door answers on the address the banner gives.
    let addr = banner
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("the banner names the HTTP address");
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut conn, &mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // Commands on the held directory go through the server.
    assert!(run_ok(d, &["hub", "list"]).starts_with("events"));
    serve.kill().unwrap();
    serve.wait().unwrap();
    assert!(run_ok(d, &["hub", "list"]).starts_with("events"));
}

/// `kill -9` a writer while it appends; every batch it acknowledged must be there afterwards.
#[test]
fn acknowledged_events_survive_kill_9() {
    acknowledged_events_survive_kill_9_syncing("file");
}

/// The same with the partitions sharing syncs of the file system (`--sync-scope filesystem`).
#[test]
fn acknowledged_events_survive_kill_9_with_file_system_syncs() {
    acknowledged_events_survive_kill_9_syncing("filesystem");
}

fn acknowledged_events_survive_kill_9_syncing(scope: &str) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &["hub", "create", "h", "-p", "4"]);
    let send = [
        "send",
        "h",
        "--receipts",
        "--batch-size",
        "20",
        "--sync-scope",
        scope,
    ];
    let mut writer = tributary(d, &send)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = writer.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        // Writes until the pipe breaks (the writer was killed).
        for i in 0u64.. {
            if writeln!(stdin, "event-{i}").is_err() {
                return;
            }
        }
    });
    let mut acknowledged = Vec::new();
    let mut receipts = BufReader::new(writer.stdout.take().unwrap());
    let mut line = String::new();
    while acknowledged.len() < 300 {
        line.clear();
        assert!(
            receipts.read_line(&mut line).unwrap() > 0,
            "the writer stopped early"
        );
        let receipt: Value = serde_json::from_str(&line).unwrap();
        acknowledged.push(receipt);
    }
    writer.kill().unwrap(); // SIGKILL
    writer.wait().unwrap();
    feeder.join().unwrap();

    let mut present = std::collections::HashSet::new();
    for line in run_ok(d, &["receive", "h", "--format", "json"]).lines() {
        let e: Value = serde_json::from_str(line).unwrap();
        present.insert((
            e["partition"].as_str().unwrap().to_owned(),
            e["sequence_number"].as_i64().unwrap(),
        ));
    }
    let mut checked = 0;
    for receipt in &acknowledged {
        let partition = receipt["partition"].as_str().unwrap().to_owned();
        let first = receipt["first_sequence_number"].as_i64().unwrap();
        for seq in first..first + receipt["count"].as_i64().unwrap() {
            assert!(
                present.contains(&(partition.clone(), seq)),
                "acknowledged event {partition}/{seq} is missing"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 300 * 20);
}

/// Waits until `condition` holds (polling), failing after 30 s.
fn wait_until(what: &str, condition: impl Fn() -> bool) {
    wait_until_explained(what, condition, String::new);
}

/// Waits until `condition` holds (polling), failing after 30 s with what `explain` says then.
fn wait_until_explained(what: &str, condition: impl Fn() -> bool, explain: impl Fn() -> String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !condition() {
        if std::time::Instant::now() >= deadline {
            panic!("not reached within 30 s: {what}\n{}", explain());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn lines_in(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        lines.extend(text.lines().map(str::to_owned));
    }
    lines.sort();
    lines
}

fn sigterm(child: &std::process::Child) {
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_processor_checkpoints_and_resumes_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("out");
    run_ok(d, &["hub", "create", "h", "-p", "4"]);
    let input: String = (0..40).map(|i| format!("event-{i:02}\n")).collect();
    // Four batches of ten: round-robin puts one batch on each partition.
    assert!(
        run_with_stdin(d, &["send", "h", "--batch-size", "10"], &input)
            .status
            .success()
    );
    let args = [
        "process",
        "h",
        "--action",
        "file",
        "--output-dir",
        out.to_str().unwrap(),
        "--host-name",
        "p1",
    ];
    let mut processor = tributary(d, &args).stderr(Stdio::null()).spawn().unwrap();
    wait_until("all 40 events processed", || lines_in(&out).len() == 40);
    sigterm(&processor);
    assert!(processor.wait().unwrap().success());
    let expected: Vec<String> = (0..40).map(|i| format!("event-{i:02}")).collect();
    assert_eq!(lines_in(&out), expected);
    // The tracking table: every partition released, checkpointed at its last event.
    let table = run_ok(d, &["ownership", "h"]);
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 4, "{table}");
    for row in &rows {
        let cols: Vec<&str> = row.split('\t').collect();
        assert_eq!(cols[0], "$Default");
        assert_eq!(cols[2], "(released)", "{table}");
        assert_eq!(
            cols[5], "9",
            "each partition got 10 events round-robin: {table}"
        );
    }
    // A new instance resumes after the checkpoints: only new events arrive.
    assert!(
        run_with_stdin(d, &["send", "h"], "late-1\nlate-2\n")
            .status
            .success()
    );
    let mut processor = tributary(d, &args).stderr(Stdio::null()).spawn().unwrap();
    wait_until("the two new events processed", || {
        lines_in(&out).len() == 42
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    sigterm(&processor);
    assert!(processor.wait().unwrap().success());
    let lines = lines_in(&out);
    assert_eq!(lines.len(), 42, "nothing processed twice");
    assert!(lines.contains(&"late-1".to_owned()) && lines.contains(&"late-2".to_owned()));
}

/// A child process that is killed if the test ends (or fails) before it stops on its own.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `tributary serve` on free ports; the connection string comes from its first-start banner.
struct Served {
    child: std::process::Child,
    connection_string: String,
    /// Its start-up lines on stderr.
    banner: String,
}

impl Served {
    fn start(d: &Path, hub: &str, partitions: &str) -> Served {
        Served::start_with(d, hub, partitions, &[])
    }

    /// `serve` on free ports with `extra` flags; its first start's connection string.
    fn start_with(d: &Path, hub: &str, partitions: &str, extra: &[&str]) -> Served {
        let mut args = vec![
            "serve",
            "--hub",
            hub,
            "--partitions",
            partitions,
            "--amqp-port",
            "0",
            "--http-port",
            "0",
        ];
        args.extend_from_slice(extra);
        let mut child = tributary(d, &args).stdout(Stdio::piped()).spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut banner = String::new();
        while !banner.contains("press Ctrl-C") {
            assert!(
                stdout.read_line(&mut banner).unwrap() > 0,
                "serve exited: {banner}"
            );
        }
        let connection_string = banner
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("Endpoint=sb://"))
            .unwrap_or_else(|| panic!("no connection string in the banner: {banner}"))
            .to_owned();
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        Served {
            child,
            connection_string,
            banner,
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tributary cert` makes an authority and a server certificate; `serve` with them speaks TLS
/// only, and prints a connection string without emulator mode; the CLI's client connects when
/// told to trust the authority (`--ca-file`) and is refused, with what to do, when not; `hub`
/// and `group` work through the HTTPS admin API.
#[test]
fn serve_with_a_development_certificate_speaks_tls_to_clients_that_trust_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    assert!(run_ok(d, &["cert", "--host", "hub.test"]).contains("a new development authority"));
    let tls = d.join("tls");
    let (cert, key, ca) = (
        tls.join("server.pem"),
        tls.join("server-key.pem"),
        tls.join("ca.pem"),
    );
    let flags = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--amqps-port",
        "0",
        "--https-port",
        "0",
    ];
    let served = Served::start_with(d, "events", "1", &flags);
    let cs = served.connection_string.as_str();
    assert!(!cs.contains("UseDevelopmentEmulator"), "{cs}");
    let client_dir = d.join("client");
    let ca = ca.to_str().unwrap();
    let send = ["--ca-file", ca, "send", "events", "--connection-string", cs];
    let out = run_with_stdin(&client_dir, &send, "over tls\n");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let receive = [
        "--ca-file",
        ca,
        "receive",
        "events",
        "--connection-string",
        cs,
    ];
    assert_eq!(run_ok(&client_dir, &receive), "over tls\n");
    let refused = run_err(
        &client_dir,
        &["receive", "events", "--connection-string", cs],
    );
    assert!(
        refused.contains("UnknownIssuer") && refused.contains("--ca-file"),
        "{refused}"
    );
    https_admin_api(&served, &client_dir, ca);
    // On the server's own data directory the CLI goes through its HTTPS door, trusting the
    // authority `cert` left there.
    assert_eq!(
        run_ok(d, &["group", "list", "events"]),
        "$Default\nbilling\n"
    );
    // A second certificate is signed by the same authority.
    assert!(run_ok(d, &["cert"]).contains("the development authority already there"));
}

/// `hub` and `group` against the HTTPS door of `served`: with `--ca-file` they work, without
/// it the certificate is refused and the message names the flag.
fn https_admin_api(served: &Served, client_dir: &Path, ca: &str) {
    let port = served
        .banner
        .split("https://")
        .nth(1)
        .and_then(|rest| rest.split(['/', ' ']).next())
        .and_then(|addr| addr.rsplit(':').next())
        .unwrap_or_else(|| panic!("no https door in the banner: {}", served.banner));
    let url = format!("https://localhost:{port}");
    let cs = served.connection_string.as_str();
    let remote = ["--connection-string", cs, "--admin-url", url.as_str()];
    let trusted = ["--ca-file", ca];
    let create = ["group", "create", "events", "billing"];
    run_ok(client_dir, &[&trusted[..], &create, &remote].concat());
    let list = ["group", "list", "events"];
    let groups = run_ok(client_dir, &[&trusted[..], &list, &remote].concat());
    assert_eq!(groups, "$Default\nbilling\n");
    let refused = run_err(client_dir, &[&["hub", "list"][..], &remote].concat());
    assert!(
        refused.contains("UnknownIssuer") && refused.contains("--ca-file"),
        "{refused}"
    );
}

#[test]
fn send_and_receive_through_the_amqp_front_door() {
    let dir = tempfile::tempdir().unwrap();
    let served = Served::start(dir.path(), "events", "2");
    let cs = served.connection_string.as_str();
    let client_dir = dir.path().join("client"); // the hub's directory is the server's alone
    let out = run_with_stdin(
        &client_dir,
        &["send", "events", "--connection-string", cs, "--key", "k1"],
        "one\ntwo\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = run_ok(
        &client_dir,
        &[
            "receive",
            "events",
            "--connection-string",
            cs,
            "--format",
            "json",
        ],
    );
    let bodies: Vec<String> = got
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["body"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(bodies, ["one", "two"]);
    receipt_read_back(&client_dir, cs);
    let wrong = cs.replace("SharedAccessKey=", "SharedAccessKey=x");
    let out = run_with_stdin(
        &client_dir,
        &["send", "events", "--connection-string", &wrong],
        "x\n",
    );
    assert_eq!(out.status.code(), Some(1), "a wrong key is refused");
}

/// Over AMQP a receipt is read back: it names where "three" was stored, as `receive` sees it
/// (after "one" and "two", sent with the same key).
fn receipt_read_back(client_dir: &Path, cs: &str) {
    let out = run_with_stdin(
        client_dir,
        &["send", "events", "--connection-string", cs, "--key", "k1"]
            .into_iter()
            .chain(["--receipts"])
            .collect::<Vec<_>>(),
        "three\n",
    );
    assert!(out.status.success(), "{out:?}");
    let receipt: Value = serde_json::from_slice(&out.stdout).unwrap();
    let partition = tributary_event::partition_for_key("k1", 2).to_string();
    assert_eq!(receipt["partition"], partition.as_str());
    assert_eq!(receipt["first_sequence_number"], 2, "after one and two");
    assert_eq!(receipt["count"], 1);
    let got = run_ok(
        client_dir,
        &[
            "receive",
            "events",
            "--connection-string",
            cs,
            "--format",
            "json",
        ],
    );
    let three: Value = serde_json::from_str(got.lines().last().unwrap()).unwrap();
    assert_eq!(three["body"], "three");
    assert_eq!(three["sequence_number"], 2);
    assert_eq!(three["offset"], receipt["offsets"][0]);
    assert_eq!(three["enqueued_time"], receipt["enqueued_time"]);
    assert!(
        three["message_id"].is_string(),
        "the marker it was found by"
    );
}

/// A `tributary process` instance of the multi-process test, writing to `out`.
/// A `tributary process` writing events to files in `out`; what it logs goes to `log`.
fn spawn_processor(
    client: &Path,
    cs: &str,
    store: &str,
    out: &Path,
    name: &str,
    log: &Path,
) -> Reaped {
    let args = ["process", "h", "--connection-string", cs];
    let output = ["--action", "file", "--output-dir", out.to_str().unwrap()];
    let mut cmd = tributary(client, &args);
    if !store.is_empty() {
        cmd.args(["--store", store]);
    }
    cmd.args(output).args(["--host-name", name]);
    let log = std::fs::File::create(log).unwrap();
    Reaped(cmd.stdout(Stdio::null()).stderr(log).spawn().unwrap())
}

/// Owner → the partitions it owns, from `tributary ownership`.
fn owners_of(client: &Path, cs: &str, store: &str) -> BTreeMap<String, Vec<String>> {
    if !store.is_empty() && !store.contains("://") && !Path::new(store).exists() {
        return BTreeMap::new(); // No instance has opened the SQLite file yet.
    }
    let mut args = vec!["ownership", "h", "--connection-string", cs];
    if !store.is_empty() {
        args.extend(["--store", store]);
    }
    let mut owners = BTreeMap::<String, Vec<String>>::new();
    for row in run_ok(client, &args).lines().skip(1) {
        let cols: Vec<&str> = row.split('\t').collect();
        owners
            .entry(cols[2].to_owned())
            .or_default()
            .push(cols[1].to_owned());
    }
    owners
}

/// A `tributary send` fed one line at a time, as a trickle of round-robin events.
struct Trickle {
    sender: Reaped,
    feed: Option<std::process::ChildStdin>,
    sent: usize,
}

impl Trickle {
    fn start(client: &Path, cs: &str) -> Trickle {
        let args = ["send", "h", "--connection-string", cs, "--batch-size", "1"];
        let mut child = tributary(client, &args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let feed = child.stdin.take();
        Trickle {
            sender: Reaped(child),
            feed,
            sent: 0,
        }
    }

    fn send(&mut self, n: usize) {
        let feed = self.feed.as_mut().unwrap();
        for _ in 0..n {
            writeln!(feed, "event-{:05}", self.sent).unwrap();
            self.sent += 1;
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Closes the input and waits for every event to be sent; returns what was sent.
    fn finish(mut self) -> BTreeSet<String> {
        drop(self.feed.take());
        assert!(self.sender.0.wait().unwrap().success());
        (0..self.sent).map(|i| format!("event-{i:05}")).collect()
    }
}

/// On a fleet test's failure: who owns what, and what each of the `instances` logged in `dir`.
fn explain_fleet(owners: impl std::fmt::Debug, dir: &Path, instances: usize) -> String {
    let mut said = format!("owners: {owners:?}\n");
    for i in 0..instances {
        let log = std::fs::read_to_string(dir.join(format!("p{i}.log"))).unwrap_or_default();
        said += &format!("--- p{i} logged:\n{log}\n");
    }
    said
}

/// The fleet tests run one at a time: each is ten processes on a machine's few cores.
static ONE_FLEET_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The kill -9 fleet test with a SQLite file (a bare path) as the store.
#[test]
fn five_processes_share_a_hub_and_survive_a_kill_9() {
    let _one = ONE_FLEET_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("checkpoints.sqlite");
    five_processes_survive_a_kill_9(dir.path(), store.to_str().unwrap());
}

/// The kill -9 fleet test with no `--store`: the served hub keeps ownership and checkpoints.
#[test]
fn five_processes_share_the_hubs_own_store_and_survive_a_kill_9() {
    let _one = ONE_FLEET_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    five_processes_survive_a_kill_9(dir.path(), "");
}

/// The kill -9 fleet test with a `postgres://` store on this test binary's private PostgreSQL
/// (scripts/setup-postgres installs it).
#[test]
fn five_processes_share_a_postgres_store_and_survive_a_kill_9() {
    let _one = ONE_FLEET_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let store = tributary_testkit::PostgresServer::shared().create_database("fleet");
    five_processes_survive_a_kill_9(dir.path(), &format!("{store}?schema=fleet"));
}

/// Five processor instances over a 16-partition hub share one checkpoint store (`store`, a
/// `--store` URL); one is killed with `kill -9`. Its partitions resume on the others from its
/// last checkpoints: every event is processed, and only events processed after a last
/// checkpoint are processed twice.
fn five_processes_survive_a_kill_9(d: &Path, store: &str) {
    let served = Served::start(d, "h", "16");
    let cs = served.connection_string.clone();
    let (client, out) = (d.join("client"), d.join("out"));
    let log_of = |name: &str| d.join(format!("{name}.log"));
    let mut instances: Vec<(String, Reaped)> = (0..5)
        .map(|i| {
            let name = format!("p{i}");
            let child = spawn_processor(&client, &cs, store, &out, &name, &log_of(&name));
            (name, child)
        })
        .collect();
    let owners = || owners_of(&client, &cs, store);
    let explain = || explain_fleet(owners(), d, 5);
    wait_until_explained(
        "five instances sharing 16 partitions",
        || {
            let o = owners();
            o.len() == 5 && o.values().all(|p| p.len() == 3 || p.len() == 4)
        },
        explain,
    );
    // Every store here keeps host records: the table says when each owner was last seen.
    let mut args = vec!["ownership", "h", "--connection-string", &cs];
    if !store.is_empty() {
        args.extend(["--store", store]);
    }
    let table = run_ok(&client, &args);
    for row in table.lines().skip(1) {
        let cols: Vec<&str> = row.split('\t').collect();
        assert!(cols[6].ends_with('Z'), "the owner's last renewal: {table}");
    }
    let mut trickle = Trickle::start(&client, &cs);
    trickle.send(300);
    let (victim, mut victim_child) = instances.remove(2);
    let victim_partitions = owners()[&victim].clone();
    victim_child.0.kill().unwrap(); // SIGKILL: no relinquish, no final checkpoint
    victim_child.0.wait().unwrap();
    let killed_at = std::time::Instant::now();
    trickle.send(300);
    wait_until_explained(
        "the victim's partitions owned by the others",
        || !owners().contains_key(&victim),
        explain,
    );
    eprintln!(
        "partitions of the killed instance owned elsewhere after {:?}",
        killed_at.elapsed()
    );
    let expected = trickle.finish();
    wait_until("every event processed", || {
        let seen: BTreeSet<String> = lines_in(&out).into_iter().collect();
        expected.is_subset(&seen)
    });
    for (_, child) in &instances {
        sigterm(&child.0);
    }
    for (_, child) in &mut instances {
        assert!(child.0.wait().unwrap().success());
    }
    assert_processed_once_but_after_the_last_checkpoints(&out, &expected, victim_partitions.len());
}

/// Every line in `out` is a sent event, and only the killed instance's unfinished batches (one
/// per partition it owned) were processed twice.
fn assert_processed_once_but_after_the_last_checkpoints(
    out: &Path,
    expected: &BTreeSet<String>,
    victim_partitions: usize,
) {
    let lines = lines_in(out);
    assert!(
        lines.iter().all(|l| expected.contains(l)),
        "only sent events were processed"
    );
    let duplicates = lines.len() - expected.len();
    // Checkpoints follow every batch (at most 100 events), so the victim had at most one
    // batch per partition processed but not checkpointed.
    assert!(
        duplicates <= victim_partitions * 100,
        "{duplicates} events processed twice"
    );
}

/// The lines of `help` under `heading` (up to the next heading).
fn help_section<'a>(help: &'a str, heading: &str) -> &'a str {
    let start = help
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no {heading:?} in {help}"))
        + heading.len()
        + 2;
    let rest = &help[start..];
    let end = rest
        .match_indices('\n')
        .map(|(i, _)| i + 1)
        .find(|&i| rest[i..].starts_with(|c: char| c.is_ascii_alphabetic()))
        .unwrap_or(rest.len());
    &rest[..end]
}

#[test]
fn each_command_shows_the_flags_it_uses_under_headings() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let serve = run_ok(d, &["serve", "-h"]);
    for client_flag in [
        "--alias-file",
        "--alias-srv",
        "--dns-server",
        "--failover-failures",
        "--ca-file",
        "--connection-string",
    ] {
        assert!(!serve.contains(client_flag), "{client_flag} in {serve}");
    }
    let ports = help_section(&serve, "Ports:");
    assert!(
        ports.contains("--amqp-port") && ports.contains("--http-port"),
        "{ports}"
    );
    assert!(
        help_section(&serve, "TLS:").contains("--tls-cert"),
        "{serve}"
    );
    assert!(
        help_section(&serve, "Limits:").contains("--connections-max"),
        "{serve}"
    );
    assert!(
        help_section(&serve, "Data directory:").contains("--durability"),
        "{serve}"
    );
    for client in ["receive", "send", "process"] {
        let help = run_ok(d, &[client, "-h"]);
        let connection = help_section(&help, "Connection:");
        for flag in [
            "--connection-string",
            "--ca-file",
            "--alias-file",
            "--alias-srv",
            "--dns-server",
            "--failover-after",
        ] {
            assert!(connection.contains(flag), "{client}: {flag} in {help}");
        }
        assert!(
            !help_section(&help, "Options:").contains("--alias"),
            "{help}"
        );
    }
    let hub = run_ok(d, &["hub", "list", "-h"]);
    assert!(
        help_section(&hub, "Connection:").contains("--ca-file"),
        "{hub}"
    );
    assert!(
        !hub.contains("--alias-file"),
        "hub never follows an alias: {hub}"
    );
    let demo = run_ok(d, &["demo", "-h"]);
    assert_eq!(demo.matches("--data-dir").count(), 1, "{demo}");
    assert!(!demo.contains("--data "), "{demo}");
    let replicate = run_ok(d, &["replicate", "-h"]);
    assert!(!replicate.contains("--data-dir"), "{replicate}");
    assert!(!replicate.contains("--alias-file"), "{replicate}");
}

#[test]
fn shared_flags_before_the_command_work_where_it_takes_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let tributary_plain = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tributary"))
            .env_remove("TRIBUTARY_DATA_DIR")
            .current_dir(dir.path())
            .args(args)
            .output()
            .unwrap()
    };
    let created = tributary_plain(&["--data-dir", d, "hub", "create", "h", "-p", "1"]);
    assert!(created.status.success(), "{created:?}");
    let listed = tributary_plain(&["hub", "list", "--data-dir", d]);
    assert!(
        String::from_utf8_lossy(&listed.stdout).starts_with("h\t"),
        "{listed:?}"
    );
    let refused = tributary_plain(&["--alias-file", "active", "serve", "--data-dir", d]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("--alias-file does not apply to `tributary serve`"),
        "{stderr}"
    );
    let refused = tributary_plain(&["--data-dir", d, "replicate", "task.toml"]);
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
}

#[test]
fn receive_embeds_json_bodies_and_says_when_there_are_none() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &["hub", "create", "h", "-p", "1"]);
    run_ok(d, &["hub", "create", "empty", "-p", "2"]);
    let sent = run_with_stdin(
        d,
        &["send", "h"],
        "{\"t\": 21.5}\nplain\n[1, 2]\n\"quoted\"\n",
    );
    assert!(sent.status.success(), "{sent:?}");
    let bodies: Vec<Value> = run_ok(d, &["receive", "h", "--format", "json"])
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["body"].clone())
        .collect();
    assert_eq!(
        bodies,
        [
            serde_json::json!({"t": 21.5}),
            serde_json::json!("plain"),
            serde_json::json!([1, 2]),
            serde_json::json!("\"quoted\""),
        ]
    );
    for format in ["json", "text"] {
        let out = run(d, &["receive", "empty", "--format", format]);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(out.stdout, b"", "standard output carries only events");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "no events\n");
    }
    let out = run(d, &["receive", "h", "--from", "latest"]);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "no events\n");
}

/// `serve` on free ports on `d`, up once it says so; its AMQP port, read from `server.json`.
fn serve_on_free_ports(d: &Path) -> (Reaped, u16) {
    let args = [
        "serve",
        "--amqp-port",
        "0",
        "--http-port",
        "0",
        "--hub",
        "h",
    ];
    let mut child = tributary(d, &args).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut banner = String::new();
    while !banner.contains("press Ctrl-C") {
        assert!(
            stdout.read_line(&mut banner).unwrap() > 0,
            "serve exited: {banner}"
        );
    }
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("server.json")).unwrap()).unwrap();
    let amqp: std::net::SocketAddr = record["amqp"].as_str().unwrap().parse().unwrap();
    (Reaped(child), amqp.port())
}

#[test]
fn a_follower_finds_its_server_again_on_other_ports() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (server, first_port) = serve_on_free_ports(d);
    let follow = ["receive", "h", "--follow", "--from", "latest"];
    let mut follower = tributary(d, &follow)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = lines_of(follower.stdout.take().unwrap());
    let stderr = lines_of(follower.stderr.take().unwrap());
    let follower = Reaped(follower);
    // The follower's receivers attach in the background: send until one arrives.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        assert!(
            run_with_stdin(d, &["send", "h", "-p", "0"], "one\n")
                .status
                .success()
        );
        let got = stdout.recv_timeout(std::time::Duration::from_secs(1));
        if got.as_deref() == Ok("one") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the follower printed nothing"
        );
    }
    drop(server);
    let (_server, second_port) = loop {
        let (server, port) = serve_on_free_ports(d);
        if port != first_port {
            break (server, port);
        }
    };
    let sent = run_with_stdin(d, &["send", "h", "-p", "0"], "two\n");
    assert!(sent.status.success(), "{sent:?}");
    let printed = wait_for_line(&stdout, "two", "the follower");
    assert_eq!(printed, "two\n");
    let said = wait_for_line(&stderr, "reconnected", "the follower");
    let reconnecting = said.lines().filter(|l| l.contains("reconnecting")).count();
    assert_eq!(
        reconnecting, 1,
        "one line for the connection, not one per partition: {said:?}"
    );
    let last = said.lines().last().unwrap();
    assert!(last.ends_with(&format!(":{second_port}")), "{said:?}");
    drop(follower);
}

#[test]
fn completions_and_man_pages_come_from_the_command_definitions() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bash = run_ok(d, &["completions", "bash"]);
    for word in [
        "serve",
        "receive",
        "completions",
        "man",
        "--alias-srv",
        "--amqp-port",
    ] {
        assert!(bash.contains(word), "{word} not in the bash script");
    }
    for shell in ["zsh", "fish", "powershell", "elvish"] {
        assert!(
            run_ok(d, &["completions", shell]).contains("receive"),
            "{shell}"
        );
    }
    let page = run_ok(d, &["man"]);
    assert!(page.contains(".TH tributary 1"), "{page}");
    for command in ["serve", "receive", "completions"] {
        assert!(
            page.contains(&format!("tributary\\-{command}(1)")),
            "{command}: {page}"
        );
    }
    let pages = d.join("man");
    run_ok(d, &["man", "--dir", pages.to_str().unwrap()]);
    for file in ["tributary.1", "tributary-serve.1", "tributary-hub-create.1"] {
        let text = std::fs::read_to_string(pages.join(file)).unwrap();
        assert!(text.contains(".TH"), "{file}: {text}");
    }
    let serve = std::fs::read_to_string(pages.join("tributary-serve.1")).unwrap();
    assert!(serve.contains("amqp\\-port"), "{serve}");
    assert!(!pages.join("tributary-demo-worker.1").exists());
}

/// The README's install command is the one that installs this binary: the package at that path
/// builds `tributary` (installing it for real rebuilds everything in release mode).
#[test]
fn the_readme_says_how_to_install_this_binary() {
    let manifest = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(Path::new(manifest).join("../../README.md")).unwrap();
    assert!(
        readme.contains("cargo install --locked --path crates/cli"),
        "no install command"
    );
    for command in ["tributary completions bash", "tributary man"] {
        assert!(
            readme.contains(command),
            "the README does not say {command:?}"
        );
    }
    let cargo = std::fs::read_to_string(Path::new(manifest).join("Cargo.toml")).unwrap();
    assert!(cargo.contains("[[bin]]\nname = \"tributary\""), "{cargo}");
    assert!(Path::new(manifest).ends_with("crates/cli"), "{manifest}");
}

/// `send --receipts` through the `serve` running on the data directory reads each batch back:
/// its receipts agree with what `receive` shows, also after another producer's events; with a
/// policy that may only send, it names the Listen right and sends nothing.
#[test]
fn receipts_over_amqp_are_read_back_and_need_the_listen_right() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d).unwrap();
    let policies = serde_json::json!({"policies": [
        {"name": "RootManageSharedAccessKey", "key": "cm9vdC1rZXktZm9yLXRlc3Rz", "rights": ["Manage"]},
        {"name": "sender", "key": "c2VuZGVyLWtleS1mb3ItdGVzdHM=", "rights": ["Send"]},
    ]});
    let file = d.join("access-policies.json");
    std::fs::write(&file, policies.to_string()).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (_server, port) = serve_on_free_ports(d);
    run_with_stdin(d, &["send", "h", "--partition", "1"], "before\n");
    let out = run_with_stdin(
        d,
        &["send", "h", "--partition", "1", "--receipts"],
        "x\ny\n",
    );
    assert!(out.status.success(), "{out:?}");
    let receipt: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(receipt["partition"], "1");
    assert_eq!(receipt["first_sequence_number"], 1);
    assert_eq!(receipt["count"], 2);
    let got = run_ok(d, &["receive", "h", "--partition", "1", "--format", "json"]);
    let events: Vec<Value> = got
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 3);
    assert_eq!(events[1]["offset"], receipt["offsets"][0]);
    assert_eq!(events[2]["offset"], receipt["offsets"][1]);
    let cs = format!(
        "Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=sender;SharedAccessKey=c2VuZGVyLWtleS1mb3ItdGVzdHM=;UseDevelopmentEmulator=true"
    );
    let send = [
        "send",
        "h",
        "--connection-string",
        cs.as_str(),
        "--receipts",
    ];
    let out = run_with_stdin(&d.join("client"), &send, "z\n");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("needs the Listen right") && err.contains("without --receipts"),
        "{err}"
    );
    let after = run_ok(d, &["receive", "h", "--format", "json"]);
    assert_eq!(after.lines().count(), 3, "nothing was sent: {after}");
}

/// `tributary migrate` opens a data directory an earlier build wrote (the newest format
/// fixture), upgrading it in place, and says what it opened — again when run twice; a data
/// directory whose catalog a newer build wrote is refused, naming both versions, and left as
/// it was.
#[test]
fn migrate_opens_an_earlier_build_s_data_directory_and_refuses_a_newer_one() {
    let fixture = tributary_testkit::formats::format_fixtures().pop().unwrap();
    let copy = tributary_testkit::formats::copy_of(&fixture);
    let data = copy.path().join("data");
    for _ in 0..2 {
        let said = run_ok(&data, &["migrate"]);
        assert!(
            said.contains("3 hubs, 4 partitions, 4 consumer groups' records, access policies, server-side groups"),
            "{said}"
        );
    }
    let catalog = data.join("catalog.json");
    let mut json: Value = serde_json::from_slice(&std::fs::read(&catalog).unwrap()).unwrap();
    json["version"] = 7.into();
    std::fs::write(&catalog, json.to_string()).unwrap();
    let refused = run_err(&data, &["migrate"]);
    assert!(
        refused.contains("was written by format 7; this binary reads up to format 3"),
        "{refused}"
    );
    assert_eq!(
        std::fs::read(&catalog).unwrap(),
        json.to_string().into_bytes()
    );
    let empty = tempfile::tempdir().unwrap();
    let nothing = run_err(empty.path(), &["migrate"]);
    assert!(nothing.contains("holds no hub data"), "{nothing}");
}
