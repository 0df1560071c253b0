//! A checkpoint store in PostgreSQL tables, shared by processors on any number of machines.
//!
//! Tables: `tributary_ownership` and `tributary_checkpoint`, keyed by (namespace, event hub,
//! consumer group, partition), and `tributary_host` (host records), keyed by (namespace, event
//! hub, consumer group, owner id) — the first three in lowercase — created if absent, in the
//! schema the URL's `schema` parameter names (default `public`; created if absent). Where they
//! exist already the store needs only SELECT, INSERT, UPDATE and DELETE on them (no CREATE
//! privilege).
//!
//! A host's renewal is one statement: it renews the host's row, forgets rows silent for the
//! retention, and returns the group's host and ownership rows — one round trip per host per
//! balancing cycle in steady state.
//!
//! Guarantees, and how:
//! - **Atomic claims across hosts.** Every claim is one statement that compares and writes:
//!   `INSERT … ON CONFLICT DO NOTHING` for a first claim, `UPDATE … WHERE etag = $expected` for
//!   the rest. Under PostgreSQL's row locks two claims with the same etag serialise, and the
//!   second finds the etag changed: a lost race is simply a claim missing from the result. The
//!   claims of one call are independent statements (pipelined on the connection); each wins or
//!   loses on its own, as the trait allows. Unlike the SQLite store's, a call is not
//!   all-or-nothing: if the connection breaks midway it fails although some claims may have been
//!   recorded; the records then name this host, and its next cycle renews them from the listing.
//! - **Fenced checkpoints.** One statement locks the partition's ownership row (`FOR SHARE`),
//!   checks the owner and writes the checkpoint, so a claim that takes the partition over either
//!   waits for the checkpoint or makes it fail; a checkpoint from a former owner never lands after
//!   the new owner has read the checkpoints.
//! - **Monotonic versions.** A claim sets `version = version + 1` in the same statement that
//!   compares the etag; a first claim writes 1.
//! - **Reconnects.** One connection per store; when the server closes it, the next call opens a
//!   new one. A call that fails on a broken connection returns [`StoreError::Backend`] (the host
//!   retries on its next balancing cycle).
//! - **Durability** is the server's: a committed claim or checkpoint survives what the server's
//!   `synchronous_commit` and replication settings say it survives.
//!
//! Not done: TLS to the server (connections are plain TCP or a Unix socket; run it on a trusted
//! network or over a local socket), and migrating tables from another schema version.

use std::sync::Arc;

use tokio::sync::Mutex;
use tokio_postgres::{Client, Config, NoTls, Statement};
use tributary_event::{Clock, SystemClock};

use super::{
    Checkpoint, CheckpointStore, HostRecord, Ownership, OwnershipFence, OwnershipListing, ScopeKey,
    StoreError, host_record_horizon_ms, new_etag, sql_offset, validate_checkpoint, validate_claim,
    validate_host,
};

/// The URL query parameter that picks the schema; removed before the URL reaches the driver.
const SCHEMA_PARAMETER: &str = "schema";

/// A [`CheckpointStore`] in a PostgreSQL database.
///
/// Every store connected to the same database and schema sees the same ownership and
/// checkpoints.
pub struct PostgresCheckpointStore {
    config: Config,
    schema: String,
    clock: Arc<dyn Clock>,
    connection: Mutex<Option<Arc<Connected>>>,
}

impl std::fmt::Debug for PostgresCheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The config holds the password: show only where the store is.
        f.debug_struct("PostgresCheckpointStore")
            .field("location", &self.location())
            .finish_non_exhaustive()
    }
}

/// A live connection and the statements prepared on it.
struct Connected {
    client: Client,
    first_claim: Statement,
    claim: Statement,
    list_ownership: Statement,
    list_checkpoints: Statement,
    fenced_checkpoint: Statement,
    renew_host: Statement,
    list_with_hosts: Statement,
    remove_host: Statement,
}

fn backend(operation: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |error| StoreError::Backend {
        operation,
        description: describe(&error),
    }
}

/// The driver's error with the server's message, when there is one.
fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{error}: {}", db.message()),
        None => match std::error::Error::source(error) {
            Some(source) => format!("{error}: {source}"),
            None => error.to_string(),
        },
    }
}

