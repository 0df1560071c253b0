//! The scale scenario's results: a [`Table`] per sweep (one row per step, numeric columns, the
//! first the swept quantity), written as CSV, printed as a table on the terminal, and drawn
//! into one self-contained HTML page — an inline SVG chart per sweep (plotters' SVG backend:
//! no script, font or image is fetched when it is viewed), the targets of issue 38 with their
//! verdicts, the table and the conditions of the run.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use plotters::prelude::*;

use super::Plan;
use crate::args::Sweep;

/// The name a sweep has on the command line and in file names.
pub fn sweep_name(sweep: Sweep) -> &'static str {
    match sweep {
        Sweep::Partitions => "partitions",
        Sweep::Hubs => "hubs",
        Sweep::Connections => "connections",
        Sweep::Idle => "idle",
        Sweep::Groups => "groups",
        Sweep::Data => "data",
    }
}

/// Which columns a sweep's chart draws against its first: one on the left axis, one on the
/// right.
#[derive(Debug, Clone)]
pub struct Chart {
    left: (usize, String),
    right: Option<(usize, String)>,
}

impl Chart {
    /// A chart of column `column` (its label `label`) on the left axis.
    pub fn new(column: usize, label: &str) -> Chart {
        Chart {
            left: (column, label.to_owned()),
            right: None,
        }
    }

    /// Adds column `column` on the right axis.
    pub fn right(mut self, column: usize, label: &str) -> Chart {
        self.right = Some((column, label.to_owned()));
        self
    }
}

/// A target of issue 38 and the figure measured against it.
#[derive(Debug, Clone)]
pub struct Target {
    what: String,
    value: f64,
    limit: f64,
    unit: String,
    at_least: bool,
}

impl Target {
    /// Met when `value` ≥ `limit`.
    pub fn at_least(what: &str, value: f64, limit: f64, unit: &str) -> Target {
        Target {
            what: what.to_owned(),
            value,
            limit,
            unit: unit.to_owned(),
            at_least: true,
        }
    }

    /// Met when `value` ≤ `limit`.
    pub fn at_most(what: &str, value: f64, limit: f64, unit: &str) -> Target {
        Target {
            at_least: false,
            ..Target::at_least(what, value, limit, unit)
        }
    }

    fn line(&self) -> String {
        let (op, met) = if self.at_least {
            ("≥", self.value >= self.limit)
        } else {
            ("≤", self.value <= self.limit)
        };
        format!(
            "{}: {} {} (target {op} {} {}): {}",
            self.what,
            number(self.value),
            self.unit,
            number(self.limit),
            self.unit,
            crate::bench_silent::verdict(met)
        )
    }
}

/// One sweep's results.
#[derive(Debug, Clone)]
pub struct Table {
    sweep: Sweep,
    title: String,
    columns: Vec<String>,
    rows: Vec<Vec<f64>>,
    chart: Chart,
    targets: Vec<Target>,
    notes: Vec<String>,
}

