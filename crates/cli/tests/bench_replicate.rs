//! `tributary bench --scenario replicate` with tiny runs, the task copying both ways in one
//! run: every run line comes out, and the three CPU ratios of issue 38 (task / hub over AMQP
//! and in process, the target's stamped / unstamped) each with finite, positive figures, the
//! ratio of its two figures and a verdict against its target.

mod common;

use common::{figure_after, line_starting};

#[test]
fn a_tiny_replicate_bench_prints_its_cpu_ratios_with_their_figures_and_verdicts() {
    let data = tempfile::tempdir().unwrap();
    // Two partitions, one producer, runs of a second: seconds in all, in a debug build too.
    let args: Vec<&str> = "bench --scenario replicate --modes fsync --event-bytes 100 \
        --partitions 2 --producers 1 --send-window 4 --seconds 1 --copy-events 40000 \
        --task-transport amqp,local --lag-rates 5000 --lag-seconds 1"
        .split_whitespace()
        .collect();
    let output = common::tributary(data.path(), &args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for start in [
        "replicate ingest (baseline):",
        "replicate ingest into the target (unstamped",
        "replicate fill:",
    ] {
        line_starting(&stdout, start);
    }
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("replicate copy:"))
            .count(),
        2,
        "one copy each way: {stdout}"
    );
    assert_eq!(
        stdout
            .lines()
            .filter(|l| l.starts_with("replicate lag at"))
            .count(),
        2,
        "one lag run each way: {stdout}"
    );
    let ratios = [
        (
            "replicate ratio task/hub over AMQP:",
            ["task CPU", "hub CPU"],
            0.5,
        ),
        (
            "replicate ratio task/hub in process:",
            ["task CPU", "hub CPU"],
            0.5,
        ),
        (
            "replicate ratio stamped/unstamped:",
            ["target hub CPU", " / "],
            1.2,
        ),
    ];
    for (start, figures, target) in ratios {
        check_ratio(line_starting(&stdout, start), figures, target);
    }
}

/// `line` holds two finite, positive figures (after the labels `over` and `under`), their
/// ratio after `=` and the verdict against `target` that ratio earns.
fn check_ratio(line: &str, [over, under]: [&str; 2], target: f64) {
    let (over, under) = (figure_after(line, over), figure_after(line, under));
    for figure in [over, under] {
        assert!(figure.is_finite() && figure > 0.0, "{line}");
    }
    let ratio = figure_after(line, "=");
    // The figures are printed rounded to hundredths.
    assert!(
        (ratio - over / under).abs() <= 0.02 + 0.05 * ratio,
        "the ratio is not its figures': {line}"
    );
    let met = line.ends_with(&format!("(target <= {target}: met)"));
    let missed = line.ends_with(&format!("(target <= {target}: MISSED)"));
    assert!(met || missed, "no verdict: {line}");
    if (ratio - target).abs() > 0.01 {
        assert_eq!(met, ratio <= target, "the wrong verdict: {line}");
    }
}