/// A URL split into the driver's config and our schema parameter.
fn parse_url(url: &str) -> Result<(Config, String), StoreError> {
    let invalid = |reason: String| StoreError::Invalid {
        what: "PostgreSQL store URL",
        reason,
    };
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut schema = "public".to_owned();
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some((SCHEMA_PARAMETER, value)) => schema = value.to_owned(),
            _ => kept.push(pair),
        }
    }
    let valid_schema = !schema.is_empty()
        && schema.len() <= 63
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid_schema {
        return Err(invalid(format!(
            "schema {schema:?} must be 1 to 63 lowercase letters, digits or underscores, not \
             starting with a digit"
        )));
    }
    let driver_url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    // The driver's own error names the bad part and never echoes the password.
    let config = driver_url
        .parse::<Config>()
        .map_err(|error| invalid(describe(&error)))?;
    Ok((config, schema))
}

/// Where a database is, for people: user, hosts, database and schema; never the password.
fn location(config: &Config, schema: &str) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .zip(config.get_ports().iter().chain(std::iter::repeat(&5432)))
        .map(|(host, port)| match host {
            tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
            tokio_postgres::config::Host::Unix(path) => format!("{}:{port}", path.display()),
        })
        .collect();
    format!(
        "postgres://{}@{}/{} (schema {schema})",
        config.get_user().unwrap_or(""),
        hosts.join(","),
        config.get_dbname().unwrap_or(""),
    )
}

/// Opens a connection for `user` (a phrase for the log line when the connection ends); the
/// error names where (never the password) and the server's reason.
async fn connect(config: &Config, schema: &str, user: &'static str) -> Result<Client, String> {
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|error| format!("{}: {}", location(config, schema), describe(&error)))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(error = %describe(&error), "the PostgreSQL connection of {user} ended");
        }
    });
    Ok(client)
}

/// A `postgres://` URL as Tributary takes it — the driver's URL plus an optional `?schema=NAME`
/// (default `public`) — checked and ready to connect. The checkpoint store and replication's
/// projection targets share it.
#[derive(Clone)]
pub struct PostgresUrl {
    config: Config,
    schema: String,
}

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.location())
    }
}

impl PostgresUrl {
    /// Checks `url`; the error names what is wrong and never echoes the password.
    pub fn parse(url: &str) -> Result<PostgresUrl, StoreError> {
        let (config, schema) = parse_url(url)?;
        Ok(PostgresUrl { config, schema })
    }

    /// The schema (a checked identifier: lowercase letters, digits, underscores).
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Where it is, for people: user, hosts, database and schema; never the password.
    pub fn location(&self) -> String {
        location(&self.config, &self.schema)
    }

    /// Opens a connection (plain TCP or a Unix socket); `user` names it in the log line when
    /// it ends. The error names where and the server's reason.
    pub async fn connect(&self, user: &'static str) -> Result<Client, String> {
        connect(&self.config, &self.schema, user).await
    }
}

/// The driver's error with the server's message, when there is one.
pub fn describe_error(error: &tokio_postgres::Error) -> String {
    describe(error)
}

