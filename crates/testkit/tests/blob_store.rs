//! The Azure Blob checkpoint store (`tributary-processor`'s `blob` feature) against Azurite:
//! the store conformance suite with a Shared Key and with a SAS token, bad URLs and keys, and
//! reading what the official SDKs write (`tests/blob_fleet.rs` runs the mixed fleets).
//!
//! Azurite comes from `scripts/setup-js-interop`, the Python SDK (its blob client writes the
//! SDK-shaped blobs and signs the SAS) from `scripts/setup-python-interop`; a missing one FAILS
//! these tests, it never skips them.

use std::sync::Arc;

use serde_json::json;
use tributary_processor::store::conformance;
use tributary_processor::{
    BlobCheckpointStore, BlobCredential, Checkpoint, CheckpointStore, Ownership, OwnershipFence,
    StoreError,
};
use tributary_testkit::Azurite;
use tributary_testkit::azurite::{AZURITE_ACCOUNT, AZURITE_KEY};

fn key() -> BlobCredential {
    BlobCredential::shared_key(AZURITE_ACCOUNT, AZURITE_KEY).unwrap()
}

/// An account SAS for Azurite's account, made by the Python SDK's own signer.
async fn account_sas() -> String {
    let script = format!(
        "from azure.eventhub.extensions.checkpointstoreblobaio._vendor.storage.blob import \
         generate_account_sas, ResourceTypes, AccountSasPermissions\n\
         import datetime, json\n\
         print(json.dumps(generate_account_sas('{AZURITE_ACCOUNT}', '{AZURITE_KEY}', \
         ResourceTypes(service=True, container=True, object=True), \
         AccountSasPermissions(read=True, write=True, list=True, create=True, add=True), \
         datetime.datetime.utcnow() + datetime.timedelta(hours=1))))\n"
    );
    let mut command = tokio::process::Command::new(tributary_testkit::python());
    command.arg("-c").arg(script);
    let sas = tributary_testkit::run_json(command, "making a SAS token").await;
    sas.as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blob_store_passes_the_conformance_suite_with_a_shared_key_and_a_sas() {
    let azurite = Azurite::start().await;
    let keyed = BlobCheckpointStore::from_url(
        &format!("{}/conformance-key", azurite.blob_endpoint()),
        Some(key()),
    )
    .await
    .unwrap();
    conformance::run_all_with_server_clock(&keyed).await;

    // Several stores (each its own process, as far as versions go) race for one partition.
    let mut racers: Vec<Arc<dyn CheckpointStore>> = Vec::new();
    for _ in 0..4 {
        let store = BlobCheckpointStore::from_connection_string(
            &azurite.connection_string(),
            "conformance-race",
        )
        .await
        .unwrap();
        racers.push(Arc::new(store));
    }
    conformance::exactly_one_concurrent_claim_wins(racers).await;

    let sas = account_sas().await;
    let url = format!("{}/conformance-sas?{sas}", azurite.blob_endpoint());
    let with_sas = BlobCheckpointStore::from_url(&url, None).await.unwrap();
    assert!(!format!("{with_sas:?}").contains("sig="), "{with_sas:?}");
    conformance::run_all_with_server_clock(&with_sas).await;
    azurite.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_credentials_are_refused_with_clear_errors() {
    let azurite = Azurite::start().await;
    let endpoint = azurite.blob_endpoint();
    let cases = [
        ("ftp://127.0.0.1/devstoreaccount1/c", Some(key()), "scheme"),
        (
            &format!("{endpoint}/Bad_Name") as &str,
            Some(key()),
            "container name",
        ),
        (
            &format!("{endpoint}/ok-name") as &str,
            None,
            "no credential",
        ),
        (
            &format!("{endpoint}/ok-name") as &str,
            Some(BlobCredential::shared_key("otheraccount", AZURITE_KEY).unwrap()),
            "otheraccount",
        ),
    ];
    for (url, credential, expected) in cases {
        let error = BlobCheckpointStore::from_url(url, credential)
            .await
            .unwrap_err();
        assert!(
            matches!(error, StoreError::Invalid { .. }),
            "{url}: {error}"
        );
        assert!(error.to_string().contains(expected), "{url}: {error}");
    }
    // A wrong key reaches the service and is refused there; the key is in no message.
    let wrong = BlobCredential::shared_key(AZURITE_ACCOUNT, "d3Jvbmcta2V5").unwrap();
    let error = BlobCheckpointStore::from_url(&format!("{endpoint}/ok-name"), Some(wrong))
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Backend { .. }), "{error}");
    assert!(error.to_string().contains("403"), "{error}");
    assert!(!error.to_string().contains("d3Jvbmcta2V5"), "{error}");
    azurite.stop().await;
}

