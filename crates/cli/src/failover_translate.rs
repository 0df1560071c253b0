//! `tributary failover translate-checkpoints`: a consumer group's checkpoints on a source hub,
//! rewritten for its replica from the replication task's offset map
//! ([`tributary_replicate::offset_map`], which holds the rule and why it never skips an
//! unprocessed event).
//!
//! Nothing is written until everything was read and translated; with `--dry-run` nothing is
//! written at all. On the replica each partition is claimed under the name
//! [`TRANSLATOR`], given its checkpoint and released, so the store's fences hold as they do
//! for processors; a partition a processor owns there, or a group that already has
//! checkpoints there, is refused unless `--force`.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use tributary_processor::store::{CheckpointStore, StoreLocation};
use tributary_processor::{Checkpoint, Ownership, OwnershipFence};
use tributary_replicate::offset_map::{self, OffsetMap, SyncRow, Translated};

use crate::args::TranslateArgs;

/// The owner name the replica's partitions are claimed under while their checkpoints are
/// written.
pub const TRANSLATOR: &str = "tributary-failover-translate";

/// Runs the command.
pub async fn translate(args: &TranslateArgs) -> Result<()> {
    let map = OffsetMap::open_existing(&args.offset_map).map_err(anyhow::Error::msg)?;
    let rows = map.rows().map_err(anyhow::Error::msg)?;
    let rows = rows_of_target(rows, args.target.as_deref())?;
    let source = open_store(&args.source_store, true).await?;
    let checkpoints = source
        .list_checkpoints(&args.source_namespace, &args.source_hub, &args.group)
        .await
        .context("cannot read the group's checkpoints on the source")?;
    ensure!(
        !checkpoints.is_empty(),
        "consumer group {:?} has no checkpoints for hub {:?} (namespace {:?}) in {}",
        args.group,
        args.source_hub,
        args.source_namespace,
        StoreLocation::parse(&args.source_store)?
    );
    let processed: HashMap<String, i64> = checkpoints
        .iter()
        .filter_map(|c| Some((c.partition_id.clone(), c.sequence_number?)))
        .collect();
    let first = &rows[0];
    let translated = offset_map::translate(
        &rows,
        &processed,
        first.source_partitions,
        first.target_partitions,
    );
    print_table(&first.target_name, &translated)?;
    if args.dry_run {
        return Ok(());
    }
    let target_url = args.target_store.as_deref().unwrap_or(&args.source_store);
    let target = open_store(target_url, false).await?;
    let scope = Scope {
        namespace: args
            .target_namespace
            .as_deref()
            .unwrap_or(&args.source_namespace),
        hub: args.target_hub.as_deref().unwrap_or(&args.source_hub),
        group: &args.group,
    };
    write(target.as_ref(), &scope, &translated, args.force).await
}

/// The rows of the one target the command translates for: the one named, or the only one.
fn rows_of_target(rows: Vec<SyncRow>, name: Option<&str>) -> Result<Vec<SyncRow>> {
    let sources: BTreeSet<&str> = rows.iter().map(|r| r.source_id.as_str()).collect();
    ensure!(
        sources.len() <= 1,
        "the offset map holds syncs of several source hubs ({sources:?}); give each task its own checkpoint store"
    );
    let targets: BTreeSet<(&str, &str)> = rows
        .iter()
        .map(|r| (r.target_name.as_str(), r.target_id.as_str()))
        .collect();
    let names: Vec<&str> = targets.iter().map(|(name, _)| *name).collect();
    let chosen = match (name, targets.len()) {
        (_, 0) => bail!(
            "the offset map has no syncs yet: a task takes a partition's first sync once it has \
             read one batch and its prefetch past where it started, or once the partition has \
             been idle for [offset_map] every"
        ),
        (None, 1) => targets.iter().next().expect("one target").1.to_owned(),
        (None, _) => {
            bail!("the offset map has several targets ({names:?}); pick one with --target")
        }
        (Some(name), _) => match targets.iter().find(|(n, _)| *n == name) {
            Some((_, id)) => (*id).to_owned(),
            None => bail!("the offset map has no target named {name:?}; it has {names:?}"),
        },
    };
    Ok(rows.into_iter().filter(|r| r.target_id == chosen).collect())
}