impl PostgresCheckpointStore {
    /// Connects to the database at `url` (`postgres://user:password@host:port/database`, with
    /// an optional `?schema=NAME`), creating the tables if absent.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        PostgresCheckpointStore::connect_with_clock(url, Arc::new(SystemClock)).await
    }

    /// As [`connect`](Self::connect), stamping `last_modified_time_ms` with `clock`.
    pub async fn connect_with_clock(url: &str, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        let (config, schema) = parse_url(url)?;
        let store = PostgresCheckpointStore {
            config,
            schema,
            clock,
            connection: Mutex::new(None),
        };
        store.connected().await?;
        Ok(store)
    }

    /// Where the store is, for people: user, hosts, database and schema; never the password.
    pub fn location(&self) -> String {
        location(&self.config, &self.schema)
    }

    /// The live connection, opening one (and the tables) when there is none or it closed.
    async fn connected(&self) -> Result<Arc<Connected>, StoreError> {
        let mut slot = self.connection.lock().await;
        if let Some(connected) = slot.as_ref().filter(|c| !c.client.is_closed()) {
            return Ok(Arc::clone(connected));
        }
        let connected = Arc::new(self.open_connection().await?);
        *slot = Some(Arc::clone(&connected));
        Ok(connected)
    }

    async fn open_connection(&self) -> Result<Connected, StoreError> {
        let client = connect(&self.config, &self.schema, "the checkpoint store")
            .await
            .map_err(|description| StoreError::Backend {
                operation: "connecting to PostgreSQL",
                description,
            })?;
        // Creating needs the CREATE privilege even when the tables exist, so a user an
        // administrator gave only reads and writes on existing tables skips it.
        let present: bool = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL \
                 AND to_regclass($3) IS NOT NULL",
                &[
                    &format!("\"{}\".tributary_ownership", self.schema),
                    &format!("\"{}\".tributary_checkpoint", self.schema),
                    &format!("\"{}\".tributary_host", self.schema),
                ],
            )
            .await
            .map_err(backend("looking for the tables"))?
            .get(0);
        if !present {
            client
                .batch_execute(&create_schema_sql(&self.schema))
                .await
                .map_err(backend("creating the tables"))?;
        }
        let prepare = backend("preparing statements");
        let sql = Sql::new(&self.schema);
        Ok(Connected {
            first_claim: client.prepare(&sql.first_claim).await.map_err(&prepare)?,
            claim: client.prepare(&sql.claim).await.map_err(&prepare)?,
            list_ownership: client
                .prepare(&sql.list_ownership)
                .await
                .map_err(&prepare)?,
            list_checkpoints: client
                .prepare(&sql.list_checkpoints)
                .await
                .map_err(&prepare)?,
            fenced_checkpoint: client
                .prepare(&sql.fenced_checkpoint)
                .await
                .map_err(&prepare)?,
            renew_host: client.prepare(&sql.renew_host).await.map_err(&prepare)?,
            list_with_hosts: client
                .prepare(&sql.list_with_hosts)
                .await
                .map_err(&prepare)?,
            remove_host: client.prepare(&sql.remove_host).await.map_err(&prepare)?,
            client,
        })
    }
}

/// Creates the schema and tables if absent. Several hosts starting together run this at once;
/// PostgreSQL's `IF NOT EXISTS` can still collide on the catalog then, so a transaction-scoped
/// advisory lock serialises them.
fn create_schema_sql(schema: &str) -> String {
    format!(
        "BEGIN;
SELECT pg_advisory_xact_lock(hashtext('tributary checkpoint store ' || '{schema}'));
CREATE SCHEMA IF NOT EXISTS \"{schema}\";
CREATE TABLE IF NOT EXISTS \"{schema}\".tributary_ownership (
    namespace TEXT NOT NULL,
    event_hub TEXT NOT NULL,
    consumer_group TEXT NOT NULL,
    partition_id TEXT NOT NULL,
    owner_id TEXT NOT NULL,
    last_modified_time_ms BIGINT NOT NULL,
    etag TEXT NOT NULL,
    version BIGINT NOT NULL CHECK (version >= 1),
    PRIMARY KEY (namespace, event_hub, consumer_group, partition_id)
);
CREATE TABLE IF NOT EXISTS \"{schema}\".tributary_checkpoint (
    namespace TEXT NOT NULL,
    event_hub TEXT NOT NULL,
    consumer_group TEXT NOT NULL,
    partition_id TEXT NOT NULL,
    event_offset BIGINT CHECK (event_offset >= 0),
    sequence_number BIGINT,
    PRIMARY KEY (namespace, event_hub, consumer_group, partition_id)
);
CREATE TABLE IF NOT EXISTS \"{schema}\".tributary_host (
    namespace TEXT NOT NULL,
    event_hub TEXT NOT NULL,
    consumer_group TEXT NOT NULL,
    owner_id TEXT NOT NULL,
    last_modified_time_ms BIGINT NOT NULL,
    version BIGINT NOT NULL CHECK (version >= 1),
    PRIMARY KEY (namespace, event_hub, consumer_group, owner_id)
);
COMMIT;"
    )
}

/// The statements, for one schema.
struct Sql {
    first_claim: String,
    claim: String,
    list_ownership: String,
    list_checkpoints: String,
    fenced_checkpoint: String,
    renew_host: String,
    list_with_hosts: String,
    remove_host: String,
}

