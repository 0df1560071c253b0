//! The scale scenario's clients (the Rust client over AMQP): producers keeping a window of
//! sends in flight across a hub's partitions, consumer groups reading a backlog or tailing a
//! hub, and idle connections each holding a receiver. Each load measures only its timed window
//! (after a warm-up), and the server's CPU time over that window.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use tokio::task::JoinSet;
use tributary_client::{ConsumerClient, ProducerClient};
use tributary_event::{EventData, EventPosition, ReceivedEvent, SendTarget};

use super::Plan;
use super::server::ServerProcess;

/// Events per batch every producer sends.
pub const BATCH_EVENTS: usize = 100;

/// What one timed window of load measured.
#[derive(Debug, Clone)]
pub struct Measured {
    /// Events per second acknowledged (ingest) or received (delivery) in the window.
    pub rate: f64,
    /// p99 of the latency recorded (acknowledgement or end to end), in milliseconds.
    pub p99_ms: f64,
    /// The server's CPU time per event in the window, in microseconds.
    pub server_cpu_us: f64,
    /// This process's (the clients') CPU time per event in the window, in microseconds.
    pub client_cpu_us: f64,
    /// Events counted from the start of the load to its end, warm-up and drain included.
    pub events_all: u64,
}

/// Who sends: producers on `hubs`, each keeping `window` sends in flight round the partitions.
pub struct Producers {
    pub hubs: Vec<String>,
    pub partitions: u32,
    pub connections_per_hub: usize,
    pub window: usize,
    pub event_bytes: usize,
}

impl Producers {
    /// `connections_per_hub` producers on each of `hubs`, each keeping `window` sends of 100 B
    /// events in flight.
    pub fn new(
        hubs: Vec<String>,
        partitions: u32,
        connections_per_hub: usize,
        window: usize,
    ) -> Self {
        Producers {
            hubs,
            partitions,
            connections_per_hub,
            window,
            event_bytes: 100,
        }
    }
}

/// Runs the producers through the plan's warm-up and one timed step.
pub async fn ingest(plan: &Plan, server: &ServerProcess, who: &Producers) -> Result<Measured> {
    let mut producers = Vec::new();
    for hub in &who.hubs {
        for _ in 0..who.connections_per_hub {
            let producer = ProducerClient::connect(&server.conn, hub)
                .await
                .with_context(|| format!("a producer cannot connect to {hub}"))?;
            producers.push(producer);
        }
    }
    let counter = Arc::new(Window::default());
    let mut tasks = JoinSet::new();
    let body = vec![b'x'; who.event_bytes];
    let events: Arc<[EventData]> = (0..BATCH_EVENTS)
        .map(|_| EventData::new(body.clone()))
        .collect();
    // Connection k of a hub's c sends to the partitions k, k + c, k + 2c, …: with 1,024
    // partitions no connection needs a link to each (a session holds 1,024 links at most).
    let c = who.connections_per_hub;
    for (n, producer) in producers.iter().enumerate() {
        for slot in 0..who.window {
            let (producer, counter, events) = (producer.clone(), counter.clone(), events.clone());
            let (partitions, stride) = (who.partitions as usize, who.window * c);
            let first = n % c + slot * c;
            tasks.spawn(async move {
                let mut partition = first % partitions;
                while !counter.stop.load(Ordering::Relaxed) {
                    let target = SendTarget::Partition(partition.to_string());
                    let sent = Instant::now();
                    producer.send(&events, target).await?;
                    counter.record(events.len() as u64, sent.elapsed());
                    partition = (partition + stride) % partitions;
                }
                anyhow::Ok(())
            });
        }
    }
    let measured = counter.measure(plan, server, &mut tasks).await;
    for producer in &producers {
        producer.close().await;
    }
    measured
}

/// Events counted and latencies recorded by many tasks, from the start of the timed window.
#[derive(Default)]
pub struct Window {
    events: AtomicU64,
    events_all: AtomicU64,
    timing: AtomicBool,
    stop: AtomicBool,
    latency_us: std::sync::Mutex<Option<Histogram<u64>>>,
}

