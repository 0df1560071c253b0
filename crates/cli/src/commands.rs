//! What each command does: glue between the arguments and the broker.

use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use tributary_broker::{HubSpec, HubUpdate, SendTarget};
use tributary_capture::CaptureDescription;

use crate::admin::Catalog;
use crate::args::{
    ConnectionStringArgs, GlobalArgs, GroupArgs, GroupCommand, HubArgs, HubCommand, SendArgs,
};
use crate::hub_handle::HubHandle;
use crate::input::{Batch, Batcher, LineDefaults, Spreader, parse_line};
use crate::output;
use crate::running;

/// `tributary connection-string`: for the server running on the data directory (where it
/// really listens), else for the given or default host and port.
pub fn connection_string(global: &GlobalArgs, args: &ConnectionStringArgs) -> Result<()> {
    let running = running::find(&global.data_dir).and_then(|l| l.amqp_endpoint());
    let (host, port, tls) = running.unwrap_or_else(|| ("localhost".to_owned(), 5672, false));
    let host = args.host.clone().unwrap_or(host);
    let port = args.port.unwrap_or(port);
    let text = running::connection_string(&global.data_dir, &args.policy, &host, port, tls)?;
    if args.kafka {
        return kafka_client_settings(global, args, &text);
    }
    println!("{text}");
    Ok(())
}

/// `tributary connection-string --kafka`: librdkafka properties for the Kafka door, the plain
/// one when the running server has it, else its SASL_SSL one (whose CA the client must trust).
fn kafka_client_settings(
    global: &GlobalArgs,
    args: &ConnectionStringArgs,
    connection_string: &str,
) -> Result<()> {
    let listeners = running::find(&global.data_dir);
    let door = listeners.as_ref().and_then(|l| {
        l.kafka
            .map(|addr| (addr, false))
            .or(l.kafka_tls.map(|addr| (addr, true)))
    });
    let (host, port, tls) = match door {
        Some((addr, tls)) => (running::client_host(addr), addr.port(), tls),
        None => ("localhost".to_owned(), 9092, false),
    };
    let host = args.host.clone().unwrap_or(host);
    let protocol = if tls { "SASL_SSL" } else { "SASL_PLAINTEXT" };
    let mut out = std::io::stdout().lock();
    writeln!(out, "bootstrap.servers={host}:{port}")?;
    writeln!(out, "security.protocol={protocol}")?;
    if tls {
        writeln!(
            out,
            "# ssl.ca.location=<the CA file of the server's certificate>"
        )?;
    }
    writeln!(out, "sasl.mechanisms=PLAIN")?;
    writeln!(out, "sasl.username=$ConnectionString")?;
    writeln!(out, "sasl.password={connection_string}")?;
    Ok(())
}

/// `tributary hub …`: on the data directory, or through the server running on it.
pub async fn hub(global: &GlobalArgs, args: &HubArgs) -> Result<()> {
    let catalog = Catalog::open(global, &args.remote).await?;
    let mut out = std::io::stdout().lock();
    match &args.command {
        HubCommand::Create {
            name,
            partitions,
            retention,
            retention_bytes,
            cleanup,
            capture,
        } => {
            let capture = match capture.description().map_err(anyhow::Error::msg)? {
                Some(description) => description.apply(name, None)?,
                None => None,
            };
            let spec = HubSpec {
                name: name.clone(),
                partition_count: *partitions,
                retention_age_ms: retention.0,
                retention_bytes_max: *retention_bytes,
                cleanup: cleanup.cleanup(),
                capture,
            };
            let (name, partitions) = catalog.create_hub(spec).await?;
            writeln!(
                out,
                "created event hub {name:?} with {}",
                crate::output::count(partitions, "partition")
            )?;
        }
        HubCommand::Update { name, .. } => {
            let (update, capture) = hub_update(&args.command)?;
            catalog.update_hub(name, &update, capture.as_ref()).await?;
            writeln!(out, "updated event hub {name:?}")?;
        }
        HubCommand::List => {
            for (name, partitions, groups) in catalog.list_hubs().await? {
                writeln!(
                    out,
                    "{name}\t{}\t{}",
                    crate::output::count(partitions, "partition"),
                    crate::output::count(u64::try_from(groups)?, "consumer group")
                )?;
            }
        }
        HubCommand::Show { name } => {
            output::write_hub(&mut out, &catalog.show_hub(name).await?)?;
        }
        HubCommand::Delete { name } => {
            catalog.delete_hub(name).await?;
            writeln!(out, "deleted event hub {name:?}")?;
        }
    }
    Ok(())
}

/// What `hub update` changes: the retention and cleanup settings, and the capture as Azure's
/// `captureDescription` (`--no-capture`: `enabled: false`).
fn hub_update(command: &HubCommand) -> Result<(HubUpdate, Option<CaptureDescription>)> {
    let HubCommand::Update {
        retention,
        retention_bytes,
        cleanup_policy,
        min_compaction_lag,
        tombstone_retention,
        capture,
        no_capture,
        ..
    } = command
    else {
        unreachable!("hub_update is called for hub update only")
    };
    let update = HubUpdate {
        retention_age_ms: retention.map(|r| r.0),
        retention_bytes_max: retention_bytes.map(|r| r.0),
        cleanup_policy: *cleanup_policy,
        min_compaction_lag_ms: *min_compaction_lag,
        tombstone_retention_ms: *tombstone_retention,
        capture: None,
    };
    let capture = match capture.description().map_err(anyhow::Error::msg)? {
        Some(description) => Some(description),
        None => no_capture.then(|| CaptureDescription {
            enabled: Some(false),
            ..CaptureDescription::default()
        }),
    };
    if update == HubUpdate::default() && capture.is_none() {
        anyhow::bail!(
            "nothing to change: give --retention, --retention-bytes, --cleanup-policy, --min-compaction-lag, --tombstone-retention, --capture… or --no-capture"
        );
    }
    Ok((update, capture))
}