impl Sql {
    fn new(schema: &str) -> Sql {
        let ownership = format!("\"{schema}\".tributary_ownership");
        let checkpoint = format!("\"{schema}\".tributary_checkpoint");
        let host = format!("\"{schema}\".tributary_host");
        let key = "namespace = $1 AND event_hub = $2 AND consumer_group = $3";
        Sql {
            first_claim: format!(
                "INSERT INTO {ownership} (namespace, event_hub, consumer_group, partition_id, \
                 owner_id, last_modified_time_ms, etag, version) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 1) ON CONFLICT DO NOTHING RETURNING version"
            ),
            claim: format!(
                "UPDATE {ownership} SET owner_id = $5, last_modified_time_ms = $6, etag = $7, \
                 version = version + 1 \
                 WHERE {key} AND partition_id = $4 AND etag = $8 RETURNING version"
            ),
            list_ownership: format!(
                "SELECT partition_id, owner_id, last_modified_time_ms, etag, version \
                 FROM {ownership} WHERE {key} ORDER BY partition_id"
            ),
            list_checkpoints: format!(
                "SELECT partition_id, event_offset, sequence_number FROM {checkpoint} \
                 WHERE {key} ORDER BY partition_id"
            ),
            // The owner row is locked for the statement's transaction, so no claim can change
            // the owner between the check and the write.
            fenced_checkpoint: format!(
                "WITH fence AS (SELECT owner_id FROM {ownership} \
                     WHERE {key} AND partition_id = $4 FOR SHARE), \
                 written AS (INSERT INTO {checkpoint} (namespace, event_hub, consumer_group, \
                     partition_id, event_offset, sequence_number) \
                     SELECT $1, $2, $3, $4, $5, $6 FROM fence \
                     WHERE fence.owner_id = $7 AND $7 <> '' \
                     ON CONFLICT (namespace, event_hub, consumer_group, partition_id) DO UPDATE \
                     SET event_offset = excluded.event_offset, \
                         sequence_number = excluded.sequence_number \
                     RETURNING 1) \
                 SELECT (SELECT owner_id FROM fence), EXISTS (SELECT 1 FROM written)"
            ),
            // $4 the host, $5 now, $6 the retention horizon. Every part of the statement sees
            // the table as it was before, so the renewed row comes from `renewed`, and rows
            // `forgotten` deletes are left out of the listing by the same condition.
            renew_host: format!(
                "WITH forgotten AS (DELETE FROM {host} \
                     WHERE {key} AND owner_id <> $4 AND last_modified_time_ms <= $6), \
                 renewed AS (INSERT INTO {host} (namespace, event_hub, consumer_group, owner_id, \
                     last_modified_time_ms, version) VALUES ($1, $2, $3, $4, $5, 1) \
                     ON CONFLICT (namespace, event_hub, consumer_group, owner_id) DO UPDATE \
                     SET last_modified_time_ms = excluded.last_modified_time_ms, \
                         version = {host}.version + 1 \
                     RETURNING owner_id, version, last_modified_time_ms) \
                 SELECT TRUE, owner_id, NULL::TEXT, version, last_modified_time_ms, NULL::TEXT \
                     FROM renewed \
                 UNION ALL SELECT TRUE, owner_id, NULL, version, last_modified_time_ms, NULL \
                     FROM {host} WHERE {key} AND owner_id <> $4 AND last_modified_time_ms > $6 \
                 UNION ALL SELECT FALSE, owner_id, partition_id, version, last_modified_time_ms, \
                     etag FROM {ownership} WHERE {key}"
            ),
            // $4 the retention horizon; rows as `renew_host` gives them.
            list_with_hosts: format!(
                "SELECT TRUE, owner_id, NULL::TEXT, version, last_modified_time_ms, NULL::TEXT \
                     FROM {host} WHERE {key} AND last_modified_time_ms > $4 \
                 UNION ALL SELECT FALSE, owner_id, partition_id, version, last_modified_time_ms, \
                     etag FROM {ownership} WHERE {key}"
            ),
            remove_host: format!("DELETE FROM {host} WHERE {key} AND owner_id = $4"),
        }
    }
}

