//! `tributary demo` end to end: a small run of the seed scenario whose aggregates must equal
//! what the simulated sensors sent, with the added instance taking partitions, the killed one's
//! partitions resumed by the others, and the residents' page answering; and, without
//! `--duration`, the verdict given once, when the script ends, not at Ctrl-C.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// `GET path` on the page server; the status code and the body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

/// A running `tributary demo` and the lines it prints; killed if dropped while it runs, so a
/// failed test leaves no demo behind (its instances exit when their input closes).
struct Demo {
    child: Child,
    lines: mpsc::Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
    seen: Vec<String>,
}

impl Demo {
    /// `tributary demo ARGS… --data DATA`, its standard output read line by line.
    fn start(scratch: &std::path::Path, args: &[&str], data: &std::path::Path) -> Demo {
        let mut child = common::tributary(&scratch.join("unused"), args)
            .arg("--data")
            .arg(data)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Demo {
            child,
            lines,
            reader: Some(reader),
            seen: Vec::new(),
        }
    }

    /// Waits for a line that contains `needle`; returns it.
    fn wait_for(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(100);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "the demo never printed {needle:?}; it printed:\n{}",
            self.seen.join("\n")
        );
    }

    /// Waits for the demo to exit; its status and every line it printed.
    fn exit(&mut self) -> (ExitStatus, Vec<String>) {
        let status = self.child.wait().unwrap();
        if let Some(reader) = self.reader.take() {
            reader.join().unwrap();
        }
        self.seen.extend(self.lines.try_iter());
        (status, self.seen.clone())
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if self.child.try_wait().is_ok_and(|s| s.is_none()) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn owners_of(summary: &Value, key: &str) -> HashMap<String, String> {
    summary[key]
        .as_object()
        .unwrap_or_else(|| panic!("{key} in the summary: {summary}"))
        .iter()
        .map(|(p, o)| (p.clone(), o.as_str().unwrap().to_owned()))
        .collect()
}

/// The residents' page while the demo runs: the page, a home, a bad home id, the overview.
fn check_page(addr: &str) {
    let (status, body) = get(addr, "/");
    assert_eq!(status, 200);
    assert!(body.contains("residents' page"), "{body}");
    let (status, body) = get(addr, "/api/home/7");
    assert_eq!(status, 200, "{body}");
    let home: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(home["home"], 7);
    let (status, body) = get(addr, "/api/home/1000");
    assert_eq!(status, 400, "home ids are 0..999: {body}");
    assert!(body.contains("no home"), "{body}");
    let (status, body) = get(addr, "/api/overview");
    assert_eq!(status, 200);
    let overview: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(overview["homes"], 1000);
    assert_eq!(overview["instances"].as_array().unwrap().len(), 5);
}

/// The aggregates database, read here, against the per-home tallies the demo wrote.
fn check_aggregates_against_sent(data: &std::path::Path) {
    let sent: Vec<(i64, String, i64, i64)> =
        serde_json::from_str(&std::fs::read_to_string(data.join("sent.json")).unwrap()).unwrap();
    let sent: HashMap<(i64, String, i64), i64> = sent
        .into_iter()
        .map(|(home, kind, minute, n)| ((home, kind, minute), n))
        .collect();
    let conn = rusqlite::Connection::open(data.join("aggregates.sqlite")).unwrap();
    let mut statement = conn
        .prepare("SELECT home, kind, minute, count FROM home_minute")
        .unwrap();
    let stored: HashMap<(i64, String, i64), i64> = statement
        .query_map([], |row| {
            Ok(((row.get(0)?, row.get(1)?, row.get(2)?), row.get(3)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert!(
        sent.keys().any(|(_, kind, _)| kind == "co"),
        "CO sensors sent"
    );
    assert_eq!(stored.len(), sent.len(), "(home, sensor, minute) cells");
    assert!(stored == sent, "the aggregates differ from what was sent");
}

/// The demo's own check, and the owners: the added instance took partitions, the killed one's
/// moved, every partition is owned at the end.
fn check_summary(summary: &Value) {
    assert_eq!(summary["agree"], true, "{summary}");
    assert_eq!(summary["failed_sends"], 0);
    assert_eq!(summary["per_home_mismatches"], 0);
    let sent = summary["sent"].as_u64().unwrap();
    assert!(sent > 2000, "1000 homes × 3-4 sensors for a minute: {sent}");
    assert_eq!(summary["aggregated"], sent);

    let killed = summary["killed"].as_str().unwrap();
    let added = summary["added"].as_str().unwrap();
    let before_kill = owners_of(summary, "owners_before_kill");
    let end = owners_of(summary, "owners_end");
    assert!(before_kill.values().any(|o| o == killed), "{summary}");
    assert!(
        before_kill.values().any(|o| o == added),
        "the added instance took partitions: {summary}"
    );
    assert_eq!(end.len(), 16, "every partition owned at the end: {summary}");
    assert!(
        end.values().all(|o| o != killed),
        "the killed instance's partitions moved: {summary}"
    );
    let before_add = owners_of(summary, "owners_before_add");
    assert!(before_add.values().all(|o| o != added));
}

#[test]
fn the_demo_aggregates_exactly_what_the_sensors_sent_through_a_rebalance_and_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("demo");
    let mut demo = Demo::start(
        dir.path(),
        &[
            "demo",
            "--homes",
            "1000",
            "--duration",
            "60s",
            "--port",
            "0",
        ],
        &data,
    );
    let url = demo.wait_for("residents' page: http://");
    let addr = url
        .split("http://")
        .nth(1)
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    demo.wait_for("the demo runs");
    std::thread::sleep(Duration::from_secs(3));
    check_page(&addr);
    for step in ["step 1/3", "step 2/3", "step 3/3", "check:"] {
        demo.wait_for(step);
    }
    let (status, seen) = demo.exit();
    assert!(status.success(), "the demo failed:\n{}", seen.join("\n"));

    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("summary.json")).unwrap()).unwrap();
    check_summary(&summary);
    check_aggregates_against_sent(&data);
    for pid in summary["pids"].as_array().unwrap() {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "instance pid {pid} outlived the demo"
        );
    }
}

/// Without `--duration` (its steps timed for 20 s here, not 8 min) the demo checks the
/// aggregates when the script ends — after the last step, an instance killed, has played out —
/// and says so without waiting for Ctrl-C; the sensors then resume, and Ctrl-C stops the demo
/// without a second verdict.
#[test]
fn without_a_duration_the_verdict_comes_when_the_script_ends() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("demo");
    let mut demo = Demo::start(
        dir.path(),
        &[
            "demo",
            "--homes",
            "200",
            "--instances",
            "2",
            "--script-length",
            "20s",
            "--port",
            "0",
        ],
        &data,
    );
    demo.wait_for("step 3/3");
    let verdict = demo.wait_for("check:");
    assert!(
        verdict.contains("they agree, every reading counted exactly once"),
        "{verdict}"
    );
    demo.wait_for("until Ctrl-C");
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["agree"], true, "{summary}");
    let checked = summary["sent"].as_u64().unwrap();
    assert!(checked > 0, "{summary}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        demo.child.try_wait().unwrap().is_none(),
        "the demo keeps running after its verdict"
    );
    let interrupted = std::process::Command::new("kill")
        .args(["-INT", &demo.child.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let (status, seen) = demo.exit();
    assert!(status.success(), "the demo failed:\n{}", seen.join("\n"));
    let verdicts = seen.iter().filter(|l| l.contains("check:")).count();
    assert_eq!(verdicts, 1, "one verdict:\n{}", seen.join("\n"));
    let stopped = seen
        .iter()
        .find_map(|l| l.split("the sensors stopped after ").nth(1))
        .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no 'stopped after N readings':\n{}", seen.join("\n")));
    assert!(
        stopped > checked,
        "the sensors resumed after the check: {stopped} readings, {checked} at the check"
    );
}
