//! What each command does: glue between the arguments and the broker.

use std::io::{BufRead, Write};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use tributary_broker::{Broker, BrokerConfig, HubSpec, SendTarget};
use tributary_event::ReceivedEvent;
use tributary_processor::{PartitionReceiver, ReceiverOptions, SourceError};

use crate::args::{
    ConnectionStringArgs, GlobalArgs, GroupCommand, HubCommand, ReceiveArgs, SendArgs, ServeArgs,
};
use crate::hub_handle::{HubHandle, open_broker};
use crate::input::{Batch, Batcher, LineDefaults, parse_line};
use crate::output;

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
    let (policies, created) = tributary_amqp::AccessPolicies::load_or_create(&global.data_dir)
        .context("cannot load the shared access policies")?;
    let root = created.and_then(|_| policies.policies().first().cloned());
    let amqp_config =
        tributary_amqp::AmqpConfig::new((args.listen, args.amqp_port).into(), policies);
    let amqp = tributary_amqp::start(broker.clone(), amqp_config)
        .await
        .context("cannot start the AMQP front door")?;
    http_config.websocket_amqp = Some(amqp_over_websockets(&amqp));
    let http = tributary_http::start(broker.clone(), http_config)
        .await
        .context("cannot start the HTTP front door")?;
    print_banner(global, args, &broker, amqp.local_addr(), http.local_addr())?;
    if let Some(root) = root {
        let addr = amqp.local_addr();
        let host = if addr.ip().is_unspecified() {
            "localhost".to_owned()
        } else {
            addr.ip().to_string()
        };
        eprintln!(
            "created the shared access policy {:?}; its connection string (shown once; `tributary connection-string` prints it again):\n  {}",
            root.name,
            tributary_amqp::connection_string(&host, addr.port(), &root)
        );
    }
    eprintln!("press Ctrl-C to stop");
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    eprintln!("stopping: closing listeners, syncing partitions");
    amqp.shutdown().await;
    http.shutdown().await?;
    broker.shutdown().await?;
    Ok(())
}

/// AMQP over WebSockets: the HTTP door hands each connection it upgrades at
/// `/$servicebus/websocket` to the AMQP door, which authenticates and serves it as any other.
fn amqp_over_websockets(
    amqp: &tributary_amqp::RunningAmqpServer,
) -> tributary_http::AmqpOverWebSockets {
    let connections = amqp.connections();
    tributary_http::AmqpOverWebSockets::new(move |stream, peer| {
        let connections = connections.clone();
        Box::pin(async move { connections.serve(stream, peer).await })
    })
}

/// `tributary connection-string`.
pub fn connection_string(global: &GlobalArgs, args: &ConnectionStringArgs) -> Result<()> {
    let (policies, _) = tributary_amqp::AccessPolicies::load_or_create(&global.data_dir)
        .context("cannot load the shared access policies")?;
    let policy = policies.get(&args.policy).with_context(|| {
        let names: Vec<&str> = policies
            .policies()
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        format!(
            "there is no shared access policy {:?} (there are: {})",
            args.policy,
            names.join(", ")
        )
    })?;
    println!(
        "{}",
        tributary_amqp::connection_string(&args.host, args.port, policy)
    );
    Ok(())
}

