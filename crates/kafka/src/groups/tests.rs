//! The group state machine and its timers on tokio's paused clock.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::Coordinator;
use super::state::{Beat, Group, GroupState, Join, JoinAnswer, Protocol, Sync, SyncAnswer};

const SESSION: Duration = Duration::from_secs(10);
const REBALANCE: Duration = Duration::from_secs(30);

fn join_as(member_id: &str, protocols: &[&str]) -> Join {
    Join {
        member_id: member_id.to_owned(),
        instance_id: None,
        client_id: "test".to_owned(),
        client_host: "127.0.0.1".to_owned(),
        session_timeout: SESSION,
        rebalance_timeout: REBALANCE,
        protocol_type: "consumer".to_owned(),
        protocols: protocols
            .iter()
            .map(|name| Protocol {
                name: (*name).to_owned(),
                metadata: Bytes::from(format!("{member_id}:{name}")),
            })
            .collect(),
        member_id_required: true,
    }
}

/// The answer if it came already.
fn ready<T>(rx: &mut oneshot::Receiver<T>) -> Option<T> {
    rx.try_recv().ok()
}

/// A first join: MEMBER_ID_REQUIRED with an id, then the rejoin with it (waiting).
fn first_join(group: &mut Group, protocols: &[&str]) -> (String, oneshot::Receiver<JoinAnswer>) {
    let now = Instant::now();
    let mut rx = group.join(join_as("", protocols), now);
    let answer = ready(&mut rx).expect("answered at once");
    assert_eq!(answer.error, ResponseError::MemberIdRequired.code());
    assert!(!answer.member_id.is_empty());
    let id = answer.member_id;
    let rx = group.join(join_as(&id, protocols), now);
    (id, rx)
}

fn sync_as(id: &str, generation: i32, assignments: Vec<(String, Bytes)>) -> Sync {
    Sync {
        member_id: id.to_owned(),
        instance_id: None,
        generation,
        protocol_type: None,
        protocol_name: None,
        assignments,
    }
}

fn beat(id: &str, generation: i32) -> Beat {
    Beat {
        member_id: id.to_owned(),
        instance_id: None,
        generation,
    }
}

/// Advances the paused clock and runs the group's timers as the coordinator would.
async fn advance(group: &mut Group, by: Duration) {
    tokio::time::advance(by).await;
    group.tick(Instant::now());
}

/// Two members join a new group, the leader assigns, both get their assignments.
async fn stable_pair(group: &mut Group) -> (String, String, i32) {
    let (a, mut a_rx) = first_join(group, &["cooperative-sticky", "range"]);
    let (b, mut b_rx) = first_join(group, &["range"]);
    assert!(ready(&mut a_rx).is_none(), "waits for the initial delay");
    advance(group, Duration::from_secs(3)).await;
    let (a_answer, b_answer) = (ready(&mut a_rx).unwrap(), ready(&mut b_rx).unwrap());
    assert_eq!((a_answer.error, b_answer.error), (0, 0));
    assert_eq!(
        a_answer.protocol_name.as_deref(),
        Some("range"),
        "the one both support"
    );
    let generation = a_answer.generation;
    assert_eq!(b_answer.generation, generation);
    let (leader, follower) = if a_answer.leader == a { (a, b) } else { (b, a) };
    let leader_answer = if a_answer.leader == a_answer.member_id {
        a_answer
    } else {
        b_answer
    };
    assert_eq!(
        leader_answer.members.len(),
        2,
        "the leader gets every member"
    );
    assert_eq!(group.state(), GroupState::CompletingRebalance);
    let now = Instant::now();
    let mut follower_rx = group.sync(sync_as(&follower, generation, vec![]), now);
    assert!(
        ready(&mut follower_rx).is_none(),
        "a follower waits for the leader"
    );
    let assignments = vec![
        (leader.clone(), Bytes::from_static(b"L")),
        (follower.clone(), Bytes::from_static(b"F")),
    ];
    let mut leader_rx = group.sync(sync_as(&leader, generation, assignments), now);
    assert_eq!(
        ready(&mut leader_rx).unwrap().assignment,
        Bytes::from_static(b"L")
    );
    let follower_sync: SyncAnswer = ready(&mut follower_rx).unwrap();
    assert_eq!(follower_sync.assignment, Bytes::from_static(b"F"));
    assert_eq!(group.state(), GroupState::Stable);
    (leader, follower, generation)
}

