//! What the CLI's test binaries share: running the built `tributary` on a data directory.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// `tributary --data-dir DATA ARGS…`, not yet started.
pub(crate) fn tributary(data: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tributary"));
    cmd.arg("--data-dir").arg(data).args(args);
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
