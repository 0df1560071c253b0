//! The bounds of this crate, each with its reason.

use std::time::Duration;

/// How long a metadata, watermark or time-lookup request may take. librdkafka retries across
/// brokers within it; 10 s covers a leader election on a healthy cluster, and a cluster that
/// answers nothing in that time is reported as a transient failure for the caller to retry.
pub const CLUSTER_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a receiver that tracks the partition's last enqueued event asks for the high
/// watermark: one small request a second per partition costs the cluster nothing, and lag
/// shown a second late is what Event Hubs' own runtime metrics give too.
pub const WATERMARKS_REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// The most bytes librdkafka may hold fetched ahead per receiver, in KiB
/// (`queued.max.messages.kbytes`): 16 MiB is 16 events of the 1 MiB largest, and bounds a
/// process reading 32 partitions to half a gibibyte of prefetched records at worst.
pub const PREFETCH_KIB_MAX: u32 = 16 * 1024;

/// How long librdkafka waits before fetching again once a receiver's prefetch queue is above
/// its bounds (`fetch.queue.backoff.ms`, 1,000 by default). One fetch answer can hold a
/// mebibyte per partition — thousands of small records, more than the prefetch — and with the
/// default a receiver that drained it would sit idle for the rest of a second. 10 ms keeps the
/// check cheap and the queue fed.
pub const FETCH_QUEUE_BACKOFF_MS: u32 = 10;

/// How long the cluster may hold a fetch open waiting for records (`fetch.wait.max.ms`): a
/// record appended to an idle partition reaches the receiver within this, and an idle receiver
/// sends about ten fetches a second.
pub const FETCH_WAIT_MS_MAX: u32 = 100;

/// The room each event's property list is made with beyond the record's own properties: a
/// replication task stamps six `repl-*` properties on every event it forwards, and may mark a
/// fan-out and Azure's merge target besides. Made with that room, the list is never grown (a
/// copy of it) by the stamp; an event nobody stamps carries the unused room, a few hundred
/// bytes, only while it is held.
pub const PROPERTY_ROOM: usize = 8;
