//! Host-level behaviour: several hosts over an in-memory hub, on a paused Tokio clock so every
//! run takes the same path. Timing targets come from the default options (500 ms balancing
//! interval, 5 s ownership expiration).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep};
use tributary_event::{EventData, EventPosition, ReceivedEvent};
#[cfg(feature = "sqlite")]
use tributary_processor::SqliteCheckpointStore;
use tributary_processor::{
    Checkpoint, CheckpointStore, CloseReason, EventProcessor, EventProcessorHost, HostError,
    InMemoryCheckpointStore, LoadBalancingStrategy, Ownership, OwnershipFence, PartitionContext,
    PartitionError, PartitionSource, ProcessorOptions, RunningHost, SourceError, StoreError,
};
use tributary_source::testing::InMemoryPartitionSource;

const NAMESPACE: &str = "ns.test";
const HUB: &str = "orders";
const GROUP: &str = "$Default";

// ---------------------------------------------------------------------------------------------
// A processor that writes down every call.

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Open,
    Events(Vec<i64>),
    Error(PartitionError),
    Close(CloseReason),
}

#[derive(Debug, Clone)]
struct Entry {
    host: String,
    partition_id: String,
    instance: u64,
    call: Call,
}

#[derive(Default)]
struct Journal {
    entries: Mutex<Vec<Entry>>,
    contexts: Mutex<Vec<(String, PartitionContext)>>,
    next_instance: AtomicU64,
}

impl Journal {
    fn record(&self, processor: &Recorder, call: Call) {
        self.entries.lock().unwrap().push(Entry {
            host: processor.host.clone(),
            partition_id: processor.partition_id.clone(),
            instance: processor.instance,
            call,
        });
    }

    fn entries(&self) -> Vec<Entry> {
        self.entries.lock().unwrap().clone()
    }

    /// Every (partition, sequence number) delivered, with how often.
    fn deliveries(&self) -> BTreeMap<(String, i64), usize> {
        let mut deliveries = BTreeMap::new();
        for entry in self.entries() {
            if let Call::Events(sequence_numbers) = entry.call {
                for sequence_number in sequence_numbers {
                    *deliveries
                        .entry((entry.partition_id.clone(), sequence_number))
                        .or_insert(0) += 1;
                }
            }
        }
        deliveries
    }

    fn delivered_to(&self, host: &str, partition_id: &str) -> Vec<i64> {
        self.entries()
            .into_iter()
            .filter(|e| e.host == host && e.partition_id == partition_id)
            .flat_map(|e| match e.call {
                Call::Events(sequence_numbers) => sequence_numbers,
                _ => Vec::new(),
            })
            .collect()
    }

    fn closes(&self, host: &str) -> Vec<(String, CloseReason)> {
        self.entries()
            .into_iter()
            .filter(|e| e.host == host)
            .filter_map(|e| match e.call {
                Call::Close(reason) => Some((e.partition_id, reason)),
                _ => None,
            })
            .collect()
    }

    fn errors(&self) -> Vec<PartitionError> {
        self.entries()
            .into_iter()
            .filter_map(|e| match e.call {
                Call::Error(error) => Some(error),
                _ => None,
            })
            .collect()
    }

    fn context_of(&self, host: &str, partition_id: &str) -> PartitionContext {
        self.contexts
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(h, c)| h == host && c.partition_id() == partition_id)
            .map(|(_, c)| c.clone())
            .expect("the host processed the partition")
    }

    /// Each processor instance was opened first, closed at most once and last.
    fn assert_lifecycles(&self) {
        let mut by_instance: BTreeMap<u64, Vec<Call>> = BTreeMap::new();
        for entry in self.entries() {
            by_instance
                .entry(entry.instance)
                .or_default()
                .push(entry.call);
        }
        for (instance, calls) in by_instance {
            assert_eq!(calls[0], Call::Open, "instance {instance}: {calls:?}");
            let closes = calls.iter().filter(|c| matches!(c, Call::Close(_))).count();
            assert!(closes <= 1, "instance {instance}: {calls:?}");
            if closes == 1 {
                assert!(matches!(calls.last(), Some(Call::Close(_))), "{calls:?}");
            }
        }
    }
}

struct Recorder {
    host: String,
    partition_id: String,
    instance: u64,
    journal: Arc<Journal>,
}

#[async_trait::async_trait]
impl EventProcessor for Recorder {
    async fn open(&mut self, context: &PartitionContext) {
        self.journal
            .contexts
            .lock()
            .unwrap()
            .push((self.host.clone(), context.clone()));
        self.journal.record(self, Call::Open);
    }

