//! What a newcomer tripped over (issue 17, point 4), and the CLI on a running hub (point 3):
//! the `tributary` binary run as a user runs it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{lines_of, run_with_stdin, start_serve, tributary, wait_for_line};

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn failed(out: &Output, what: &str) -> String {
    assert_eq!(out.status.code(), Some(1), "{what} should fail");
    String::from_utf8(out.stderr.clone()).unwrap()
}

fn run_ok(data: &Path, args: &[&str]) -> String {
    ok(
        &tributary(data, args).output().unwrap(),
        &format!("{args:?}"),
    )
}

/// The partition of each event `receive --format json` prints.
fn partitions_received(data: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["receive", "h", "--format", "json"];
    args.extend_from_slice(extra);
    run_ok(data, &args)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["partition"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// A `tributary serve`, stopped (SIGKILL) when dropped.
struct Server {
    child: Child,
    /// Its standard output up to the banner's end.
    banner: String,
    /// Its standard error, line by line.
    stderr: Receiver<String>,
}

impl Server {
    fn start(data: &Path, extra: &[&str]) -> Server {
        let args = [&["--hub", "h", "--partitions", "4"], extra].concat();
        let (child, banner, stderr) = start_serve(data, &args);
        Server {
            child,
            banner,
            stderr,
        }
    }

    /// The connection string of the first start.
    fn connection_string(&self) -> String {
        self.banner
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("Endpoint=sb://"))
            .unwrap_or_else(|| panic!("no connection string in the banner: {}", self.banner))
            .to_owned()
    }

    /// Ctrl-C, as a person stops it; waits for the exit.
    fn stop(self) {
        self.stop_with("-INT");
    }

    /// Sends `signal` (as `kill` names it); waits for the exit, which must be a clean one.
    fn stop_with(mut self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
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

/// A server on free ports for tests that only talk to it, with its connection string and a
/// client directory. (One per test: a server in a static would outlive the test binary.)
fn a_server(dir: &Path) -> (Server, PathBuf, String) {
    let server = Server::start(dir, &["--amqp-port", "0", "--http-port", "0"]);
    let cs = server.connection_string();
    (server, dir.join("client"), cs)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn round_robin_spreads_events_not_batches_and_runs_start_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &["hub", "create", "h", "--partitions", "4"]);
    let out = run_with_stdin(d, &["send", "h"], "a\nb\n");
    ok(&out, "send");
    let first = partitions_received(d, &[]);
    assert_eq!(first.len(), 2);
    assert_ne!(first[0], first[1], "two lines went to one partition");
    // Runs of one line each: not every run starts at the same partition.
    for _ in 0..12 {
        ok(&run_with_stdin(d, &["send", "h"], "x\n"), "send");
    }
    let mut counts = std::collections::BTreeMap::new();
    for p in partitions_received(d, &[]) {
        *counts.entry(p).or_insert(0) += 1;
    }
    assert!(counts.len() > 1, "every run started at {counts:?}");
}

#[test]
fn a_bad_partition_on_a_file_line_writes_nothing_and_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &["hub", "create", "h", "--partitions", "4"]);
    let file = d.join("events.jsonl");
    std::fs::write(
        &file,
        "{\"body\": \"a\", \"partition\": \"1\"}\n{\"body\": \"b\"}\n{\"body\": \"c\", \"partition\": \"99\"}\n",
    )
    .unwrap();
    let args = [
        "send",
        "h",
        "--format",
        "json",
        "--file",
        file.to_str().unwrap(),
    ];
    let err = failed(&tributary(d, &args).output().unwrap(), "send --file");
    assert!(err.contains("line 3:"), "{err}");
    assert!(err.contains("no partition \"99\""), "{err}");
    assert!(err.contains("nothing was sent"), "{err}");
    assert_eq!(partitions_received(d, &[]), Vec::<String>::new());
}

