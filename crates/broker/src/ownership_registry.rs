//! The ownership and checkpoint registry: the hub-hosted checkpoint store of event processors.
//!
//! Per (event hub, consumer group, partition) the broker keeps who owns the partition (an
//! [`OwnershipRecord`]: owner id, etag, version, last-modified time) and how far the group has
//! processed it (a [`CheckpointRecord`]), with the semantics of the processor's checkpoint
//! stores (the broker does not depend on the processor crate; these are its own types):
//!
//! - A claim is conditional: without an etag it wins only if the partition has no record, with
//!   one only if the record still has that etag. A lost race is left out of the answer, not an
//!   error. Every won claim gets a fresh etag, the broker's time and the next version; versions
//!   never go back (the processor opens its receiver with the version as its epoch).
//! - A checkpoint is fenced: it is written only if the fence's owner id is the partition's
//!   current (non-empty) owner, else [`BrokerError::OwnershipLost`] and nothing changes.
//! - A processor host may keep a liveness record ([`ProcessorHostRecord`]) per group, renewed
//!   with every balancing cycle, which proves all its ownership records alive at once. Host
//!   records live in memory only: after a restart every host's next renewal creates its record
//!   again, and processors count any change of a record's version as a renewal.
//! - Hub and group names compare case-insensitively; a claim or checkpoint for an unknown hub,
//!   group or partition is refused. Deleting a hub or a consumer group deletes its records.
//!
//! # Durability
//! One small JSON file per (hub, consumer group), `hubs/<hub>/processor/<group>.json`, replaced
//! atomically on every change: written to a temporary file, `fsync`ed, renamed over the old one,
//! and the directory `fsync`ed — before the claim or checkpoint is acknowledged. A `kill -9`
//! therefore leaves the old or the new file, never a torn one, and never loses an acknowledged
//! change. A file per group rather than an append log: a group holds at most one record of each
//! kind per partition (1,024 at most, a few tens of kilobytes), so rewriting it is cheap, and
//! there is no log to compact or replay. Every change is serialised by one lock, which is what
//! makes a claim's compare-and-write atomic.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use tributary_event::EventPosition;
use tributary_event::names::name_key;

use crate::catalog::check_json_format;
use crate::hub::Hub;
use crate::{Broker, BrokerError};

/// The longest owner id a claim or fence may carry, in bytes.
pub const OWNER_ID_BYTES_MAX: usize = 256;

/// How recently an owner must have claimed or renewed a partition to count as running when its
/// group's checkpoints are reset. Processors renew at every load-balancing interval (0.5 s by
/// default, expiring after 5 s); a minute leaves room for slow intervals and long expirations.
pub const OWNER_RUNNING_WINDOW_MS: i64 = 60_000;

/// How long a host record is kept without a renewal: a live processor renews every balancing
/// interval, so a record this old is a crashed host's (as the processor's own stores keep them).
pub const PROCESSOR_HOST_RETENTION_MS: i64 = 24 * 60 * 60 * 1000;

/// The format of a group's records file (see [`tributary_event::format`]).
const FILE_VERSION: u32 = 1;

/// A processor host's liveness record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorHostRecord {
    /// The host's owner id.
    pub owner_id: String,
    /// One more with every renewal, starting at 1.
    pub version: i64,
    /// When the broker last renewed it, ms since the Unix epoch (its clock).
    pub last_modified_ms: i64,
}

/// Who owns one partition for one consumer group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnershipRecord {
    /// The partition id.
    pub partition_id: String,
    /// The owner's id; `""` when the partition was relinquished.
    pub owner_id: String,
    /// Changes with every won claim; a claim must present the current one.
    pub etag: String,
    /// One more with every won claim, starting at 1; never goes back.
    pub version: i64,
    /// When the broker last changed the record, ms since the Unix epoch (its clock).
    pub last_modified_ms: i64,
}

/// A claim of one partition: wins if `etag` is the record's current etag, or if `etag` is
/// `None` and the partition has no record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnershipClaim {
    /// The partition id.
    pub partition_id: String,
    /// The new owner id (`""` relinquishes the partition).
    pub owner_id: String,
    /// The etag the claimant last saw; `None`: only if no record exists.
    pub etag: Option<String>,
}

