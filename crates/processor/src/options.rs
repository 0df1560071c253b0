//! How a host reads, balances and reports: [`ProcessorOptions`] and their validation.
//!
//! The options follow Event Processor Host's `EventProcessorOptions` (max batch size, prefetch
//! count, invoke after receive timeout, initial offset provider, exception notifications) plus the
//! load-balancing knobs of `EventProcessorClient` (strategy, interval, ownership expiration).
//! [`ProcessorOptions::validate`] refuses combinations that cannot work, naming the option and
//! what would be accepted; the host builder calls it.
//!
//! # Why the timing defaults are what they are
//!
//! The defaults — a 500 ms balancing interval and a 5 s ownership expiration — are chosen for
//! three targets:
//!
//! - **A crashed host (`kill -9`) is replaced within 10 s.** Its records stop changing version;
//!   another host sees that within one interval of the last renewal, declares them expired 5 s
//!   later and claims them on its next cycle: at most about 5 s + 2 × 500 ms = 6 s, plus opening
//!   receivers.
//! - **After a graceful shutdown another host takes over within 1 s.** Shutdown relinquishes
//!   every partition; relinquished partitions are free at once, so the next cycle of any other
//!   host (at most 500 ms away) claims them.
//! - **One host on a 32-partition hub processes all 32 within 1 s.** The first cycle runs at
//!   start, and a host takes every free partition it is short of in one cycle.
//!
//! The cost is one store call per host every 500 ms where the store keeps host records (memory,
//! SQLite, PostgreSQL, the hub-hosted store: a host renewal that lists ownership too), else a
//! list and a claim call renewing every owned partition; the in-process and SQLite stores answer
//! in well under a millisecond. Against a remote store (Azure blobs), raise
//! both — the Azure SDKs use 10–30 s intervals and 60–120 s expirations. The expiration is 10
//! intervals, so nine renewals in a row can fail or be late before a live host loses its
//! partitions.

use std::sync::Arc;
use std::time::Duration;

use tributary_event::EventPosition;
use tributary_event::names::{DEFAULT_CONSUMER_GROUP, validate_consumer_group_name};

use crate::error::{HostError, InvalidOption};
use crate::limits::{
    BATCH_EVENTS_LIMIT, EXPIRATION_INTERVALS_MIN, HOST_NAME_CHARS_MAX, LOAD_BALANCING_INTERVAL_MIN,
    PREFETCH_COUNT_LIMIT,
};

/// Picks where to start reading a partition that has no checkpoint; called with the partition id.
pub type InitialPositionProvider = Arc<dyn Fn(&str) -> EventPosition + Send + Sync>;

/// Asked when a partition is initialised (before its pump starts), with the partition id and
/// its checkpoint in the store, if any: `Ok(Some(position))` starts there instead of where the
/// checkpoint (or the initial position) says, `Ok(None)` keeps the host's choice, and `Err`
/// leaves the partition unstarted until the next balancing cycle asks again (the reason is
/// logged). For a processor whose output holds its own progress — rows written in one
/// transaction with the position they came from — so it resumes from what it actually has,
/// whether the checkpoint store lags behind or runs ahead. Bounded by the store timeout.
pub type StartPositionOverride = Arc<
    dyn Fn(
            &str,
            Option<&crate::Checkpoint>,
        ) -> std::pin::Pin<
            Box<dyn Future<Output = Result<Option<EventPosition>, String>> + Send + 'static>,
        > + Send
        + Sync,
>;

/// Receives the host's own errors (see [`HostError`]). Called on the host's task: keep it quick.
pub type ErrorNotifier = Arc<dyn Fn(&HostError) + Send + Sync>;

