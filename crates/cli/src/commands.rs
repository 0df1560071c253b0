//! What each command does: glue between the arguments and the broker.

use std::io::{BufRead, Write};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use tributary_broker::{Broker, BrokerConfig, HubSpec, ReceiveError, ReceiverSpec, SendTarget};
use tributary_event::ReceivedEvent;
use tributary_log::LogConfig;

use crate::args::{GlobalArgs, GroupCommand, HubCommand, ReceiveArgs, SendArgs, ServeArgs};
use crate::input::{Batch, Batcher, LineDefaults, parse_line};
use crate::output;

/// Opens the broker on the data directory with the global settings.
pub async fn open_broker(global: &GlobalArgs) -> Result<Broker> {
    let config = BrokerConfig {
        log: LogConfig {
            durability: global.durability,
            event_bytes_max: global.event_bytes_max,
            ..LogConfig::default()
        },
        ..BrokerConfig::new(&global.data_dir)
    };
    Broker::open(config).await.with_context(|| {
        format!(
            "cannot open the data directory {}",
            global.data_dir.display()
        )
    })
}

/// The log's own limit while front doors run: they enforce the 1 MiB protocol limits on what
/// clients send; the log's check counts record framing and keys too, so it needs headroom.
const FRONT_DOOR_EVENT_BYTES_MAX: u32 = 1024 * 1024 + 16 * 1024;

/// `tributary serve`.
pub async fn serve(global: &GlobalArgs, args: &ServeArgs) -> Result<()> {
    let mut config = BrokerConfig::new(&global.data_dir);
    config.log.durability = global.durability;
    config.log.event_bytes_max = global.event_bytes_max.max(FRONT_DOOR_EVENT_BYTES_MAX);
    config.retention_check_interval = Duration::from_millis(args.retention_check as u64);
    let broker = Broker::open(config).await.with_context(|| {
        format!(
            "cannot open the data directory {}",
            global.data_dir.display()
        )
    })?;
    if broker.list_hubs().is_empty() {
        broker
            .create_hub(HubSpec::new(&args.hub, args.partitions))
            .await
            .context("cannot create the default hub")?;
    }
    let auth = if args.http_unauthenticated {
        tributary_http::AuthConfig::DevelopmentUnauthenticated
    } else {
        // An empty key file on first start: every request is refused until a key is added
        // (the file is re-read when it changes, no restart needed).
        let keys = global.data_dir.join("oci-api-keys.json");
        if !keys.exists() {
            std::fs::write(&keys, "{}\n")
                .with_context(|| format!("cannot create {}", keys.display()))?;
        }
        tributary_http::AuthConfig::signatures()
    };
    let mut http_config =
        tributary_http::HttpConfig::new((args.listen, args.http_port).into(), auth);
    if args.http_oci_rate_limits {
        http_config.rate_limits = tributary_http::RateLimits::oci();
    }
    let http = tributary_http::start(broker.clone(), http_config)
        .await
        .context("cannot start the HTTP front door")?;
    print_banner(global, args, &broker, http.local_addr())?;
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    eprintln!("stopping: closing listeners, syncing partitions");
    http.shutdown().await?;
    broker.shutdown().await?;
    Ok(())
}

fn print_banner(
    global: &GlobalArgs,
    args: &ServeArgs,
    broker: &Broker,
    http: std::net::SocketAddr,
) -> Result<()> {
    let mut err = std::io::stderr().lock();
    writeln!(
        err,
        "tributary {} serving {}",
        env!("CARGO_PKG_VERSION"),
        global.data_dir.display()
    )?;
    writeln!(err, "  durability: {}", global.durability)?;
    for hub in broker.list_hubs() {
        let groups: Vec<_> = hub
            .consumer_groups
            .iter()
            .map(|g| g.name.as_str())
            .collect();
        writeln!(
            err,
            "  hub {:?}: {} partitions, consumer groups {}",
            hub.name,
            hub.partition_count,
            groups.join(", ")
        )?;
    }
    let auth = if args.http_unauthenticated {
        "UNAUTHENTICATED (development mode)".to_owned()
    } else {
        format!(
            "OCI request signatures, keys in {}",
            global.data_dir.join("oci-api-keys.json").display()
        )
    };
    writeln!(
        err,
        "  http: http://{http}/20180418 (OCI Streaming), /admin/v1, /health, /metrics; {auth}"
    )?;
    writeln!(err, "press Ctrl-C to stop")?;
    Ok(())
}

