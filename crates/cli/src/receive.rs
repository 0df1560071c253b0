//! `tributary receive`: one pump per partition reads into one channel, and the events are
//! printed in the order they arrive.
//!
//! Without `--follow` reading stops at each partition's end as of the start; a partition with
//! nothing to read from the start position is not read at all, and when no event was printed the
//! command says `no events` on stderr (standard output carries only events, so `--format json`
//! stays JSON lines).
//!
//! With `--follow` on a remote hub the pumps share one [`Link`]: when the connection drops, one
//! pump reconnects for all of them, printing one line per connection attempt, and the others
//! wait for it. A hub reached through the `tributary serve` running on the data directory is
//! looked up there again on each attempt (`server.json`), so a server restarted on other ports
//! is found; the data directory itself is never opened (the server needs its lock).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tributary_client::RemoteHub;
use tributary_event::{EventPosition, ReceivedEvent};
use tributary_source::{PartitionReceiver, PartitionSource, ReceiverOptions, SourceError};

use crate::args::{GlobalArgs, ReceiveArgs};
use crate::hub_handle::HubHandle;
use crate::output;

/// `tributary receive`.
pub async fn receive(global: &GlobalArgs, args: &ReceiveArgs) -> Result<()> {
    let hub = HubHandle::open(
        global,
        &args.hub,
        args.connection.connection_string.as_deref(),
    )
    .await?;
    let partitions: Vec<String> = match &args.partition {
        Some(p) => {
            hub.check_partition(p).await?;
            vec![p.clone()]
        }
        None => hub.partition_ids().await?,
    };
    let link = match (&hub, args.follow) {
        // Following a remote hub outlives its restarts.
        (
            HubHandle::Remote {
                hub: remote,
                connection_string,
                ..
            },
            true,
        ) => Some(Arc::new(Link::new(global, args, remote, connection_string))),
        _ => None,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    for partition in &partitions {
        if let Some(pump) = pump(&hub, args, partition, link.clone(), &tx).await? {
            let receiver = pump
                .source
                .open_receiver(pump.options.clone())
                .await
                .with_context(|| format!("cannot receive from partition {partition}"))?;
            tokio::spawn(pump.run(receiver));
        }
    }
    drop(tx);
    let printed = print(args, rx).await?;
    if let Some(n) = args.count
        && printed < n
    {
        bail!("only {printed} of the {n} requested events were available");
    }
    if printed == 0 {
        eprintln!("no events");
    }
    Ok(())
}

/// Prints what the pumps send until they are done or `--count` events were printed; how many.
async fn print(
    args: &ReceiveArgs,
    mut rx: tokio::sync::mpsc::Receiver<PartitionBatch>,
) -> Result<u64> {
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
                return Ok(printed);
            }
        }
        out.flush()?;
    }
    Ok(printed)
}

/// The pump of one partition, or `None` when, without `--follow`, it has nothing to read.
async fn pump(
    hub: &HubHandle,
    args: &ReceiveArgs,
    partition: &str,
    link: Option<Arc<Link>>,
    tx: &tokio::sync::mpsc::Sender<PartitionBatch>,
) -> Result<Option<Pump>> {
    let start = args.from.to_position(args.exclusive);
    // The end as of now: without --follow, reading stops there.
    let end = hub.last_sequence(partition).await?;
    if !args.follow && nothing_after(start, end) {
        return Ok(None);
    }
    // A remote receiver may return nothing for a moment before its first credit round trip.
    let idle_wait = if hub.is_remote() {
        Duration::from_secs(2)
    } else {
        Duration::ZERO
    };
    let options = ReceiverOptions {
        partition_id: partition.to_owned(),
        consumer_group: args.group.clone(),
        start,
        owner_level: args.owner_level,
        prefetch: 500,
        track_last_enqueued: false,
    };
    Ok(Some(Pump {
        source: hub.source(None),
        generation: 0,
        options,
        until: (!args.follow).then_some((end, idle_wait)),
        link,
        tx: tx.clone(),
    }))
}

