//! `tributary bench --scenario capture --quick`: the five phases run (the served one's producers
//! in a child process) and print their lines, each with finite, positive figures and a verdict
//! against its target, and the floor line its figures; a size window Azure would refuse is
//! refused.

mod common;

/// `tributary bench --scenario capture --quick` with `more` flags, in a data directory of its own.
fn quick_capture_bench(more: &[&str]) -> std::process::Output {
    let data = tempfile::tempdir().unwrap();
    let mut args = vec!["bench", "--scenario", "capture", "--quick"];
    args.extend_from_slice(more);
    common::tributary(data.path(), &args).output().unwrap()
}

#[test]
fn quick_capture_bench_prints_its_cpu_ratio_and_lag() {
    let output = quick_capture_bench(&["--modes", "none"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let figures = [
        ("capture ingest", "s:"),
        ("capture ingest", "hub CPU"),
        ("capture cpu", "capture CPU"),
        ("capture cpu", "="),
        ("capture live", "hub CPU"),
        ("capture live", "capture CPU"),
        ("capture live", "="),
        ("capture served", "over AMQP in"),
        ("capture served", "hub CPU"),
        ("capture served", "capture CPU"),
        ("capture served", "="),
        ("capture lag", "p50"),
        ("capture lag", "p99"),
        ("capture lag", "over"),
        ("capture floor", "thread wrote:"),
        ("capture floor", "of CPU ("),
        ("capture floor", "the target leaves"),
    ];
    for (line, label) in figures {
        let value = common::figure_after(common::line_starting(&stdout, line), label);
        assert!(
            value.is_finite() && value > 0.0,
            "{line} {label} is {value}: {stdout}"
        );
    }
    for line in ["capture live", "capture served", "capture lag"] {
        let line = common::line_starting(&stdout, line);
        assert!(
            line.ends_with(": met)") || line.ends_with(": MISSED)"),
            "no verdict: {line}"
        );
    }
}

#[test]
fn a_size_window_outside_azures_range_is_refused_before_anything_runs() {
    let output = quick_capture_bench(&["--capture-size", "5MiB"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("--capture-size must be 10 MiB to 500 MiB"),
        "{stderr}"
    );
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains("capture live"),
        "a phase ran"
    );
}