/// How far one consumer group processed one partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointRecord {
    /// The partition id.
    pub partition_id: String,
    /// The offset of the last processed event.
    pub offset: Option<u64>,
    /// The sequence number of the last processed event.
    pub sequence_number: Option<i64>,
}

/// One partition of one consumer group as the dashboard shows it: its owner and checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessorPartitionState {
    /// The partition id.
    pub partition_id: String,
    /// The owner (`""`: relinquished or never claimed).
    pub owner_id: String,
    /// The ownership version (0: never claimed).
    pub version: i64,
    /// When ownership last changed, ms since the Unix epoch (0: never claimed).
    pub last_modified_ms: i64,
    /// The checkpoint's offset, if any.
    pub checkpoint_offset: Option<u64>,
    /// The checkpoint's sequence number, if any.
    pub checkpoint_sequence_number: Option<i64>,
}

/// The records of one (hub, consumer group), as kept in its file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct GroupRecords {
    version: u32,
    ownership: BTreeMap<String, OwnershipRecord>,
    checkpoints: BTreeMap<String, CheckpointRecord>,
    /// Host records by owner id; in memory only (see the module docs).
    #[serde(skip)]
    hosts: BTreeMap<String, ProcessorHostRecord>,
}

/// Every group's records that were read or written since the broker opened, keyed by
/// (hub key, group key); the files are the truth, this is their cache.
#[derive(Debug, Default)]
pub(crate) struct OwnershipRegistry {
    groups: Mutex<HashMap<(String, String), GroupRecords>>,
}

/// The registry's lock: held for a whole read or change.
pub(crate) struct Locked<'a> {
    groups: MutexGuard<'a, HashMap<(String, String), GroupRecords>>,
}

fn group_file(hub_dir: &Path, group: &str) -> PathBuf {
    hub_dir
        .join("processor")
        .join(format!("{}.json", name_key(group)))
}

fn storage(op: &str, path: &Path, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Storage(format!("{op} {}: {e}", path.display()))
}

impl OwnershipRegistry {
    pub(crate) fn lock(&self) -> Locked<'_> {
        // Every change is made to a copy and put back only once its file is written, so a
        // panic under the lock leaves the cache as consistent as the files.
        Locked {
            groups: self
                .groups
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        }
    }
}