fn print_banner(
    global: &GlobalArgs,
    args: &ServeArgs,
    broker: &Broker,
    amqp: std::net::SocketAddr,
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
    let policies = global.data_dir.join("access-policies.json");
    writeln!(
        err,
        "  amqp: amqp://{amqp} (Azure Event Hubs SDKs; SAS policies in {})",
        policies.display()
    )?;
    writeln!(
        err,
        "  http: http://{http}/20180418 (OCI Streaming), /admin/v1, /health, /metrics; {auth}"
    )?;
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
    let hub = HubHandle::open(global, &args.hub, args.connection_string.as_deref()).await?;
    if args.receipts && hub.is_remote() {
        bail!(
            "--receipts needs the hub in this process: over AMQP a producer is not told sequence numbers or offsets"
        );
    }
    let target = match (&args.key, &args.partition) {
        (Some(key), _) => SendTarget::PartitionKey(key.clone()),
        (None, Some(partition)) => {
            // Check the id now, before any input is read.
            hub.check_partition(partition).await?;
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
        send_input(&hub, std::io::BufReader::new(file), args, &defaults, &bar).await
    } else {
        let bar = progress_bar(None);
        send_input(&hub, std::io::stdin().lock(), args, &defaults, &bar).await
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
    hub: &HubHandle,
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
            sent += send_batch(hub, batch, args.receipts, &mut out, sent).await?;
            bar.set_position(sent);
        }
    }
    if let Some(batch) = batcher.flush() {
        sent += send_batch(hub, batch, args.receipts, &mut out, sent).await?;
    }
    bar.finish_and_clear();
    if !args.receipts {
        eprintln!("sent {sent} events to {:?}", args.hub);
    }
    Ok(())
}

async fn send_batch(
    hub: &HubHandle,
    batch: Batch,
    receipts: bool,
    out: &mut impl Write,
    sent_before: u64,
) -> Result<u64> {
    let count = batch.events.len() as u64;
    let last_line = batch.last_line;
    let receipt = hub.send(batch.target, batch.events).await.map_err(|e| {
        anyhow::anyhow!(
            "the batch ending at line {last_line} was refused: {e:#}; the {sent_before} events before it were sent"
        )
    })?;
    if let (true, Some(receipt)) = (receipts, receipt) {
        writeln!(out, "{}", output::receipt_json(&receipt))?;
        out.flush()?;
    }
    Ok(count)
}

/// `tributary receive`.
pub async fn receive(global: &GlobalArgs, args: &ReceiveArgs) -> Result<()> {
    let hub = HubHandle::open(global, &args.hub, args.connection_string.as_deref()).await?;
    let partitions: Vec<String> = match &args.partition {
        Some(p) => {
            hub.check_partition(p).await?;
            vec![p.clone()]
        }
        None => hub.partition_ids().await?,
    };
    let source = hub.source(None);
    let mut pumps = Vec::new();
    for partition in &partitions {
        let options = ReceiverOptions {
            partition_id: partition.clone(),
            consumer_group: args.group.clone(),
            start: args.from.to_position(args.exclusive),
            owner_level: args.owner_level,
            prefetch: 500,
            track_last_enqueued: false,
        };
        // The end as of now: without --follow, reading stops there.
        let end = hub.last_sequence(partition).await?;
        let receiver = source
            .open_receiver(options)
            .await
            .with_context(|| format!("cannot receive from partition {partition}"))?;
        pumps.push((partition.clone(), receiver, end));
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    // A remote receiver may return nothing for a moment before its first credit round trip.
    let idle_wait = if hub.is_remote() {
        Duration::from_secs(2)
    } else {
        Duration::ZERO
    };
    for (partition, receiver, end) in pumps {
        let until = (!args.follow).then_some((end, idle_wait));
        tokio::spawn(pump(partition, receiver, until, tx.clone()));
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

type PartitionBatch = (String, Result<Vec<ReceivedEvent>, SourceError>);

/// Reads one partition into the channel: forever when `until` is `None`, else until the event
/// with sequence number `until.0` arrived or nothing came for `until.1`.
async fn pump(
    partition: String,
    mut receiver: Box<dyn PartitionReceiver>,
    until: Option<(i64, Duration)>,
    tx: tokio::sync::mpsc::Sender<PartitionBatch>,
) {
    let wait = until.map_or(Duration::from_secs(3600), |(_, idle)| idle);
    loop {
        match receiver.receive(500, wait).await {
            Ok(events) if events.is_empty() => {
                if until.is_some() {
                    return;
                }
            }
            Ok(events) => {
                let last = events.last().map(|e| e.sequence_number);
                if tx.send((partition.clone(), Ok(events))).await.is_err() {
                    return;
                }
                if until.is_some_and(|(end, _)| last >= Some(end)) {
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