#[test]
fn many_3_kb_lines_over_amqp_are_cut_by_the_hub_message_size() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, client, cs) = a_server(dir.path());
    let (client, cs) = (&client, cs.as_str());
    let line = "y".repeat(3000);
    let input: String = (0..500).map(|_| format!("{line}\n")).collect();
    let args = ["send", "h", "--connection-string", cs, "--key", "big"];
    let out = run_with_stdin(client, &args, &input);
    ok(&out, "send of 500 lines of 3 KB");
    assert!(String::from_utf8_lossy(&out.stderr).contains("sent 500 events"));
    let received = run_ok(
        client,
        &[
            "receive",
            "h",
            "--connection-string",
            cs,
            "--from",
            "earliest",
        ],
    );
    let big = received.lines().filter(|l| *l == line).count();
    assert_eq!(big, 500);
}

#[test]
fn errors_are_said_once_and_name_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_ok(d, &["hub", "create", "h", "--partitions", "4"]);
    let err = failed(
        &run_with_stdin(d, &["send", "h", "-p", "99"], "x\n"),
        "send",
    );
    assert_eq!(err.matches("\"99\"").count(), 1, "{err}");
    assert!(err.contains("no partition \"99\""), "{err}");
    // Over AMQP too: the partition is named, not "not found: event hub".
    let (_server, client, cs) = a_server(&d.join("served"));
    let args = ["receive", "h", "-p", "99", "--connection-string", &cs];
    let err = failed(&tributary(&client, &args).output().unwrap(), "receive");
    assert_eq!(err.matches("\"99\"").count(), 1, "{err}");
    assert!(err.contains("no partition \"99\""), "{err}");
    // A port in use: said once, with the flag that moves it; ports in use: all of them at once.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let serve = ["serve", "--amqp-port", &port, "--http-port", "0"];
    let err = failed(&tributary(&d.join("s"), &serve).output().unwrap(), "serve");
    assert_eq!(err.matches(" in use").count(), 1, "{err}");
    assert!(
        err.contains(&format!("port {port} (--amqp-port) is in use")),
        "{err}"
    );
    let also = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let http = also.local_addr().unwrap().port().to_string();
    let serve = ["serve", "--amqp-port", &port, "--http-port", &http];
    let err = failed(&tributary(&d.join("s"), &serve).output().unwrap(), "serve");
    assert!(
        err.contains(&format!(
            "ports {port} (--amqp-port), {http} (--http-port) are in use"
        )),
        "{err}"
    );
    assert!(!d.join("s").join("access-policies.json").exists(), "{err}");
}

#[test]
fn the_log_has_no_colour_codes_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let out = tributary(dir.path(), &["--log", "debug", "hub", "list"])
        .output()
        .unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("DEBUG") || err.contains("INFO"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
}

#[test]
fn a_follower_reconnects_when_its_server_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = free_port().to_string();
    let flags = ["--amqp-port", port.as_str(), "--http-port", "0"];
    let server = Server::start(d, &flags);
    let cs = server.connection_string();
    let client = d.join("client");
    let follow = [
        "receive",
        "h",
        "--follow",
        "--from",
        "latest",
        "--connection-string",
        &cs,
    ];
    let mut receiver = tributary(&client, &follow)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = lines_of(receiver.stdout.take().unwrap());
    let stderr = lines_of(receiver.stderr.take().unwrap());
    // The follower's receivers attach in the background: send until one arrives.
    let send = ["send", "h", "--connection-string", &cs, "-p", "0"];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        ok(&run_with_stdin(&client, &send, "one\n"), "send");
        if stdout.recv_timeout(Duration::from_secs(1)).as_deref() == Ok("one") {
            break;
        }
        assert!(Instant::now() < deadline, "the follower printed nothing");
    }
    server.stop();
    wait_for_line(&stderr, "reconnecting", "the follower");
    let server = Server::start(d, &flags);
    ok(
        &run_with_stdin(&client, &send, "two\n"),
        "send after the restart",
    );
    let got = wait_for_line(&stdout, "two", "the follower after the restart");
    assert!(
        receiver.try_wait().unwrap().is_none(),
        "the follower exited"
    );
    assert!(!got.contains("tributary:"), "{got}");
    let _ = receiver.kill();
    let _ = receiver.wait();
    drop(server);
}

