//! Every command README.md shows, in its order, against a running `tributary serve` (issue 34,
//! "The first hour").
//!
//! The test reads the README's shell blocks (```sh and ```bash fences), joins lines continued
//! with `\`, and runs each command with `sh -c` in a fresh directory — so the README's default
//! data directory, `./tributary-data`, is the test's — with the `tributary` cargo built first on
//! the PATH, HOME a temporary directory and no `TRIBUTARY_*` variable from outside. The README's
//! `serve` is started on free ports (and stopped where the README starts another, with TLS); the
//! ports the test chose replace the README's only where a command names a port ([`substitute`]).
//! Shell variables a command sets (`export NAME=…`, `NAME=…`) carry over to the next commands.
//!
//! Every command must exit 0, and where the README shows or describes its output the output is
//! checked ([`check_output`]). Commands that never end by themselves (`receive --follow`,
//! `process`) run until they have done what the README says, then get Ctrl-C (SIGINT), as a
//! person would stop them. What cannot run in a test is in [`SKIPPED`] with the reason.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{lines_of, wait_for};

/// README commands the test does not run, by how they start, and why.
const SKIPPED: &[(&str, &str)] = &[
    ("./scripts/test", "the whole test suite, this test included"),
    (
        "cargo run --release -p tributary-cli -- demo",
        "runs until Ctrl-C, its page on the fixed port 8090; tests/demo.rs runs a short demo",
    ),
    (
        "tributary serve --emulator-config",
        "listens on the emulator's fixed ports (5672, 5300) and needs the emulator's Config.json; tests/emulator.rs covers it",
    ),
    (
        "cargo install",
        "a release build into ~/.cargo/bin, minutes long; the test runs the binary cargo built for it",
    ),
    (
        "tributary completions zsh",
        "zsh syntax ($fpath), for a zsh user's shell; the bash and fish lines run",
    ),
    (
        "tributary process orders --store postgres://",
        "needs a PostgreSQL server at db:5432; the processor's store tests run one",
    ),
    (
        "tributary process orders --store \"https://acct.blob.core.windows.net",
        "needs an Azure Storage account; the blob store's tests run against Azurite",
    ),
    (
        "tributary failover translate-checkpoints",
        "needs a replication task's offset map, which only a running `tributary replicate` writes; tests/failover_translate.rs covers it",
    ),
    (
        "docker ",
        "needs docker and an image build; scripts/container-smoke covers the container",
    ),
];

/// How long a command that runs until stopped may take to show what it does.
const SHOWN_WITHIN: Duration = Duration::from_secs(30);

/// The commands of README.md's shell blocks, in order, continued lines joined.
fn readme_commands() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut commands = Vec::new();
    let mut in_shell = false;
    let mut pending = String::new();
    for line in text.lines() {
        let fence = line.trim_start();
        if fence.starts_with("```") {
            in_shell = !in_shell && matches!(fence, "```sh" | "```bash");
            continue;
        }
        if !in_shell || (pending.is_empty() && (line.trim().is_empty() || fence.starts_with('#'))) {
            continue;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(start) => pending.push_str(start),
            None => {
                pending.push_str(line.trim());
                commands.push(std::mem::take(&mut pending).trim().to_owned());
            }
        }
    }
    assert!(pending.is_empty(), "a README command ends with a `\\`");
    commands
}

/// The ports of the running `serve`, from its `server.json`.
#[derive(Debug, Default, Clone)]
struct Ports {
    amqp: Option<u16>,
    amqps: Option<u16>,
    https: Option<u16>,
}

/// A running `tributary serve`, SIGKILLed if the test fails before stopping it.
struct Server {
    child: Child,
    banner: String,
    ports: Ports,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The state of the README's flow.
struct Flow {
    dir: PathBuf,
    home: PathBuf,
    path: String,
    variables: BTreeMap<String, String>,
    server: Option<Server>,
}

impl Flow {
    fn new(dir: &Path) -> Flow {
        let home = dir.join("home");
        std::fs::create_dir_all(&home).unwrap();
        let bin = Path::new(env!("CARGO_BIN_EXE_tributary")).parent().unwrap();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Flow {
            dir: dir.join("work"),
            home,
            path,
            variables: BTreeMap::new(),
            server: None,
        }
    }

