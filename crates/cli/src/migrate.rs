//! `tributary migrate`: opens everything a data directory holds with this build, so that what
//! an older build wrote is upgraded in place now rather than on the next start, and a format
//! newer than this build reads is found before `serve` is started on it.
//!
//! It opens what `serve` opens — the catalog, every partition's log, every consumer group's
//! ownership and checkpoint records, the access policies, the server-side groups' database —
//! and the processor's SQLite store `checkpoints.sqlite` that `tributary process` keeps there.
//! Each upgrade is the one opening does (see the README's "Upgrades"): crash-safe on its own,
//! so an interrupted migrate is run again. A newer format stops it with the file and both
//! versions; nothing is changed then. It refuses a data directory a running `serve` holds.

use anyhow::{Context, Result, bail};
use tributary_processor::SqliteCheckpointStore;

use crate::args::GlobalArgs;
use crate::hub_handle::open_broker;

/// Runs `tributary migrate`.
pub async fn run(global: &GlobalArgs) -> Result<()> {
    let dir = &global.data_dir;
    if !dir.join("catalog.json").is_file() {
        bail!("{} holds no hub data (no catalog.json)", dir.display());
    }
    let broker = open_broker(global).await?;
    let hubs = broker.list_hubs();
    let mut groups = 0;
    for hub in &hubs {
        for group in &hub.consumer_groups {
            broker
                .list_checkpoints(&hub.name, &group.name)
                .await
                .with_context(|| format!("hub {} group {}", hub.name, group.name))?;
            groups += 1;
        }
    }
    let partitions: u32 = hubs.iter().map(|hub| hub.partition_count).sum();
    let mut opened = vec![format!(
        "{} hubs, {partitions} partitions, {groups} consumer groups' records",
        hubs.len()
    )];
    if dir.join(tributary_amqp::policies::POLICIES_FILE).is_file() {
        tributary_amqp::AccessPolicies::load_or_create(dir)?;
        opened.push("access policies".to_owned());
    }
    if dir.join("groups.sqlite").is_file() {
        let config = tributary_groups::CoordinatorConfig::default();
        tributary_groups::GroupCoordinator::open(broker.clone(), config).await?;
        opened.push("server-side groups".to_owned());
    }
    broker.shutdown().await?;
    let store = dir.join("checkpoints.sqlite");
    if store.is_file() {
        SqliteCheckpointStore::open(&store).await?;
        opened.push("processor checkpoint store".to_owned());
    }
    println!(
        "{}: {} — every format read by this build, upgraded in place where older",
        dir.display(),
        opened.join(", ")
    );
    Ok(())
}
