//! Prometheus metrics, encoded by `prometheus-client` in the OpenMetrics text format.
//!
//! Counted as requests pass: `tributary_http_requests` and the latency histogram
//! `tributary_http_request_duration_seconds` (by matched route, method and status), and the
//! messages and key+value bytes the HTTP front door put and got, by hub and partition. Read from
//! the broker and the coordinator at each scrape (so they cover every front door): each
//! partition's next sequence number (events ever appended), open receivers per hub, and each
//! server-side group's lag per partition (messages after its committed offset), and the
//! log's disk time: `tributary_log_sync_duration_seconds` (each `fdatasync` the group committer
//! made) and `tributary_log_append_sync_wait_seconds` (each `fsync` append's wait for the sync
//! that made it durable — the disk's share of its acknowledgement).
//!
//! `tributary_throttled_total{door,hub,direction}` counts the requests each front door
//! throttled under the throughput limits (refused, or made to wait), read from the broker's
//! throttle ([`tributary_broker::throttle`]) at each scrape.
//!
//! For each partition of a hub that compacts: `tributary_compaction_bytes_before` and
//! `tributary_compaction_bytes_after` (the range compaction's last run rewrote, before and
//! after), `tributary_compaction_dirty_ratio` (the share of the partition's bytes compaction
//! has not yet seen) and `tributary_compaction_last_run_timestamp_seconds` (absent until a run
//! since the server started).
//!
//! For each partition of a captured hub (as its capture reports it to the broker):
//! `tributary_capture_lag_events`, `tributary_capture_lag_seconds` (the oldest uncaptured
//! event's wait), `tributary_capture_files_written`, `tributary_capture_bytes_written`,
//! `tributary_capture_errors`, `tributary_capture_last_success_timestamp_seconds`,
//! `tributary_capture_retention_held` and `tributary_capture_uncaptured_events_removed`.

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use tributary_broker::{Broker, DurationCounts, HubDefinition};
use tributary_groups::GroupCoordinator;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartitionLabels {
    hub: String,
    partition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HubLabels {
    hub: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabels {
    hub: String,
    group: String,
    partition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ThrottleLabels {
    door: String,
    hub: String,
    direction: String,
}

fn latency_histogram() -> Histogram {
    // 0.5 ms to about 16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// A histogram counted elsewhere — by the log's group committer, in its own buckets — and
/// copied in at each scrape.
#[derive(Debug, Clone, Default)]
struct CountedHistogram(Arc<Mutex<DurationCounts>>);

impl CountedHistogram {
    fn set(&self, counts: DurationCounts) {
        *self.0.lock().expect("histogram") = counts;
    }
}

impl TypedMetric for CountedHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for CountedHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let counts = self.0.lock().expect("histogram").clone();
        let buckets: Vec<(f64, u64)> = counts
            .buckets()
            .map(|(bound, n)| (bound.map_or(f64::INFINITY, |b| b.as_secs_f64()), n))
            .collect();
        encoder.encode_histogram::<NoLabelSet>(
            counts.total.as_secs_f64(),
            counts.count,
            &buckets,
            None,
        )
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Compaction's progress per partition of each hub that compacts, read at each scrape.
#[derive(Debug, Default)]
struct CompactionGauges {
    bytes_before: Family<PartitionLabels, Gauge>,
    bytes_after: Family<PartitionLabels, Gauge>,
    dirty_ratio: Family<PartitionLabels, Gauge<f64, AtomicU64>>,
    last_run: Family<PartitionLabels, Gauge<f64, AtomicU64>>,
}

impl CompactionGauges {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "compaction_bytes_before",
            "Bytes of the range compaction's last run rewrote, before it",
            self.bytes_before.clone(),
        );
        registry.register(
            "compaction_bytes_after",
            "Bytes of the range compaction's last run rewrote, after it",
            self.bytes_after.clone(),
        );
        registry.register(
            "compaction_dirty_ratio",
            "The share of the partition's bytes compaction has not yet seen",
            self.dirty_ratio.clone(),
        );
        registry.register(
            "compaction_last_run_timestamp_seconds",
            "When compaction last ran on the partition (Unix time)",
            self.last_run.clone(),
        );
    }

    fn clear(&self) {
        self.bytes_before.clear();
        self.bytes_after.clear();
        self.dirty_ratio.clear();
        self.last_run.clear();
    }

    #[allow(clippy::cast_precision_loss)]
    fn refresh(&self, broker: &Broker, hub: &HubDefinition) {
        if !hub.cleanup.policy.compacts() {
            return;
        }
        let Ok(states) = broker.compaction_states(&hub.name) else {
            return;
        };
        for (p, state) in states.iter().enumerate() {
            let labels = PartitionLabels {
                hub: hub.name.clone(),
                partition: p.to_string(),
            };
            self.dirty_ratio
                .get_or_create(&labels)
                .set(state.dirty_ratio);
            if let Some(ms) = state.last_run_ms {
                self.last_run.get_or_create(&labels).set(ms as f64 / 1000.0);
            }
            if let Some(outcome) = state.last_outcome {
                let gauge = |bytes: u64| i64::try_from(bytes).unwrap_or(i64::MAX);
                self.bytes_before
                    .get_or_create(&labels)
                    .set(gauge(outcome.bytes_before));
                self.bytes_after
                    .get_or_create(&labels)
                    .set(gauge(outcome.bytes_after));
            }
        }
    }
}

/// Each captured partition's capture, read at each scrape from what the capture reports to
/// the broker.
#[derive(Debug, Default)]
struct CaptureGauges {
    lag_events: Family<PartitionLabels, Gauge>,
    lag_seconds: Family<PartitionLabels, Gauge<f64, AtomicU64>>,
    files: Family<PartitionLabels, Gauge>,
    bytes: Family<PartitionLabels, Gauge>,
    errors: Family<PartitionLabels, Gauge>,
    last_success: Family<PartitionLabels, Gauge<f64, AtomicU64>>,
    retention_held: Family<PartitionLabels, Gauge>,
    removed: Family<PartitionLabels, Gauge>,
}

impl CaptureGauges {
    fn register(&self, registry: &mut Registry) {
        let gauges: [(&str, &str, Family<PartitionLabels, Gauge>); 6] = [
            (
                "capture_lag_events",
                "Events appended to the partition and not yet in a capture file",
                self.lag_events.clone(),
            ),
            (
                "capture_files_written",
                "Capture files published since the server started",
                self.files.clone(),
            ),
            (
                "capture_bytes_written",
                "Bytes of the capture files published since the server started",
                self.bytes.clone(),
            ),
            (
                "capture_errors",
                "Failed capture steps since the server started (each retried)",
                self.errors.clone(),
            ),
            (
                "capture_retention_held",
                "1 while retention keeps segments past the retention for the capture",
                self.retention_held.clone(),
            ),
            (
                "capture_uncaptured_events_removed",
                "Events retention removed before they were captured (serve --capture-retention proceed)",
                self.removed.clone(),
            ),
        ];
        for (name, help, family) in gauges {
            registry.register(name, help, family);
        }
        registry.register(
            "capture_lag_seconds",
            "How long the oldest event not yet captured has waited",
            self.lag_seconds.clone(),
        );
        registry.register(
            "capture_last_success_timestamp_seconds",
            "When a capture step last succeeded (Unix time)",
            self.last_success.clone(),
        );
    }

    fn clear(&self) {
        for family in [
            &self.lag_events,
            &self.files,
            &self.bytes,
            &self.errors,
            &self.retention_held,
            &self.removed,
        ] {
            family.clear();
        }
        self.lag_seconds.clear();
        self.last_success.clear();
    }

    #[allow(clippy::cast_precision_loss)]
    fn refresh(&self, broker: &Broker, hub: &HubDefinition, next: &[i64]) {
        if hub.capture.is_none() {
            return;
        }
        let now_ms = broker.clock().now_ms();
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for (p, status) in broker
            .capture_statuses(&hub.name, hub.partition_count)
            .iter()
            .enumerate()
        {
            let labels = PartitionLabels {
                hub: hub.name.clone(),
                partition: p.to_string(),
            };
            let next_sequence = next.get(p).copied().unwrap_or(0);
            self.lag_events
                .get_or_create(&labels)
                .set(status.lag_events(next_sequence));
            self.lag_seconds
                .get_or_create(&labels)
                .set(status.lag_seconds(now_ms));
            self.files
                .get_or_create(&labels)
                .set(gauge(status.files_written));
            self.bytes
                .get_or_create(&labels)
                .set(gauge(status.bytes_written));
            self.errors.get_or_create(&labels).set(gauge(status.errors));
            self.retention_held
                .get_or_create(&labels)
                .set(i64::from(status.retention_held));
            self.removed
                .get_or_create(&labels)
                .set(gauge(status.uncaptured_events_removed));
            if let Some(ms) = status.last_success_ms {
                self.last_success
                    .get_or_create(&labels)
                    .set(ms as f64 / 1000.0);
            }
        }
    }
}

/// The front door's metrics.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RequestLabels, Histogram, fn() -> Histogram>,
    events_in: Family<PartitionLabels, Counter>,
    bytes_in: Family<PartitionLabels, Counter>,
    events_out: Family<PartitionLabels, Counter>,
    bytes_out: Family<PartitionLabels, Counter>,
    next_sequence: Family<PartitionLabels, Gauge>,
    receivers: Family<HubLabels, Gauge>,
    lag: Family<GroupLabels, Gauge>,
    compaction: CompactionGauges,
    capture: CaptureGauges,
    log_syncs: CountedHistogram,
    log_sync_waits: CountedHistogram,
    throttled: Family<ThrottleLabels, Counter>,
    scrape: Mutex<()>,
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tributary");
        let m = Metrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            events_in: Family::default(),
            bytes_in: Family::default(),
            events_out: Family::default(),
            bytes_out: Family::default(),
            next_sequence: Family::default(),
            receivers: Family::default(),
            lag: Family::default(),
            compaction: CompactionGauges::default(),
            capture: CaptureGauges::default(),
            log_syncs: CountedHistogram::default(),
            log_sync_waits: CountedHistogram::default(),
            throttled: Family::default(),
            scrape: Mutex::new(()),
            registry: Registry::default(),
        };
        registry.register(
            "http_requests",
            "HTTP requests answered",
            m.requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency",
            m.latency.clone(),
        );
        registry.register(
            "http_events_in",
            "Messages put over HTTP",
            m.events_in.clone(),
        );
        registry.register(
            "http_event_bytes_in",
            "Key and value bytes put over HTTP",
            m.bytes_in.clone(),
        );
        registry.register(
            "http_events_out",
            "Messages got over HTTP",
            m.events_out.clone(),
        );
        registry.register(
            "http_event_bytes_out",
            "Key and value bytes got over HTTP",
            m.bytes_out.clone(),
        );
        registry.register("partition_next_sequence_number", "Events ever appended to the partition (its next sequence number), over all front doors", m.next_sequence.clone());
        registry.register(
            "hub_open_receivers",
            "Receivers open on the hub",
            m.receivers.clone(),
        );
        registry.register(
            "group_lag_events",
            "Messages after the server-side consumer group's committed offset",
            m.lag.clone(),
        );
        m.compaction.register(&mut registry);
        m.capture.register(&mut registry);
        m.register_broker_counts(&mut registry);
        Metrics { registry, ..m }
    }

    /// Registers what is read from the broker at each scrape besides the gauges: the log's
    /// sync times and the throttled requests.
    fn register_broker_counts(&self, registry: &mut Registry) {
        registry.register(
            "log_sync_duration_seconds",
            "Each sync the log made for fsync appends (an fdatasync, or a syncfs shared by partitions with --sync-scope filesystem)",
            self.log_syncs.clone(),
        );
        registry.register(
            "log_append_sync_wait_seconds",
            "Each fsync append's wait from its write to the return of the sync that made it durable",
            self.log_sync_waits.clone(),
        );
        registry.register(
            "throttled",
            "Requests a front door throttled under the throughput limits (refused, or made to wait)",
            self.throttled.clone(),
        );
    }

    pub(crate) fn request(&self, route: &str, method: &str, status: u16, seconds: f64) {
        let labels = RequestLabels {
            route: route.to_owned(),
            method: method.to_owned(),
            status,
        };
        self.requests.get_or_create(&labels).inc();
        self.latency.get_or_create(&labels).observe(seconds);
    }

    pub(crate) fn put(&self, hub: &str, partition: u32, events: u64, bytes: u64) {
        let labels = PartitionLabels {
            hub: hub.to_owned(),
            partition: partition.to_string(),
        };
        self.events_in.get_or_create(&labels).inc_by(events);
        self.bytes_in.get_or_create(&labels).inc_by(bytes);
    }

    pub(crate) fn got(&self, hub: &str, partition: u32, events: u64, bytes: u64) {
        let labels = PartitionLabels {
            hub: hub.to_owned(),
            partition: partition.to_string(),
        };
        self.events_out.get_or_create(&labels).inc_by(events);
        self.bytes_out.get_or_create(&labels).inc_by(bytes);
    }

    /// Catches the throttled-request counters up with the broker's counts (which only grow).
    fn refresh_throttled(&self, broker: &Broker) {
        for (door, hub, direction, n) in broker.throttle().throttled_counts() {
            let labels = ThrottleLabels {
                door: door.to_owned(),
                hub,
                direction: direction.as_str().to_owned(),
            };
            let counter = self.throttled.get_or_create(&labels);
            counter.inc_by(n.saturating_sub(counter.get()));
        }
    }

    /// Refreshes the scrape-time gauges and encodes everything.
    pub(crate) fn encode(&self, broker: &Broker, coordinator: &GroupCoordinator) -> String {
        let _one_scrape_at_a_time = self.scrape.lock().expect("scrape lock");
        self.next_sequence.clear();
        self.receivers.clear();
        self.lag.clear();
        self.compaction.clear();
        self.capture.clear();
        let mut next_by_partition = std::collections::HashMap::new();
        for hub in broker.list_hubs() {
            let mut next_of_hub = Vec::new();
            for p in 0..hub.partition_count {
                let Ok(props) = broker.partition_properties(&hub.name, &p.to_string()) else {
                    continue;
                };
                let next = props.last_enqueued_sequence_number + 1;
                next_of_hub.push(next);
                next_by_partition.insert((hub.name.to_ascii_lowercase(), p), next);
                let labels = PartitionLabels {
                    hub: hub.name.clone(),
                    partition: p.to_string(),
                };
                self.next_sequence.get_or_create(&labels).set(next);
            }
            self.compaction.refresh(broker, &hub);
            self.capture.refresh(broker, &hub, &next_of_hub);
            if let Ok(n) = broker.open_receiver_count(&hub.name) {
                let n = i64::try_from(n).unwrap_or(i64::MAX);
                self.receivers
                    .get_or_create(&HubLabels {
                        hub: hub.name.clone(),
                    })
                    .set(n);
            }
        }
        for group in coordinator.list(None) {
            for (p, committed) in group.committed.iter().enumerate() {
                let key = (group.stream.to_ascii_lowercase(), p as u32);
                let Some(next) = next_by_partition.get(&key) else {
                    continue;
                };
                let labels = GroupLabels {
                    hub: group.stream.clone(),
                    group: group.group.clone(),
                    partition: p.to_string(),
                };
                self.lag
                    .get_or_create(&labels)
                    .set((next - committed).max(0));
            }
        }
        self.refresh_throttled(broker);
        let sync_times = broker.sync_times();
        self.log_syncs.set(sync_times.syncs);
        self.log_sync_waits.set(sync_times.waits);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String does not fail");
        out
    }
}