    /// `sh -c SCRIPT` in the flow's directory, with its environment.
    fn shell(&self, script: &str) -> Command {
        std::fs::create_dir_all(&self.dir).unwrap();
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).current_dir(&self.dir);
        for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("TRIBUTARY_")) {
            cmd.env_remove(name);
        }
        cmd.env("PATH", &self.path).env("HOME", &self.home);
        cmd.envs(&self.variables).stdin(Stdio::null());
        cmd
    }

    fn ports(&self) -> Ports {
        self.server.as_ref().expect("serve runs").ports.clone()
    }

    /// Starts `tributary serve ARGS` on free ports and waits for its banner.
    fn start_server(&mut self, args: &str) {
        assert!(self.server.is_none());
        let script = format!("exec {args}");
        let mut child = self.shell(&script).stdout(Stdio::piped()).spawn().unwrap();
        let lines = lines_of(child.stdout.take().unwrap());
        let banner = wait_for(
            &lines,
            |l| l.contains("press Ctrl-C"),
            SHOWN_WITHIN,
            "serve's banner",
        );
        std::thread::spawn(move || lines.iter().count());
        let record = std::fs::read_to_string(self.dir.join("tributary-data/server.json")).unwrap();
        let record: Value = serde_json::from_str(&record).unwrap();
        let port = |name: &str| {
            let addr = record[name].as_str()?;
            addr.rsplit(':').next()?.parse().ok()
        };
        let ports = Ports {
            amqp: port("amqp"),
            amqps: port("amqps"),
            https: port("https"),
        };
        self.server = Some(Server {
            child,
            banner,
            ports,
        });
    }

    /// Stops the running `serve` with Ctrl-C, as the README's reader would before starting
    /// another on the same data directory.
    fn stop_server(&mut self) {
        let mut server = self.server.take().expect("serve runs");
        interrupt(&server.child);
        let status = server.child.wait().unwrap();
        assert!(status.success(), "serve stopped with {status}");
    }
}