impl Locked<'_> {
    /// The records of `group` in `hub`, read from its file the first time.
    fn records(&mut self, hub: &Hub, group: &str) -> Result<&mut GroupRecords, BrokerError> {
        let key = (name_key(&hub.name()), name_key(group));
        if !self.groups.contains_key(&key) {
            let loaded = load(&group_file(&hub.dir, group))?;
            self.groups.insert(key.clone(), loaded);
        }
        Ok(self.groups.get_mut(&key).expect("inserted above"))
    }

    /// Forgets every cached record of `hub` (its directory is being removed or replaced).
    pub(crate) fn forget_hub(&mut self, hub_key: &str) {
        self.groups.retain(|(hub, _), _| hub != hub_key);
    }

    /// Deletes the records of `group` in `hub`, file and cache.
    pub(crate) fn delete_group(&mut self, hub: &Hub, group: &str) -> Result<(), BrokerError> {
        self.groups
            .remove(&(name_key(&hub.name()), name_key(group)));
        let path = group_file(&hub.dir, group);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(storage("remove", &path, e)),
        }
    }

    pub(crate) fn list_ownership(
        &mut self,
        hub: &Hub,
        group: &str,
    ) -> Result<Vec<OwnershipRecord>, BrokerError> {
        Ok(self
            .records(hub, group)?
            .ownership
            .values()
            .cloned()
            .collect())
    }

    pub(crate) fn list_checkpoints(
        &mut self,
        hub: &Hub,
        group: &str,
    ) -> Result<Vec<CheckpointRecord>, BrokerError> {
        Ok(self
            .records(hub, group)?
            .checkpoints
            .values()
            .cloned()
            .collect())
    }

    /// Renews `owner`'s host record (forgetting records silent for
    /// [`PROCESSOR_HOST_RETENTION_MS`]) and returns the group's ownership and host records.
    pub(crate) fn renew_host(
        &mut self,
        hub: &Hub,
        group: &str,
        owner: &str,
        now_ms: i64,
    ) -> Result<(Vec<OwnershipRecord>, Vec<ProcessorHostRecord>), BrokerError> {
        check_owner_id(owner)?;
        if owner.is_empty() {
            return Err(BrokerError::InvalidProcessorRecord(
                "a host record needs an owner id".to_owned(),
            ));
        }
        let records = self.records(hub, group)?;
        records.hosts.retain(|_, host| {
            now_ms.saturating_sub(host.last_modified_ms) < PROCESSOR_HOST_RETENTION_MS
        });
        let host = records
            .hosts
            .entry(owner.to_owned())
            .or_insert_with(|| ProcessorHostRecord {
                owner_id: owner.to_owned(),
                version: 0,
                last_modified_ms: now_ms,
            });
        host.version += 1;
        host.last_modified_ms = now_ms;
        Ok((
            records.ownership.values().cloned().collect(),
            records.hosts.values().cloned().collect(),
        ))
    }

    /// The group's ownership and host records, renewing nothing (hosts silent for the
    /// retention are left out, as a renewal would forget them).
    pub(crate) fn list_with_hosts(
        &mut self,
        hub: &Hub,
        group: &str,
        now_ms: i64,
    ) -> Result<(Vec<OwnershipRecord>, Vec<ProcessorHostRecord>), BrokerError> {
        let records = self.records(hub, group)?;
        let hosts = records
            .hosts
            .values()
            .filter(|host| {
                now_ms.saturating_sub(host.last_modified_ms) < PROCESSOR_HOST_RETENTION_MS
            })
            .cloned()
            .collect();
        Ok((records.ownership.values().cloned().collect(), hosts))
    }

    /// Forgets `owner`'s host record.
    pub(crate) fn remove_host(
        &mut self,
        hub: &Hub,
        group: &str,
        owner: &str,
    ) -> Result<(), BrokerError> {
        self.records(hub, group)?.hosts.remove(owner);
        Ok(())
    }

    /// Applies every claim that wins, writes the file, and returns the won records.
    pub(crate) fn claim(
        &mut self,
        hub: &Hub,
        group: &str,
        claims: Vec<OwnershipClaim>,
        now_ms: i64,
    ) -> Result<Vec<OwnershipRecord>, BrokerError> {
        for claim in &claims {
            hub.partition(&claim.partition_id)?;
            check_owner_id(&claim.owner_id)?;
        }
        let mut records = self.records(hub, group)?.clone();
        let mut won = Vec::new();
        for claim in claims {
            let current = records.ownership.get(&claim.partition_id);
            let previous_version = match (current, &claim.etag) {
                (None, None) => 0,
                (Some(current), Some(etag)) if &current.etag == etag => current.version,
                _ => continue,
            };
            let record = OwnershipRecord {
                partition_id: claim.partition_id,
                owner_id: claim.owner_id,
                etag: uuid::Uuid::new_v4().to_string(),
                version: previous_version + 1,
                last_modified_ms: now_ms,
            };
            records
                .ownership
                .insert(record.partition_id.clone(), record.clone());
            won.push(record);
        }
        if !won.is_empty() {
            self.store(hub, group, records)?;
        }
        Ok(won)
    }

    /// Writes `checkpoint` if `fence_owner` owns its partition now.
    pub(crate) fn update_checkpoint(
        &mut self,
        hub: &Hub,
        group: &str,
        checkpoint: CheckpointRecord,
        fence_owner: &str,
    ) -> Result<(), BrokerError> {
        hub.partition(&checkpoint.partition_id)?;
        check_owner_id(fence_owner)?;
        if checkpoint.offset.is_none() && checkpoint.sequence_number.is_none() {
            return Err(BrokerError::InvalidProcessorRecord(format!(
                "the checkpoint for partition {} has neither an offset nor a sequence number",
                checkpoint.partition_id
            )));
        }
        let current = self.records(hub, group)?;
        let current_owner = current
            .ownership
            .get(&checkpoint.partition_id)
            .map_or("", |o| o.owner_id.as_str());
        if fence_owner.is_empty() || current_owner != fence_owner {
            return Err(BrokerError::OwnershipLost {
                hub: hub.name(),
                group: group.to_owned(),
                partition_id: checkpoint.partition_id,
                current_owner: current_owner.to_owned(),
                fence_owner: fence_owner.to_owned(),
            });
        }
        let mut records = current.clone();
        records
            .checkpoints
            .insert(checkpoint.partition_id.clone(), checkpoint);
        self.store(hub, group, records)
    }

    /// Replaces every checkpoint of `group` with `checkpoints`, unless a partition has an owner
    /// that claimed or renewed it, or renewed its host record, within [`OWNER_RUNNING_WINDOW_MS`]
    /// of `now_ms`
    /// ([`BrokerError::ProcessorGroupRunning`]: a running processor would carry on from its own
    /// position and overwrite the reset). Ownership records are kept, so versions never go back.
    pub(crate) fn reset_checkpoints(
        &mut self,
        hub: &Hub,
        group: &str,
        checkpoints: Vec<CheckpointRecord>,
        now_ms: i64,
    ) -> Result<(), BrokerError> {
        let current = self.records(hub, group)?;
        let mut running: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let recent = |modified_ms: i64| now_ms - modified_ms < OWNER_RUNNING_WINDOW_MS;
        for record in current.ownership.values() {
            let host_renewed = current
                .hosts
                .get(&record.owner_id)
                .is_some_and(|host| recent(host.last_modified_ms));
            if !record.owner_id.is_empty() && (recent(record.last_modified_ms) || host_renewed) {
                running
                    .entry(&record.owner_id)
                    .or_default()
                    .push(&record.partition_id);
            }
        }
        if !running.is_empty() {
            return Err(BrokerError::ProcessorGroupRunning {
                hub: hub.name(),
                group: group.to_owned(),
                owners: running
                    .into_iter()
                    .map(|(owner, partitions)| {
                        format!("{owner} on partitions {}", partitions.join(" "))
                    })
                    .collect(),
            });
        }
        let mut records = current.clone();
        records.checkpoints = checkpoints
            .into_iter()
            .map(|c| (c.partition_id.clone(), c))
            .collect();
        self.store(hub, group, records)
    }

    /// Writes `records` to the group's file durably, then into the cache.
    fn store(&mut self, hub: &Hub, group: &str, records: GroupRecords) -> Result<(), BrokerError> {
        save(&group_file(&hub.dir, group), &records)?;
        self.groups
            .insert((name_key(&hub.name()), name_key(group)), records);
        Ok(())
    }

    /// Every partition of `group` that has an owner record or a checkpoint, by partition.
    pub(crate) fn states(
        &mut self,
        hub: &Hub,
        group: &str,
    ) -> Result<Vec<ProcessorPartitionState>, BrokerError> {
        let records = self.records(hub, group)?;
        let mut states: BTreeMap<u32, ProcessorPartitionState> = BTreeMap::new();
        let blank = |partition_id: &str| ProcessorPartitionState {
            partition_id: partition_id.to_owned(),
            owner_id: String::new(),
            version: 0,
            last_modified_ms: 0,
            checkpoint_offset: None,
            checkpoint_sequence_number: None,
        };
        for (partition, owner) in &records.ownership {
            let state = states
                .entry(partition.parse().unwrap_or(u32::MAX))
                .or_insert_with(|| blank(partition));
            state.owner_id.clone_from(&owner.owner_id);
            state.version = owner.version;
            state.last_modified_ms = owner.last_modified_ms;
        }
        for (partition, checkpoint) in &records.checkpoints {
            let state = states
                .entry(partition.parse().unwrap_or(u32::MAX))
                .or_insert_with(|| blank(partition));
            state.checkpoint_offset = checkpoint.offset;
            state.checkpoint_sequence_number = checkpoint.sequence_number;
        }
        Ok(states.into_values().collect())
    }
}

