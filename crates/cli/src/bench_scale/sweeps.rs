//! The scale scenario's sweeps: for each, its steps (tiny ones with `--quick`), what runs at
//! each step and which columns it fills, and the targets of issue 38 checked against the rows.
//! Every step that measures memory starts a fresh server, so no step inherits another's heap.

use anyhow::Result;
use indicatif::ProgressBar;

use super::load::{self, IdleCrowd, Measured, Producers};
use super::report::{Chart, Table, Target};
use super::server::{ServerOptions, ServerProcess};
use super::{Plan, data};
use crate::args::Sweep;

/// Sends each producer connection keeps in flight in the partitions and hubs sweeps (spread
/// round the partitions), and connections sending.
const INGEST_WINDOW: usize = 64;
const INGEST_PRODUCERS: usize = 4;
/// Sends each producer keeps in flight in the partitions sweep's saturated runs: two per
/// partition of its largest step. Past a few hundred partitions a sync waits on that many
/// files, so at [`INGEST_WINDOW`] the rate is what the window's sends get through a sync's
/// latency while the cores idle; the more each sync carries per file, the less each event
/// pays of it. At a few partitions the rate is the same at either window (the cores are the
/// bound); at 1,024 it still grows from 1,024 sends to this many (BENCHMARKS.md).
const SATURATING_WINDOW: usize = 2048;
/// Sends each producer keeps in flight in the connections sweep.
const CONNECTION_WINDOW: usize = 4;
/// Partitions of the hubs the connection and group sweeps load.
const LOAD_PARTITIONS: u32 = 16;
/// Events/s offered while groups tail the hub.
const TAIL_RATE: u64 = 10_000;
/// The idle sweep's hub: 128 partitions × 20 groups × 5 receivers ≥ 10,000 (with `--quick`,
/// 4 × 2 × 5).
const IDLE_HUB: (u32, usize) = (128, 20);
const IDLE_HUB_QUICK: (u32, usize) = (4, 2);

/// The steps of `sweep`.
pub fn steps_of(sweep: Sweep, plan: &Plan) -> Vec<u64> {
    let q = plan.quick;
    match sweep {
        Sweep::Partitions if q => vec![1, 4],
        Sweep::Partitions => vec![4, 16, 64, 256, 1024],
        Sweep::Hubs if q => vec![1, 2],
        Sweep::Hubs => vec![1, 10, 100],
        Sweep::Connections if q => vec![1, 4],
        Sweep::Connections => vec![1, 10, 100, 1000],
        Sweep::Idle if q => vec![0, 4, 8],
        Sweep::Idle => vec![0, 100, 1_000, 10_000],
        Sweep::Groups if q => vec![1, 2],
        Sweep::Groups => vec![1, 2, 5, 10, 20],
        Sweep::Data => data::steps(plan),
    }
}

/// How many steps `sweep` runs.
pub fn steps(sweep: Sweep, plan: &Plan) -> u64 {
    // The data sweep adds its retention runs; the partitions sweep measures its first step
    // again at the end.
    let extra = u64::from(sweep == Sweep::Data) * 2 + u64::from(sweep == Sweep::Partitions);
    steps_of(sweep, plan).len() as u64 + extra
}

/// Runs one sweep.
pub async fn run(sweep: Sweep, plan: &Plan, progress: &ProgressBar) -> Result<Table> {
    match sweep {
        Sweep::Partitions => partitions(plan, progress).await,
        Sweep::Hubs => hubs(plan, progress).await,
        Sweep::Connections => connections(plan, progress).await,
        Sweep::Idle => idle(plan, progress).await,
        Sweep::Groups => groups(plan, progress).await,
        Sweep::Data => data::sweep(plan, progress).await,
    }
}

/// Starts a fresh server under the plan's work directory, named for the step.
pub async fn fresh_server(plan: &Plan, name: &str) -> Result<ServerProcess> {
    let dir = plan.work.join(name);
    let _ = std::fs::remove_dir_all(&dir);
    ServerProcess::start(plan, &dir, ServerOptions::default()).await
}