/// Whether this process ignores SIGINT (its children inherit that, even across `exec`):
/// the `SigIgn` mask of `/proc/self/status`, in which signal n is bit n - 1.
fn sigint_ignored() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let mask = status
        .lines()
        .find_map(|line| line.strip_prefix("SigIgn:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
        .expect("a SigIgn line");
    mask & (1 << (2 - 1)) != 0
}

/// Ctrl-C for `child`.
fn interrupt(child: &Child) {
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// The command with the test's ports where the README names the default ones, and the
/// `cargo run` form as the built binary.
fn substitute(command: &str, ports: &Ports) -> String {
    let mut command = command.replace("cargo run --release -p tributary-cli --", "tributary");
    if let Some(https) = ports.https {
        command = command.replace(
            "https://localhost:8443",
            &format!("https://localhost:{https}"),
        );
    }
    if let Some(amqps) = ports.amqps {
        // The replica a failover switches to: this test's own hub (the switch checks that it
        // accepts connections).
        command = command.replace("replica.example.com:5671", &format!("127.0.0.1:{amqps}"));
    }
    command
}

/// Runs `command` to its end; it must exit 0.
fn run(flow: &Flow, command: &str) -> Output {
    let out = flow.shell(command).output().unwrap();
    assert!(
        out.status.success(),
        "README command `{command}` failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A shell variable a command sets (`export NAME=…` or `NAME=…`): its name.
fn assigned_variable(command: &str) -> Option<&str> {
    let assignment = command.strip_prefix("export ").unwrap_or(command);
    let (name, _) = assignment.split_once('=')?;
    let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_');
    valid.then_some(name)
}

#[test]
fn every_readme_command_runs_in_the_readmes_order_against_a_running_serve() {
    assert!(
        !sigint_ignored(),
        "SIGINT is ignored in this process, so the commands it starts would ignore the Ctrl-C \
         that stops them and the test would wait forever: run the tests from a shell that does \
         not ignore it (a non-interactive shell ignores it in the commands it puts in the \
         background with `&`; use a subshell with job control, `set -m`, or a foreground run)"
    );
    let temporary = tempfile::tempdir().unwrap();
    let mut flow = Flow::new(temporary.path());
    let commands = readme_commands();
    assert!(commands.len() > 20, "{commands:#?}");
    let mut ran = Vec::new();
    let mut skipped = Vec::new();
    for command in &commands {
        if let Some((_, reason)) = SKIPPED.iter().find(|(start, _)| command.starts_with(start)) {
            skipped.push(format!("{command}  -- {reason}"));
            continue;
        }
        let ports = flow
            .server
            .as_ref()
            .map(|s| s.ports.clone())
            .unwrap_or_default();
        let line = substitute(command, &ports);
        step(&mut flow, &line);
        ran.push(line);
    }
    println!(
        "ran:\n  {}\nskipped:\n  {}",
        ran.join("\n  "),
        skipped.join("\n  ")
    );
    assert!(ran.iter().any(|c| c.contains("--receipts")));
    flow.stop_server();
}

/// Runs one README command as what it is.
fn step(flow: &mut Flow, command: &str) {
    if command.starts_with("tributary serve") {
        if flow.server.is_some() {
            flow.stop_server();
        }
        let tls = command.contains("--tls-cert");
        let ports = if tls {
            " --amqps-port 0 --https-port 0 --kafka-tls-port 0"
        } else {
            " --amqp-port 0 --http-port 0 --kafka-port 0"
        };
        let script = command.split('#').next().unwrap().trim().to_owned() + ports;
        flow.start_server(&script);
        check_banner(flow, tls);
    } else if command.contains("--follow") {
        follow(flow, command);
    } else if command.starts_with("tributary process") {
        process(flow, command);
    } else if let Some(name) = assigned_variable(command) {
        let out = run(flow, &format!("{command}\nprintf %s \"${name}\""));
        let value = String::from_utf8(out.stdout).unwrap();
        check_variable(flow, name, &value);
        flow.variables.insert(name.to_owned(), value);
    } else if command == "tributary man | man -l -" && which("man").is_none() {
        println!("skipped `{command}`: man(1) is not installed");
    } else {
        let out = run(flow, command);
        check_output(flow, command, &out);
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var("PATH")
        .ok()?
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
}

/// What the README says `serve` shows: its hub, and with TLS the AMQPS door.
fn check_banner(flow: &Flow, tls: bool) {
    let server = flow.server.as_ref().unwrap();
    assert!(
        server.banner.contains("event hub \"events\": 4 partitions"),
        "{}",
        server.banner
    );
    if tls {
        assert!(server.ports.amqps.is_some() && server.ports.https.is_some());
        assert!(
            server.ports.amqp.is_none(),
            "with a certificate the plain ports are off"
        );
    }
}

fn check_variable(flow: &Flow, name: &str, value: &str) {
    if value.starts_with("Endpoint=") {
        // "the port `serve` really listens on"
        let ports = flow.ports();
        let port = ports.amqp.or(ports.amqps).unwrap();
        assert!(value.contains(&format!(":{port}")), "{name}={value}");
    }
}

/// Checks the output of a command that ended where the README shows or describes it.
fn check_output(flow: &Flow, command: &str, out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stdout.lines().collect();
    let command = command.split(" #").next().unwrap().trim();
    match command {
        c if c.starts_with("printf 'first\\nsecond\\n' | tributary send orders") => {
            assert_eq!(stderr, "sent 2 events to \"orders\"\n");
        }
        c if c.contains("--receipts") => check_receipts(flow, &lines),
        "tributary receive orders --from earliest" => {
            for body in ["first", "second"] {
                assert!(lines.contains(&body), "{stdout}");
            }
            let file = std::fs::read_to_string(flow.dir.join("lines.txt")).unwrap();
            for body in file.lines() {
                assert!(lines.contains(&body), "{body}: {stdout}");
            }
        }
        c if c.starts_with("tributary receive orders --partition 3 --from seq:0") => {
            // The partition from its first event: sequence numbers 0, 1, 2 … in order.
            for (expected, line) in (0..).zip(&lines) {
                let event: Value = serde_json::from_str(line).unwrap();
                assert_eq!(event["partition"], "3", "{stdout}");
                assert_eq!(event["sequence_number"], expected, "{stdout}");
            }
        }
        "tributary hub show orders" => {
            assert!(stdout.contains("partitions:     8"), "{stdout}");
            assert!(
                stdout.contains("consumer groups: $Default, billing"),
                "{stdout}"
            );
        }
        "tributary hub show prices" => {
            let cleanup =
                "cleanup:        compact (min compaction lag 600 s, tombstone retention 168 h)";
            assert!(stdout.contains(cleanup), "{stdout}");
        }
        "tributary ownership orders --group billing" => {
            assert!(
                lines.len() == 9 && lines[1].starts_with("billing\t0\t"),
                "{stdout}"
            );
        }
        c if c.starts_with("tributary hub list") => {
            assert!(
                lines.contains(&"orders\t8 partitions\t2 consumer groups"),
                "{stdout}"
            );
        }
        c if c.starts_with("tributary policy") => check_policy(c, &stdout),
        c if c.starts_with("tributary cert") => {
            for file in ["ca.pem", "server.pem", "server-key.pem"] {
                assert!(flow.dir.join("tributary-data/tls").join(file).is_file());
            }
        }
        c if c.starts_with("tributary failover status") => {
            assert!(stdout.contains("active endpoint: "), "{stdout}");
        }
        c if c.starts_with("tributary failover switch") => {
            let endpoint = c.rsplit(' ').next().unwrap();
            let file = std::fs::read_to_string(flow.dir.join("active-hub")).unwrap();
            assert_eq!(file.trim(), endpoint);
        }
        c if c.starts_with("tributary completions") || c.starts_with("tributary man") => {
            check_generated(flow, c, &stdout);
        }
        _ => {}
    }
}

/// What `tributary policy list` and `show --keys` print for the README's hub policy.
fn check_policy(command: &str, stdout: &str) {
    if command == "tributary policy list --hub orders" {
        assert_eq!(stdout, "orders-send\tSend\tevent hub \"orders\"\n");
    } else if command.starts_with("tributary policy show orders-send") {
        assert!(stdout.contains("primary key: "), "{stdout}");
        assert!(stdout.contains(";EntityPath=orders"), "{stdout}");
    }
}

/// The receipts of `send --format json --file events.jsonl --receipts`: one JSON line per
/// batch, as many events as the file has lines, each batch where `receive` finds it.
fn check_receipts(flow: &Flow, lines: &[&str]) {
    let file = std::fs::read_to_string(flow.dir.join("events.jsonl")).unwrap();
    let mut events = 0;
    for line in lines {
        let receipt: Value = serde_json::from_str(line).unwrap();
        let count = receipt["count"].as_u64().unwrap();
        let offsets = receipt["offsets"].as_array().unwrap();
        assert_eq!(offsets.len() as u64, count, "{line}");
        assert!(receipt["enqueued_time"].is_string(), "{line}");
        let partition = receipt["partition"].as_str().unwrap();
        let first = receipt["first_sequence_number"].as_i64().unwrap();
        let got = run(
            flow,
            &format!(
                "tributary receive orders --partition {partition} --from seq:{first} -n {count} --format json"
            ),
        );
        let got: Vec<Value> = String::from_utf8_lossy(&got.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let got_offsets: Vec<&Value> = got.iter().map(|e| &e["offset"]).collect();
        assert_eq!(got_offsets, offsets.iter().collect::<Vec<_>>(), "{line}");
        events += count;
    }
    assert_eq!(events, file.lines().count() as u64, "{lines:?}");
}

/// Completion scripts and man pages where the README writes them.
fn check_generated(flow: &Flow, command: &str, stdout: &str) {
    if let Some((_, target)) = command.split_once(" > ") {
        let path = target
            .trim()
            .replacen('~', &flow.home.display().to_string(), 1);
        let script = std::fs::read_to_string(&path).unwrap();
        assert!(script.contains("tributary"), "{path}");
    } else if command.starts_with("tributary man --dir") {
        let dir = flow.home.join(".local/share/man/man1");
        assert!(dir.join("tributary.1").is_file());
        assert!(dir.join("tributary-receive.1").is_file());
    } else {
        assert!(stdout.contains("tributary"), "{stdout}");
    }
}

/// `receive … --follow`: prints what is sent while it runs, until Ctrl-C.
fn follow(flow: &mut Flow, command: &str) {
    let mut child = flow
        .shell(&format!("exec {command}"))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(child.stdout.take().unwrap());
    // From `latest`: what is sent once its receivers are attached shows; send until it does.
    let deadline = Instant::now() + SHOWN_WITHIN;
    let shown = loop {
        assert!(Instant::now() < deadline, "`{command}` showed nothing sent");
        run(flow, "echo followed | tributary send orders");
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(500)) {
            break line;
        }
    };
    assert_eq!(shown, "followed");
    assert!(
        child.try_wait().unwrap().is_none(),
        "it follows until stopped"
    );
    interrupt(&child);
    child.wait().unwrap();
}

/// `process …`: a processor instance does its action until Ctrl-C, and then stops cleanly.
fn process(flow: &mut Flow, command: &str) {
    // Counted before the processor starts: its epoch receivers then refuse plain ones in its
    // consumer group, which `receive` would use for `$Default`.
    let total = hub_events(flow);
    let mut child = flow
        .shell(&format!("exec {command}"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = lines_of(child.stderr.take().unwrap());
    if command.contains("--action file") {
        let out = flow.dir.join("out");
        let deadline = Instant::now() + SHOWN_WITHIN;
        while written_lines(&out) < total {
            assert!(
                Instant::now() < deadline,
                "`{command}` wrote {} of {total} events",
                written_lines(&out)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(written_lines(&out), total);
    } else {
        // `--action count` prints its counts on stderr every few seconds.
        let all = format!("processed {total} events");
        wait_for(
            &stderr,
            |l| l.starts_with(&all),
            SHOWN_WITHIN,
            &format!("`{command}`"),
        );
    }
    interrupt(&child);
    let status = child.wait().unwrap();
    assert!(status.success(), "`{command}` stopped with {status}");
}

/// How many events the hub `orders` holds.
fn hub_events(flow: &Flow) -> u64 {
    let out = run(flow, "tributary receive orders --from earliest");
    String::from_utf8_lossy(&out.stdout).lines().count() as u64
}

/// The lines `process --action file` wrote into `dir`.
fn written_lines(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default())
        .map(|text| text.lines().count() as u64)
        .sum()
}
