//! Two Python `EventHubConsumerClient`s (azure.eventhub.aio), each in its own process, share a
//! hub's partitions through the blob checkpoint store (`azure-eventhub-checkpointstoreblob-aio`)
//! on Azurite; one stops and the other takes over its partitions from their checkpoints.
//!
//! The test starts the broker and the AMQP listener, Azurite's blob service (from
//! `<repo>/.interop/node_modules`, in memory, on a free port; killed at the end) and two
//! `tests/python/processor.py` processes, which report what they claim, process and checkpoint
//! as JSON lines. Install the clients with `scripts/setup-python-interop` and
//! `scripts/setup-js-interop`; a missing client FAILS this test, it never skips it.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use tributary_testkit::official::STEP_TIMEOUT;
use tributary_testkit::{Azurite, OfficialProcessor, OfficialSeen, Sdk, TestHub};

const PARTITIONS: u32 = 8;
const FIRST_ROUND: i64 = 22;
const SECOND_ROUND: i64 = 10;
const CHECKPOINT_EVERY: i64 = 5;

type Seen = OfficialSeen;

fn processed(seen: &Seen, partition: &str, seq: i64) -> bool {
    seen.events
        .get(partition)
        .is_some_and(|seqs| seqs.contains(&seq))
}

/// Reads both processes' reports until `done` holds; panics after [`STEP_TIMEOUT`].
async fn until(
    what: &str,
    a: &mut OfficialProcessor,
    b: &mut OfficialProcessor,
    done: impl Fn(&Seen, &Seen) -> bool,
) {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        a.pump();
        b.pump();
        if done(&a.seen, &b.seen) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}\nA: {:?}\nB: {:?}\nA stderr:\n{}\nB stderr:\n{}",
            a.seen,
            b.seen,
            a.lines.stderr(),
            b.lines.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn balanced(a: &Seen, b: &Seen) -> bool {
    let half = (PARTITIONS / 2) as usize;
    a.owned.len() == half && b.owned.len() == half && a.owned.is_disjoint(&b.owned)
}

async fn send_round(f: &TestHub, round: &str, count: i64) {
    for p in 0..PARTITIONS {
        for i in 0..count {
            f.send("shared", &p.to_string(), &format!("{round}-{p}-{i}"))
                .await;
        }
    }
}

/// Waits for a stable 4/4 split: balanced now and still so after three load-balancing rounds.
async fn wait_balanced(a: &mut OfficialProcessor, b: &mut OfficialProcessor) {
    loop {
        until("a balanced 4/4 split", a, b, balanced).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        a.pump();
        b.pump();
        if balanced(&a.seen, &b.seen) {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_processors_share_partitions_and_take_over_from_checkpoints() {
    let f = TestHub::start(&[("shared", PARTITIONS)]).await;
    let azurite = Azurite::start().await;
    let args = json!({
        "conn": f.conn(&f.root),
        "hub": "shared",
        "storage": azurite.connection_string(),
        "container": "checkpoints",
        "checkpoint_every": CHECKPOINT_EVERY,
        "load_balancing_interval": 1.0,
    });
    let mut a = OfficialProcessor::spawn(Sdk::Python, &args);
    let mut b = OfficialProcessor::spawn(Sdk::Python, &args);
    wait_balanced(&mut a, &mut b).await;
    // While they balanced, partitions may have changed hands (even back and forth): the
    // processors use owner level 0, so each loser's receiver was detached with amqp:link:stolen
    // and reported it. Nothing else may have gone wrong.
    for seen in [&mut a.seen, &mut b.seen] {
        for error in seen.errors.drain(..) {
            let text = error["error"].as_str().unwrap();
            assert!(text.contains("amqp:link:stolen"), "{error}");
        }
    }
    let owned_a = a.seen.owned.clone();
    let owned_b = b.seen.owned.clone();

    // Round one: everything is processed, each partition by its owner.
    send_round(&f, "one", FIRST_ROUND).await;
    until("round one processed", &mut a, &mut b, |a, b| {
        (0..PARTITIONS).all(|p| {
            let p = p.to_string();
            processed(a, &p, FIRST_ROUND - 1) || processed(b, &p, FIRST_ROUND - 1)
        })
    })
    .await;

    // A stops (releasing its partitions); B takes them over from A's checkpoints.
    a.stop().await;
    send_round(&f, "two", SECOND_ROUND).await;
    let last = FIRST_ROUND + SECOND_ROUND - 1;
    until("B processing everything", &mut a, &mut b, |_, b| {
        (0..PARTITIONS).all(|p| processed(b, &p.to_string(), last))
    })
    .await;
    b.stop().await;
    azurite.stop().await;

    check_takeover(&f, &a.seen, &b.seen, &owned_a, &owned_b).await;
    f.stop().await;
}

async fn check_takeover(
    f: &TestHub,
    a: &Seen,
    b: &Seen,
    owned_a: &BTreeSet<String>,
    owned_b: &BTreeSet<String>,
) {
    assert_eq!(a.errors, Vec::<Value>::new(), "A reported errors");
    assert_eq!(b.errors, Vec::<Value>::new(), "B reported errors");
    let all: BTreeSet<String> = (0..PARTITIONS).map(|p| p.to_string()).collect();
    assert_eq!(
        owned_a.union(owned_b).cloned().collect::<BTreeSet<_>>(),
        all
    );
    let last = FIRST_ROUND + SECOND_ROUND - 1;
    // The last checkpoint of round one: the last n < FIRST_ROUND with n % k == k - 1.
    let last_checkpoint = (FIRST_ROUND / CHECKPOINT_EVERY) * CHECKPOINT_EVERY - 1;
    for p in owned_b {
        assert_eq!(a.events.get(p), None, "A processed B's partition {p}");
        assert_eq!(
            b.events[p],
            (0..=last).collect::<Vec<_>>(),
            "B's own partition {p}: each event once, in order"
        );
    }
    for p in owned_a {
        assert_eq!(
            a.events[p],
            (0..FIRST_ROUND).collect::<Vec<_>>(),
            "A's partition {p} in round one"
        );
        let (seq, offset) = (&a.checkpoints[p], &a.checkpoint_offsets[p]);
        assert_eq!(*seq, last_checkpoint, "A's last checkpoint on {p}");
        let stored = f.read_all("shared", p.parse().unwrap()).await;
        assert_eq!(
            offset,
            &stored[*seq as usize].offset.to_string(),
            "the checkpoint's offset is the event's"
        );
        // B resumes right after A's last checkpoint: it re-processes only what A processed
        // after that checkpoint, then goes on.
        assert_eq!(
            b.events[p],
            ((last_checkpoint + 1)..=last).collect::<Vec<_>>(),
            "B's takeover of {p}"
        );
    }
    // The store, as B saw it after stopping: every partition checkpointed at its last multiple,
    // every ownership released.
    let stopped = b.stopped.as_ref().unwrap();
    let final_checkpoint = ((last + 1) / CHECKPOINT_EVERY) * CHECKPOINT_EVERY - 1;
    for p in &all {
        assert_eq!(
            stopped["checkpoints"][p]["seq"], final_checkpoint,
            "{stopped}"
        );
        // Released: the store reads back an empty owner id as none.
        let owner = &stopped["ownership"][p];
        assert!(owner.is_null() || owner == "", "{stopped}");
    }
}
