//! `tributary bench --scenario capture --quick`: the three phases run in one process and print
//! their lines, each with finite, positive figures and a verdict against its target.

mod common;

/// The number right after `label` in `line` (up to the next space or `%`).
fn figure_after(line: &str, label: &str) -> f64 {
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

fn line_starting<'a>(stdout: &'a str, start: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting {start:?}: {stdout}"))
}

#[test]
fn quick_capture_bench_prints_its_cpu_ratio_and_lag() {
    let data = tempfile::tempdir().unwrap();
    let output = common::tributary(
        data.path(),
        &[
            "bench",
            "--scenario",
            "capture",
            "--quick",
            "--modes",
            "none",
        ],
    )
    .output()
    .unwrap();
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
        ("capture lag", "p50"),
        ("capture lag", "p99"),
        ("capture lag", "over"),
    ];
    for (line, label) in figures {
        let value = figure_after(line_starting(&stdout, line), label);
        assert!(
            value.is_finite() && value > 0.0,
            "{line} {label} is {value}: {stdout}"
        );
    }
    for line in ["capture cpu", "capture lag"] {
        let line = line_starting(&stdout, line);
        assert!(
            line.ends_with(": met)") || line.ends_with(": MISSED)"),
            "no verdict: {line}"
        );
    }
}