/// `tributary hub …`.
pub async fn hub(global: &GlobalArgs, command: &HubCommand) -> Result<()> {
    let broker = open_broker(global).await?;
    let mut out = std::io::stdout().lock();
    match command {
        HubCommand::Create {
            name,
            partitions,
            retention,
            retention_bytes,
        } => {
            let spec = HubSpec {
                name: name.clone(),
                partition_count: *partitions,
                retention_age_ms: retention.0,
                retention_bytes_max: *retention_bytes,
            };
            let hub = broker.create_hub(spec).await?;
            writeln!(
                out,
                "created event hub {:?} with {} partitions",
                hub.name, hub.partition_count
            )?;
        }
        HubCommand::List => {
            for hub in broker.list_hubs() {
                writeln!(
                    out,
                    "{}\t{} partitions\t{} consumer groups",
                    hub.name,
                    hub.partition_count,
                    hub.consumer_groups.len()
                )?;
            }
        }
        HubCommand::Show { name } => {
            let hub = broker.describe_hub(name)?;
            output::write_hub(&mut out, &broker, &hub)?;
        }
        HubCommand::Delete { name } => {
            broker.delete_hub(name).await?;
            writeln!(out, "deleted event hub {name:?}")?;
        }
    }
    Ok(())
}

/// `tributary group …`.
pub async fn group(global: &GlobalArgs, command: &GroupCommand) -> Result<()> {
    let broker = open_broker(global).await?;
    let mut out = std::io::stdout().lock();
    match command {
        GroupCommand::Create { hub, name } => {
            broker.create_consumer_group(hub, name).await?;
            writeln!(out, "created consumer group {name:?} in {hub:?}")?;
        }
        GroupCommand::List { hub } => {
            for group in broker.list_consumer_groups(hub)? {
                writeln!(out, "{}", group.name)?;
            }
        }
        GroupCommand::Delete { hub, name } => {
            broker.delete_consumer_group(hub, name).await?;
            writeln!(out, "deleted consumer group {name:?} from {hub:?}")?;
        }
    }
    Ok(())
}

/// `tributary send`.
pub async fn send(global: &GlobalArgs, args: &SendArgs) -> Result<()> {
    let broker = open_broker(global).await?;
    let hub = broker.describe_hub(&args.hub)?;
    let target = match (&args.key, &args.partition) {
        (Some(key), _) => SendTarget::PartitionKey(key.clone()),
        (None, Some(partition)) => {
            // Check the id now, before any input is read.
            broker.partition_properties(&hub.name, partition)?;
            SendTarget::Partition(partition.clone())
        }
        (None, None) => SendTarget::RoundRobin,
    };
    let defaults = LineDefaults {
        target,
        properties: args.properties.clone(),
    };
    if let Some(path) = &args.file {
        // A file is checked whole first, so a bad line anywhere sends nothing.
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let lines = check_input(std::io::BufReader::new(file), args, &defaults)
            .with_context(|| format!("{}: nothing was sent", path.display()))?;
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let bar = progress_bar(Some(lines));
        send_input(
            &broker,
            std::io::BufReader::new(file),
            args,
            &defaults,
            &bar,
        )
        .await
    } else {
        let bar = progress_bar(None);
        send_input(&broker, std::io::stdin().lock(), args, &defaults, &bar).await
    }
}

fn check_input(input: impl BufRead, args: &SendArgs, defaults: &LineDefaults) -> Result<u64> {
    let mut count = 0;
    for (i, line) in input.lines().enumerate() {
        let line = line.with_context(|| format!("line {}: cannot read", i + 1))?;
        parse_line(&line, args.format, defaults)
            .map_err(|e| anyhow::anyhow!("line {}: {e}", i + 1))?;
        count += 1;
    }
    Ok(count)
}

fn progress_bar(len: Option<u64>) -> ProgressBar {
    let bar = match len {
        Some(n) => ProgressBar::new(n).with_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} events ({per_sec}, eta {eta})")
                .expect("valid template"),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} {pos} events sent ({per_sec})")
                .expect("valid template"),
        ),
    };
    // Large inputs only: a bar for a handful of events is noise.
    bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    bar
}