/// Stops a step's server and removes its data.
pub async fn finish(plan: &Plan, server: ServerProcess, name: &str) -> Result<()> {
    server.stop().await?;
    let _ = std::fs::remove_dir_all(plan.work.join(name));
    Ok(())
}

/// Lets the server settle (tasks started, allocator quiet) before its memory is read.
pub async fn settle(plan: &Plan) {
    let pause = if plan.quick { 50 } else { 500 };
    tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
}

const KIB_PER_MIB: f64 = 1024.0;

async fn partitions(plan: &Plan, progress: &ProgressBar) -> Result<Table> {
    let mut columns = hubs_columns("partitions").to_vec();
    columns.extend([
        "saturated_events_per_s",
        "saturated_ack_p99_ms",
        "saturated_server_cpu_us_per_event",
    ]);
    let mut table = Table::new(
        Sweep::Partitions,
        "Partitions of one hub",
        &columns,
        Chart::new(10, "ingest events/s, saturated").right(5, "RSS per idle partition, KiB"),
    );
    let steps = steps_of(Sweep::Partitions, plan);
    for &n in &steps {
        progress.set_message(format!("partitions: {n}"));
        let mut row = hubs_step(plan, 1, n as u32).await?;
        row.extend(saturated_step(plan, n as u32).await?);
        table.push(&[n as f64], &row);
        progress.inc(1);
    }
    // The machine ingests slower as a run goes on (each step writes gigabytes), so the fewest
    // partitions are measured again right after the most, and the target compares those two
    // neighbours in time; the ratio to the first step is a note. The target compares the
    // saturated rates: the most each partition count takes.
    progress.set_message(format!("partitions: {} again", steps[0]));
    let again = saturated_step(plan, steps[0] as u32).await?[0];
    progress.inc(1);
    let rates = table.column("saturated_events_per_s");
    let windowed = table.column("events_per_s");
    if let (Some(first), Some(last)) = (rates.first(), rates.last()) {
        let (fewest, most) = (steps[0], steps[steps.len() - 1]);
        table.target(Target::at_least(
            &format!(
                "ingest at {most} partitions vs at {fewest} measured right after it, saturated"
            ),
            last / again.max(1.0) * 100.0,
            70.0,
            "%",
        ));
        table.note(&format!(
            "saturated: {} sends in flight per producer ({} producers); {fewest} partitions measured again after {most}: {again:.0} events/s, against {first:.0} as the first step; {most} against the first step: {:.1} %",
            saturating_window(plan),
            INGEST_PRODUCERS,
            last / first.max(1.0) * 100.0
        ));
    }
    if let (Some(first), Some(last)) = (windowed.first(), windowed.last()) {
        table.note(&format!(
            "at {INGEST_WINDOW} sends in flight per producer, {} partitions against {}: {:.1} % (bound by the sync's latency over that many files, not by the cores)",
            steps[steps.len() - 1],
            steps[0],
            last / first.max(1.0) * 100.0
        ));
    }
    // At the most partitions: what the first hub costs whatever its partitions is shared by
    // the most there.
    let most = table.column("rss_per_idle_partition_kib");
    table.target(Target::at_most(
        &format!("RSS per idle partition at {}", steps[steps.len() - 1]),
        most.last().copied().unwrap_or(0.0),
        64.0,
        "KiB",
    ));
    let idle = table.column("rss_idle_mib");
    if let (Some(fewest), Some(most)) = (idle.first(), idle.last()) {
        let added = steps[steps.len() - 1].saturating_sub(steps[0]).max(1) as f64;
        table.note(&format!(
            "marginal memory of an idle partition, (RSS idle at {} − at {}) / {added}: {:.1} KiB (without what the first hub costs whatever its partitions)",
            steps[steps.len() - 1],
            steps[0],
            (most - fewest) * KIB_PER_MIB / added
        ));
    }
    Ok(table)
}

/// The partitions sweep's saturated run of `partitions` (a fresh server; producers keeping
/// [`SATURATING_WINDOW`] sends in flight): events/s, acknowledgement p99 in ms and the
/// server's CPU per event in µs.
async fn saturated_step(plan: &Plan, partitions: u32) -> Result<[f64; 3]> {
    let producers = Producers::new(
        vec!["h0".into()],
        partitions,
        INGEST_PRODUCERS,
        saturating_window(plan),
    );
    let step = ingest_step(plan, &format!("saturated-{partitions}"), &producers).await?;
    let m = step.measured;
    Ok([m.rate, m.p99_ms, m.server_cpu_us])
}