impl Table {
    /// An empty table; `columns[0]` is the swept quantity.
    pub fn new(sweep: Sweep, title: &str, columns: &[&str], chart: Chart) -> Table {
        Table {
            sweep,
            title: title.to_owned(),
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            rows: Vec::new(),
            chart,
            targets: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a row: the step's x, then the rest of its columns.
    pub fn push(&mut self, x: &[f64], rest: &[f64]) {
        let row: Vec<f64> = x.iter().chain(rest).copied().collect();
        debug_assert_eq!(row.len(), self.columns.len(), "a row of {}", self.title);
        self.rows.push(row);
    }

    /// The values of the column named `name`, in step order (empty if there is none).
    pub fn column(&self, name: &str) -> Vec<f64> {
        let Some(i) = self.columns.iter().position(|c| c == name) else {
            return Vec::new();
        };
        self.rows.iter().map(|r| r[i]).collect()
    }

    /// Records a target and its verdict.
    pub fn target(&mut self, target: Target) {
        self.targets.push(target);
    }

    /// Records a note on how the sweep measured.
    pub fn note(&mut self, note: &str) {
        self.notes.push(note.to_owned());
    }

    /// Writes `scale-<sweep>.csv` into `dir`.
    pub fn write_csv(&self, dir: &Path) -> Result<()> {
        let mut csv = self.columns.join(",");
        csv.push('\n');
        for row in &self.rows {
            let cells: Vec<String> = row.iter().map(|v| format!("{v}")).collect();
            csv.push_str(&cells.join(","));
            csv.push('\n');
        }
        let path = dir.join(format!("scale-{}.csv", sweep_name(self.sweep)));
        std::fs::write(&path, csv).with_context(|| format!("cannot write {}", path.display()))
    }

    /// Prints the table, its targets and notes.
    pub fn print(&self) {
        println!("\n== {} (sweep {})", self.title, sweep_name(self.sweep));
        let widths: Vec<usize> = self.columns.iter().map(|c| c.len().max(10)).collect();
        let header: Vec<String> = self
            .columns
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect();
        println!("{}", header.join("  "));
        for row in &self.rows {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(v, w)| format!("{:>w$}", number(*v)))
                .collect();
            println!("{}", cells.join("  "));
        }
        for target in &self.targets {
            println!("target  {}", target.line());
        }
        for note in &self.notes {
            println!("note    {note}");
        }
    }

    /// The sweep's chart as an SVG document (steps at x ≤ 0 are left out: the axis is
    /// logarithmic).
    fn svg(&self) -> Result<String> {
        let mut svg = String::new();
        draw(self, &mut svg).map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", self.title))?;
        Ok(svg)
    }
}

/// A figure with a precision that suits its size: 1,234,567 / 123.4 / 1.23 / 0.0123 (whole
/// numbers below 10,000 without decimals).
fn number(v: f64) -> String {
    match v.abs() {
        a if (1.0..10_000.0).contains(&a) && v.fract() == 0.0 => format!("{v:.0}"),
        a if a >= 10_000.0 => crate::bench::thousands(v),
        a if a >= 100.0 => format!("{v:.1}"),
        a if a >= 1.0 || a == 0.0 => format!("{v:.2}"),
        _ => format!("{v:.4}"),
    }
}

type DrawResult = std::result::Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The (x, column) points of the steps at x > 0 (the x axis is logarithmic).
fn points(table: &Table, column: usize) -> Vec<(f64, f64)> {
    table
        .rows
        .iter()
        .filter(|r| r[0] > 0.0)
        .map(|r| (r[0], r[column]))
        .collect()
}

fn draw(table: &Table, out: &mut String) -> DrawResult {
    let points = |column: usize| points(table, column);
    let xs: Vec<f64> = points(0).iter().map(|p| p.0).collect();
    let x_min = xs.iter().copied().fold(f64::INFINITY, f64::min).min(1.0);
    let x_max = xs.iter().copied().fold(0.0, f64::max).max(x_min * 2.0);
    let top = |column: usize| points(column).iter().map(|p| p.1).fold(0.0, f64::max) * 1.15;
    let (left, left_label) = (&table.chart.left.0, &table.chart.left.1);
    let root = SVGBackend::with_string(out, (760, 380)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&table.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .right_y_label_area_size(80)
        .build_cartesian_2d((x_min..x_max).log_scale(), 0.0..top(*left).max(1e-9))?
        .set_secondary_coord(
            (x_min..x_max).log_scale(),
            0.0..table
                .chart
                .right
                .as_ref()
                .map_or(1.0, |r| top(r.0).max(1e-9)),
        );
    chart
        .configure_mesh()
        .x_desc(table.columns[0].as_str())
        .y_desc(left_label.as_str())
        .x_label_formatter(&|v| number(*v))
        .y_label_formatter(&|v| number(*v))
        .draw()?;
    chart
        .draw_series(LineSeries::new(points(*left), BLUE.stroke_width(2)))?
        .label(left_label.as_str())
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart.draw_series(PointSeries::of_element(
        points(*left),
        4,
        BLUE.filled(),
        &|c, s, st| Circle::new(c, s, st),
    ))?;
    if let Some((right, right_label)) = &table.chart.right {
        chart
            .configure_secondary_axes()
            .y_desc(right_label.as_str())
            .label_style(("sans-serif", 12))
            .y_label_formatter(&|v| number(*v))
            .draw()?;
        chart
            .draw_secondary_series(LineSeries::new(points(*right), RED.stroke_width(2)))?
            .label(right_label.as_str())
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart.draw_secondary_series(PointSeries::of_element(
            points(*right),
            4,
            RED.filled(),
            &|c, s, st| Circle::new(c, s, st),
        ))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperMiddle)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The conditions of a run, printed at its start and at the top of the report.
pub struct Context {
    started: String,
    load_at_start: String,
    cores: usize,
    build: &'static str,
    durability: String,
    step: String,
}

impl Context {
    /// The conditions now, for `plan`.
    pub fn now(plan: &Plan) -> Context {
        let started = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        Context {
            started,
            load_at_start: crate::bench::load_average(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            durability: format!("{}, sync scope {}", plan.durability, plan.sync_scope),
            step: format!(
                "{:.1} s per step after {:.1} s of warm-up{}",
                plan.step.as_secs_f64(),
                plan.warm_up.as_secs_f64(),
                if plan.quick {
                    " (--quick: the figures mean nothing)"
                } else {
                    ""
                }
            ),
        }
    }

    /// One line of conditions.
    pub fn summary(&self) -> String {
        format!(
            "started {}, {} build, {} cores, load average {}, durability {}, {}; the server runs in a child process (its own VmRSS and CPU time), the Rust clients over AMQP on loopback in this one, sharing the cores",
            self.started, self.build, self.cores, self.load_at_start, self.durability, self.step
        )
    }
}

/// The report: every table with its chart, targets and notes.
pub fn html(context: &Context, tables: &[Table]) -> Result<String> {
    let mut page = String::from(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Tributary scale curves</title><style>\
         body{font-family:sans-serif;max-width:980px;margin:2em auto;color:#222}\
         table{border-collapse:collapse;font-size:13px;display:block;overflow-x:auto}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}\
         .met{color:#080}.missed{color:#b00;font-weight:bold}.note{color:#555;font-size:13px}\
         </style></head><body>\n<h1>Tributary scale curves</h1>\n",
    );
    writeln!(
        page,
        "<p>{}; load average at the end {}.</p>",
        escape(&context.summary()),
        crate::bench::load_average()
    )?;
    if let Some(note) = crate::bench::host_memory_note() {
        let note = note.trim_start_matches("# note: ");
        writeln!(page, "<p class=\"note\">Note: {}.</p>", escape(note))?;
    }
    for table in tables {
        writeln!(
            page,
            "<section id=\"{}\"><h2>{}</h2>",
            sweep_name(table.sweep),
            escape(&table.title)
        )?;
        page.push_str(&table.svg()?);
        page.push_str("\n<ul>\n");
        for target in &table.targets {
            let line = target.line();
            let class = if line.ends_with("MISSED") {
                "missed"
            } else {
                "met"
            };
            writeln!(page, "<li class=\"{class}\">{}</li>", escape(&line))?;
        }
        page.push_str("</ul>\n<table><tr>");
        for column in &table.columns {
            write!(page, "<th>{}</th>", escape(column))?;
        }
        page.push_str("</tr>\n");
        for row in &table.rows {
            page.push_str("<tr>");
            for v in row {
                write!(page, "<td>{}</td>", number(*v))?;
            }
            page.push_str("</tr>\n");
        }
        page.push_str("</table>\n");
        for note in &table.notes {
            writeln!(page, "<p class=\"note\">{}</p>", escape(note))?;
        }
        page.push_str("</section>\n");
    }
    page.push_str("</body></html>\n");
    Ok(page)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