    async fn process_events(&mut self, context: &PartitionContext, events: Vec<ReceivedEvent>) {
        let sequence_numbers = events.iter().map(|e| e.sequence_number).collect();
        self.journal.record(self, Call::Events(sequence_numbers));
        // Processing takes a little while, so batches and balancing cycles interleave.
        sleep(Duration::from_millis(5)).await;
        if !events.is_empty() {
            // A refusal here is expected after a steal; the pump then stops on its own.
            let _ = context.checkpoint().await;
        }
    }

    async fn process_error(&mut self, _context: &PartitionContext, error: &PartitionError) {
        self.journal.record(self, Call::Error(error.clone()));
    }

    async fn close(&mut self, context: &PartitionContext, reason: CloseReason) {
        if reason == CloseReason::Shutdown {
            context
                .checkpoint()
                .await
                .expect("still the owner while closing for shutdown");
        }
        self.journal.record(self, Call::Close(reason));
    }
}

// ---------------------------------------------------------------------------------------------
// Setup.

fn test_options(host: &str) -> ProcessorOptions {
    ProcessorOptions {
        host_name: host.to_owned(),
        receive_timeout: Duration::from_secs(1),
        ..ProcessorOptions::default()
    }
}

fn start(
    options: ProcessorOptions,
    source: &Arc<InMemoryPartitionSource>,
    store: Arc<dyn CheckpointStore>,
    journal: &Arc<Journal>,
) -> RunningHost {
    let host = options.host_name.clone();
    let journal = Arc::clone(journal);
    let factory = move |context: &PartitionContext| Recorder {
        host: host.clone(),
        partition_id: context.partition_id().to_owned(),
        instance: journal.next_instance.fetch_add(1, Ordering::SeqCst),
        journal: Arc::clone(&journal),
    };
    let source: Arc<dyn PartitionSource> = source.clone();
    EventProcessorHost::builder(source, store, factory)
        .options(options)
        .build()
        .expect("valid options")
        .start()
        .expect("inside a runtime")
}

fn hub_with_events(
    partition_count: u32,
    events_per_partition: usize,
) -> Arc<InMemoryPartitionSource> {
    let source = Arc::new(InMemoryPartitionSource::new(
        NAMESPACE,
        HUB,
        partition_count,
    ));
    append_to_all(&source, events_per_partition);
    source
}

fn append_to_all(source: &InMemoryPartitionSource, events_per_partition: usize) {
    for partition in 0..source.partition_count() {
        let events = (0..events_per_partition)
            .map(|i| EventData::new(format!("p{partition} e{i}")))
            .collect();
        source.append(&partition.to_string(), events);
    }
}

/// Every event of every partition was delivered at least once.
fn assert_all_delivered(source: &InMemoryPartitionSource, journal: &Journal) {
    let deliveries = journal.deliveries();
    for partition in 0..source.partition_count() {
        let partition_id = partition.to_string();
        for event in source.events(&partition_id) {
            assert!(
                deliveries.contains_key(&(partition_id.clone(), event.sequence_number)),
                "partition {partition_id} event {} never delivered",
                event.sequence_number
            );
        }
    }
}

/// For each partition b took over from a, b's deliveries are exactly the events after the
/// last one a processed (a checkpointed every batch and again while closing), up to
/// `event_count`.
fn assert_resumed_exactly_after(journal: &Journal, a_partitions: &[String], event_count: i64) {
    assert!(!a_partitions.is_empty());
    for partition_id in a_partitions {
        let a_last = *journal.delivered_to("a", partition_id).last().unwrap();
        let b_delivered = journal.delivered_to("b", partition_id);
        let expected: Vec<i64> = (a_last + 1..event_count).collect();
        assert_eq!(b_delivered, expected, "partition {partition_id}");
    }
}

fn owned_sets(hosts: &[&RunningHost]) -> Vec<BTreeSet<String>> {
    hosts
        .iter()
        .map(|h| h.owned_partitions().into_iter().collect())
        .collect()
}

/// The hosts own every partition exactly once, in shares that differ by at most one.
fn assert_even_spread(hosts: &[&RunningHost], partition_count: usize) {
    let sets = owned_sets(hosts);
    let total: usize = sets.iter().map(BTreeSet::len).sum();
    let union: BTreeSet<&String> = sets.iter().flatten().collect();
    assert_eq!(total, partition_count, "{sets:?}");
    assert_eq!(union.len(), partition_count, "{sets:?}");
    let max = sets.iter().map(BTreeSet::len).max().unwrap();
    let min = sets.iter().map(BTreeSet::len).min().unwrap();
    assert!(max - min <= 1, "{sets:?}");
}

