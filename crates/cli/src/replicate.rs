//! `tributary replicate`: runs a replication task until interrupted, or prints its status.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tributary_replicate::metrics::TaskMetrics;
use tributary_replicate::status::TaskStatus;
use tributary_replicate::{Replicator, StartOptions, TaskConfig, wall_clock_ms};

use crate::args::ReplicateArgs;

/// `tributary replicate`.
pub async fn run(args: &ReplicateArgs) -> Result<()> {
    let mut config = TaskConfig::load(&args.task)?;
    if let Some(name) = &args.host_name {
        config.host_name = Some(name.clone());
    }
    if args.status {
        return print_status(&config).await;
    }
    let metrics = Arc::new(TaskMetrics::new(&config.name));
    if let Some(listen) = config.metrics_listen.filter(|_| !args.check) {
        serve_metrics(listen, Arc::clone(&metrics)).await?;
    }
    // A check fails at once on a source that does not answer; a running task waits for it.
    let options = StartOptions {
        wait_for_source: !args.check,
        metrics: Some(metrics),
        ..StartOptions::default()
    };
    let replicator = Replicator::start(&config, options).await?;
    if args.check {
        eprintln!("{}: every endpoint answers", args.task.display());
        return replicator.shutdown().await.map_err(anyhow::Error::msg);
    }
    eprintln!(
        "replicating {} as {}; Ctrl-C to stop",
        config.name,
        replicator.host_name()
    );
    wait_for_stop(&replicator).await?;
    replicator.shutdown().await.map_err(anyhow::Error::msg)
}

/// Serves the task's counters at `http://<listen>/metrics`.
async fn serve_metrics(listen: std::net::SocketAddr, metrics: Arc<TaskMetrics>) -> Result<()> {
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = Arc::clone(&metrics);
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    metrics.encode_prometheus(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} for metrics ([metrics] listen)"))?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::warn!(%error, "the metrics endpoint stopped");
        }
    });
    Ok(())
}

/// Waits for Ctrl-C or SIGTERM; on a terminal, shows a progress line meanwhile.
async fn wait_for_stop(replicator: &Replicator) -> Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let progress = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg}").expect("template"),
        );
        bar
    });
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut last_out = 0;
    loop {
        tokio::select! {
            result = tokio::signal::ctrl_c() => break result.context("waiting for Ctrl-C")?,
            _ = terminate.recv() => break,
            _ = ticker.tick() => if let Some(bar) = &progress {
                let snapshot = replicator.metrics().snapshot();
                let (events_in, out, dead, filtered) = snapshot.totals();
                let lag = snapshot.lag_p99_ms.map_or("-".to_owned(), |ms| format!("{ms:.1} ms"));
                bar.set_message(format!(
                    "partitions {:?}: in {events_in}, out {out} ({}/s), dead-lettered {dead}, filtered {filtered}, lag p99 {lag}",
                    replicator.owned_partitions(),
                    out - last_out
                ));
                bar.tick();
                last_out = out;
            },
        }
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    Ok(())
}

async fn print_status(config: &TaskConfig) -> Result<()> {
    let namespace = match &config.source.endpoint.connection {
        tributary_replicate::task::Connection::Remote {
            connection_string, ..
        } => tributary_client::ConnectionString::parse(connection_string)?
            .host()
            .to_owned(),
        tributary_replicate::task::Connection::Local { .. } => "localhost".to_owned(),
        tributary_replicate::task::Connection::Kafka(kafka) => kafka.namespace().to_owned(),
    };
    let status = TaskStatus::read(config, &namespace, wall_clock_ms()).await?;
    println!(
        "task {} ({} → {} target(s))",
        config.name,
        config.source.endpoint.event_hub,
        config.targets.len()
    );
    println!("partition\towner\tcheckpoint\tin\tout\tdead-lettered\tfiltered\tlag ms");
    for (partition, row) in &status.partitions {
        let owner = if row.owner.is_empty() {
            "(released)"
        } else {
            &row.owner
        };
        let checkpoint = row
            .checkpoint_sequence
            .map_or("-".to_owned(), |s| s.to_string());
        let stale = if row.stale { " (stale)" } else { "" };
        println!(
            "{partition}\t{owner}{stale}\t{checkpoint}\t{}\t{}\t{}\t{}\t{}",
            row.events_in, row.events_out, row.dead_lettered, row.filtered, row.lag_last_ms
        );
    }
    for (process, stale) in &status.processes {
        println!("{}", source_health_line(process, *stale, wall_clock_ms()));
    }
    Ok(())
}

/// What one process last saw of the source.
fn source_health_line(
    process: &tributary_replicate::status::ProcessStatus,
    stale: bool,
    now_ms: i64,
) -> String {
    let counters = &process.counters;
    let stale = if stale { " (stale)" } else { "" };
    let errors = counters.source_errors;
    match &counters.source_failure {
        None => format!(
            "source as {}{stale} sees it: answering ({errors} failures so far)",
            process.host_name
        ),
        Some(failure) => format!(
            "source as {}{stale} sees it: FAILING for {} s ({errors} failures so far): {}",
            process.host_name,
            now_ms.saturating_sub(failure.since_ms) / 1000,
            failure.error
        ),
    }
}
