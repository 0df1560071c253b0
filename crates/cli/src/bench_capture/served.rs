//! The capture scenario's phase **served**: the hub behind its AMQP door, as `serve` runs it,
//! with the capture following it, and producers in a child process (this binary again, with
//! [`PRODUCER_ENV`] holding the door's connection string) sending 1 KiB events over loopback
//! with the Rust client, as fast as the hub takes them.
//!
//! The bench's process is then what a server is: the hub, its door and its capture. The
//! producers' CPU is the child's, so the process's CPU time less the capture's (its stepping
//! thread and its files' writer threads) is the hub's, door included: what a served hub
//! spends per ingested event, against which the capture's CPU per captured event is the
//! first target's ratio as a deployment sees it. Phase **together** gives the same ratio
//! against a hub sent to in process, whose events cost it no decoding and no network.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::task::JoinSet;
use tributary_amqp::{AccessPolicies, AccessPolicy, AmqpConfig, Right};
use tributary_broker::Broker;
use tributary_client::ProducerClient;
use tributary_event::{EventData, SendTarget};

use super::{CaptureThread, CpuRatio, EVENT_BYTES, HUB, process_cpu_ns};
use crate::args::BenchArgs;

/// Set in the producers' child: the connection string of the door it sends to.
pub const PRODUCER_ENV: &str = "TRIBUTARY_BENCH_CAPTURE_PRODUCER";

/// Phase "served": `--producers` connections in a child process, each keeping
/// `--send-window` batches in flight to the hub's one partition for `duration`; reports the
/// capture's CPU per captured event against the served hub's per ingested event.
pub async fn served(
    broker: &Broker,
    args: &BenchArgs,
    capture: &CaptureThread,
    duration: Duration,
) -> Result<()> {
    let policy = AccessPolicy::generate("BenchProducers", vec![Right::Send])?;
    let config = AmqpConfig::new(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        AccessPolicies::new(vec![policy.clone()])?,
    );
    let door = tributary_amqp::start(broker.clone(), config)
        .await
        .context("cannot start the AMQP door")?;
    let conn = tributary_amqp::connection_string("127.0.0.1", door.local_addr().port(), &policy);
    let head = || {
        broker
            .partition_properties(HUB, "0")
            .map_or(-1, |p| p.last_enqueued_sequence_number)
    };
    let head_before = head();
    let cpu_before = process_cpu_ns();
    let cost_before = capture.following_cost();
    capture.set_stepping(true).await?;
    let started = Instant::now();
    let producers = run_producers(args, &conn, duration).await;
    let elapsed = started.elapsed();
    capture.set_stepping(false).await?;
    let cost = capture.following_cost().since(&cost_before);
    let process_cpu = process_cpu_ns() - cpu_before;
    door.shutdown().await;
    let client_cpu_s = producers?;
    let ingested = u64::try_from(head() - head_before).unwrap_or(0);
    anyhow::ensure!(ingested > 0, "the producers sent nothing through the door");
    let ratio = CpuRatio::of(&cost, process_cpu, ingested)?;
    println!(
        "capture served  {ingested} events sent over AMQP in {:.1} s ({:.0} events/s; {} producers in a child process, {:.2} µs of its CPU per event) with the capture following, {} of them captured: {}",
        elapsed.as_secs_f64(),
        ingested as f64 / elapsed.as_secs_f64(),
        args.producers,
        client_cpu_s * 1e6 / ingested as f64,
        cost.events,
        ratio.describe("the server process's less the capture's, its AMQP door included"),
    );
    Ok(())
}

/// Runs the producers' child to its end; the CPU time it reported, in seconds.
async fn run_producers(args: &BenchArgs, conn: &str, duration: Duration) -> Result<f64> {
    let exe = std::env::current_exe().context("cannot find this program")?;
    let mut command = tokio::process::Command::new(exe);
    command
        .args(["bench", "--scenario", "capture", "--seconds"])
        .arg(duration.as_secs_f64().ceil().to_string())
        .arg("--batch-events")
        .arg(args.batch_events.to_string())
        .arg("--producers")
        .arg(args.producers.to_string())
        .arg("--send-window")
        .arg(args.send_window.to_string())
        .env(PRODUCER_ENV, conn)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    if duration < Duration::from_secs(1) || args.quick {
        command.arg("--quick");
    }
    let output = command.output().await.context("cannot run the producers")?;
    let said = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "the producers failed ({}): {said}",
        output.status
    );
    said.lines()
        .find_map(|l| l.strip_prefix("producers cpu-seconds "))
        .and_then(|s| s.trim().parse().ok())
        .with_context(|| format!("the producers said {said:?}"))
}

/// The producers' child: sends 1 KiB events in batches of `--batch-events` to partition 0 of
/// the hub, `--producers` connections each keeping `--send-window` sends in flight, for
/// `--seconds` (a fraction of a second with `--quick`); prints its CPU time.
pub async fn produce_child(args: &BenchArgs, conn: &str) -> Result<()> {
    let duration = if args.quick {
        Duration::from_millis(700)
    } else {
        Duration::from_secs(args.seconds)
    };
    anyhow::ensure!(
        args.producers > 0 && args.send_window > 0,
        "producers and send window must be above 0"
    );
    let body = vec![0x5a; EVENT_BYTES];
    let events: Arc<[EventData]> = (0..args.batch_events)
        .map(|_| EventData::new(body.clone()))
        .collect();
    let cpu_before = process_cpu_ns();
    let sent = Arc::new(AtomicU64::new(0));
    let mut producers = Vec::with_capacity(args.producers);
    for _ in 0..args.producers {
        producers.push(
            ProducerClient::connect(conn, HUB)
                .await
                .context("a producer cannot connect")?,
        );
    }
    let deadline = Instant::now() + duration;
    let mut sends = JoinSet::new();
    for producer in &producers {
        for _ in 0..args.send_window {
            let (producer, events, sent) = (producer.clone(), events.clone(), sent.clone());
            sends.spawn(async move {
                while Instant::now() < deadline {
                    producer
                        .send(&events, SendTarget::Partition("0".into()))
                        .await?;
                    sent.fetch_add(events.len() as u64, Ordering::Relaxed);
                }
                anyhow::Ok(())
            });
        }
    }
    while let Some(done) = sends.join_next().await {
        done.context("a send task panicked")??;
    }
    for producer in &producers {
        producer.close().await;
    }
    println!("producers sent {}", sent.load(Ordering::Relaxed));
    println!(
        "producers cpu-seconds {}",
        (process_cpu_ns() - cpu_before) as f64 / 1e9
    );
    Ok(())
}