/// Whether a partition whose newest event has sequence number `end` (-1: none) surely holds
/// nothing from `start` (offsets and times are not compared: their end is not known here). A
/// sequence number past the next one is not skipped: the hub refuses it, as Event Hubs does,
/// and the user learns where the partition ends.
fn nothing_after(start: EventPosition, end: i64) -> bool {
    match start {
        EventPosition::SequenceNumber {
            sequence_number,
            inclusive,
        } => {
            let next = if inclusive {
                sequence_number
            } else {
                sequence_number.saturating_add(1)
            };
            next == end.saturating_add(1)
        }
        _ if end < 0 => true,
        EventPosition::Latest => true,
        _ => false,
    }
}

type PartitionBatch = (String, Result<Vec<ReceivedEvent>, SourceError>);

/// The first and the longest wait before a follower tries to reconnect to a remote hub.
const RECONNECT_DELAY_MIN: Duration = Duration::from_millis(500);
const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(30);

/// Reads one partition into the channel: forever when `until` is `None`, else until the event
/// with sequence number `until.0` arrived or nothing came for `until.1`.
struct Pump {
    /// The hub as it reads it, from `link`'s connection number `generation` when following.
    source: Arc<dyn PartitionSource>,
    generation: u64,
    options: ReceiverOptions,
    until: Option<(i64, Duration)>,
    /// Where a failed receiver is reopened (after the last event seen) instead of ending.
    link: Option<Arc<Link>>,
    tx: tokio::sync::mpsc::Sender<PartitionBatch>,
}

impl Pump {
    async fn run(mut self, mut receiver: Box<dyn PartitionReceiver>) {
        let partition = self.options.partition_id.clone();
        let wait = self
            .until
            .map_or(Duration::from_secs(3600), |(_, idle)| idle);
        loop {
            let error = match receiver.receive(500, wait).await {
                Ok(events) if events.is_empty() => {
                    if self.until.is_some() {
                        return;
                    }
                    continue;
                }
                Ok(events) => {
                    let last = events.last().map(|e| e.sequence_number);
                    if let Some(last) = last {
                        // A reopened receiver continues after what was printed.
                        self.options.start = EventPosition::SequenceNumber {
                            sequence_number: last,
                            inclusive: false,
                        };
                    }
                    if self.tx.send((partition.clone(), Ok(events))).await.is_err() {
                        return;
                    }
                    if self.until.is_some_and(|(end, _)| last >= Some(end)) {
                        return;
                    }
                    continue;
                }
                Err(error) => error,
            };
            match self.reopen(error).await {
                Ok(reopened) => receiver = reopened,
                Err(error) => {
                    let _ = self.tx.send((partition, Err(error))).await;
                    return;
                }
            }
        }
    }

    /// After `error`, a receiver on the hub reconnected through the link, continuing where this
    /// one stopped; `error` itself when there is no link or reconnecting cannot help.
    async fn reopen(
        &mut self,
        mut error: SourceError,
    ) -> Result<Box<dyn PartitionReceiver>, SourceError> {
        let Some(link) = self.link.clone() else {
            return Err(error);
        };
        loop {
            if !worth_reconnecting(&error) {
                return Err(error);
            }
            (self.generation, self.source) = link.reconnect(self.generation, &error).await;
            match self.source.open_receiver(self.options.clone()).await {
                Ok(receiver) => return Ok(receiver),
                Err(e) => error = e,
            }
        }
    }
}

/// Whether a follower should reconnect after `error`: not when reconnecting cannot help (the
/// hub or partition is gone, the credentials are refused, a higher epoch took over).
fn worth_reconnecting(error: &SourceError) -> bool {
    !matches!(
        error,
        SourceError::NotFound { .. }
            | SourceError::Unauthorized { .. }
            | SourceError::OwnershipLost { .. }
    )
}

/// A follower's connection to a remote hub, shared by its partitions' pumps.
struct Link {
    global: GlobalArgs,
    hub: String,
    /// The connection string given with --connection-string; `None`: the one of the `serve`
    /// running on the data directory, whichever ports it listens on now.
    given: Option<String>,
    current: tokio::sync::Mutex<Connection>,
}