/// The rows of `renew_host` or `list_with_hosts`: (is a host record, owner, partition,
/// version, last modified, etag).
fn listing_of_rows(scope: &ScopeKey, rows: Vec<tokio_postgres::Row>) -> OwnershipListing {
    let mut listing = OwnershipListing::default();
    for row in rows {
        if row.get::<_, bool>(0) {
            listing.hosts.push(HostRecord {
                owner_id: row.get(1),
                version: row.get(3),
                last_modified_time_ms: row.get(4),
            });
        } else {
            listing.ownership.push(Ownership {
                fully_qualified_namespace: scope.namespace.clone(),
                event_hub_name: scope.hub.clone(),
                consumer_group: scope.consumer_group.clone(),
                partition_id: row.get(2),
                owner_id: row.get(1),
                last_modified_time_ms: row.get(4),
                etag: Some(row.get(5)),
                version: row.get(3),
            });
        }
    }
    listing
}

impl Connected {
    /// Tries one claim; returns the stored record if it won.
    async fn try_claim(
        &self,
        claim: Ownership,
        now_ms: i64,
    ) -> Result<Option<Ownership>, StoreError> {
        let scope = ScopeKey::new(
            &claim.fully_qualified_namespace,
            &claim.event_hub_name,
            &claim.consumer_group,
        );
        let etag = new_etag();
        let key = [&scope.namespace, &scope.hub, &scope.consumer_group];
        let row = match &claim.etag {
            None => {
                self.client
                    .query_opt(
                        &self.first_claim,
                        &[
                            key[0],
                            key[1],
                            key[2],
                            &claim.partition_id,
                            &claim.owner_id,
                            &now_ms,
                            &etag,
                        ],
                    )
                    .await
            }
            Some(expected) => {
                self.client
                    .query_opt(
                        &self.claim,
                        &[
                            key[0],
                            key[1],
                            key[2],
                            &claim.partition_id,
                            &claim.owner_id,
                            &now_ms,
                            &etag,
                            expected,
                        ],
                    )
                    .await
            }
        }
        .map_err(backend("claiming ownership"))?;
        Ok(row.map(|row| Ownership {
            version: row.get(0),
            fully_qualified_namespace: scope.namespace,
            event_hub_name: scope.hub,
            consumer_group: scope.consumer_group,
            partition_id: claim.partition_id,
            owner_id: claim.owner_id,
            last_modified_time_ms: now_ms,
            etag: Some(etag),
        }))
    }
}

#[async_trait::async_trait]
impl CheckpointStore for PostgresCheckpointStore {
    async fn list_ownership(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Ownership>, StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        let connected = self.connected().await?;
        let rows = connected
            .client
            .query(
                &connected.list_ownership,
                &[&scope.namespace, &scope.hub, &scope.consumer_group],
            )
            .await
            .map_err(backend("listing ownership"))?;
        Ok(rows
            .into_iter()
            .map(|row| Ownership {
                fully_qualified_namespace: scope.namespace.clone(),
                event_hub_name: scope.hub.clone(),
                consumer_group: scope.consumer_group.clone(),
                partition_id: row.get(0),
                owner_id: row.get(1),
                last_modified_time_ms: row.get(2),
                etag: Some(row.get(3)),
                version: row.get(4),
            })
            .collect())
    }

    fn keeps_host_records(&self) -> bool {
        true
    }

    async fn renew_host(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        owner_id: &str,
    ) -> Result<OwnershipListing, StoreError> {
        validate_host(owner_id)?;
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        let now_ms = self.clock.now_ms();
        let horizon_ms = host_record_horizon_ms(now_ms);
        let connected = self.connected().await?;
        let rows = connected
            .client
            .query(
                &connected.renew_host,
                &[
                    &scope.namespace,
                    &scope.hub,
                    &scope.consumer_group,
                    &owner_id,
                    &now_ms,
                    &horizon_ms,
                ],
            )
            .await
            .map_err(backend("renewing the host record"))?;
        Ok(listing_of_rows(&scope, rows))
    }

    async fn list_ownership_and_hosts(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<OwnershipListing, StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        let horizon_ms = host_record_horizon_ms(self.clock.now_ms());
        let connected = self.connected().await?;
        let rows = connected
            .client
            .query(
                &connected.list_with_hosts,
                &[
                    &scope.namespace,
                    &scope.hub,
                    &scope.consumer_group,
                    &horizon_ms,
                ],
            )
            .await
            .map_err(backend("listing ownership and hosts"))?;
        Ok(listing_of_rows(&scope, rows))
    }