/// Writes blobs the way the official SDKs do (through the Python SDK's blob client).
async fn write_as_sdk(azurite: &Azurite, container: &str, blobs: serde_json::Value) {
    let script = "import json, sys\n\
        from azure.eventhub.extensions.checkpointstoreblobaio._vendor.storage.blob import \
        ContainerClient\n\
        args = json.loads(sys.argv[1])\n\
        client = ContainerClient.from_connection_string(args['conn'], args['container'])\n\
        for name, metadata in args['blobs'].items():\n\
        \x20   blob = client.get_blob_client(name)\n\
        \x20   blob.upload_blob(b'', overwrite=True, metadata=metadata)\n\
        print(json.dumps('ok'))\n";
    let args = json!({"conn": azurite.connection_string(), "container": container, "blobs": blobs});
    let mut command = tokio::process::Command::new(tributary_testkit::python());
    command.arg("-c").arg(script).arg(args.to_string());
    tributary_testkit::run_json(command, "writing blobs as the SDK does").await;
}

fn claim(partition_id: &str, owner_id: &str, etag: Option<String>) -> Ownership {
    Ownership {
        fully_qualified_namespace: "ns.example.test".to_owned(),
        event_hub_name: "hub".to_owned(),
        consumer_group: "$Default".to_owned(),
        partition_id: partition_id.to_owned(),
        owner_id: owner_id.to_owned(),
        last_modified_time_ms: 0,
        etag,
        version: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_take_what_other_sdks_write_and_sdk_claims_still_move_the_version() {
    let azurite = Azurite::start().await;
    let store =
        BlobCheckpointStore::from_connection_string(&azurite.connection_string(), "foreign")
            .await
            .unwrap();
    let ours = store
        .claim_ownership(vec![claim("0", "tributary-a", None)])
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(ours.version, 1);
    // An official SDK takes partition 0 over (dropping our version key) and writes checkpoints:
    // .NET's extra key, an empty offset, a sequence number only, garbage.
    let prefix = "ns.example.test/hub/$default";
    write_as_sdk(
        &azurite,
        "foreign",
        json!({
            format!("{prefix}/ownership/0"): {"ownerid": "python-b"},
            format!("{prefix}/checkpoint/0"): {"offset": "120", "sequencenumber": "3", "clientidentifier": "dotnet"},
            format!("{prefix}/checkpoint/1"): {"offset": "", "sequencenumber": "7"},
            format!("{prefix}/checkpoint/2"): {"offset": "not-a-number"},
            format!("{prefix}/checkpoint/3"): {},
        }),
    )
    .await;
    let records = store
        .list_ownership("NS.example.test", "hub", "$Default")
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    let foreign = &records[0];
    assert_eq!(foreign.owner_id, "python-b");
    assert!(foreign.version > ours.version, "{foreign:?} after {ours:?}");
    // Listing again without a change reports the same version (it is not a renewal).
    let again = store
        .list_ownership("ns.example.test", "hub", "$default")
        .await
        .unwrap();
    assert_eq!(again, records);
    // The SDK renews within the same second: a new etag, so a higher version.
    write_as_sdk(
        &azurite,
        "foreign",
        json!({format!("{prefix}/ownership/0"): {"ownerid": "python-b"}}),
    )
    .await;
    let renewed = store
        .list_ownership("ns.example.test", "hub", "$default")
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_ne!(renewed.etag, foreign.etag);
    assert!(
        renewed.version > foreign.version,
        "{renewed:?} after {foreign:?}"
    );
    fenced_then_stolen(&store, &azurite, &renewed).await;
    foreign_checkpoints_are_read(&store).await;
    azurite.stop().await;
}

fn checkpoint(partition_id: &str, offset: Option<u64>, sequence_number: Option<i64>) -> Checkpoint {
    Checkpoint {
        fully_qualified_namespace: "ns.example.test".to_owned(),
        event_hub_name: "hub".to_owned(),
        consumer_group: "$Default".to_owned(),
        partition_id: partition_id.to_owned(),
        offset,
        sequence_number,
    }
}

/// After an SDK's claim our former owner's checkpoints are refused, and a Tributary steal gets
/// the next version, which every store then reports.
async fn fenced_then_stolen(store: &BlobCheckpointStore, azurite: &Azurite, renewed: &Ownership) {
    // Our former owner is fenced; a Tributary steal outranks every epoch used before.
    let refused = store
        .update_checkpoint(
            checkpoint("0", Some(500), Some(9)),
            &OwnershipFence {
                owner_id: "tributary-a".to_owned(),
            },
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::OwnershipLost { .. })),
        "{refused:?}"
    );
    let stolen = store
        .claim_ownership(vec![claim("0", "tributary-c", renewed.etag.clone())])
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(stolen.version, renewed.version + 1);
    // Another store (another process) agrees on what we wrote.
    let other =
        BlobCheckpointStore::from_connection_string(&azurite.connection_string(), "foreign")
            .await
            .unwrap();
    let listed = other
        .list_ownership("ns.example.test", "hub", "$default")
        .await
        .unwrap();
    assert_eq!(listed, vec![stolen]);
}