/// How a host claims partitions beyond the free ones it is short of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadBalancingStrategy {
    /// Move only the partitions an even split needs moved — from owners above their share to
    /// owners below it, by a plan every host computes alike from the same records — all in one
    /// cycle; a host that owns nothing first steals one, to be seen by the others' plans. Each
    /// partition restarts from its checkpoint at most once on the way to an even split.
    #[default]
    Balanced,
    /// Steal, each cycle, every partition needed to reach a fair share from the most loaded
    /// owners, whatever the others plan: no wait to be seen, but hosts racing for the same
    /// partitions make more partitions restart, and against a slow store it can keep moving
    /// partitions for a long time (see BENCHMARKS.md).
    Greedy,
}

/// Options of one [`EventProcessorHost`](crate::EventProcessorHost).
#[derive(Clone)]
pub struct ProcessorOptions {
    /// This host's name in ownership records. Must be unique among the hosts of a consumer
    /// group (two hosts with one name would both think they own the same partitions), so do not
    /// hard-code it. Default: `"<machine host name>-<random UUID>"`.
    pub host_name: String,
    /// The consumer group to read in. Default: `$Default`.
    pub consumer_group: String,
    /// The fully qualified namespace the host's ownership and checkpoint records are keyed by.
    /// Processors balance a consumer group together only when they key it alike. Default:
    /// `None`, the source's namespace (a connection string's host name, as the official .NET
    /// and JavaScript processors use). Set it when the processors of one group reach the hub
    /// by different names — one through `127.0.0.1`, another through `localhost` — or to join
    /// processors that key their records differently.
    pub fully_qualified_namespace: Option<String>,
    /// The most events in one `process_events` call; fewer when fewer are available. Default:
    /// 100 (enough to amortise a checkpoint per batch, small enough to keep a batch's latency
    /// low).
    pub batch_events_max: u32,
    /// How many events the receiver may buffer ahead of the processor; at least
    /// `batch_events_max`. Default: 300 (three batches), as in Event Processor Host.
    pub prefetch_count: u32,
    /// Whether `process_events` is called with an empty batch when `receive_timeout` passes
    /// without an event, for time-based work while a partition is idle. Default: `false`.
    pub invoke_processor_after_receive_timeout: bool,
    /// How long one receive waits for the first event. Default: 60 s, as in Event Processor
    /// Host; it only matters with `invoke_processor_after_receive_timeout`.
    pub receive_timeout: Duration,
    /// Where to start a partition that has no checkpoint. Default: the earliest event.
    pub initial_position_provider: InitialPositionProvider,
    /// Where a partition starts instead of its checkpoint, when set (see
    /// [`StartPositionOverride`]). Default: none.
    pub start_position_override: Option<StartPositionOverride>,
    /// Called with errors that concern the host rather than one partition (store failures,
    /// listing partitions, a panicking processor). Default: none; they are logged either way.
    pub error_notifier: Option<ErrorNotifier>,
    /// How to claim partitions from other hosts. Default: [`LoadBalancingStrategy::Balanced`].
    pub load_balancing_strategy: LoadBalancingStrategy,
    /// How often the host renews its ownership and rebalances. Default: 500 ms (see the module
    /// docs).
    pub load_balancing_interval: Duration,
    /// How long an ownership record's version must stay unchanged before other hosts treat the
    /// partition as free. At least three intervals: an observer can see a live owner's latest
    /// renewal up to two intervals late, and the third is margin for a slow store call (see
    /// [`EXPIRATION_INTERVALS_MIN`](crate::limits::EXPIRATION_INTERVALS_MIN)). It is also the
    /// longest a partition taken from a live owner waits before it is processed (see the
    /// module docs of `handoff`). Default: 5 s (see the module docs).
    pub ownership_expiration: Duration,
    /// Whether receivers report the partition's last enqueued event, for
    /// [`PartitionContext::last_enqueued_event_properties`](crate::PartitionContext::last_enqueued_event_properties).
    /// Default: `false`.
    pub track_last_enqueued_event_properties: bool,
}