async fn store_owner(store: &dyn CheckpointStore, partition_id: &str) -> Option<Ownership> {
    store
        .list_ownership(NAMESPACE, HUB, GROUP)
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.partition_id == partition_id)
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[tokio::test(start_paused = true)]
async fn a_lone_host_processes_all_32_partitions_within_a_second() {
    let source = hub_with_events(32, 3);
    let store = Arc::new(InMemoryCheckpointStore::new());
    let journal = Arc::new(Journal::default());
    let options = ProcessorOptions {
        track_last_enqueued_event_properties: true,
        ..test_options("solo")
    };
    let host = start(options, &source, store.clone(), &journal);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(host.owned_partitions().len(), 32);
    assert_eq!(journal.deliveries().len(), 32 * 3);
    assert_all_delivered(&source, &journal);
    let newest = journal
        .context_of("solo", "7")
        .last_enqueued_event_properties()
        .expect("tracking was asked for");
    assert_eq!(newest.sequence_number, 2);
    assert_eq!(newest.offset, source.events("7")[2].offset);
    // Partitions are listed in numeric order.
    assert_eq!(host.owned_partitions()[..3], ["0", "1", "2"]);
    assert_eq!(host.owned_partitions()[10], "10");
    host.shutdown().await.unwrap();
    journal.assert_lifecycles();
}

#[tokio::test(start_paused = true)]
async fn three_hosts_converge_to_an_even_spread_and_stay_there() {
    let source = hub_with_events(8, 5);
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let journal = Arc::new(Journal::default());
    let a = start(test_options("a"), &source, store.clone(), &journal);
    let b = start(test_options("b"), &source, store.clone(), &journal);
    let c = start(test_options("c"), &source, store.clone(), &journal);
    sleep(Duration::from_secs(5)).await;
    assert_even_spread(&[&a, &b, &c], 8);
    let settled = owned_sets(&[&a, &b, &c]);
    let opened: u64 = (0..8)
        .map(|p| source.receivers_opened(&p.to_string()))
        .sum();

    append_to_all(&source, 5);
    sleep(Duration::from_secs(20)).await;
    assert_eq!(
        owned_sets(&[&a, &b, &c]),
        settled,
        "owners moved after settling"
    );
    let opened_later: u64 = (0..8)
        .map(|p| source.receivers_opened(&p.to_string()))
        .sum();
    assert_eq!(
        opened, opened_later,
        "no receiver was reopened after settling"
    );
    assert_all_delivered(&source, &journal);
    for host in [a, b, c] {
        host.shutdown().await.unwrap();
    }
    journal.assert_lifecycles();
}

#[tokio::test(start_paused = true)]
async fn a_joining_host_takes_its_share_and_the_old_owner_closes_with_ownership_lost() {
    for strategy in [
        LoadBalancingStrategy::Balanced,
        LoadBalancingStrategy::Greedy,
    ] {
        let source = hub_with_events(8, 4);
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        let journal = Arc::new(Journal::default());
        let options = |host: &str| ProcessorOptions {
            load_balancing_strategy: strategy,
            ..test_options(host)
        };
        let a = start(options("a"), &source, store.clone(), &journal);
        sleep(Duration::from_secs(1)).await;
        assert_eq!(a.owned_partitions().len(), 8);
        let b = start(options("b"), &source, store.clone(), &journal);
        sleep(Duration::from_secs(4)).await;
        assert_even_spread(&[&a, &b], 8);

        let moved: BTreeSet<String> = b.owned_partitions().into_iter().collect();
        let closed: BTreeSet<String> = journal
            .closes("a")
            .into_iter()
            .map(|(partition_id, reason)| {
                assert_eq!(reason, CloseReason::OwnershipLost, "{strategy:?}");
                partition_id
            })
            .collect();
        assert_eq!(closed, moved, "{strategy:?}");
        // b read from a's checkpoints: nothing a finished is delivered again.
        assert!(
            journal.deliveries().values().all(|&count| count == 1),
            "{strategy:?}"
        );
        // b's receivers outrank a's: the owner level is the version b won.
        for partition_id in &moved {
            let level = source.active_owner_level(partition_id, GROUP).unwrap();
            assert!(level >= 2, "{strategy:?}: {partition_id} at {level}");
        }
        append_to_all(&source, 2);
        sleep(Duration::from_secs(1)).await;
        assert_all_delivered(&source, &journal);
        a.shutdown().await.unwrap();
        b.shutdown().await.unwrap();
        journal.assert_lifecycles();
    }
}

/// A processor whose batches take a minute; notes when a batch is cancelled and how it closed.
#[derive(Default)]
struct SlowBatches {
    inside_since: Option<Instant>,
    cancelled_at: Option<Instant>,
    finished: u32,
    closed: Option<CloseReason>,
}

struct SlowProcessor(Arc<Mutex<SlowBatches>>);

/// Notes a cancelled batch when dropped before the batch finished.
struct BatchGuard(Arc<Mutex<SlowBatches>>);

impl Drop for BatchGuard {
    fn drop(&mut self) {
        let mut state = self.0.lock().unwrap();
        if state.inside_since.take().is_some() {
            state.cancelled_at = Some(Instant::now());
        }
    }
}