impl Window {
    /// Counts `events`, and with one latency sample if the timed window is open.
    pub fn record(&self, events: u64, latency: Duration) {
        self.events_all.fetch_add(events, Ordering::Relaxed);
        if !self.timing.load(Ordering::Relaxed) {
            return;
        }
        self.events.fetch_add(events, Ordering::Relaxed);
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut histogram = self.latency_us.lock().expect("latencies");
        if let Some(h) = histogram.as_mut() {
            h.saturating_record(us);
        }
    }

    /// Whether the tasks should end.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Waits out the warm-up, times one step, stops the tasks and waits for them.
    pub async fn measure(
        &self,
        plan: &Plan,
        server: &ServerProcess,
        tasks: &mut JoinSet<Result<()>>,
    ) -> Result<Measured> {
        tokio::time::sleep(plan.warm_up).await;
        *self.latency_us.lock().expect("latencies") =
            Some(Histogram::new_with_bounds(1, 600_000_000, 3).context("a histogram")?);
        let (server_cpu, client_cpu) = (server.cpu_seconds(), own_cpu_seconds());
        let started = Instant::now();
        self.timing.store(true, Ordering::Relaxed);
        tokio::time::sleep(plan.step).await;
        self.timing.store(false, Ordering::Relaxed);
        let elapsed = started.elapsed().as_secs_f64();
        let server_cpu = server.cpu_seconds() - server_cpu;
        let client_cpu = own_cpu_seconds() - client_cpu;
        self.stop.store(true, Ordering::Relaxed);
        while let Some(done) = tasks.join_next().await {
            done.context("a load task panicked")??;
        }
        let events = self.events.load(Ordering::Relaxed);
        let histogram = self.latency_us.lock().expect("latencies").take();
        let p99_us = histogram.map_or(0, |h| h.value_at_quantile(0.99));
        let per_event = |cpu: f64| cpu * 1e6 / events.max(1) as f64;
        Ok(Measured {
            rate: events as f64 / elapsed,
            p99_ms: p99_us as f64 / 1000.0,
            server_cpu_us: per_event(server_cpu),
            client_cpu_us: per_event(client_cpu),
            events_all: self.events_all.load(Ordering::Relaxed),
        })
    }
}

fn own_cpu_seconds() -> f64 {
    crate::bench::cpu_ticks("self") as f64 / 100.0
}

/// `groups` consumer groups (one connection each, a receiver on every partition) reading `hub`
/// from the start through one timed step: the events all of them received per second.
pub async fn deliver(
    plan: &Plan,
    server: &ServerProcess,
    hub: &str,
    partitions: u32,
    groups: &[String],
) -> Result<Measured> {
    let window = Arc::new(Window::default());
    let mut tasks = JoinSet::new();
    let readers = Readers {
        hub: (hub, partitions),
        groups,
        start: EventPosition::Earliest,
        credit: 3_000,
    };
    let consumers = readers
        .spawn(server, &window, &mut tasks, |window, events| {
            window.record(events.len() as u64, Duration::ZERO);
            Ok(())
        })
        .await?;
    let measured = window.measure(plan, server, &mut tasks).await;
    for consumer in &consumers {
        consumer.close().await;
    }
    measured
}

/// `groups` consumer groups tailing `hub` while one producer offers `rate` events/s (batches of
/// 10, each body stamped with its send time): p99 from the send call to the receive.
pub async fn tail_latency(
    plan: &Plan,
    server: &ServerProcess,
    hub: (&str, u32),
    groups: &[String],
    rate: u64,
) -> Result<Measured> {
    let base = Instant::now();
    let window = Arc::new(Window::default());
    let mut tasks = JoinSet::new();
    let readers = Readers {
        hub,
        groups,
        start: EventPosition::Latest,
        credit: 300,
    };
    let consumers = readers
        .spawn(server, &window, &mut tasks, move |window, events| {
            for event in events {
                let stamp = event.data.body.get(..8).context("a short body")?;
                let sent = u64::from_le_bytes(stamp.try_into()?);
                let now = base.elapsed().as_nanos() as u64;
                window.record(1, Duration::from_nanos(now.saturating_sub(sent)));
            }
            Ok(())
        })
        .await?;
    let producer = ProducerClient::connect(&server.conn, hub.0).await?;
    tasks.spawn(pace(producer.clone(), hub.1, rate, base, window.clone()));
    let measured = window.measure(plan, server, &mut tasks).await;
    producer.close().await;
    for consumer in &consumers {
        consumer.close().await;
    }
    measured
}