impl std::fmt::Debug for ProcessorOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessorOptions")
            .field("host_name", &self.host_name)
            .field("consumer_group", &self.consumer_group)
            .field("fully_qualified_namespace", &self.fully_qualified_namespace)
            .field("batch_events_max", &self.batch_events_max)
            .field("prefetch_count", &self.prefetch_count)
            .field(
                "invoke_processor_after_receive_timeout",
                &self.invoke_processor_after_receive_timeout,
            )
            .field("receive_timeout", &self.receive_timeout)
            .field("error_notifier", &self.error_notifier.is_some())
            .field(
                "start_position_override",
                &self.start_position_override.is_some(),
            )
            .field("load_balancing_strategy", &self.load_balancing_strategy)
            .field("load_balancing_interval", &self.load_balancing_interval)
            .field("ownership_expiration", &self.ownership_expiration)
            .field(
                "track_last_enqueued_event_properties",
                &self.track_last_enqueued_event_properties,
            )
            .finish_non_exhaustive()
    }
}

impl Default for ProcessorOptions {
    fn default() -> Self {
        ProcessorOptions {
            host_name: generated_host_name(),
            consumer_group: DEFAULT_CONSUMER_GROUP.to_owned(),
            fully_qualified_namespace: None,
            batch_events_max: 100,
            prefetch_count: 300,
            invoke_processor_after_receive_timeout: false,
            receive_timeout: Duration::from_secs(60),
            initial_position_provider: Arc::new(|_| EventPosition::Earliest),
            start_position_override: None,
            error_notifier: None,
            load_balancing_strategy: LoadBalancingStrategy::Balanced,
            load_balancing_interval: Duration::from_millis(500),
            ownership_expiration: Duration::from_secs(5),
            track_last_enqueued_event_properties: false,
        }
    }
}

impl ProcessorOptions {
    /// Sets where partitions without a checkpoint start (builder style).
    pub fn with_initial_position(
        mut self,
        provider: impl Fn(&str) -> EventPosition + Send + Sync + 'static,
    ) -> Self {
        self.initial_position_provider = Arc::new(provider);
        self
    }

    /// Sets the callback for host errors (builder style).
    pub fn with_error_notifier(
        mut self,
        notifier: impl Fn(&HostError) + Send + Sync + 'static,
    ) -> Self {
        self.error_notifier = Some(Arc::new(notifier));
        self
    }

    /// Checks that the options can work together; the error names the option and the fix.
    pub fn validate(&self) -> Result<(), InvalidOption> {
        validate_host_name(&self.host_name)?;
        validate_consumer_group_name(&self.consumer_group).map_err(|error| InvalidOption {
            option: "consumer_group",
            reason: error.to_string(),
        })?;
        if self
            .fully_qualified_namespace
            .as_ref()
            .is_some_and(|n| n.trim().is_empty())
        {
            return Err(InvalidOption {
                option: "fully_qualified_namespace",
                reason: "is empty; leave it None to use the source's namespace".to_owned(),
            });
        }
        self.validate_batching()?;
        self.validate_timing()
    }

    fn validate_batching(&self) -> Result<(), InvalidOption> {
        if self.batch_events_max == 0 || self.batch_events_max > BATCH_EVENTS_LIMIT {
            return Err(InvalidOption {
                option: "batch_events_max",
                reason: format!(
                    "{} is outside 1..={BATCH_EVENTS_LIMIT}",
                    self.batch_events_max
                ),
            });
        }
        if self.prefetch_count < self.batch_events_max || self.prefetch_count > PREFETCH_COUNT_LIMIT
        {
            return Err(InvalidOption {
                option: "prefetch_count",
                reason: format!(
                    "{} must be at least batch_events_max ({}) — a batch is taken from the \
                     prefetched events — and at most {PREFETCH_COUNT_LIMIT}",
                    self.prefetch_count, self.batch_events_max
                ),
            });
        }
        Ok(())
    }