/// [`SATURATING_WINDOW`], or [`INGEST_WINDOW`] for `--quick`'s tiny steps.
fn saturating_window(plan: &Plan) -> usize {
    if plan.quick {
        INGEST_WINDOW
    } else {
        SATURATING_WINDOW
    }
}

/// The columns of the partitions and hubs sweeps after their x, `x`.
fn hubs_columns(x: &str) -> [&str; 10] {
    [
        x,
        "events_per_s",
        "ack_p99_ms",
        "rss_baseline_mib",
        "rss_idle_mib",
        "rss_per_idle_partition_kib",
        "rss_after_ingest_mib",
        "server_cpu_us_per_event",
        "client_cpu_us_per_event",
        "events_per_sync",
    ]
}

/// One step of the partitions or hubs sweep: `hubs` hubs of `partitions` each. Returns the row
/// after its x.
async fn hubs_step(plan: &Plan, hubs: usize, partitions: u32) -> Result<Vec<f64>> {
    let names: Vec<String> = (0..hubs).map(|h| format!("h{h}")).collect();
    // One hub: four connections; more: one connection per hub. The same sends in flight in
    // all, spread over the hubs (at least one per hub).
    let (connections_per_hub, window) = if hubs == 1 {
        (INGEST_PRODUCERS, INGEST_WINDOW)
    } else {
        (1, (INGEST_WINDOW * INGEST_PRODUCERS / hubs).max(1))
    };
    let producers = Producers::new(names, partitions, connections_per_hub, window);
    let step = ingest_step(plan, &format!("hubs-{hubs}x{partitions}"), &producers).await?;
    let per_partition =
        step.idle_kib.saturating_sub(step.baseline_kib) as f64 / (hubs as f64 * partitions as f64);
    Ok(vec![
        step.measured.rate,
        step.measured.p99_ms,
        step.baseline_kib as f64 / KIB_PER_MIB,
        step.idle_kib as f64 / KIB_PER_MIB,
        per_partition,
        step.after_kib as f64 / KIB_PER_MIB,
        step.measured.server_cpu_us,
        step.measured.client_cpu_us,
        step.events_per_sync,
    ])
}

/// What an ingest step measured: the server's RSS before any hub, with its hubs idle, and
/// after the load; the load; and the events each `fdatasync` covered on average over the whole
/// load (0 without syncs).
struct IngestStep {
    baseline_kib: u64,
    idle_kib: u64,
    after_kib: u64,
    measured: Measured,
    events_per_sync: f64,
}

/// The body every ingest step shares: a fresh server named `name`, the producers' hubs created
/// (memory read before and after, each time settled), the producers' warm-up and timed step
/// (the server's syncs counted over it), memory read again, and the server stopped and its
/// data removed.
async fn ingest_step(plan: &Plan, name: &str, producers: &Producers) -> Result<IngestStep> {
    let mut server = fresh_server(plan, name).await?;
    settle(plan).await;
    let baseline_kib = server.rss_kib();
    for hub in &producers.hubs {
        server
            .command(&format!("hub {hub} {}", producers.partitions))
            .await?;
    }
    settle(plan).await;
    let idle_kib = server.rss_kib();
    let syncs = server.syncs().await?;
    let measured = load::ingest(plan, &server, producers).await?;
    let syncs = server.syncs().await? - syncs;
    let after_kib = server.rss_kib();
    finish(plan, server, name).await?;
    Ok(IngestStep {
        baseline_kib,
        idle_kib,
        after_kib,
        events_per_sync: if syncs == 0 {
            0.0
        } else {
            measured.events_all as f64 / syncs as f64
        },
        measured,
    })
}