/// `tributary group …`: on the data directory, or through the server running on it.
pub async fn group(global: &GlobalArgs, args: &GroupArgs) -> Result<()> {
    let catalog = Catalog::open(global, &args.remote).await?;
    let mut out = std::io::stdout().lock();
    match &args.command {
        GroupCommand::Create { hub, name } => {
            catalog.create_group(hub, name).await?;
            writeln!(out, "created consumer group {name:?} in {hub:?}")?;
        }
        GroupCommand::List { hub } => {
            for group in catalog.list_groups(hub).await? {
                writeln!(out, "{group}")?;
            }
        }
        GroupCommand::Delete { hub, name } => {
            catalog.delete_group(hub, name).await?;
            writeln!(out, "deleted consumer group {name:?} from {hub:?}")?;
        }
        GroupCommand::Reset { hub, name, to } => {
            for (partition, after) in catalog.reset_group(hub, name, *to).await? {
                writeln!(
                    out,
                    "{hub}/{name} partition {partition}: processors resume after sequence number {after}"
                )?;
            }
        }
    }
    Ok(())
}

/// `tributary send`.
pub async fn send(global: &GlobalArgs, args: &SendArgs) -> Result<()> {
    let hub = HubHandle::open(
        global,
        &args.hub,
        args.connection.connection_string.as_deref(),
    )
    .await?;
    let spreader = Spreader::new(hub.partition_ids().await?);
    let target = match (&args.key, &args.partition) {
        (Some(key), _) => SendTarget::PartitionKey(key.clone()),
        (None, Some(partition)) => {
            // Check the id now, before any input is read.
            let target = SendTarget::Partition(partition.clone());
            spreader
                .check(&target)
                .map_err(|e| anyhow::anyhow!("event hub {:?}: {e}", args.hub))?;
            target
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
        let lines = check_input(std::io::BufReader::new(file), args, &defaults, &spreader)
            .with_context(|| format!("{}: nothing was sent", path.display()))?;
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let bar = progress_bar(Some(lines));
        let input = std::io::BufReader::new(file);
        send_input(&hub, input, args, &defaults, spreader, &bar).await
    } else {
        let bar = progress_bar(None);
        let input = std::io::stdin().lock();
        send_input(&hub, input, args, &defaults, spreader, &bar).await
    }
}

/// One input line as an event, its partition (if it names one) checked against the hub's.
fn parse_checked(
    line: &str,
    args: &SendArgs,
    defaults: &LineDefaults,
    spreader: &Spreader,
) -> Result<crate::input::InputEvent, String> {
    let input = parse_line(line, args.format, defaults)?;
    spreader
        .check(&input.target)
        .map_err(|e| format!("event hub {:?}: {e}", args.hub))?;
    Ok(input)
}

fn check_input(
    input: impl BufRead,
    args: &SendArgs,
    defaults: &LineDefaults,
    spreader: &Spreader,
) -> Result<u64> {
    let mut count = 0;
    for (i, line) in input.lines().enumerate() {
        let line = line.with_context(|| format!("line {}: cannot read", i + 1))?;
        parse_checked(&line, args, defaults, spreader)
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
    mut spreader: Spreader,
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
        let mut event = parse_checked(&line, args, defaults, &spreader)
            .map_err(|e| anyhow::anyhow!("line {line_no}: {e}; {}", sent_before_it(sent)))?;
        event.target = spreader.route(event.target);
        if let Some(batch) = batcher.push(line_no, event) {
            sent += send_batch(hub, batch, args.receipts, &mut out, sent).await?;
            bar.set_position(sent);
        }
    }
    while let Some(batch) = batcher.flush() {
        sent += send_batch(hub, batch, args.receipts, &mut out, sent).await?;
    }
    bar.finish_and_clear();
    if !args.receipts {
        eprintln!(
            "sent {} to {:?}",
            crate::output::count(sent, "event"),
            args.hub
        );
    }
    Ok(())
}

/// What a failed `send` had already done: how many events before the failure were sent.
fn sent_before_it(sent: u64) -> String {
    match sent {
        0 => "nothing before it was sent".to_owned(),
        1 => "the event before it was sent".to_owned(),
        n => format!("the {n} events before it were sent"),
    }
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
    let found = hub
        .send(batch.target, batch.events, receipts)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "the batch ending at line {last_line} was refused: {e:#}; {}",
                sent_before_it(sent_before)
            )
        })?;
    for receipt in &found {
        writeln!(out, "{}", output::receipt_json(receipt))?;
    }
    out.flush()?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::sent_before_it;

    #[test]
    fn what_was_sent_before_a_failure_agrees_with_its_number() {
        assert_eq!(sent_before_it(0), "nothing before it was sent");
        assert_eq!(sent_before_it(1), "the event before it was sent");
        assert_eq!(sent_before_it(7), "the 7 events before it were sent");
    }
}