#[tokio::test(start_paused = true)]
async fn members_join_sync_and_heartbeat() {
    let mut group = Group::new();
    let (leader, follower, generation) = stable_pair(&mut group).await;
    let now = Instant::now();
    assert_eq!(group.heartbeat(&beat(&leader, generation), now), 0);
    assert_eq!(
        group.heartbeat(&beat(&follower, generation - 1), now),
        ResponseError::IllegalGeneration.code()
    );
    assert_eq!(
        group.heartbeat(&beat("stranger", generation), now),
        ResponseError::UnknownMemberId.code()
    );
    assert_eq!(
        group.check_commit(&beat(&leader, generation), now),
        Ok(Some(leader.clone()))
    );
    assert_eq!(
        group.check_commit(&beat("", -1), now),
        Err(ResponseError::UnknownMemberId),
        "a commit from outside a group with members"
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_member_makes_the_others_rejoin_and_the_generation_moves_on() {
    let mut group = Group::new();
    let (leader, follower, generation) = stable_pair(&mut group).await;
    let (newcomer, mut newcomer_rx) = first_join(&mut group, &["range"]);
    assert_eq!(group.state(), GroupState::PreparingRebalance);
    let now = Instant::now();
    assert_eq!(
        group.heartbeat(&beat(&leader, generation), now),
        ResponseError::RebalanceInProgress.code()
    );
    assert!(
        ready(&mut newcomer_rx).is_none(),
        "waits for the known members"
    );
    let mut leader_rx = group.join(join_as(&leader, &["range"]), now);
    assert!(ready(&mut leader_rx).is_none());
    let mut follower_rx = group.join(join_as(&follower, &["range"]), now);
    let answers = [&mut leader_rx, &mut follower_rx, &mut newcomer_rx].map(|rx| ready(rx).unwrap());
    for answer in &answers {
        assert_eq!(answer.error, 0);
        assert_eq!(answer.generation, generation + 1);
        assert_eq!(answer.leader, leader, "the leader stays the leader");
    }
    assert_eq!(answers[0].members.len(), 3);
    assert!(answers[1].members.is_empty() && answers[2].members.is_empty());
    assert!(!newcomer.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_silent_member_is_removed_after_its_session_timeout() {
    let mut group = Group::new();
    let (leader, follower, generation) = stable_pair(&mut group).await;
    for _ in 0..2 {
        advance(&mut group, SESSION * 2 / 5).await;
        assert_eq!(
            group.heartbeat(&beat(&leader, generation), Instant::now()),
            0
        );
    }
    assert!(group.members().any(|m| m.id == follower));
    advance(&mut group, SESSION * 2 / 5).await;
    // The follower said nothing for more than a session: gone, and the leader is told to rejoin.
    assert!(group.members().all(|m| m.id != follower));
    assert_eq!(group.state(), GroupState::PreparingRebalance);
    assert_eq!(
        group.heartbeat(&beat(&leader, generation), Instant::now()),
        ResponseError::RebalanceInProgress.code()
    );
    let mut rx = group.join(join_as(&leader, &["range"]), Instant::now());
    let answer = ready(&mut rx).unwrap();
    assert_eq!((answer.error, answer.generation), (0, generation + 1));
    assert_eq!(answer.members.len(), 1);
    let effects = group.take_effects();
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, super::state::Effect::Released { member } if *member == follower))
    );
}

#[tokio::test(start_paused = true)]
async fn a_member_that_does_not_rejoin_is_removed_at_the_rebalance_deadline() {
    let mut group = Group::new();
    let (leader, follower, _) = stable_pair(&mut group).await;
    let now = Instant::now();
    let mut leader_rx = group.join(join_as(&leader, &["range", "roundrobin"]), now);
    assert!(ready(&mut leader_rx).is_none());
    // The follower keeps heartbeating (it is alive) but never rejoins.
    for _ in 0..5 {
        advance(&mut group, Duration::from_secs(5)).await;
        let generation = group.generation();
        let code = group.heartbeat(&beat(&follower, generation), Instant::now());
        assert_eq!(code, ResponseError::RebalanceInProgress.code());
    }
    advance(&mut group, Duration::from_secs(6)).await;
    let answer = ready(&mut leader_rx).expect("completed at the deadline");
    assert_eq!(answer.error, 0);
    assert_eq!(answer.members.len(), 1);
    assert!(group.members().all(|m| m.id != follower));
}

#[tokio::test(start_paused = true)]
async fn a_leave_rebalances_and_the_last_leave_empties_the_group() {
    let mut group = Group::new();
    let (leader, follower, generation) = stable_pair(&mut group).await;
    let now = Instant::now();
    assert_eq!(group.leave(&follower, None, now), 0);
    assert_eq!(
        group.leave(&follower, None, now),
        ResponseError::UnknownMemberId.code()
    );
    assert_eq!(group.state(), GroupState::PreparingRebalance);
    assert_eq!(group.leave(&leader, None, now), 0);
    assert_eq!(group.state(), GroupState::Empty);
    assert!(group.is_dead());
    assert!(group.generation() > generation);
    assert_eq!(
        group.check_commit(&beat("", -1), now),
        Ok(None),
        "a simple commit"
    );
}

#[tokio::test(start_paused = true)]
async fn protocols_must_be_shared_and_syncs_must_be_current() {
    let mut group = Group::new();
    let (leader, _, generation) = stable_pair(&mut group).await;
    let now = Instant::now();
    let mut rx = group.join(join_as("", &["roundrobin"]), now);
    assert_eq!(
        ready(&mut rx).unwrap().error,
        ResponseError::InconsistentGroupProtocol.code()
    );
    assert_eq!(
        group.state(),
        GroupState::Stable,
        "a refused join changes nothing"
    );
    let mut rx = group.sync(sync_as(&leader, generation + 1, vec![]), now);
    assert_eq!(
        ready(&mut rx).unwrap().error,
        ResponseError::IllegalGeneration.code()
    );
    let mut rx = group.sync(sync_as(&leader, generation, vec![]), now);
    assert_eq!(ready(&mut rx).unwrap().assignment, Bytes::from_static(b"L"));
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_never_syncs_is_removed_and_the_others_rejoin() {
    let mut group = Group::new();
    let (a, mut a_rx) = first_join(&mut group, &["range"]);
    let (b, mut b_rx) = first_join(&mut group, &["range"]);
    advance(&mut group, Duration::from_secs(3)).await;
    let (a_answer, b_answer) = (ready(&mut a_rx).unwrap(), ready(&mut b_rx).unwrap());
    let follower = if a_answer.leader == a { b } else { a };
    let mut follower_rx = group.sync(
        sync_as(&follower, b_answer.generation, vec![]),
        Instant::now(),
    );
    advance(&mut group, REBALANCE).await;
    assert_eq!(
        ready(&mut follower_rx).unwrap().error,
        ResponseError::RebalanceInProgress.code()
    );
    assert_eq!(group.members().count(), 1);
    assert_eq!(group.state(), GroupState::PreparingRebalance);
}

#[tokio::test(start_paused = true)]
async fn a_static_member_rejoining_fences_its_old_id() {
    let mut group = Group::new();
    let now = Instant::now();
    let mut join = join_as("", &["range"]);
    join.instance_id = Some("consumer-1".to_owned());
    let mut rx = group.join(join.clone(), now);
    advance(&mut group, Duration::from_secs(3)).await;
    let first = ready(&mut rx).unwrap();
    assert_eq!(
        first.error, 0,
        "a static member needs no MEMBER_ID_REQUIRED round"
    );
    let mut rx = group.join(join, Instant::now());
    let second = ready(&mut rx).unwrap();
    assert_ne!(second.member_id, first.member_id);
    let mut old = beat(&first.member_id, second.generation);
    old.instance_id = Some("consumer-1".to_owned());
    assert_eq!(
        group.heartbeat(&old, Instant::now()),
        ResponseError::FencedInstanceId.code()
    );
}

#[tokio::test(start_paused = true)]
async fn an_unused_member_id_expires() {
    let mut group = Group::new();
    let mut rx = group.join(join_as("", &["range"]), Instant::now());
    assert!(ready(&mut rx).is_some());
    assert!(group.has_members());
    advance(&mut group, SESSION).await;
    assert!(group.is_dead());
}

/// The coordinator's timer task runs each group's deadline on its own, without polling.
#[tokio::test(start_paused = true)]
async fn the_coordinator_times_out_a_silent_member_by_itself() {
    let dir = tempfile_dir();
    let broker = tributary_broker::Broker::open(tributary_broker::BrokerConfig::new(&dir))
        .await
        .unwrap();
    let (_stop, shutdown) = watch::channel(false);
    let coordinator = Coordinator::start(&broker, shutdown);
    let answer = coordinator
        .with_group("g", true, &[], |g, now| {
            g.join(join_as("", &["range"]), now)
        })
        .unwrap()
        .await
        .unwrap();
    let id = answer.member_id;
    let rx = coordinator
        .with_group("g", true, &[], |g, now| {
            g.join(join_as(&id, &["range"]), now)
        })
        .unwrap();
    let joined = rx.await.unwrap();
    assert_eq!(
        joined.error, 0,
        "completed after the initial delay by the timer task"
    );
    assert!(coordinator.has_members("g"));
    tokio::time::sleep(SESSION + REBALANCE + Duration::from_secs(1)).await;
    assert!(!coordinator.has_members("g"), "removed by the timer task");
    assert!(
        coordinator.view("g").is_none(),
        "and the empty group forgotten"
    );
    std::fs::remove_dir_all(&dir).ok();
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kafka-groups-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A subscription claiming two billion topics in a few bytes is no subscription: refused by the
/// bounded probe before the codec could reserve memory for it.
#[test]
fn consumer_protocol_bytes_are_decoded_within_their_size() {
    use bytes::BufMut;
    use kafka_protocol::messages::ConsumerProtocolSubscription;
    use kafka_protocol::protocol::{Encodable, StrBytes};

    let mut bomb = bytes::BytesMut::new();
    bomb.put_i16(0);
    bomb.put_i32(i32::MAX);
    bomb.put_slice(b"abc");
    let decoded: Option<ConsumerProtocolSubscription> =
        super::decode_consumer_protocol(bomb.freeze(), 3);
    assert!(decoded.is_none());

    let subscription = ConsumerProtocolSubscription::default()
        .with_topics(vec![StrBytes::from_static_str("orders")]);
    let mut real = bytes::BytesMut::new();
    real.put_i16(1);
    subscription.encode(&mut real, 1).unwrap();
    let decoded: ConsumerProtocolSubscription =
        super::decode_consumer_protocol(real.freeze(), 3).unwrap();
    assert_eq!(decoded.topics, vec![StrBytes::from_static_str("orders")]);
}

/// A full group refuses one more member, and a member whose metadata would take the group past
/// its byte allowance, with GROUP_MAX_SIZE_REACHED; neither changes the group.
#[tokio::test(start_paused = true)]
async fn a_full_group_refuses_more_members_and_more_metadata() {
    use crate::limits::{GROUP_MEMBERS_MAX, GROUP_METADATA_BYTES_MAX};

    let mut group = Group::new();
    let now = Instant::now();
    for _ in 0..GROUP_MEMBERS_MAX {
        let mut rx = group.join(join_as("", &["range"]), now);
        assert_eq!(
            ready(&mut rx).unwrap().error,
            ResponseError::MemberIdRequired.code()
        );
    }
    let mut rx = group.join(join_as("", &["range"]), now);
    assert_eq!(
        ready(&mut rx).unwrap().error,
        ResponseError::GroupMaxSizeReached.code()
    );

    let mut group = Group::new();
    let mut big = join_as("", &["range"]);
    big.protocols[0].metadata = Bytes::from(vec![0u8; GROUP_METADATA_BYTES_MAX + 1]);
    let mut rx = group.join(big, now);
    assert_eq!(
        ready(&mut rx).unwrap().error,
        ResponseError::GroupMaxSizeReached.code()
    );
    assert!(group.is_dead(), "nothing was added");
}