async fn hubs(plan: &Plan, progress: &ProgressBar) -> Result<Table> {
    let partitions = if plan.quick { 2 } else { LOAD_PARTITIONS };
    let mut table = Table::new(
        Sweep::Hubs,
        &format!("Hubs of {partitions} partitions"),
        &hubs_columns("hubs"),
        Chart::new(1, "ingest events/s").right(4, "server RSS idle, MiB"),
    );
    for n in steps_of(Sweep::Hubs, plan) {
        progress.set_message(format!("hubs: {n}"));
        let row = hubs_step(plan, n as usize, partitions).await?;
        table.push(&[n as f64], &row);
        progress.inc(1);
    }
    let most = table.column("rss_per_idle_partition_kib");
    table.target(Target::at_most(
        "RSS per idle partition at the most hubs",
        most.last().copied().unwrap_or(0.0),
        64.0,
        "KiB",
    ));
    table.note("one producer connection per hub; 256 sends in flight in all, spread over the hubs (at least one per hub)");
    Ok(table)
}

async fn connections(plan: &Plan, progress: &ProgressBar) -> Result<Table> {
    let mut table = Table::new(
        Sweep::Connections,
        "Producer connections, each sending",
        &[
            "connections",
            "events_per_s",
            "ack_p99_ms",
            "rss_baseline_mib",
            "rss_after_ingest_mib",
            "rss_per_connection_kib",
            "server_cpu_us_per_event",
            "client_cpu_us_per_event",
        ],
        Chart::new(1, "ingest events/s").right(5, "RSS per connection, KiB"),
    );
    for n in steps_of(Sweep::Connections, plan) {
        progress.set_message(format!("producer connections: {n}"));
        let producers = Producers::new(
            vec!["load".into()],
            LOAD_PARTITIONS,
            n as usize,
            CONNECTION_WINDOW,
        );
        let step = ingest_step(plan, &format!("connections-{n}"), &producers).await?;
        let m = &step.measured;
        // Before any connection: the hub is created and idle.
        let per_connection = step.after_kib.saturating_sub(step.idle_kib) as f64 / n as f64;
        table.push(
            &[n as f64],
            &[
                m.rate,
                m.p99_ms,
                step.idle_kib as f64 / KIB_PER_MIB,
                step.after_kib as f64 / KIB_PER_MIB,
                per_connection,
                m.server_cpu_us,
                m.client_cpu_us,
            ],
        );
        progress.inc(1);
    }
    table.note(&format!("{CONNECTION_WINDOW} sends in flight per connection, batches of 100 events of 100 B, one hub of {LOAD_PARTITIONS} partitions; RSS per connection = (RSS at the end of the timed step − RSS before any connection) / connections, so it includes the log's growth during the step"));
    Ok(table)
}

async fn idle(plan: &Plan, progress: &ProgressBar) -> Result<Table> {
    let mut table = Table::new(
        Sweep::Idle,
        "Idle connections holding a receiver, beside one active producer",
        &[
            "idle_connections",
            "rss_mib",
            "rss_per_idle_connection_kib",
            "events_per_s",
            "ack_p99_ms",
            "server_cpu_us_per_event",
        ],
        Chart::new(3, "ingest events/s (one producer)").right(2, "RSS per idle connection, KiB"),
    );
    let (partitions, group_count) = if plan.quick { IDLE_HUB_QUICK } else { IDLE_HUB };
    let mut server = fresh_server(plan, "idle").await?;
    let groups = hub_with_groups(&mut server, ("idle", partitions), group_count).await?;
    settle(plan).await;
    let baseline = server.rss_kib();
    let mut crowd = IdleCrowd::default();
    for n in steps_of(Sweep::Idle, plan) {
        progress.set_message(format!("idle connections: {n}"));
        crowd
            .grow_to(&server.conn, ("idle", partitions), &groups, n as usize)
            .await?;
        settle(plan).await;
        let held = server.rss_kib();
        let producers = Producers::new(vec!["idle".into()], partitions, 1, INGEST_WINDOW);
        let m = load::ingest(plan, &server, &producers).await?;
        let per = held.saturating_sub(baseline) as f64 / crowd.len().max(1) as f64;
        table.push(
            &[n as f64],
            &[
                held as f64 / KIB_PER_MIB,
                if n == 0 { 0.0 } else { per },
                m.rate,
                m.p99_ms,
                m.server_cpu_us,
            ],
        );
        progress.inc(1);
    }
    crowd.close().await;
    finish(plan, server, "idle").await?;
    let most = table.column("rss_per_idle_connection_kib");
    table.target(Target::at_most(
        "server memory per idle connection holding a receiver, at the most connections",
        most.last().copied().unwrap_or(0.0),
        32.0,
        "KiB",
    ));
    table.note(&format!("hub of {partitions} partitions and {group_count} consumer groups; receiver i on partition i mod {partitions}; RSS measured before the producer's step, per connection against the hub's idle RSS; each held connection costs this process and the server one file descriptor each (the server needs a limit of about one per connection plus its log files: this bench raises both to {})", super::server::FD_WANTED));
    Ok(table)
}

