//! `tributary bench --scenario scale`: performance as curves (issue 38). Each sweep steps one
//! dimension — partitions of a hub, hubs, producer connections, idle connections holding a
//! receiver, consumer groups, data on disk — and runs a short timed measurement at each step.
//!
//! The server (a hub and its AMQP door) runs in a child process — this binary again, told so by
//! [`server::SERVER_ENV`] — so the memory a step measures is the server's own resident set
//! (`VmRSS` of that process), and its CPU time is counted apart from the clients'. The clients
//! (the Rust client over AMQP on loopback) run in this process; both share the machine's cores.
//!
//! Every sweep is written as a CSV file (one row per step, the columns of [`Table`]) into the
//! report directory, and all of them into one `report.html` with an SVG chart per sweep drawn
//! by `plotters` (nothing is fetched when it is viewed). The terminal shows progress and, per
//! sweep, the table and the targets of issue 38 beside the figures. `--quick` runs tiny steps
//! of a fraction of a second (for tests: the figures mean nothing).

mod data;
mod load;
mod report;
mod server;
mod sweeps;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::{BenchArgs, GlobalArgs, Sweep};

/// How long each step runs and how big the steps are.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The timed part of each step.
    pub step: Duration,
    /// Load before the timed part (links attach, segments grow).
    pub warm_up: Duration,
    /// The durability of every hub.
    pub durability: tributary_log::Durability,
    /// What the server's syncs cover.
    pub sync_scope: tributary_log::SyncScope,
    /// Tiny steps, for tests.
    pub quick: bool,
    /// The largest data directory of the data sweep (already capped by free disk).
    pub data_max: u64,
    /// Why `data_max` is below what was asked, if it is.
    pub data_capped: Option<String>,
    /// Where the sweeps write their data directories.
    pub work: PathBuf,
    /// Where the server children's standard error goes.
    pub server_log: PathBuf,
}

/// Runs the chosen sweeps and writes their report.
pub async fn run(global: &GlobalArgs, args: &BenchArgs, root: &Path) -> Result<()> {
    if let Ok(dir) = std::env::var(server::SERVER_ENV) {
        return server::serve_child(args, Path::new(&dir)).await;
    }
    crate::bench_silent::raise_fd_limit(server::FD_WANTED)?;
    let report_dir = args
        .report_dir
        .clone()
        .unwrap_or_else(|| global.data_dir.join("scale-report"));
    std::fs::create_dir_all(&report_dir)
        .with_context(|| format!("cannot create {}", report_dir.display()))?;
    std::fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
    let plan = plan(args, root, &report_dir)?;
    let context = report::Context::now(&plan);
    println!("# scale: {}", context.summary());
    if let Some(note) = crate::bench::host_memory_note() {
        println!("{note}");
    }
    let mut tables = Vec::new();
    let steps: u64 = args.sweep.iter().map(|s| sweeps::steps(*s, &plan)).sum();
    let progress = progress_bar(steps);
    for &sweep in &dedup(&args.sweep) {
        let table = sweeps::run(sweep, &plan, &progress)
            .await
            .with_context(|| format!("the {} sweep failed", report::sweep_name(sweep)))?;
        progress.suspend(|| table.print());
        table.write_csv(&report_dir)?;
        tables.push(table);
    }
    progress.finish_and_clear();
    let html = report_dir.join("report.html");
    std::fs::write(&html, report::html(&context, &tables)?)
        .with_context(|| format!("cannot write {}", html.display()))?;
    println!(
        "# scale: report written to {} (and one CSV per sweep beside it)",
        html.display()
    );
    Ok(())
}

fn dedup(sweeps: &[Sweep]) -> Vec<Sweep> {
    let mut out: Vec<Sweep> = Vec::new();
    for s in sweeps {
        if !out.contains(s) {
            out.push(*s);
        }
    }
    out
}

fn plan(args: &BenchArgs, root: &Path, report_dir: &Path) -> Result<Plan> {
    anyhow::ensure!(args.seconds > 0, "--seconds must be above 0");
    let durability = *args.modes.first().context("give a durability mode")?;
    let (step, warm_up) = if args.quick {
        (Duration::from_millis(200), Duration::from_millis(50))
    } else {
        (Duration::from_secs(args.seconds), Duration::from_secs(1))
    };
    let free = free_bytes(root)?;
    let (data_max, data_capped) = if args.data_max > free / 2 {
        let capped = free / 2;
        let why = format!(
            "--data-max {} GiB lowered to {:.1} GiB: half the free disk under {}",
            args.data_max >> 30,
            capped as f64 / (1u64 << 30) as f64,
            root.display()
        );
        (capped, Some(why))
    } else {
        (args.data_max, None)
    };
    Ok(Plan {
        step,
        warm_up,
        durability,
        sync_scope: args.sync_scope.sync_scope,
        quick: args.quick,
        data_max,
        data_capped,
        work: root.to_path_buf(),
        server_log: report_dir.join("server-stderr.log"),
    })
}

/// The bytes free to an unprivileged writer on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64> {
    let stat = rustix::fs::statvfs(dir)
        .with_context(|| format!("cannot read the free space under {}", dir.display()))?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

fn progress_bar(steps: u64) -> ProgressBar {
    let bar = ProgressBar::new(steps).with_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} steps  {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar
}