/// Opens the store at `url`; a SQLite file is created unless it `must_exist` (the source's:
/// a mistyped path must not read as a group without checkpoints).
async fn open_store(url: &str, must_exist: bool) -> Result<Arc<dyn CheckpointStore>> {
    let location = StoreLocation::parse(url)?;
    if let StoreLocation::Sqlite(path) = &location
        && must_exist
    {
        ensure!(
            path.exists(),
            "there is no checkpoint store at {}",
            path.display()
        );
    }
    location
        .open()
        .await
        .with_context(|| format!("cannot open the checkpoint store {location}"))
}

fn print_table(target_name: &str, translated: &[Translated]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "target\tpartition\tresume after sequence number\tbecause"
    )?;
    for t in translated {
        let after = if t.sequence_number < 0 {
            "(beginning)".to_owned()
        } else {
            t.sequence_number.to_string()
        };
        writeln!(out, "{target_name}\t{}\t{after}\t{}", t.partition, t.reason)?;
    }
    Ok(())
}

/// The consumer group on the replica.
struct Scope<'a> {
    namespace: &'a str,
    hub: &'a str,
    group: &'a str,
}

/// Writes every translated checkpoint, each under a claim of its partition, after checking
/// that the group is not running on the replica (unless `force`).
async fn write(
    store: &dyn CheckpointStore,
    scope: &Scope<'_>,
    translated: &[Translated],
    force: bool,
) -> Result<()> {
    let owners = store
        .list_ownership(scope.namespace, scope.hub, scope.group)
        .await?;
    if !force {
        let busy: Vec<String> = owners
            .iter()
            .filter(|o| !o.is_relinquished())
            .map(|o| format!("{} by {}", o.partition_id, o.owner_id))
            .collect();
        ensure!(
            busy.is_empty(),
            "the group's partitions on the replica are owned ({}): stop its processors there first, or --force",
            busy.join(", ")
        );
        let existing = store
            .list_checkpoints(scope.namespace, scope.hub, scope.group)
            .await?;
        ensure!(
            existing.is_empty(),
            "the group already has checkpoints on the replica for partitions {:?}; --force overwrites them",
            existing.iter().map(|c| &c.partition_id).collect::<Vec<_>>()
        );
    }
    for t in translated {
        let etag = owners
            .iter()
            .find(|o| o.partition_id == t.partition)
            .and_then(|o| o.etag.clone());
        write_one(store, scope, t, etag).await?;
    }
    Ok(())
}

async fn write_one(
    store: &dyn CheckpointStore,
    scope: &Scope<'_>,
    translated: &Translated,
    etag: Option<String>,
) -> Result<()> {
    let claim = |owner_id: &str, etag: Option<String>| Ownership {
        fully_qualified_namespace: scope.namespace.to_owned(),
        event_hub_name: scope.hub.to_owned(),
        consumer_group: scope.group.to_owned(),
        partition_id: translated.partition.clone(),
        owner_id: owner_id.to_owned(),
        last_modified_time_ms: 0,
        etag,
        version: 0,
    };
    let partition = &translated.partition;
    let won = store.claim_ownership(vec![claim(TRANSLATOR, etag)]).await?;
    let Some(won) = won.into_iter().next() else {
        bail!("partition {partition} on the replica was claimed by someone else meanwhile");
    };
    let checkpoint = Checkpoint {
        fully_qualified_namespace: scope.namespace.to_owned(),
        event_hub_name: scope.hub.to_owned(),
        consumer_group: scope.group.to_owned(),
        partition_id: partition.clone(),
        offset: None,
        sequence_number: Some(translated.sequence_number),
    };
    let fence = OwnershipFence {
        owner_id: TRANSLATOR.to_owned(),
    };
    store
        .update_checkpoint(checkpoint, &fence)
        .await
        .with_context(|| format!("cannot write the checkpoint of partition {partition}"))?;
    store.claim_ownership(vec![claim("", won.etag)]).await?;
    Ok(())
}