/// Consumer groups reading a hub: one connection per group, a receiver on every partition
/// starting at `start` with `credit` prefetched and asked for per receive.
struct Readers<'a> {
    hub: (&'a str, u32),
    groups: &'a [String],
    start: EventPosition,
    credit: u32,
}

impl Readers<'_> {
    /// Opens the receivers, each in a task of `tasks` receiving until `window` stops and
    /// handing every batch received to `on_events`; the connections, to close when done.
    async fn spawn<F>(
        &self,
        server: &ServerProcess,
        window: &Arc<Window>,
        tasks: &mut JoinSet<Result<()>>,
        on_events: F,
    ) -> Result<Vec<ConsumerClient>>
    where
        F: Fn(&Window, Vec<ReceivedEvent>) -> Result<()> + Clone + Send + 'static,
    {
        let (hub, partitions) = self.hub;
        let mut consumers = Vec::new();
        for group in self.groups {
            let consumer = ConsumerClient::connect(&server.conn, hub).await?;
            for partition in 0..partitions {
                let mut receiver = consumer
                    .open_receiver(&partition.to_string(), group, self.start, None, self.credit)
                    .await?;
                let (window, on_events) = (window.clone(), on_events.clone());
                let credit = self.credit as usize;
                tasks.spawn(async move {
                    while !window.stopped() {
                        let events = receiver.receive(credit, Duration::from_millis(100)).await?;
                        on_events(&window, events)?;
                    }
                    receiver.close().await;
                    anyhow::Ok(())
                });
            }
            consumers.push(consumer);
        }
        Ok(consumers)
    }
}

/// Sends batches of 10 stamped events at `rate` events/s round the partitions until stopped.
async fn pace(
    producer: ProducerClient,
    partitions: u32,
    rate: u64,
    base: Instant,
    window: Arc<Window>,
) -> Result<()> {
    let interval = Duration::from_nanos(10 * 1_000_000_000 / rate.max(10));
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut n = 0u32;
    while !window.stopped() {
        ticks.tick().await;
        let stamp = (base.elapsed().as_nanos() as u64).to_le_bytes();
        let events: Vec<EventData> = (0..10)
            .map(|_| {
                let mut body = vec![b'x'; 100];
                body[..8].copy_from_slice(&stamp);
                EventData::new(body)
            })
            .collect();
        let target = SendTarget::Partition((n % partitions).to_string());
        producer.send(&events, target).await?;
        n = n.wrapping_add(1);
    }
    Ok(())
}

/// Idle connections, each holding one receiver; dropped to close them.
#[derive(Default)]
pub struct IdleCrowd {
    held: Vec<(ConsumerClient, tributary_client::EventReceiver)>,
}

/// Connections opened at once while the crowd grows.
const CONNECT_WAVE: usize = 128;

impl IdleCrowd {
    /// How many are held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Opens connections until `n` are held, receiver `i` on partition `i mod partitions` of
    /// group `groups[(i / partitions) mod groups]` (five receivers per partition and group at
    /// most, as Event Hubs allows).
    pub async fn grow_to(
        &mut self,
        conn: &str,
        (hub, partitions): (&str, u32),
        groups: &[String],
        n: usize,
    ) -> Result<()> {
        while self.held.len() < n {
            let mut opening = JoinSet::new();
            for i in self.held.len()..n.min(self.held.len() + CONNECT_WAVE) {
                let partition = (i % partitions as usize).to_string();
                let group = groups[(i / partitions as usize) % groups.len()].clone();
                let (conn, hub) = (conn.to_owned(), hub.to_owned());
                opening.spawn(async move {
                    let consumer = ConsumerClient::connect(&conn, &hub).await?;
                    let receiver = consumer
                        .open_receiver(&partition, &group, EventPosition::Latest, None, 10)
                        .await?;
                    anyhow::Ok((consumer, receiver))
                });
            }
            while let Some(opened) = opening.join_next().await {
                let held = opened.context("a connecting task panicked")?;
                self.held.push(
                    held.with_context(|| {
                        format!("idle connection {} failed", self.held.len() + 1)
                    })?,
                );
            }
        }
        Ok(())
    }

    /// Closes every connection.
    pub async fn close(self) {
        for (consumer, receiver) in self.held {
            receiver.close().await;
            consumer.close().await;
        }
    }
}