#[async_trait::async_trait]
impl EventProcessor for SlowProcessor {
    async fn process_events(&mut self, _context: &PartitionContext, _events: Vec<ReceivedEvent>) {
        self.0.lock().unwrap().inside_since = Some(Instant::now());
        let _guard = BatchGuard(Arc::clone(&self.0));
        sleep(Duration::from_secs(60)).await;
        let mut state = self.0.lock().unwrap();
        state.inside_since = None;
        state.finished += 1;
    }

    async fn close(&mut self, _context: &PartitionContext, reason: CloseReason) {
        self.0.lock().unwrap().closed = Some(reason);
    }
}

/// A new owner that could not wait for the former one (see `handoff.rs`) opens its receiver
/// with a higher owner level while the former owner, which has not noticed in the store, is in
/// the middle of a batch: that batch is cancelled at once, before the clock moves on.
#[tokio::test(start_paused = true)]
async fn a_receiver_taken_over_by_a_higher_owner_level_cancels_the_batch_in_progress() {
    let source = hub_with_events(1, 3);
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let state = Arc::new(Mutex::new(SlowBatches::default()));
    let shared = Arc::clone(&state);
    let factory = move |_: &PartitionContext| SlowProcessor(Arc::clone(&shared));
    let source_dyn: Arc<dyn PartitionSource> = source.clone();
    let host = EventProcessorHost::builder(source_dyn, store, factory)
        .options(test_options("a"))
        .build()
        .unwrap()
        .start()
        .unwrap();
    sleep(Duration::from_secs(1)).await;
    assert!(state.lock().unwrap().inside_since.is_some());

    let taken_at = Instant::now();
    let options = tributary_source::ReceiverOptions {
        partition_id: "0".to_owned(),
        consumer_group: GROUP.to_owned(),
        start: EventPosition::Earliest,
        owner_level: Some(1_000),
        prefetch: 10,
        track_last_enqueued: false,
    };
    let _new_owner = source.open_receiver(options).await.unwrap();
    sleep(Duration::from_secs(1)).await;
    let state = state.lock().unwrap();
    assert_eq!(state.cancelled_at, Some(taken_at));
    assert_eq!(state.finished, 0);
    assert_eq!(state.closed, Some(CloseReason::OwnershipLost));
    assert!(host.owned_partitions().is_empty());
    host.abort();
}

#[tokio::test(start_paused = true)]
async fn a_graceful_shutdown_hands_every_partition_over_within_a_second_from_its_checkpoints() {
    let source = hub_with_events(8, 10);
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let journal = Arc::new(Journal::default());
    let a = start(test_options("a"), &source, store.clone(), &journal);
    let b = start(test_options("b"), &source, store.clone(), &journal);
    sleep(Duration::from_secs(5)).await;
    assert_even_spread(&[&a, &b], 8);
    let a_partitions = a.owned_partitions();
    // a started with every partition and lost half of them to b while balancing.
    let closed_while_balancing = journal.closes("a").len();
    assert_eq!(closed_while_balancing, 8 - a_partitions.len());

    a.shutdown().await.unwrap();
    let shutdown_at = Instant::now();
    let a_closes = journal.closes("a").split_off(closed_while_balancing);
    assert!(
        a_closes
            .iter()
            .all(|(_, reason)| *reason == CloseReason::Shutdown)
    );
    assert_eq!(a_closes.len(), a_partitions.len());
    for partition_id in &a_partitions {
        let record = store_owner(store.as_ref(), partition_id).await.unwrap();
        assert!(record.owner_id.is_empty() || record.owner_id == "b");
    }
    while b.owned_partitions().len() < 8 {
        sleep(Duration::from_millis(10)).await;
    }
    let takeover = shutdown_at.elapsed();
    assert!(takeover <= Duration::from_secs(1), "took {takeover:?}");

    append_to_all(&source, 3);
    sleep(Duration::from_secs(2)).await;
    assert_all_delivered(&source, &journal);
    assert_resumed_exactly_after(&journal, &a_partitions, 13);
    b.shutdown().await.unwrap();
    journal.assert_lifecycles();
}

