//! `tributary failover status|switch` and the alias flags, as a user runs them.

use std::net::TcpListener;

mod common;
use common::{run_err, run_ok, run_with_stdin};

/// A port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn switch_rewrites_the_alias_file_and_status_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let alias = dir.path().join("orders.alias");
    let alias_arg = alias.to_str().unwrap();
    let hub_a = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = format!("127.0.0.1:{}", hub_a.local_addr().unwrap().port());
    let b = format!("127.0.0.1:{}", closed_port());

    // A first switch creates the file.
    let out = run_ok(
        &data,
        &["failover", "switch", "--alias-file", alias_arg, &a],
    );
    assert!(out.contains(&format!("(none) -> {a}")), "{out}");
    assert_eq!(std::fs::read_to_string(&alias).unwrap().trim(), a);

    let status = run_ok(
        &data,
        &[
            "failover",
            "status",
            "--alias-file",
            alias_arg,
            "--candidate",
            &b,
        ],
    );
    assert!(
        status.contains(&format!("active endpoint: {a}")),
        "{status}"
    );
    assert!(status.contains("changed: "), "{status}");
    assert!(status.contains(&format!("{a} (active)\tyes")), "{status}");
    assert!(status.contains(&format!("{b}\tno: ")), "{status}");

    // An unreachable endpoint is refused unless forced; the file stays as it was.
    let error = run_err(
        &data,
        &["failover", "switch", "--alias-file", alias_arg, &b],
    );
    assert!(error.contains("does not accept a connection"), "{error}");
    assert_eq!(std::fs::read_to_string(&alias).unwrap().trim(), a);
    let out = run_ok(
        &data,
        &[
            "failover",
            "switch",
            "--alias-file",
            alias_arg,
            &b,
            "--force",
        ],
    );
    assert!(out.contains(&format!("{a} -> {b}")), "{out}");
    assert_eq!(std::fs::read_to_string(&alias).unwrap().trim(), b);
    let status = run_ok(&data, &["failover", "status", "--alias-file", alias_arg]);
    assert!(status.contains(&format!("{b} (active)\tno: ")), "{status}");

    // Only the alias file itself is in the directory (no temporary file left over).
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn alias_mistakes_get_readable_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let alias = dir.path().join("alias");
    let alias_arg = alias.to_str().unwrap();

    // A secret is never written to an alias file, nor echoed.
    let secret = "Endpoint=sb://h;SharedAccessKeyName=a;SharedAccessKey=s3kr1t";
    let error = run_err(
        &data,
        &["failover", "switch", "--alias-file", alias_arg, secret],
    );
    assert!(error.contains("never holds"), "{error}");
    assert!(!error.contains("s3kr1t"), "{error}");
    assert!(!alias.exists());

    let error = run_err(&data, &["failover", "switch", "h:5671"]);
    assert!(error.contains("--alias-file"), "{error}");
    let error = run_err(&data, &["failover", "status"]);
    assert!(
        error.contains("--alias-file PATH or --alias-srv NAME"),
        "{error}"
    );
    let error = run_err(&data, &["failover", "status", "--alias-file", alias_arg]);
    assert!(error.contains("cannot read the alias file"), "{error}");

    // An alias names a remote hub: it needs a connection string for the key.
    std::fs::write(&alias, "127.0.0.1:5672\n").unwrap();
    let out = run_with_stdin(&data, &["send", "orders", "--alias-file", alias_arg], "x\n");
    assert_eq!(out.status.code(), Some(1));
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(error.contains("--connection-string"), "{error}");
    let error = run_err(
        &data,
        &[
            "receive",
            "orders",
            "--alias-file",
            alias_arg,
            "--alias-srv",
            "eh.example.com",
        ],
    );
    assert!(error.contains("not both"), "{error}");
}
