//! The [`CheckpointStore`] operations on blobs: ownership records with versions (see the parent
//! module's doc for how versions survive the official SDKs' claims), fenced checkpoints.

use super::requests::Condition;
use super::{
    BlobCheckpointStore, Checkpoint, CheckpointStore, ListedBlob, Ownership, OwnershipFence,
    ScopeKey, Seen, StoreError, VERSION_KEY, Write, backend, blob_name, prefix,
    validate_checkpoint, validate_claim, validate_value,
};

const OWNER_KEY: &str = "ownerid";
const OFFSET_KEY: &str = "offset";
const SEQUENCE_NUMBER_KEY: &str = "sequencenumber";

fn ownership_record(
    scope: &ScopeKey,
    partition_id: &str,
    owner_id: &str,
    etag: String,
    last_modified_time_ms: i64,
    version: i64,
) -> Ownership {
    Ownership {
        fully_qualified_namespace: scope.namespace.clone(),
        event_hub_name: scope.hub.clone(),
        consumer_group: scope.consumer_group.clone(),
        partition_id: partition_id.to_owned(),
        owner_id: owner_id.to_owned(),
        last_modified_time_ms,
        etag: Some(etag),
        version,
    }
}

/// The partition id a listed blob is filed under, if it is one of `prefix`'s records.
fn partition_of<'a>(blob: &'a ListedBlob, prefix: &str) -> Option<&'a str> {
    let partition_id = blob.name.strip_prefix(prefix)?;
    (!partition_id.is_empty() && !partition_id.contains('/')).then_some(partition_id)
}

impl BlobCheckpointStore {
    /// The version to report for a record with `etag`: ours from the metadata key, else the
    /// server's modification time; never at or below what this store last reported for the
    /// partition once its etag has changed.
    fn observe(
        &self,
        scope: &ScopeKey,
        partition_id: &str,
        etag: &str,
        stored_version: Option<i64>,
        last_modified_ms: i64,
    ) -> i64 {
        let base = stored_version.unwrap_or(last_modified_ms);
        let mut seen = self
            .seen
            .lock()
            .expect("the seen map's lock is never poisoned");
        let key = (scope.clone(), partition_id.to_owned());
        let version = match seen.get(&key) {
            Some(last) if last.etag == etag => last.version,
            Some(last) => base.max(last.version + 1),
            None => base,
        };
        seen.insert(
            key,
            Seen {
                etag: etag.to_owned(),
                version,
            },
        );
        version
    }

    /// The version this store last reported for the record with `etag`, if it did.
    fn remembered(&self, scope: &ScopeKey, partition_id: &str, etag: &str) -> Option<i64> {
        let seen = self
            .seen
            .lock()
            .expect("the seen map's lock is never poisoned");
        seen.get(&(scope.clone(), partition_id.to_owned()))
            .filter(|last| last.etag == etag)
            .map(|last| last.version)
    }

    /// The current version of the record if its etag is still `etag`; `None` if it moved on.
    async fn current_version(
        &self,
        scope: &ScopeKey,
        partition_id: &str,
        etag: &str,
    ) -> Result<Option<i64>, StoreError> {
        if let Some(version) = self.remembered(scope, partition_id, etag) {
            return Ok(Some(version));
        }
        let name = blob_name(scope, "ownership", partition_id);
        let Some(properties) = self.head(&name).await? else {
            return Ok(None);
        };
        let version = self.observe(
            scope,
            partition_id,
            &properties.etag,
            stored_version(&properties.metadata),
            properties.last_modified_ms,
        );
        Ok((properties.etag == etag).then_some(version))
    }

    async fn claim_one(&self, claim: &Ownership) -> Result<Option<Ownership>, StoreError> {
        let scope = ScopeKey::new(
            &claim.fully_qualified_namespace,
            &claim.event_hub_name,
            &claim.consumer_group,
        );
        let partition_id = claim.partition_id.to_lowercase();
        let name = blob_name(&scope, "ownership", &partition_id);
        let (version, create, condition) = match claim.etag.as_deref() {
            None => (1, true, Condition::Absent),
            Some(etag) => match self.current_version(&scope, &partition_id, etag).await? {
                Some(current) => (current + 1, false, Condition::Etag(etag)),
                None => return Ok(None),
            },
        };
        let metadata = [
            (OWNER_KEY, claim.owner_id.clone()),
            (VERSION_KEY, version.to_string()),
        ];
        match self.write(&name, create, &metadata, condition).await? {
            Write::Done {
                etag,
                last_modified_ms,
            } => {
                let version = self.observe(&scope, &partition_id, &etag, Some(version), 0);
                Ok(Some(ownership_record(
                    &scope,
                    &partition_id,
                    &claim.owner_id,
                    etag,
                    last_modified_ms,
                    version,
                )))
            }
            Write::Conflict | Write::NotFound => {
                tracing::debug!(
                    partition_id,
                    owner_id = claim.owner_id,
                    "lost an ownership claim"
                );
                Ok(None)
            }
        }
    }