#[test]
fn process_help_shows_no_rust_type_names() {
    let dir = tempfile::tempdir().unwrap();
    let help = run_ok(dir.path(), &["process", "--help"]);
    assert!(help.contains("balanced"), "{help}");
    assert!(!help.contains("::"), "{help}");
    assert!(!help.contains("LoadBalancingStrategy"), "{help}");
}

#[test]
fn the_cli_finds_the_server_running_on_its_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let server = Server::start(d, &["--amqp-port", "0", "--http-port", "0"]);
    let banner_cs = server.connection_string();
    // The port the server really listens on, not 5672.
    assert_eq!(run_ok(d, &["connection-string"]).trim(), banner_cs);
    // Commands on the held data directory go through the server.
    ok(
        &run_with_stdin(d, &["send", "h", "-p", "2"], "through the server\n"),
        "send",
    );
    assert_eq!(
        run_ok(d, &["receive", "h", "-p", "2"]),
        "through the server\n"
    );
    server.stop();
    assert!(!d.join("server.json").exists(), "a clean stop removes it");
    assert_eq!(
        run_ok(d, &["receive", "h", "-p", "2"]),
        "through the server\n"
    );
}

#[test]
fn a_failed_first_start_keeps_its_connection_string_for_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let serve = ["serve", "--amqp-port", &port, "--http-port", "0"];
    let err = failed(&tributary(d, &serve).output().unwrap(), "serve");
    assert!(
        err.contains(&format!("port {port} (--amqp-port) is in use")),
        "{err}"
    );
    assert!(!err.contains("SharedAccessKey="), "{err}");
    let server = Server::start(d, &["--amqp-port", "0", "--http-port", "0"]);
    assert!(server.connection_string().contains("SharedAccessKey="));
    let mut stderr_rest = String::new();
    while let Ok(line) = server.stderr.try_recv() {
        stderr_rest.push_str(&line);
    }
    assert!(!stderr_rest.contains("ERROR"), "{stderr_rest}");
}

/// `serve` prints its banner on stdout (a user redirecting it gets it): the dashboard's
/// address, the connection string on the first start and the command that prints it after a
/// restart; on stderr nothing an Event Hubs user does not need (no OCI key warning).
#[test]
fn the_banner_is_on_stdout_with_the_dashboard_and_the_connection_string_command() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ports = ["--amqp-port", "0", "--http-port", "0"];
    let first = Server::start(d, &ports);
    assert!(
        first.banner.contains("dashboard: http://127.0.0.1:"),
        "{}",
        first.banner
    );
    assert!(first.connection_string().contains("SharedAccessKey="));
    first.stop();
    let again = Server::start(d, &ports);
    assert!(
        !again.banner.contains("SharedAccessKey="),
        "{}",
        again.banner
    );
    let command = format!("`tributary --data-dir {} connection-string`", d.display());
    assert!(
        again
            .banner
            .contains(&format!("connection string: {command} prints it")),
        "{}",
        again.banner
    );
    let said: Vec<String> = again.stderr.try_iter().collect();
    assert!(said.is_empty(), "{said:?}");
    // SIGTERM (`docker stop`, systemd) stops it as cleanly as Ctrl-C.
    again.stop_with("-TERM");
    assert!(!d.join("server.json").exists(), "a clean stop removes it");
}