async fn send_input(
    broker: &Broker,
    input: impl BufRead,
    args: &SendArgs,
    defaults: &LineDefaults,
    bar: &ProgressBar,
) -> Result<()> {
    let mut batcher = Batcher::new(args.batch_size as usize);
    let mut sent = 0u64;
    let mut out = std::io::stdout();
    for (i, line) in input.lines().enumerate() {
        let line_no = i as u64 + 1;
        if line_no == 10_000 {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        let line = line.with_context(|| format!("line {line_no}: cannot read"))?;
        let event = parse_line(&line, args.format, defaults).map_err(|e| {
            anyhow::anyhow!("line {line_no}: {e}; the {sent} events before it were sent")
        })?;
        if let Some(batch) = batcher.push(line_no, event) {
            sent += send_batch(broker, &args.hub, batch, args.receipts, &mut out, sent).await?;
            bar.set_position(sent);
        }
    }
    if let Some(batch) = batcher.flush() {
        sent += send_batch(broker, &args.hub, batch, args.receipts, &mut out, sent).await?;
    }
    bar.finish_and_clear();
    if !args.receipts {
        eprintln!("sent {sent} events to {:?}", args.hub);
    }
    Ok(())
}

async fn send_batch(
    broker: &Broker,
    hub: &str,
    batch: Batch,
    receipts: bool,
    out: &mut impl Write,
    sent_before: u64,
) -> Result<u64> {
    let count = batch.events.len() as u64;
    let last_line = batch.last_line;
    let receipt = broker.send(hub, batch.target, batch.events).await.map_err(|e| {
        anyhow::anyhow!(
            "the batch ending at line {last_line} was refused: {e}; the {sent_before} events before it were sent"
        )
    })?;
    if receipts {
        writeln!(out, "{}", output::receipt_json(&receipt))?;
        out.flush()?;
    }
    Ok(count)
}

/// `tributary receive`.
pub async fn receive(global: &GlobalArgs, args: &ReceiveArgs) -> Result<()> {
    let broker = open_broker(global).await?;
    let hub = broker.describe_hub(&args.hub)?;
    let partitions: Vec<String> = match &args.partition {
        Some(p) => vec![p.clone()],
        None => (0..hub.partition_count).map(|p| p.to_string()).collect(),
    };
    let start = args.from.to_position(args.exclusive);
    let mut receivers = Vec::new();
    for partition in &partitions {
        let spec = ReceiverSpec {
            consumer_group: args.group.clone(),
            owner_level: args.owner_level,
            name: Some(format!("tributary-cli-{}", std::process::id())),
            ..ReceiverSpec::new(&hub.name, partition, start)
        };
        // Every receiver opens (and every position is checked) before anything is printed.
        receivers.push(broker.open_receiver(spec)?);
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    for (partition, receiver) in partitions.into_iter().zip(receivers) {
        tokio::spawn(pump(partition, receiver, args.follow, tx.clone()));
    }
    drop(tx);
    let mut printed = 0u64;
    let mut out = std::io::stdout().lock();
    while let Some((partition, batch)) = rx.recv().await {
        let batch: Vec<ReceivedEvent> =
            batch.with_context(|| format!("receiving from partition {partition} failed"))?;
        for event in batch {
            output::write_event(&mut out, args.format, &partition, &event)?;
            printed += 1;
            if args.count.is_some_and(|n| printed >= n) {
                out.flush()?;
                return Ok(());
            }
        }
        out.flush()?;
    }
    if let Some(n) = args.count
        && printed < n
    {
        bail!("only {printed} of the {n} requested events were available");
    }
    Ok(())
}

type PartitionBatch = (String, Result<Vec<ReceivedEvent>, ReceiveError>);

/// Reads one partition into the channel: to its end, or forever when following.
async fn pump(
    partition: String,
    mut receiver: tributary_broker::Receiver,
    follow: bool,
    tx: tokio::sync::mpsc::Sender<PartitionBatch>,
) {
    let wait = if follow {
        Duration::from_secs(3600)
    } else {
        Duration::ZERO
    };
    loop {
        match receiver.receive(500, wait).await {
            Ok(events) if events.is_empty() => {
                if !follow {
                    return;
                }
            }
            Ok(events) => {
                if tx.send((partition.clone(), Ok(events))).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = tx.send((partition, Err(e))).await;
                return;
            }
        }
    }
}