    /// Refuses the checkpoint unless the ownership blob names `fence.owner_id`.
    async fn check_fence(
        &self,
        scope: &ScopeKey,
        partition_id: &str,
        fence: &OwnershipFence,
    ) -> Result<(), StoreError> {
        let name = blob_name(scope, "ownership", partition_id);
        let current_owner = self
            .head(&name)
            .await?
            .and_then(|p| p.metadata.get(OWNER_KEY).cloned())
            .unwrap_or_default();
        if current_owner.is_empty() || current_owner != fence.owner_id {
            return Err(StoreError::OwnershipLost {
                partition_id: partition_id.to_owned(),
                current_owner,
                fence_owner: fence.owner_id.clone(),
            });
        }
        Ok(())
    }
}

fn stored_version(metadata: &std::collections::HashMap<String, String>) -> Option<i64> {
    metadata.get(VERSION_KEY)?.trim().parse().ok()
}

/// Reads a listed checkpoint blob; `None` when it says nowhere to resume.
fn checkpoint_record(
    scope: &ScopeKey,
    partition_id: &str,
    blob: &ListedBlob,
) -> Option<Checkpoint> {
    let offset = blob
        .metadata
        .get(OFFSET_KEY)
        .and_then(|o| o.trim().parse::<u64>().ok());
    let sequence_number = blob
        .metadata
        .get(SEQUENCE_NUMBER_KEY)
        .and_then(|s| s.trim().parse::<i64>().ok());
    if offset.is_none() && sequence_number.is_none() {
        tracing::debug!(
            name = blob.name,
            "skipping a checkpoint blob with no usable position"
        );
        return None;
    }
    Some(Checkpoint {
        fully_qualified_namespace: scope.namespace.clone(),
        event_hub_name: scope.hub.clone(),
        consumer_group: scope.consumer_group.clone(),
        partition_id: partition_id.to_owned(),
        offset,
        sequence_number,
    })
}

#[async_trait::async_trait]
impl CheckpointStore for BlobCheckpointStore {
    async fn list_ownership(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Ownership>, StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        let prefix = prefix(&scope, "ownership");
        let blobs = self.list(&prefix).await?;
        let mut records = Vec::with_capacity(blobs.len());
        for blob in &blobs {
            let Some(partition_id) = partition_of(blob, &prefix) else {
                continue;
            };
            let last_modified_ms = tributary_blob::http_date_ms(&blob.last_modified);
            let version = self.observe(
                &scope,
                partition_id,
                &blob.etag,
                stored_version(&blob.metadata),
                last_modified_ms,
            );
            let owner_id = blob.metadata.get(OWNER_KEY).map_or("", String::as_str);
            records.push(ownership_record(
                &scope,
                partition_id,
                owner_id,
                blob.etag.clone(),
                last_modified_ms,
                version,
            ));
        }
        Ok(records)
    }

    async fn claim_ownership(&self, claims: Vec<Ownership>) -> Result<Vec<Ownership>, StoreError> {
        for claim in &claims {
            validate_claim(claim)?;
            validate_value("ownership claim", &claim.owner_id)?;
        }
        let mut won = Vec::with_capacity(claims.len());
        for claim in &claims {
            if let Some(record) = self.claim_one(claim).await? {
                won.push(record);
            }
        }
        Ok(won)
    }

    async fn list_checkpoints(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Checkpoint>, StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        let prefix = prefix(&scope, "checkpoint");
        let blobs = self.list(&prefix).await?;
        Ok(blobs
            .iter()
            .filter_map(|blob| checkpoint_record(&scope, partition_of(blob, &prefix)?, blob))
            .collect())
    }

    async fn update_checkpoint(
        &self,
        checkpoint: Checkpoint,
        fence: &OwnershipFence,
    ) -> Result<(), StoreError> {
        validate_checkpoint(&checkpoint)?;
        let scope = ScopeKey::new(
            &checkpoint.fully_qualified_namespace,
            &checkpoint.event_hub_name,
            &checkpoint.consumer_group,
        );
        let partition_id = checkpoint.partition_id.to_lowercase();
        self.check_fence(&scope, &partition_id, fence).await?;
        let mut metadata = Vec::with_capacity(2);
        if let Some(offset) = checkpoint.offset {
            metadata.push((OFFSET_KEY, offset.to_string()));
        }
        if let Some(sequence_number) = checkpoint.sequence_number {
            metadata.push((SEQUENCE_NUMBER_KEY, sequence_number.to_string()));
        }
        let name = blob_name(&scope, "checkpoint", &partition_id);
        // As the SDKs do: set the metadata, and create the blob the first time.
        let written = match self.write(&name, false, &metadata, Condition::None).await? {
            Write::NotFound => self.write(&name, true, &metadata, Condition::None).await?,
            other => other,
        };
        match written {
            Write::Done { .. } => Ok(()),
            Write::Conflict | Write::NotFound => Err(backend(
                "writing a checkpoint",
                format!("the service refused to write {name}"),
            )),
        }
    }
}