    fn validate_timing(&self) -> Result<(), InvalidOption> {
        if self.receive_timeout.is_zero() {
            return Err(InvalidOption {
                option: "receive_timeout",
                reason: "must be longer than zero".to_owned(),
            });
        }
        if self.load_balancing_interval < LOAD_BALANCING_INTERVAL_MIN {
            return Err(InvalidOption {
                option: "load_balancing_interval",
                reason: format!(
                    "{} ms is below the minimum of {} ms",
                    self.load_balancing_interval.as_millis(),
                    LOAD_BALANCING_INTERVAL_MIN.as_millis()
                ),
            });
        }
        let expiration_min = self.load_balancing_interval * EXPIRATION_INTERVALS_MIN;
        if self.ownership_expiration < expiration_min {
            return Err(InvalidOption {
                option: "ownership_expiration",
                reason: format!(
                    "{} ms is less than {EXPIRATION_INTERVALS_MIN} × load_balancing_interval \
                     ({} ms); live hosts would be taken for dead and partitions would change \
                     owner constantly — raise it to at least {} ms or shorten the interval",
                    self.ownership_expiration.as_millis(),
                    self.load_balancing_interval.as_millis(),
                    expiration_min.as_millis()
                ),
            });
        }
        Ok(())
    }
}

fn validate_host_name(host_name: &str) -> Result<(), InvalidOption> {
    let invalid = |reason: &str| {
        Err(InvalidOption {
            option: "host_name",
            reason: reason.to_owned(),
        })
    };
    if host_name.trim().is_empty() {
        return invalid(
            "the host name is empty (an empty owner means \"relinquished\"); leave the default \
             or give each instance a unique name",
        );
    }
    if host_name.chars().count() > HOST_NAME_CHARS_MAX {
        return invalid("the host name is longer than 256 characters");
    }
    if host_name.chars().any(char::is_control) {
        return invalid("the host name contains control characters");
    }
    Ok(())
}