/// A raw HTTP/1.1 request; the status line of the answer.
fn http_status(addr: &str, request_line: &str, authorization: Option<&str>) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    let auth = authorization.map_or(String::new(), |a| format!("authorization: {a}\r\n"));
    write!(
        conn,
        "{request_line}\r\nhost: {addr}\r\n{auth}connection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut conn, &mut reply).unwrap();
    reply.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn hubs_and_groups_change_through_the_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let server = Server::start(d, &["--amqp-port", "0", "--http-port", "0"]);
    let created = run_ok(d, &["hub", "create", "orders", "--partitions", "3"]);
    assert_eq!(created, "created event hub \"orders\" with 3 partitions\n");
    let list = run_ok(d, &["hub", "list"]);
    assert!(
        list.contains("h\t4 partitions\t1 consumer group\n"),
        "{list}"
    );
    assert!(
        list.contains("orders\t3 partitions\t1 consumer group\n"),
        "{list}"
    );
    run_ok(d, &["group", "create", "orders", "billing"]);
    assert_eq!(
        run_ok(d, &["group", "list", "orders"]),
        "$Default\nbilling\n"
    );
    let reset = [
        "group",
        "reset",
        "orders",
        "billing",
        "--to",
        "time:4102444800000",
    ];
    assert!(
        run_ok(d, &reset)
            .contains("orders/billing partition 2: processors resume after sequence number -1"),
        "the running server's admin API resets a processor group"
    );
    let show = run_ok(d, &["hub", "show", "orders"]);
    assert!(
        show.contains("consumer groups: $Default, billing"),
        "{show}"
    );
    assert_eq!(
        show.lines().filter(|l| l.ends_with("true")).count(),
        3,
        "{show}"
    );
    run_ok(d, &["group", "delete", "orders", "billing"]);
    let out = tributary(d, &["hub", "show", "nope"]).output().unwrap();
    let err = failed(&out, "hub show nope");
    assert_eq!(err.matches("does not exist").count(), 1, "{err}");
    // The admin API still refuses requests without a signature or a Manage token.
    let http = server
        .banner
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_owned();
    let status = http_status(&http, "GET /admin/v1/hubs HTTP/1.1", None);
    assert!(status.contains(" 401"), "{status}");
    let forged = "SharedAccessSignature sr=sb%3A%2F%2Fx%2F&sig=AAAA&se=9999999999&skn=RootManageSharedAccessKey";
    let status = http_status(&http, "GET /admin/v1/hubs HTTP/1.1", Some(forged));
    assert!(status.contains(" 401"), "{status}");
    remote_admin(&d.join("client"), &server.connection_string(), &http);
    server.stop();
    assert!(run_ok(d, &["hub", "list"]).starts_with("h\t4 partitions"));
}

/// `hub` and `group` from another directory, with a connection string and the admin API's
/// address (`http` is `host:port`); a wrong key is refused. Deletes the hub "orders".
fn remote_admin(client: &Path, cs: &str, http: &str) {
    // From elsewhere, with the connection string and the admin API's address.
    let url = format!("http://{http}");
    let remote = ["--connection-string", cs, "--admin-url", url.as_str()];
    let list = run_ok(client, &[&["hub", "list"][..], &remote].concat());
    assert!(list.contains("orders\t3 partitions"), "{list}");
    let groups = run_ok(
        client,
        &[&["group", "list", "orders"][..], &remote].concat(),
    );
    assert_eq!(groups, "$Default\n");
    let wrong = cs.replace("SharedAccessKey=", "SharedAccessKey=x");
    let refused = [
        "hub",
        "list",
        "--connection-string",
        &wrong,
        "--admin-url",
        &url,
    ];
    let err = failed(
        &tributary(client, &refused).output().unwrap(),
        "a wrong key",
    );
    assert!(err.contains("401"), "{err}");
    // A token must cover the whole namespace: one for a single hub is refused.
    let key = cs
        .split(';')
        .find_map(|part| part.strip_prefix("SharedAccessKey="))
        .unwrap();
    let sign = |audience: &str| {
        tributary_eventhubs::sas::sign(audience, "RootManageSharedAccessKey", key, 4_000_000_000)
    };
    let list = "GET /admin/v1/hubs HTTP/1.1";
    let status = http_status(http, list, Some(&sign("sb://localhost/h")));
    assert!(status.contains(" 401"), "{status}");
    let status = http_status(http, list, Some(&sign("sb://localhost/")));
    assert!(status.contains(" 200"), "{status}");
    run_ok(
        client,
        &[&["hub", "delete", "orders"][..], &remote].concat(),
    );
}