#[tokio::test(start_paused = true)]
async fn a_crashed_host_is_replaced_after_the_expiration_and_its_checkpoints_are_refused() {
    let source = hub_with_events(8, 6);
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let journal = Arc::new(Journal::default());
    let a = start(test_options("a"), &source, store.clone(), &journal);
    let b = start(test_options("b"), &source, store.clone(), &journal);
    sleep(Duration::from_secs(5)).await;
    assert_even_spread(&[&a, &b], 8);
    let a_partitions = a.owned_partitions();
    let zombie = journal.context_of("a", &a_partitions[0]);
    let a_level = source.active_owner_level(&a_partitions[0], GROUP).unwrap();
    let closed_before_crash = journal.closes("a").len();

    a.abort();
    let crashed_at = Instant::now();
    append_to_all(&source, 4);
    // Before the expiration nobody may take a's partitions: a might just be slow.
    sleep(Duration::from_millis(4_400)).await;
    assert_eq!(b.owned_partitions().len(), 4);
    while b.owned_partitions().len() < 8 {
        sleep(Duration::from_millis(10)).await;
    }
    let takeover = crashed_at.elapsed();
    assert!(takeover <= Duration::from_secs(7), "took {takeover:?}");
    assert!(takeover >= Duration::from_secs(5), "took {takeover:?}");
    sleep(Duration::from_secs(1)).await;
    assert_all_delivered(&source, &journal);
    assert_eq!(
        journal.closes("a").len(),
        closed_before_crash,
        "a crashed: nothing more was closed"
    );

    // b's receiver displaced a's lingering one with a higher owner level.
    let b_level = source.active_owner_level(&a_partitions[0], GROUP).unwrap();
    assert!(b_level > a_level, "{b_level} vs {a_level}");
    // A checkpoint from a's leftover context is refused and changes nothing.
    let before = store.list_checkpoints(NAMESPACE, HUB, GROUP).await.unwrap();
    let stale = source.events(&a_partitions[0])[0].clone();
    let refused = zombie.checkpoint_at(&stale).await.unwrap_err();
    match refused {
        StoreError::OwnershipLost { current_owner, .. } => assert_eq!(current_owner, "b"),
        other => panic!("expected OwnershipLost, got {other:?}"),
    }
    assert!(zombie.checkpoint().await.is_err());
    let after = store.list_checkpoints(NAMESPACE, HUB, GROUP).await.unwrap();
    assert_eq!(before, after);
    b.shutdown().await.unwrap();
    journal.assert_lifecycles();
}

#[tokio::test(start_paused = true)]
async fn receive_errors_go_to_process_error_and_the_pump_resumes_after_the_last_batch() {
    let source = hub_with_events(2, 3);
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let journal = Arc::new(Journal::default());
    source.fail_next_open(SourceError::Transient {
        description: "link detached".to_owned(),
    });
    let host = start(test_options("a"), &source, store.clone(), &journal);
    sleep(Duration::from_secs(1)).await;
    source.fail_next_receive(
        "1",
        SourceError::Transient {
            description: "connection reset".to_owned(),
        },
    );
    sleep(Duration::from_secs(1)).await;
    append_to_all(&source, 3);
    sleep(Duration::from_secs(2)).await;

    let errors = journal.errors();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, PartitionError::OpenReceiver { .. }))
    );
    assert!(errors.iter().any(|e| matches!(
        e,
        PartitionError::Receive {
            source: SourceError::Transient { .. }
        }
    )));
    assert_all_delivered(&source, &journal);
    assert!(
        journal.deliveries().values().all(|&count| count == 1),
        "a reopened receiver starts after the last delivered event"
    );
    assert_eq!(
        host.owned_partitions().len(),
        2,
        "an error is not an ownership loss"
    );
    host.shutdown().await.unwrap();
    journal.assert_lifecycles();
}