/// One connection of a [`Link`]: the `generation`-th, to `hub` through `connection_string`.
struct Connection {
    generation: u64,
    hub: RemoteHub,
    connection_string: String,
}

impl Link {
    fn new(
        global: &GlobalArgs,
        args: &ReceiveArgs,
        hub: &RemoteHub,
        connection_string: &str,
    ) -> Link {
        Link {
            global: global.clone(),
            hub: args.hub.clone(),
            given: args.connection.connection_string.clone(),
            current: tokio::sync::Mutex::new(Connection {
                generation: 0,
                hub: hub.clone(),
                connection_string: connection_string.to_owned(),
            }),
        }
    }

    /// The connection after number `seen` failed with `error`: one the pump holding `seen` makes
    /// (waiting longer after each failed attempt, up to [`RECONNECT_DELAY_MAX`]), or the one
    /// another pump already made. Its number and the hub through it.
    async fn reconnect(&self, seen: u64, error: &SourceError) -> (u64, Arc<dyn PartitionSource>) {
        let mut current = self.current.lock().await;
        if current.generation == seen {
            eprintln!("tributary: {error}; reconnecting");
            let mut delay = RECONNECT_DELAY_MIN;
            loop {
                tokio::time::sleep(delay).await;
                match self.connect(&current).await {
                    Ok((hub, connection_string, to)) => {
                        eprintln!("tributary: reconnected{to}");
                        *current = Connection {
                            generation: seen + 1,
                            hub,
                            connection_string,
                        };
                        break;
                    }
                    Err(e) => {
                        delay = (delay * 2).min(RECONNECT_DELAY_MAX);
                        eprintln!(
                            "tributary: cannot reconnect: {e:#}; trying again in {} s",
                            delay.as_secs_f32()
                        );
                    }
                }
            }
        }
        (current.generation, Arc::new(current.hub.clone()))
    }

    /// One connection attempt: the hub, the connection string it was reached with, and where it
    /// is (for the message; empty for a given connection string). The current client is kept
    /// while the connection string is the same (it reconnects itself, following an alias).
    async fn connect(&self, current: &Connection) -> Result<(RemoteHub, String, String)> {
        let (connection_string, to) = match &self.given {
            Some(given) => (given.clone(), String::new()),
            None => {
                let server =
                    crate::running::local_server(&self.global.data_dir).with_context(|| {
                        format!(
                            "no tributary serve runs on {}",
                            self.global.data_dir.display()
                        )
                    })??;
                (server.connection_string, format!(" to {}", server.address))
            }
        };
        let hub = if connection_string == current.connection_string {
            current.hub.clone()
        } else {
            let options = crate::hub_handle::client_options(&self.global)?;
            RemoteHub::connect_with_options(&connection_string, Some(&self.hub), options).await?
        };
        // Proves the connection (the kept client reconnects on this call).
        hub.hub_properties().await?;
        Ok((hub, connection_string, to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_partitions_surely_without_events_from_the_start_are_skipped() {
        let seq = |sequence_number, inclusive| EventPosition::SequenceNumber {
            sequence_number,
            inclusive,
        };
        assert!(nothing_after(EventPosition::Earliest, -1));
        assert!(!nothing_after(EventPosition::Earliest, 0));
        assert!(nothing_after(EventPosition::Latest, 7));
        assert!(nothing_after(seq(8, true), 7));
        assert!(
            !nothing_after(seq(10, true), 7),
            "past the next one: the hub refuses it"
        );
        assert!(nothing_after(seq(0, true), -1));
        assert!(!nothing_after(seq(10, true), -1));
        assert!(nothing_after(seq(7, false), 7));
        assert!(!nothing_after(seq(7, true), 7));
        let offset = EventPosition::Offset {
            offset: 1 << 40,
            inclusive: true,
        };
        assert!(!nothing_after(offset, 7), "an offset's end is not known");
    }
}