    async fn remove_host(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        owner_id: &str,
    ) -> Result<(), StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        let connected = self.connected().await?;
        connected
            .client
            .execute(
                &connected.remove_host,
                &[
                    &scope.namespace,
                    &scope.hub,
                    &scope.consumer_group,
                    &owner_id,
                ],
            )
            .await
            .map_err(backend("removing the host record"))?;
        Ok(())
    }

    async fn claim_ownership(&self, claims: Vec<Ownership>) -> Result<Vec<Ownership>, StoreError> {
        claims.iter().try_for_each(validate_claim)?;
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let now_ms = self.clock.now_ms();
        let connected = self.connected().await?;
        // Issued together, the statements share the connection's round trips (the driver
        // pipelines them); each still compares and writes on its own.
        let attempts = claims
            .into_iter()
            .map(|claim| connected.try_claim(claim, now_ms));
        let results = futures_util::future::join_all(attempts).await;
        let mut won = Vec::with_capacity(results.len());
        for result in results {
            won.extend(result?);
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
        let connected = self.connected().await?;
        let rows = connected
            .client
            .query(
                &connected.list_checkpoints,
                &[&scope.namespace, &scope.hub, &scope.consumer_group],
            )
            .await
            .map_err(backend("listing checkpoints"))?;
        Ok(rows
            .into_iter()
            .map(|row| Checkpoint {
                fully_qualified_namespace: scope.namespace.clone(),
                event_hub_name: scope.hub.clone(),
                consumer_group: scope.consumer_group.clone(),
                partition_id: row.get(0),
                // The table's CHECK keeps stored offsets non-negative.
                offset: row
                    .get::<_, Option<i64>>(1)
                    .and_then(|offset| u64::try_from(offset).ok()),
                sequence_number: row.get(2),
            })
            .collect())
    }

    async fn update_checkpoint(
        &self,
        checkpoint: Checkpoint,
        fence: &OwnershipFence,
    ) -> Result<(), StoreError> {
        validate_checkpoint(&checkpoint)?;
        let offset = sql_offset(&checkpoint)?;
        let scope = ScopeKey::new(
            &checkpoint.fully_qualified_namespace,
            &checkpoint.event_hub_name,
            &checkpoint.consumer_group,
        );
        let connected = self.connected().await?;
        let row = connected
            .client
            .query_one(
                &connected.fenced_checkpoint,
                &[
                    &scope.namespace,
                    &scope.hub,
                    &scope.consumer_group,
                    &checkpoint.partition_id,
                    &offset,
                    &checkpoint.sequence_number,
                    &fence.owner_id,
                ],
            )
            .await
            .map_err(backend("updating a checkpoint"))?;
        let current_owner: Option<String> = row.get(0);
        let written: bool = row.get(1);
        if written {
            Ok(())
        } else {
            Err(StoreError::OwnershipLost {
                partition_id: checkpoint.partition_id,
                current_owner: current_owner.unwrap_or_default(),
                fence_owner: fence.owner_id.clone(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schema_parameter_is_ours_and_the_rest_is_the_drivers() {
        let (config, schema) =
            parse_url("postgres://app:secret@db.example:6543/fleet?schema=hubs&connect_timeout=5")
                .unwrap();
        assert_eq!(schema, "hubs");
        assert_eq!(config.get_dbname(), Some("fleet"));
        assert_eq!(config.get_ports(), [6543]);
        assert_eq!(
            config.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(5))
        );
        let (_, schema) = parse_url("postgresql://localhost/db").unwrap();
        assert_eq!(schema, "public");
    }

    #[test]
    fn bad_urls_and_schemas_are_refused_with_a_reason() {
        for (url, says) in [
            ("postgres://h/db?schema=Bad-Name", "schema \"Bad-Name\""),
            ("postgres://h/db?schema=", "schema \"\""),
            ("postgres://h/db?schema=x\";drop", "schema"),
            ("postgres://h/db?no_such_option=1", "no_such_option"),
        ] {
            let error = parse_url(url).unwrap_err();
            assert!(
                matches!(error, StoreError::Invalid { .. }),
                "{url}: {error}"
            );
            assert!(error.to_string().contains(says), "{url}: {error}");
        }
    }
}
