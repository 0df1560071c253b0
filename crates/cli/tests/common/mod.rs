//! What the CLI's test binaries share: running the built `tributary` on a data directory.
// Each test binary includes this module and uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

/// `tributary ARGS…` on the data directory DATA (given as TRIBUTARY_DATA_DIR, which the
/// commands that take no data directory ignore, where they refuse `--data-dir`), not yet started.
pub(crate) fn tributary(data: &Path, args: &[&str]) -> Command {
    tributary_via(Command::new(env!("CARGO_BIN_EXE_tributary")), data, args)
}

/// [`tributary`] through a launcher already naming the binary (`ip netns exec NS tributary`).
pub(crate) fn tributary_via(mut cmd: Command, data: &Path, args: &[&str]) -> Command {
    cmd.env("TRIBUTARY_DATA_DIR", data).args(args);
    // Tests run servers side by side: the Kafka doors on free ports unless a test says otherwise.
    cmd.env("TRIBUTARY_KAFKA_PORT", "0")
        .env("TRIBUTARY_KAFKA_TLS_PORT", "0");
    cmd
}

/// Runs `tributary ARGS…` with `input` on its standard input, to the end.
pub(crate) fn run_with_stdin(data: &Path, args: &[&str], input: &str) -> Output {
    let mut child = tributary(data, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Runs `tributary ARGS…` to the end.
pub(crate) fn run(data: &Path, args: &[&str]) -> Output {
    tributary(data, args).output().expect("run tributary")
}

/// Runs `tributary ARGS…`, which must succeed; its standard output.
pub(crate) fn run_ok(data: &Path, args: &[&str]) -> String {
    let out = run(data, args);
    assert!(
        out.status.success(),
        "tributary {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `tributary ARGS…`, which must fail with exit code 1; its standard error.
pub(crate) fn run_err(data: &Path, args: &[&str]) -> String {
    let out = run(data, args);
    assert_eq!(out.status.code(), Some(1), "tributary {args:?} should fail");
    String::from_utf8(out.stderr).unwrap()
}

/// `tributary replicate TASK --host-name HOST` as a child process, killed when dropped; its log
/// (standard error) goes to `log`.
pub(crate) fn replicator_logging_to(task: &Path, host: &str, log: Stdio) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_tributary"))
        .args(["--log", "warn", "replicate"])
        .arg(task)
        .args(["--host-name", host])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("tributary replicate starts")
}

/// [`replicator_logging_to`] the test's own standard error.
pub(crate) fn replicator(task: &Path, host: &str) -> tokio::process::Child {
    replicator_logging_to(task, host, Stdio::inherit())
}

/// Lines of a child's pipe, delivered as they come.
pub(crate) fn lines_of(pipe: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Reads lines until one satisfies `done`, failing after `within`; everything read, a line
/// each (`what` names the program in the failure).
pub(crate) fn wait_for(
    lines: &Receiver<String>,
    done: impl Fn(&str) -> bool,
    within: Duration,
    what: &str,
) -> String {
    let deadline = Instant::now() + within;
    let mut seen = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("{what}: nothing done within {within:?}; saw:\n{seen}"));
        seen.push_str(&line);
        seen.push('\n');
        if done(&line) {
            return seen;
        }
    }
}

/// [`wait_for`] a line containing `wanted`, for at most a minute.
pub(crate) fn wait_for_line(lines: &Receiver<String>, wanted: &str, what: &str) -> String {
    wait_for(
        lines,
        |line| line.contains(wanted),
        Duration::from_secs(60),
        what,
    )
}

/// `tributary serve ARGS…` on `data`, up once its banner says "press Ctrl-C": the child, the
/// banner (its standard output up to then, which goes on being drained), and its standard error
/// line by line.
pub(crate) fn start_serve(data: &Path, args: &[&str]) -> (Child, String, Receiver<String>) {
    let mut child = tributary(data, &[&["serve"], args].concat())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = lines_of(child.stdout.take().unwrap());
    let stderr = lines_of(child.stderr.take().unwrap());
    let banner = wait_for_line(&stdout, "press Ctrl-C", "serve");
    std::thread::spawn(move || for _ in stdout {});
    (child, banner, stderr)
}

/// The `host:port` the banner line starting with `label` names (`kafka:`, `amqp:`, …).
pub(crate) fn banner_addr(banner: &str, label: &str) -> String {
    let line = banner
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} line in the banner:\n{banner}"));
    line[label.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// The connection string a first start's banner shows once.
pub(crate) fn shown_connection_string(banner: &str) -> String {
    banner
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("Endpoint="))
        .unwrap_or_else(|| panic!("no connection string in the banner:\n{banner}"))
        .to_owned()
}

/// A child `tributary serve`, killed if a failed assertion unwinds past it, so no server
/// outlives its test; [`ServeGuard::take`] hands it over for a deliberate stop or kill.
pub(crate) struct ServeGuard(Option<Child>);

impl ServeGuard {
    pub(crate) fn new(child: Child) -> Self {
        ServeGuard(Some(child))
    }

    /// The server, no longer guarded.
    pub(crate) fn take(mut self) -> Child {
        self.0.take().expect("a guarded server")
    }
}

impl Drop for ServeGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The number right after `label` in `line` (up to the next character that is neither a digit
/// nor a `.`): a figure a benchmark printed.
pub(crate) fn figure_after(line: &str, label: &str) -> f64 {
    let rest = line
        .split_once(label)
        .unwrap_or_else(|| panic!("no {label:?} in {line:?}"))
        .1;
    let number: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    number
        .parse()
        .unwrap_or_else(|e| panic!("{label:?} in {line:?} is not a number: {e}"))
}

/// The first line of `stdout` starting with `start`.
pub(crate) fn line_starting<'a>(stdout: &'a str, start: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting {start:?}: {stdout}"))
}