async fn groups(plan: &Plan, progress: &ProgressBar) -> Result<Table> {
    let partitions = if plan.quick { 2 } else { 4 };
    let mut table = Table::new(
        Sweep::Groups,
        &format!("Consumer groups reading one hub of {partitions} partitions"),
        &[
            "groups",
            "delivered_events_per_s",
            "delivered_server_cpu_us_per_event",
            "delivered_client_cpu_us_per_event",
            "e2e_p99_ms",
            "e2e_offered_events_per_s",
        ],
        Chart::new(1, "delivered events/s, all groups").right(4, "end-to-end p99, ms"),
    );
    let mut server = fresh_server(plan, "groups").await?;
    let most = steps_of(Sweep::Groups, plan).last().copied().unwrap_or(1) as usize;
    let names = hub_with_groups(&mut server, ("groups", partitions), most).await?;
    backlog(plan, &server, partitions).await?;
    let rate = if plan.quick { 1_000 } else { TAIL_RATE };
    for n in steps_of(Sweep::Groups, plan) {
        progress.set_message(format!("consumer groups: {n}"));
        let groups = &names[..n as usize];
        let delivered = load::deliver(plan, &server, "groups", partitions, groups).await?;
        let tail = load::tail_latency(plan, &server, ("groups", partitions), groups, rate).await?;
        table.push(
            &[n as f64],
            &[
                delivered.rate,
                delivered.server_cpu_us,
                delivered.client_cpu_us,
                tail.p99_ms,
                rate as f64,
            ],
        );
        progress.inc(1);
    }
    finish(plan, server, "groups").await?;
    let one = table.column("delivered_events_per_s").first().copied();
    let most = table.column("delivered_events_per_s").last().copied();
    if let (Some(one), Some(most)) = (one, most) {
        table.target(Target::at_least(
            &format!(
                "delivered by {} groups vs one group's",
                steps_of(Sweep::Groups, plan).last().copied().unwrap_or(1)
            ),
            most / one.max(1.0) * 100.0,
            90.0,
            "%",
        ));
    }
    table.note("delivered: every group (one connection each, a receiver on every partition, prefetch 3,000) reads the backlog from the start for one step; e2e: every group tails the hub while one producer sends batches of 10 stamped 100 B events at the offered rate, p99 from the send call to the receive");
    Ok(table)
}

/// Creates `hub` with `partitions` and consumer groups up to `groups` in all (`$Default`,
/// `g1`, `g2`, …); their names.
async fn hub_with_groups(
    server: &mut ServerProcess,
    (hub, partitions): (&str, u32),
    groups: usize,
) -> Result<Vec<String>> {
    server.command(&format!("hub {hub} {partitions}")).await?;
    let mut names = vec!["$Default".to_owned()];
    for g in 1..groups {
        server.command(&format!("group {hub} g{g}")).await?;
        names.push(format!("g{g}"));
    }
    Ok(names)
}

/// Fills the groups hub with a backlog no group reads to its end within a step: ingest for
/// twice a step (four producers), 100 B events.
async fn backlog(plan: &Plan, server: &ServerProcess, partitions: u32) -> Result<()> {
    let fill = Plan {
        step: plan.step * 2,
        ..plan.clone()
    };
    let producers = Producers::new(
        vec!["groups".into()],
        partitions,
        INGEST_PRODUCERS,
        INGEST_WINDOW,
    );
    load::ingest(&fill, server, &producers).await?;
    Ok(())
}