/// `"<machine host name>-<random UUID>"`: unique per instance, and still says which machine an
/// ownership record came from.
pub(crate) fn generated_host_name() -> String {
    let machine = ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty() && !name.chars().any(char::is_control))
        .unwrap_or_else(|| "host".to_owned());
    let machine: String = machine.chars().take(64).collect();
    format!("{machine}-{}", uuid::Uuid::new_v4())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(options: &ProcessorOptions) -> InvalidOption {
        options
            .validate()
            .expect_err("the options should be refused")
    }

    #[test]
    fn the_defaults_are_valid_and_meet_the_timing_targets() {
        let options = ProcessorOptions::default();
        assert_eq!(options.validate(), Ok(()));
        assert_eq!(options.consumer_group, "$Default");
        assert_eq!(options.batch_events_max, 100);
        assert_eq!(options.prefetch_count, 300);
        assert!(!options.invoke_processor_after_receive_timeout);
        assert_eq!(
            options.load_balancing_strategy,
            LoadBalancingStrategy::Balanced
        );
        // Crash recovery: expiration + two intervals must be well under 10 s.
        let crash_takeover = options.ownership_expiration + options.load_balancing_interval * 2;
        assert!(
            crash_takeover <= Duration::from_secs(7),
            "{crash_takeover:?}"
        );
        // Graceful hand-over: the next cycle of another host is one interval away.
        assert!(options.load_balancing_interval <= Duration::from_millis(500));
        assert_eq!(
            (options.initial_position_provider)("3"),
            EventPosition::Earliest
        );
    }

    #[test]
    fn generated_host_names_are_unique_and_valid() {
        let first = ProcessorOptions::default().host_name;
        let second = ProcessorOptions::default().host_name;
        assert_ne!(first, second);
        assert_eq!(validate_host_name(&first), Ok(()));
        assert!(first.len() > 37, "{first}");
    }

    #[test]
    fn host_names_must_be_usable_as_owner_ids() {
        for bad in ["", "   ", "a\nb", &"h".repeat(257)] {
            let options = ProcessorOptions {
                host_name: bad.to_owned(),
                ..ProcessorOptions::default()
            };
            assert_eq!(refused(&options).option, "host_name", "{bad:?}");
        }
    }

    #[test]
    fn the_consumer_group_must_be_a_legal_name() {
        let options = ProcessorOptions {
            consumer_group: "no spaces".to_owned(),
            ..ProcessorOptions::default()
        };
        let error = refused(&options);
        assert_eq!(error.option, "consumer_group");
        assert!(error.to_string().contains("only letters"), "{error}");
        let options = ProcessorOptions {
            consumer_group: "$default".to_owned(),
            ..ProcessorOptions::default()
        };
        assert_eq!(options.validate(), Ok(()));
    }

    #[test]
    fn a_namespace_given_must_not_be_empty() {
        let options = ProcessorOptions {
            fully_qualified_namespace: Some(" ".to_owned()),
            ..ProcessorOptions::default()
        };
        assert_eq!(refused(&options).option, "fully_qualified_namespace");
        let options = ProcessorOptions {
            fully_qualified_namespace: Some("localhost".to_owned()),
            ..ProcessorOptions::default()
        };
        assert_eq!(options.validate(), Ok(()));
    }

    #[test]
    fn batch_size_and_prefetch_must_fit_together() {
        let cases = [
            (0, 300, "batch_events_max"),
            (
                BATCH_EVENTS_LIMIT + 1,
                PREFETCH_COUNT_LIMIT,
                "batch_events_max",
            ),
            (100, 99, "prefetch_count"),
            (100, PREFETCH_COUNT_LIMIT + 1, "prefetch_count"),
        ];
        for (batch_events_max, prefetch_count, option) in cases {
            let options = ProcessorOptions {
                batch_events_max,
                prefetch_count,
                ..ProcessorOptions::default()
            };
            assert_eq!(
                refused(&options).option,
                option,
                "{batch_events_max}/{prefetch_count}"
            );
        }
        let options = ProcessorOptions {
            batch_events_max: 100,
            prefetch_count: 100,
            ..ProcessorOptions::default()
        };
        assert_eq!(options.validate(), Ok(()));
    }

    #[test]
    fn expiration_must_cover_three_intervals() {
        let options = ProcessorOptions {
            load_balancing_interval: Duration::from_secs(1),
            ownership_expiration: Duration::from_millis(2_999),
            ..ProcessorOptions::default()
        };
        let error = refused(&options);
        assert_eq!(error.option, "ownership_expiration");
        assert!(error.to_string().contains("at least 3000 ms"), "{error}");
        let options = ProcessorOptions {
            ownership_expiration: Duration::from_secs(3),
            ..options
        };
        assert_eq!(options.validate(), Ok(()));
    }

    #[test]
    fn intervals_and_timeouts_have_floors() {
        let options = ProcessorOptions {
            load_balancing_interval: Duration::from_millis(10),
            ..ProcessorOptions::default()
        };
        assert_eq!(refused(&options).option, "load_balancing_interval");
        let options = ProcessorOptions {
            receive_timeout: Duration::ZERO,
            ..ProcessorOptions::default()
        };
        assert_eq!(refused(&options).option, "receive_timeout");
    }

    #[test]
    fn builder_helpers_set_the_callbacks() {
        let options = ProcessorOptions::default()
            .with_initial_position(|partition_id| {
                if partition_id == "0" {
                    EventPosition::Latest
                } else {
                    EventPosition::Earliest
                }
            })
            .with_error_notifier(|_| {});
        assert_eq!(
            (options.initial_position_provider)("0"),
            EventPosition::Latest
        );
        assert_eq!(
            (options.initial_position_provider)("1"),
            EventPosition::Earliest
        );
        assert!(options.error_notifier.is_some());
        assert!(format!("{options:?}").contains("error_notifier: true"));
    }
}
