//! `tributary bench --scenario scale --quick`: every sweep runs its tiny steps against a server
//! child, writes a CSV per sweep with its columns and one row per step, and one HTML report
//! that needs nothing from the network and holds a chart per sweep.

mod common;

use std::path::Path;

/// The columns each sweep's CSV starts with (its swept quantity and main figures), and its
/// steps under `--quick`.
const SWEEPS: [(&str, &[&str], usize); 6] = [
    (
        "partitions",
        &[
            "partitions",
            "events_per_s",
            "ack_p99_ms",
            "rss_baseline_mib",
        ],
        2,
    ),
    ("hubs", &["hubs", "events_per_s", "ack_p99_ms"], 2),
    (
        "connections",
        &["connections", "events_per_s", "ack_p99_ms"],
        2,
    ),
    (
        "idle",
        &["idle_connections", "rss_mib", "rss_per_idle_connection_kib"],
        3,
    ),
    (
        "groups",
        &[
            "groups",
            "delivered_events_per_s",
            "delivered_server_cpu_us_per_event",
            "delivered_client_cpu_us_per_event",
            "e2e_p99_ms",
        ],
        2,
    ),
    (
        "data",
        &[
            "data_gib",
            "open_and_serve_ms",
            "server_ready_ms",
            "rss_beyond_empty_mib",
        ],
        2,
    ),
];

#[test]
fn quick_sweeps_write_a_csv_each_and_one_self_contained_report() {
    let data = tempfile::tempdir().unwrap();
    let report = data.path().join("report");
    let output = common::tributary(
        data.path(),
        &[
            "bench",
            "--scenario",
            "scale",
            "--quick",
            "--modes",
            "none",
            "--report-dir",
            report.to_str().unwrap(),
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
    for (sweep, columns, steps) in SWEEPS {
        check_csv(&report.join(format!("scale-{sweep}.csv")), columns, steps);
        assert!(
            stdout.contains(&format!("(sweep {sweep})")),
            "no table for {sweep}: {stdout}"
        );
    }
    assert!(stdout.contains("target  "), "no target printed: {stdout}");
    check_saturated_and_cold_runs(&report, &stdout);
    let html = std::fs::read_to_string(report.join("report.html")).unwrap();
    for reference in [
        "src=\"http",
        "href=\"http",
        "src='http",
        "@import",
        "<script",
    ] {
        assert!(!html.contains(reference), "the report fetches: {reference}");
    }
    assert_eq!(
        html.matches("<svg").count(),
        SWEEPS.len(),
        "one chart per sweep"
    );
    for (sweep, _, _) in SWEEPS {
        assert!(
            html.contains(&format!("<section id=\"{sweep}\">")),
            "no {sweep} section"
        );
    }
}

/// Each partitions step ran again with producers keeping more sends in flight, and the
/// biggest data directory was measured again with its page cache dropped, the data targets
/// judging those figures.
fn check_saturated_and_cold_runs(report: &Path, stdout: &str) {
    let partitions = std::fs::read_to_string(report.join("scale-partitions.csv")).unwrap();
    let mut lines = partitions.lines();
    let saturated = lines
        .next()
        .unwrap()
        .split(',')
        .position(|c| c == "saturated_events_per_s")
        .expect("a saturated rate column");
    for row in lines {
        let rate: f64 = row.split(',').nth(saturated).unwrap().parse().unwrap();
        assert!(rate > 0.0, "no saturated rate: {row}");
    }
    assert!(
        stdout.contains("saturated: "),
        "the saturated runs' note is missing: {stdout}"
    );
    for cold in [
        "note    cold, ",
        "target  the biggest data directory opens and serves, page cache dropped: ",
        "target  a deep read's p99 in it, page cache dropped: ",
    ] {
        assert!(stdout.contains(cold), "no {cold:?}: {stdout}");
    }
}

/// The CSV at `path` starts with `columns`, has `steps` rows of numbers as wide as its header,
/// and events moved in every step of a sweep whose second column is a rate.
fn check_csv(path: &Path, columns: &[&str], steps: usize) {
    let csv = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(&header[..columns.len()], columns, "{}", path.display());
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), steps, "{}: {csv}", path.display());
    for row in rows {
        let cells: Vec<f64> = row.split(',').map(|c| c.parse().unwrap()).collect();
        assert_eq!(cells.len(), header.len(), "{}: {row}", path.display());
        assert!(
            cells.iter().all(|c| c.is_finite()),
            "{}: {row}",
            path.display()
        );
        if columns[1].ends_with("events_per_s") {
            assert!(cells[1] > 0.0, "nothing moved: {}: {row}", path.display());
        }
    }
}