#[tokio::test(start_paused = true)]
async fn empty_batches_arrive_on_receive_timeout_only_when_asked_for() {
    for invoke in [false, true] {
        let source = hub_with_events(1, 0);
        let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
        let journal = Arc::new(Journal::default());
        let options = ProcessorOptions {
            invoke_processor_after_receive_timeout: invoke,
            receive_timeout: Duration::from_secs(1),
            ..test_options("a")
        };
        let host = start(options, &source, store, &journal);
        sleep(Duration::from_millis(3_600)).await;
        let empty_batches = journal
            .entries()
            .iter()
            .filter(|e| e.call == Call::Events(Vec::new()))
            .count();
        if invoke {
            assert_eq!(empty_batches, 3);
        } else {
            assert_eq!(empty_batches, 0);
        }
        host.shutdown().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn partitions_start_at_their_checkpoint_else_at_the_initial_position() {
    let source = hub_with_events(3, 10);
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    // Partition 2 was checkpointed at sequence number 6 by an earlier host, which then left.
    let claimed = store
        .claim_ownership(vec![Ownership {
            fully_qualified_namespace: NAMESPACE.to_owned(),
            event_hub_name: HUB.to_owned(),
            consumer_group: GROUP.to_owned(),
            partition_id: "2".to_owned(),
            owner_id: "earlier".to_owned(),
            last_modified_time_ms: 0,
            etag: None,
            version: 0,
        }])
        .await
        .unwrap();
    let sixth = source.events("2")[6].clone();
    let checkpoint = Checkpoint {
        fully_qualified_namespace: NAMESPACE.to_owned(),
        event_hub_name: HUB.to_owned(),
        consumer_group: GROUP.to_owned(),
        partition_id: "2".to_owned(),
        offset: Some(sixth.offset),
        sequence_number: Some(sixth.sequence_number),
    };
    let fence = OwnershipFence {
        owner_id: "earlier".to_owned(),
    };
    store.update_checkpoint(checkpoint, &fence).await.unwrap();
    let release = Ownership {
        owner_id: String::new(),
        ..claimed[0].clone()
    };
    store.claim_ownership(vec![release]).await.unwrap();

    let journal = Arc::new(Journal::default());
    let options = test_options("a").with_initial_position(|partition_id| match partition_id {
        "0" => EventPosition::SequenceNumber {
            sequence_number: 5,
            inclusive: true,
        },
        _ => EventPosition::Earliest,
    });
    let host = start(options, &source, store, &journal);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(journal.delivered_to("a", "0"), (5..10).collect::<Vec<_>>());
    assert_eq!(journal.delivered_to("a", "1"), (0..10).collect::<Vec<_>>());
    assert_eq!(journal.delivered_to("a", "2"), (7..10).collect::<Vec<_>>());
    host.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_start_position_override_replaces_the_checkpoint_and_a_failing_one_waits() {
    let source = hub_with_events(3, 10);
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let journal = Arc::new(Journal::default());
    let failures = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&failures);
    let mut options = test_options("a");
    options.start_position_override = Some(Arc::new(move |partition_id, checkpoint| {
        assert!(checkpoint.is_none(), "no checkpoint was written");
        let answer = match partition_id {
            // Where the processor's own output says it got to.
            "0" => Ok(Some(EventPosition::SequenceNumber {
                sequence_number: 3,
                inclusive: false,
            })),
            // Fails twice, then keeps the host's choice.
            "1" if counted.fetch_add(1, Ordering::SeqCst) < 2 => Err("not yet".to_owned()),
            _ => Ok(None),
        };
        Box::pin(async move { answer })
    }));
    let host = start(options, &source, store, &journal);
    sleep(Duration::from_secs(3)).await;
    assert_eq!(journal.delivered_to("a", "0"), (4..10).collect::<Vec<_>>());
    assert_eq!(journal.delivered_to("a", "1"), (0..10).collect::<Vec<_>>());
    assert_eq!(journal.delivered_to("a", "2"), (0..10).collect::<Vec<_>>());
    assert!(
        failures.load(Ordering::SeqCst) >= 3,
        "asked again after failing"
    );
    host.shutdown().await.unwrap();
}

/// A store that fails every call while `failing` is set.
struct FlakyStore {
    inner: InMemoryCheckpointStore,
    failing: AtomicBool,
}

impl FlakyStore {
    fn check(&self) -> Result<(), StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(StoreError::Backend {
                operation: "anything",
                description: "injected outage".to_owned(),
            });
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl CheckpointStore for FlakyStore {
    async fn list_ownership(
        &self,
        ns: &str,
        hub: &str,
        group: &str,
    ) -> Result<Vec<Ownership>, StoreError> {
        self.check()?;
        self.inner.list_ownership(ns, hub, group).await
    }

    async fn claim_ownership(&self, claims: Vec<Ownership>) -> Result<Vec<Ownership>, StoreError> {
        self.check()?;
        self.inner.claim_ownership(claims).await
    }

    async fn list_checkpoints(
        &self,
        ns: &str,
        hub: &str,
        group: &str,
    ) -> Result<Vec<Checkpoint>, StoreError> {
        self.check()?;
        self.inner.list_checkpoints(ns, hub, group).await
    }

    async fn update_checkpoint(
        &self,
        checkpoint: Checkpoint,
        fence: &OwnershipFence,
    ) -> Result<(), StoreError> {
        self.check()?;
        self.inner.update_checkpoint(checkpoint, fence).await
    }
}

#[tokio::test(start_paused = true)]
async fn store_outages_are_reported_and_a_host_that_cannot_renew_stops_its_pumps() {
    let source = hub_with_events(4, 2);
    let store = Arc::new(FlakyStore {
        inner: InMemoryCheckpointStore::new(),
        failing: AtomicBool::new(false),
    });
    let journal = Arc::new(Journal::default());
    let reported = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&reported);
    let options = test_options("a").with_error_notifier(move |error: &HostError| {
        sink.lock().unwrap().push(error.clone());
    });
    let host = start(options, &source, store.clone(), &journal);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(host.owned_partitions().len(), 4);

    // A short outage: reported, nothing else changes.
    store.failing.store(true, Ordering::SeqCst);
    sleep(Duration::from_secs(2)).await;
    store.failing.store(false, Ordering::SeqCst);
    sleep(Duration::from_secs(1)).await;
    assert!(
        reported
            .lock()
            .unwrap()
            .iter()
            .all(|e| matches!(e, HostError::Store(StoreError::Backend { .. })))
    );
    assert!(!reported.lock().unwrap().is_empty());
    assert_eq!(host.owned_partitions().len(), 4);
    assert!(journal.closes("a").is_empty());

    // An outage longer than the expiration: others may own the partitions now, so stop.
    store.failing.store(true, Ordering::SeqCst);
    sleep(Duration::from_secs(6)).await;
    assert!(host.owned_partitions().is_empty());
    assert!(reported.lock().unwrap().iter().any(|e| matches!(
        e,
        HostError::RenewalExpired {
            partition_count: 4,
            ..
        }
    )));
    let closes = journal.closes("a");
    assert_eq!(closes.len(), 4);
    assert!(closes.iter().all(|(_, r)| *r == CloseReason::OwnershipLost));

    // When the store is back the host reclaims its partitions and resumes from checkpoints.
    store.failing.store(false, Ordering::SeqCst);
    append_to_all(&source, 2);
    sleep(Duration::from_secs(7)).await;
    assert_eq!(host.owned_partitions().len(), 4);
    assert_all_delivered(&source, &journal);
    host.shutdown().await.unwrap();
    journal.assert_lifecycles();
}

#[tokio::test(start_paused = true)]
async fn a_panicking_processor_is_reported_and_its_partition_restarts_from_the_checkpoint() {
    let source = hub_with_events(1, 3);
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let reported = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&reported);
    let panicked_once = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (flag, log) = (Arc::clone(&panicked_once), Arc::clone(&seen));
    let factory = tributary_processor::processor_fn(move |context, events| {
        let (flag, log) = (Arc::clone(&flag), Arc::clone(&log));
        async move {
            let sequence_numbers: Vec<i64> = events.iter().map(|e| e.sequence_number).collect();
            log.lock().unwrap().push(sequence_numbers);
            if !flag.swap(true, Ordering::SeqCst) {
                panic!("poison event");
            }
            context.checkpoint().await.unwrap();
        }
    });
    let options = test_options("a").with_error_notifier(move |error: &HostError| {
        sink.lock().unwrap().push(error.clone());
    });
    let source_dyn: Arc<dyn PartitionSource> = source.clone();
    let host = EventProcessorHost::builder(source_dyn, store, factory)
        .options(options)
        .build()
        .unwrap()
        .start()
        .unwrap();
    sleep(Duration::from_secs(2)).await;
    let reported = reported.lock().unwrap().clone();
    assert_eq!(
        reported,
        [HostError::ProcessorPanicked {
            partition_id: "0".to_owned(),
            message: "poison event".to_owned()
        }]
    );
    // Delivered twice: once to the processor that panicked, once after the restart.
    assert_eq!(*seen.lock().unwrap(), [vec![0, 1, 2], vec![0, 1, 2]]);
    assert_eq!(host.owned_partitions(), ["0"]);
    host.shutdown().await.unwrap();
}

/// Waits (on real time) until `condition` holds; fails the test after 30 s.
#[cfg(feature = "sqlite")]
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    eventually_async(what, || std::future::ready(condition())).await;
}

