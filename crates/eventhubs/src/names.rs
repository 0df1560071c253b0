//! The names of the Event Hubs dialect: message annotations, link and application properties,
//! the `$cbs` and `$management` request and response fields, and the batch message format.
//!
//! Both ends of a Tributary connection take these from here, so a name the server writes is the
//! name the client reads. Error conditions are in [`crate::condition`], node addresses in
//! [`crate::address`].

/// The transfer message format of a batch of events: Microsoft's, registered in the AMQP
/// message-format space. Its `data` sections each hold one complete encoded message.
pub const BATCH_MESSAGE_FORMAT: u32 = 0x8001_3700;

/// Message annotations the hub reads on events sent to it and stamps on events it delivers.
pub mod annotation {
    /// The partition key (string): set by the sender, kept with the event.
    pub const PARTITION_KEY: &str = "x-opt-partition-key";
    /// The sequence number the hub assigned (long).
    pub const SEQUENCE_NUMBER: &str = "x-opt-sequence-number";
    /// The offset the hub assigned (a decimal string).
    pub const OFFSET: &str = "x-opt-offset";
    /// When the hub enqueued the event (timestamp).
    pub const ENQUEUED_TIME: &str = "x-opt-enqueued-time";
    /// The legacy name of [`ENQUEUED_TIME`] some selector filters still use.
    pub const ENQUEUED_TIME_LEGACY: &str = "x-opt-enqueuedtimeutc";
}

/// Delivery annotations of the receiver runtime metric: the partition's last-enqueued event,
/// sent with each delivery when the receiver asked for
/// [`link::RUNTIME_METRIC_CAPABILITY`].
pub mod runtime_metric {
    /// The last-enqueued event's sequence number (long).
    pub const LAST_ENQUEUED_SEQUENCE_NUMBER: &str = "last_enqueued_sequence_number";
    /// The last-enqueued event's offset (string).
    pub const LAST_ENQUEUED_OFFSET: &str = "last_enqueued_offset";
    /// When the last event was enqueued (timestamp).
    pub const LAST_ENQUEUED_TIME_UTC: &str = "last_enqueued_time_utc";
    /// When the hub read these figures (timestamp).
    pub const RETRIEVAL_TIME_UTC: &str = "runtime_info_retrieval_time_utc";
}

/// Link properties, capabilities and filters of the Event Hubs receive link.
pub mod link {
    /// The link property carrying the owner level (long).
    pub const EPOCH: &str = "com.microsoft:epoch";
    /// The link property naming the receiver (shown in the hub's quota errors).
    pub const RECEIVER_NAME: &str = "com.microsoft:receiver-name";
    /// The desired capability asking for last-enqueued-event annotations on deliveries.
    pub const RUNTIME_METRIC_CAPABILITY: &str = "com.microsoft:enable-receiver-runtime-metric";
    /// The filter-set key of the selector filter (see [`crate::selector`]).
    pub const SELECTOR_FILTER_KEY: &str = "apache.org:selector-filter:string";
    /// The descriptor code of the selector filter's described value.
    pub const SELECTOR_FILTER_CODE: u64 = 0x0000_468C_0000_0004;
}