/// The SDKs' checkpoints as the store reads them: usable positions kept, unusable ones skipped.
async fn foreign_checkpoints_are_read(store: &BlobCheckpointStore) {
    let mut checkpoints = store
        .list_checkpoints("ns.example.test", "hub", "$default")
        .await
        .unwrap();
    checkpoints.sort_by(|a, b| a.partition_id.cmp(&b.partition_id));
    let positions: Vec<_> = checkpoints
        .iter()
        .map(|c| (c.partition_id.as_str(), c.offset, c.sequence_number))
        .collect();
    assert_eq!(positions, [("0", Some(120), Some(3)), ("1", None, Some(7))]);
}

/// Every blob in `container` as the Python SDK's blob client lists it: name → (size, metadata).
async fn list_as_sdk(azurite: &Azurite, container: &str) -> serde_json::Value {
    let script = "import json, sys\n\
        from azure.eventhub.extensions.checkpointstoreblobaio._vendor.storage.blob import \
        ContainerClient\n\
        args = json.loads(sys.argv[1])\n\
        client = ContainerClient.from_connection_string(args['conn'], args['container'])\n\
        blobs = {b.name: {'size': b.size, 'metadata': b.metadata} \
        for b in client.list_blobs(include=['metadata'])}\n\
        print(json.dumps(blobs))\n";
    let args = json!({"conn": azurite.connection_string(), "container": container});
    let mut command = tokio::process::Command::new(tributary_testkit::python());
    command.arg("-c").arg(script).arg(args.to_string());
    tributary_testkit::run_json(command, "listing blobs as the SDK does").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_store_writes_is_the_sdks_layout() {
    let azurite = Azurite::start().await;
    let store = BlobCheckpointStore::from_connection_string(&azurite.connection_string(), "layout")
        .await
        .unwrap();
    let mut upper = claim("0", "host-a", None);
    upper.fully_qualified_namespace = "NS.Example.TEST".to_owned();
    upper.event_hub_name = "Hub".to_owned();
    // Creating the container was one request; a first claim is one more.
    assert_eq!(store.requests_sent(), 1);
    let won = store.claim_ownership(vec![upper]).await.unwrap();
    assert_eq!(won.len(), 1);
    assert_eq!(store.requests_sent(), 2);
    // A renewal with the etag this store saw needs no read first: one request.
    let renewed = store
        .claim_ownership(vec![claim("0", "host-a", won[0].etag.clone())])
        .await
        .unwrap();
    assert_eq!(renewed[0].version, 2);
    assert_eq!(store.requests_sent(), 3);
    store
        .update_checkpoint(
            checkpoint("0", Some(4_096), Some(17)),
            &OwnershipFence {
                owner_id: "host-a".to_owned(),
            },
        )
        .await
        .unwrap();
    let blobs = list_as_sdk(&azurite, "layout").await;
    assert_eq!(
        blobs,
        json!({
            "ns.example.test/hub/$default/ownership/0": {
                "size": 0,
                "metadata": {"ownerid": "host-a", "tributaryversion": "2"},
            },
            "ns.example.test/hub/$default/checkpoint/0": {
                "size": 0,
                "metadata": {"offset": "4096", "sequencenumber": "17"},
            },
        })
    );
    azurite.stop().await;
}