/// [`eventually`] for a condition that must await (a store's answer).
#[cfg(feature = "sqlite")]
async fn eventually_async<F: std::future::Future<Output = bool>>(
    what: &str,
    condition: impl Fn() -> F,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !condition().await {
        assert!(
            std::time::Instant::now() < deadline,
            "not reached within 30 s: {what}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// Runs on real time: the SQLite store does real blocking I/O, and a paused clock auto-advances
/// while the runtime waits for it, which would make the timeline depend on machine load.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn hosts_sharing_a_sqlite_file_balance_and_hand_over() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("checkpoints.db");
    let source = hub_with_events(4, 5);
    let journal = Arc::new(Journal::default());
    // One store per host: separate connections, as separate processes would have.
    let store_a: Arc<dyn CheckpointStore> =
        Arc::new(SqliteCheckpointStore::open(&path).await.unwrap());
    let store_b: Arc<dyn CheckpointStore> =
        Arc::new(SqliteCheckpointStore::open(&path).await.unwrap());
    let a = start(test_options("a"), &source, store_a, &journal);
    let b = start(test_options("b"), &source, store_b.clone(), &journal);
    // Real time on a machine that may be loaded: wait for each state with a generous deadline.
    eventually("an even spread", || {
        a.owned_partitions().len() == 2 && b.owned_partitions().len() == 2
    })
    .await;
    assert_even_spread(&[&a, &b], 4);
    let a_partitions = a.owned_partitions();
    // Everything there is gets processed (and checkpointed: the test processor checkpoints
    // every batch) before a leaves.
    let all_five = |p: &String| {
        let mut seen = journal.delivered_to("a", p);
        seen.extend(journal.delivered_to("b", p));
        (0..5).all(|s| seen.contains(&s))
    };
    eventually("every event processed", || {
        a_partitions.iter().all(all_five)
    })
    .await;
    // Deliveries alone do not say a partition is checkpointed: its events may have been
    // delivered by b before a took it over, and a taken-over batch's checkpoint is fenced
    // off (b no longer owns the partition), so a starts it again from the last stored
    // checkpoint, and may be shut down before it got there. Wait for the stored checkpoints,
    // so that a leaves with every partition checkpointed past event 4.
    eventually_async("every partition checkpointed", || {
        let (store, partitions) = (store_b.clone(), a_partitions.clone());
        async move {
            let checkpoints = store.list_checkpoints(NAMESPACE, HUB, GROUP).await.unwrap();
            partitions.iter().all(|p| {
                checkpoints
                    .iter()
                    .any(|c| &c.partition_id == p && c.sequence_number == Some(4))
            })
        }
    })
    .await;
    let b_before: Vec<usize> = a_partitions
        .iter()
        .map(|p| journal.delivered_to("b", p).len())
        .collect();
    a.shutdown().await.unwrap();
    eventually("b owning all", || b.owned_partitions().len() == 4).await;
    append_to_all(&source, 2);
    eventually("b delivering everything", || {
        (0..4).all(|p| journal.delivered_to("b", &p.to_string()).last() == Some(&6))
    })
    .await;
    assert_all_delivered(&source, &journal);
    // b continued a's partitions exactly after their checkpoints: nothing delivered twice.
    for (p, before) in a_partitions.iter().zip(b_before) {
        assert_eq!(
            journal.delivered_to("b", p)[before..],
            [5, 6],
            "partition {p}"
        );
    }
    b.shutdown().await.unwrap();
    let records = store_b.list_ownership(NAMESPACE, HUB, GROUP).await.unwrap();
    assert_eq!(records.len(), 4);
    assert!(records.iter().all(|r| r.owner_id.is_empty()));
    journal.assert_lifecycles();
}

#[tokio::test(start_paused = true)]
async fn dropping_the_handle_shuts_down_gracefully_in_the_background() {
    let source = hub_with_events(2, 1);
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let journal = Arc::new(Journal::default());
    let host = start(test_options("a"), &source, store.clone(), &journal);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(host.host_name(), "a");
    assert_eq!(host.owned_partitions(), ["0", "1"]);
    drop(host);
    sleep(Duration::from_millis(100)).await;
    let closes = journal.closes("a");
    assert_eq!(closes.len(), 2);
    assert!(closes.iter().all(|(_, r)| *r == CloseReason::Shutdown));
    for partition_id in ["0", "1"] {
        let record = store_owner(store.as_ref(), partition_id).await.unwrap();
        assert!(record.is_relinquished(), "{record:?}");
    }
}

/// With `fully_qualified_namespace` set, the host keys its records and reports its contexts by
/// that name rather than the source's.
#[tokio::test(start_paused = true)]
async fn records_are_keyed_by_the_namespace_option_instead_of_the_sources() {
    let source = hub_with_events(2, 1);
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let journal = Arc::new(Journal::default());
    let options = ProcessorOptions {
        fully_qualified_namespace: Some("localhost".to_owned()),
        ..test_options("a")
    };
    let host = start(options, &source, store.clone(), &journal);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        journal.context_of("a", "0").fully_qualified_namespace(),
        "localhost"
    );
    let owned = store.list_ownership("localhost", HUB, GROUP).await.unwrap();
    assert_eq!(owned.len(), 2, "{owned:?}");
    let under_the_source = store.list_ownership(NAMESPACE, HUB, GROUP).await.unwrap();
    assert_eq!(under_the_source, Vec::new());
    host.shutdown().await.unwrap();
    let checkpoints = store
        .list_checkpoints("localhost", HUB, GROUP)
        .await
        .unwrap();
    assert_eq!(checkpoints.len(), 2, "{checkpoints:?}");
}

#[tokio::test(start_paused = true)]
async fn invalid_options_are_refused_when_building() {
    let source: Arc<dyn PartitionSource> = hub_with_events(1, 0);
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let factory = tributary_processor::processor_fn(|_context, _events| async {});
    let error = EventProcessorHost::builder(source, store, factory)
        .options(ProcessorOptions {
            prefetch_count: 10,
            batch_events_max: 20,
            ..ProcessorOptions::default()
        })
        .build()
        .unwrap_err();
    assert_eq!(error.option, "prefetch_count");
}

#[test]
fn starting_outside_a_runtime_is_an_error() {
    let source: Arc<dyn PartitionSource> = hub_with_events(1, 0);
    let store: Arc<dyn CheckpointStore> = Arc::new(InMemoryCheckpointStore::new());
    let factory = tributary_processor::processor_fn(|_context, _events| async {});
    let host = EventProcessorHost::builder(source, store, factory)
        .build()
        .unwrap();
    assert_eq!(host.start().unwrap_err(), HostError::NoRuntime);
}