/// The application properties of `$cbs` and `$management` requests and responses, and the
/// keys of the `$management` answers.
pub mod management {
    /// Request property: the operation.
    pub const OPERATION: &str = "operation";
    /// The `$cbs` operation putting a token.
    pub const PUT_TOKEN: &str = "put-token";
    /// The `$management` operation reading an entity's properties.
    pub const READ: &str = "READ";
    /// Request property: the token type (`$cbs`) or entity type (`$management`).
    pub const TYPE: &str = "type";
    /// Request property: the audience (`$cbs`) or hub name (`$management`).
    pub const NAME: &str = "name";
    /// Request property: when a put token expires.
    pub const EXPIRATION: &str = "expiration";
    /// Request property, and answer key: the partition id.
    pub const PARTITION: &str = "partition";
    /// Request property: the token authorizing a `$management` request.
    pub const SECURITY_TOKEN: &str = "security_token";
    /// The token type of a SAS token.
    pub const SAS_TOKEN_TYPE: &str = "servicebus.windows.net:sastoken";
    /// The entity type of an event hub.
    pub const EVENTHUB_TYPE: &str = "com.microsoft:eventhub";
    /// The entity type of a partition.
    pub const PARTITION_TYPE: &str = "com.microsoft:partition";
    /// Response property: the HTTP-style status code (int).
    pub const STATUS_CODE: &str = "status-code";
    /// Response property: the status in words.
    pub const STATUS_DESCRIPTION: &str = "status-description";
    /// Response property: the error condition of a failed request.
    pub const ERROR_CONDITION: &str = "error-condition";
    /// [`STATUS_CODE`] as older services spell it.
    pub const STATUS_CODE_CAMEL: &str = "statusCode";
    /// [`STATUS_DESCRIPTION`] as older services spell it.
    pub const STATUS_DESCRIPTION_CAMEL: &str = "statusDescription";
    /// [`ERROR_CONDITION`] as older services spell it.
    pub const ERROR_CONDITION_CAMEL: &str = "errorCondition";
    /// Answer key: when the hub was created (timestamp).
    pub const CREATED_AT: &str = "created_at";
    /// Answer key, Tributary's own: the hub's stable, unique identity (string; a UUID). Azure
    /// Event Hubs does not send it, and the SDKs ignore keys they do not know.
    pub const HUB_ID: &str = "com.tributary:hub-id";
    /// Answer key: how many partitions the hub has (int).
    pub const PARTITION_COUNT: &str = "partition_count";
    /// Answer key: the partition ids (array of strings).
    pub const PARTITION_IDS: &str = "partition_ids";
    /// Answer key: the oldest retained sequence number (long).
    pub const BEGIN_SEQUENCE_NUMBER: &str = "begin_sequence_number";
    /// Answer key: the newest sequence number (long).
    pub const LAST_ENQUEUED_SEQUENCE_NUMBER: &str = "last_enqueued_sequence_number";
    /// Answer key: the newest offset (string, `-1` when empty).
    pub const LAST_ENQUEUED_OFFSET: &str = "last_enqueued_offset";
    /// Answer key: when the newest event was enqueued (timestamp).
    pub const LAST_ENQUEUED_TIME_UTC: &str = "last_enqueued_time_utc";
    /// Answer key: whether the partition holds no events (bool).
    pub const IS_PARTITION_EMPTY: &str = "is_partition_empty";
    /// Answer key: the epoch (geo-replication segment) of the oldest retained sequence number
    /// (int). Azure Event Hubs always sends it; Java reads it as an optional integer, and the Rust
    /// SDK refuses an answer without `LAST_ENQUEUED_SEQUENCE_NUMBER_EPOCH`.
    pub const BEGIN_SEQUENCE_NUMBER_EPOCH: &str = "begin_sequence_number_epoch";
    /// Answer key: the epoch (geo-replication segment) of the newest sequence number (int).
    pub const LAST_ENQUEUED_SEQUENCE_NUMBER_EPOCH: &str = "last_enqueued_sequence_number_epoch";
}

/// Tributary's own `$management` operations: the checkpoint store a Tributary hub hosts (see
/// [`crate::checkpoint_store`]). Azure Event Hubs does not know them and refuses them.
pub mod checkpoint_store {
    /// Operation: every ownership record of a consumer group.
    pub const LIST_OWNERSHIP: &str = "com.tributary:list-ownership";
    /// Operation: conditional claims of partitions; answers the won records.
    pub const CLAIM_OWNERSHIP: &str = "com.tributary:claim-ownership";
    /// Operation: every checkpoint of a consumer group.
    pub const LIST_CHECKPOINTS: &str = "com.tributary:list-checkpoints";
    /// Operation: a checkpoint, fenced by its owner id.
    pub const UPDATE_CHECKPOINT: &str = "com.tributary:update-checkpoint";
    /// Operation: renew a processor host's liveness record; answers the group's ownership and
    /// host records.
    pub const RENEW_HOST: &str = "com.tributary:renew-host";
    /// Operation: forget a processor host's liveness record.
    pub const REMOVE_HOST: &str = "com.tributary:remove-host";
    /// List a group's ownership and host records, renewing nothing (answered like
    /// [`RENEW_HOST`]).
    pub const LIST_HOSTS: &str = "com.tributary:list-hosts";
    /// Request property: the consumer group (the hub is [`super::management::NAME`]).
    pub const CONSUMER_GROUP: &str = "com.tributary:consumer-group";
    /// Request property: of an update, the owner id the partition's record must show; of a
    /// host renewal or removal, the host's owner id.
    pub const FENCE_OWNER_ID: &str = "com.tributary:owner-id";
    /// Listing key: the ownership records (list).
    pub const OWNERSHIP: &str = "ownership";
    /// Listing key: the host records (list of maps with `owner-id`, `version`,
    /// `last-modified`).
    pub const HOSTS: &str = "hosts";
    /// Response property on every answer to these operations (int, the protocol's version,
    /// 1): what tells a hub that hosts checkpoints from one that refused an unknown operation.
    pub const STORE_VERSION: &str = "com.tributary:checkpoint-store";
    /// Response property of a refused checkpoint: the partition's owner on record (`""`: nobody).
    pub const CURRENT_OWNER_ID: &str = "com.tributary:current-owner-id";
    /// Record key: the partition id (string).
    pub const PARTITION_ID: &str = "partition-id";
    /// Record key: the owner id (string).
    pub const OWNER_ID: &str = "owner-id";
    /// Record key: the etag (string, or null in a first claim).
    pub const ETAG: &str = "etag";
    /// Record key: the ownership version (long).
    pub const VERSION: &str = "version";
    /// Record key: when the record last changed (timestamp).
    pub const LAST_MODIFIED: &str = "last-modified";
    /// Record key: the checkpoint's offset (ulong, or null).
    pub const OFFSET: &str = "offset";
    /// Record key: the checkpoint's sequence number (long, or null).
    pub const SEQUENCE_NUMBER: &str = "sequence-number";
}