fn check_owner_id(owner_id: &str) -> Result<(), BrokerError> {
    if owner_id.len() > OWNER_ID_BYTES_MAX {
        return Err(BrokerError::InvalidProcessorRecord(format!(
            "an owner id is at most {OWNER_ID_BYTES_MAX} bytes, not {}",
            owner_id.len()
        )));
    }
    Ok(())
}

fn load(path: &Path) -> Result<GroupRecords, BrokerError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let what = format_args!("ownership records {}", path.display());
            check_json_format(what, &bytes, FILE_VERSION)?;
            let records: GroupRecords = serde_json::from_slice(&bytes).map_err(|e| {
                BrokerError::Storage(format!(
                    "{}: damaged ownership records: {e}",
                    path.display()
                ))
            })?;
            if records.version != FILE_VERSION {
                return Err(BrokerError::Storage(format!(
                    "{}: ownership records version {} is not supported by this version of Tributary",
                    path.display(),
                    records.version
                )));
            }
            Ok(records)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(GroupRecords {
            version: FILE_VERSION,
            ..GroupRecords::default()
        }),
        Err(e) => Err(storage("read", path, e)),
    }
}

/// Replaces `path` with `records` atomically and durably (see the module docs).
fn save(path: &Path, records: &GroupRecords) -> Result<(), BrokerError> {
    let dir = path.parent().expect("a group file is inside its hub");
    std::fs::create_dir_all(dir).map_err(|e| storage("create", dir, e))?;
    let bytes = serde_json::to_vec(records).expect("records serialise");
    let tmp = path.with_extension("json.tmp");
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()
    };
    write().map_err(|e| storage("write", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| storage("replace", path, e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| storage("sync directory", dir, e))
}

/// The hub and its consumer group, checked under the registry's lock (so a hub or group deleted
/// meanwhile is refused, and one deleted afterwards waits for this change to finish).
fn group_of(broker: &Broker, hub: &str, group: &str) -> Result<(Arc<Hub>, String), BrokerError> {
    let hub = broker.hub(hub)?;
    let definition = hub.definition.read().expect("hub definition");
    let Some(found) = definition.consumer_group(group) else {
        return Err(BrokerError::ConsumerGroupNotFound {
            hub: definition.name.clone(),
            group: group.to_owned(),
        });
    };
    let name = found.name.clone();
    drop(definition);
    Ok((hub, name))
}

impl Broker {
    /// Every ownership record of `group`'s partitions in `hub`.
    pub async fn list_ownership(
        &self,
        hub: &str,
        group: &str,
    ) -> Result<Vec<OwnershipRecord>, BrokerError> {
        self.with_registry(hub, group, |locked, hub, group| {
            locked.list_ownership(hub, group)
        })
        .await
    }

    /// Tries every claim (see the module docs) and returns the won records; lost claims are
    /// left out. Returns once the won claims are on disk.
    pub async fn claim_ownership(
        &self,
        hub: &str,
        group: &str,
        claims: Vec<OwnershipClaim>,
    ) -> Result<Vec<OwnershipRecord>, BrokerError> {
        let now_ms = self.clock().now_ms();
        self.with_registry(hub, group, move |locked, hub, group| {
            locked.claim(hub, group, claims, now_ms)
        })
        .await
    }

    /// Renews processor host `owner`'s liveness record in `group` and returns the group's
    /// ownership and host records (see the module docs).
    pub async fn renew_processor_host(
        &self,
        hub: &str,
        group: &str,
        owner: &str,
    ) -> Result<(Vec<OwnershipRecord>, Vec<ProcessorHostRecord>), BrokerError> {
        let now_ms = self.clock().now_ms();
        let owner = owner.to_owned();
        self.with_registry(hub, group, move |locked, hub, group| {
            locked.renew_host(hub, group, &owner, now_ms)
        })
        .await
    }

    /// The ownership records and processor host liveness records of `group`, renewing
    /// nothing: what `tributary ownership` shows.
    pub async fn list_ownership_and_hosts(
        &self,
        hub: &str,
        group: &str,
    ) -> Result<(Vec<OwnershipRecord>, Vec<ProcessorHostRecord>), BrokerError> {
        let now_ms = self.clock().now_ms();
        self.with_registry(hub, group, move |locked, hub, group| {
            locked.list_with_hosts(hub, group, now_ms)
        })
        .await
    }

    /// Forgets processor host `owner`'s liveness record in `group`.
    pub async fn remove_processor_host(
        &self,
        hub: &str,
        group: &str,
        owner: &str,
    ) -> Result<(), BrokerError> {
        let owner = owner.to_owned();
        self.with_registry(hub, group, move |locked, hub, group| {
            locked.remove_host(hub, group, &owner)
        })
        .await
    }

    /// Every checkpoint of `group` in `hub`.
    pub async fn list_checkpoints(
        &self,
        hub: &str,
        group: &str,
    ) -> Result<Vec<CheckpointRecord>, BrokerError> {
        self.with_registry(hub, group, |locked, hub, group| {
            locked.list_checkpoints(hub, group)
        })
        .await
    }

    /// Writes `checkpoint` if `fence_owner` owns its partition now, else
    /// [`BrokerError::OwnershipLost`]. Returns once it is on disk.
    pub async fn update_checkpoint(
        &self,
        hub: &str,
        group: &str,
        checkpoint: CheckpointRecord,
        fence_owner: &str,
    ) -> Result<(), BrokerError> {
        let fence_owner = fence_owner.to_owned();
        self.with_registry(hub, group, move |locked, hub, group| {
            locked.update_checkpoint(hub, group, checkpoint, &fence_owner)
        })
        .await
    }

    /// Moves the checkpoint of every partition of processor group `group` so that its
    /// processors resume at `position` (earliest, latest or an enqueued time; a checkpoint names
    /// the event before the first one to process, by sequence number), refusing while the group
    /// has running owners ([`BrokerError::ProcessorGroupRunning`]). Returns the new
    /// checkpoints, once they are on disk.
    pub async fn reset_processor_group(
        &self,
        hub: &str,
        group: &str,
        position: &EventPosition,
    ) -> Result<Vec<CheckpointRecord>, BrokerError> {
        let partition_count = self.hub(hub)?.partition_count();
        let mut checkpoints = Vec::with_capacity(partition_count as usize);
        for p in 0..partition_count {
            let partition_id = p.to_string();
            let first = self.resolve_position(hub, &partition_id, position)?;
            checkpoints.push(CheckpointRecord {
                partition_id,
                offset: None,
                sequence_number: Some(first - 1),
            });
        }
        let now_ms = self.clock().now_ms();
        let written = checkpoints.clone();
        self.with_registry(hub, group, move |locked, hub, group| {
            locked.reset_checkpoints(hub, group, written, now_ms)
        })
        .await?;
        Ok(checkpoints)
    }

    /// Every consumer group of `hub` (in catalog order, `$Default` first) with the owner and
    /// checkpoint of each partition that has either.
    pub fn processor_group_states(
        &self,
        hub: &str,
    ) -> Result<Vec<(String, Vec<ProcessorPartitionState>)>, BrokerError> {
        let mut locked = self.registry().lock();
        let open = self.hub(hub)?;
        let groups: Vec<String> = open
            .definition
            .read()
            .expect("hub definition")
            .consumer_groups
            .iter()
            .map(|g| g.name.clone())
            .collect();
        groups
            .into_iter()
            .map(|group| {
                let states = locked.states(&open, &group)?;
                Ok((group, states))
            })
            .collect()
    }

    /// Runs `work` on the blocking pool under the registry's lock, with the checked hub and
    /// group.
    async fn with_registry<T, F>(&self, hub: &str, group: &str, work: F) -> Result<T, BrokerError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Locked<'_>, &Hub, &str) -> Result<T, BrokerError> + Send + 'static,
    {
        let broker = self.clone();
        let (hub, group) = (hub.to_owned(), group.to_owned());
        tokio::task::spawn_blocking(move || {
            let mut locked = broker.registry().lock();
            let (hub, group) = group_of(&broker, &hub, &group)?;
            work(&mut locked, &hub, &group)
        })
        .await
        .expect("the ownership registry does not panic")
    }
}
