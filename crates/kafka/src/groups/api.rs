//! The group APIs' requests into the coordinator and the hub's checkpoints, and their answers
//! at each advertised version (a field a version does not have is left at its default, as
//! the codec requires).

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    BrokerId, ConsumerProtocolSubscription, DeleteGroupsRequest, DeleteGroupsResponse,
    DescribeGroupsRequest, DescribeGroupsResponse, FindCoordinatorRequest, FindCoordinatorResponse,
    GroupId, HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse, RequestKind,
    ResponseKind, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::messages::{
    delete_groups_response::DeletableGroupResult,
    describe_groups_response::{DescribedGroup, DescribedGroupMember},
    find_coordinator_response::Coordinator as CoordinatorEntry,
    join_group_response::JoinGroupResponseMember,
    leave_group_response::MemberResponse,
    list_groups_response::ListedGroup,
};
use kafka_protocol::protocol::StrBytes;
use tributary_amqp::Right;
use tributary_amqp::auth::{self, Needed};
use tributary_event::names::{is_default_consumer_group, name_key, validate_consumer_group_name};

use super::checkpoints;
use super::commit;
use super::state::{Beat, Join, JoinAnswer, Protocol, Sync, SyncAnswer};
use crate::connection::{Context, Session};
use crate::limits::{
    GROUP_PROTOCOLS_MAX, GROUP_REBALANCE_TIMEOUT_MAX, GROUP_SESSION_TIMEOUT_MAX,
    GROUP_SESSION_TIMEOUT_MIN,
};
use crate::metadata::NODE_ID;

/// Deleting a group.
const MANAGE: Needed = &[Right::Manage];

/// The protocol type of consumers (whose metadata is a subscription).
const CONSUMER: &str = "consumer";

/// The longest `group.instance.id`: Kafka's limit for such ids.
const INSTANCE_ID_BYTES_MAX: usize = 249;

/// Whether `request` is one of the group APIs.
pub(crate) fn answers(request: &RequestKind) -> bool {
    matches!(
        request,
        RequestKind::FindCoordinator(_)
            | RequestKind::JoinGroup(_)
            | RequestKind::SyncGroup(_)
            | RequestKind::Heartbeat(_)
            | RequestKind::LeaveGroup(_)
            | RequestKind::OffsetCommit(_)
            | RequestKind::OffsetFetch(_)
            | RequestKind::DescribeGroups(_)
            | RequestKind::ListGroups(_)
            | RequestKind::DeleteGroups(_)
    )
}

/// Answers a group API request (see [`answers`]) at `version`.
pub(crate) async fn answer(
    request: RequestKind,
    version: i16,
    session: &Session,
    ctx: &Context,
) -> Result<ResponseKind, String> {
    Ok(match request {
        RequestKind::FindCoordinator(r) => {
            ResponseKind::FindCoordinator(find_coordinator(&r, version, ctx))
        }
        RequestKind::JoinGroup(r) => ResponseKind::JoinGroup(join(r, version, session, ctx).await),
        RequestKind::SyncGroup(r) => ResponseKind::SyncGroup(sync(r, version, ctx).await),
        RequestKind::Heartbeat(r) => ResponseKind::Heartbeat(heartbeat(&r, ctx)),
        RequestKind::LeaveGroup(r) => ResponseKind::LeaveGroup(leave(&r, version, ctx)),
        RequestKind::OffsetCommit(r) => {
            ResponseKind::OffsetCommit(commit::offset_commit(r, session, ctx).await)
        }
        RequestKind::OffsetFetch(r) => {
            ResponseKind::OffsetFetch(commit::offset_fetch(r, version, session, ctx).await)
        }
        RequestKind::DescribeGroups(r) => {
            ResponseKind::DescribeGroups(describe(&r, version, session, ctx).await)
        }
        RequestKind::ListGroups(r) => {
            ResponseKind::ListGroups(list(&r, version, session, ctx).await)
        }
        RequestKind::DeleteGroups(r) => ResponseKind::DeleteGroups(delete(&r, session, ctx).await),
        other => return Err(format!("not a group request: {other:?}")),
    })
}

/// A group id's text, if it is a legal one (see the module docs of `groups`).
pub(crate) fn group_name(id: &GroupId) -> Result<&str, i16> {
    let name = id.0.as_str();
    validate_consumer_group_name(name).map_err(|_| ResponseError::InvalidGroupId.code())?;
    Ok(name)
}

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

/// Why a transaction's coordinator is refused: the door serves no transactions.
const NO_TRANSACTIONS: &str = "transactions are not supported by this server";

/// FindCoordinator: this node, for every group (key type 0). Transactions (key type 1) are
/// refused with TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which a transactional producer reports
/// at once as a fatal error (a coordinator that is merely not available would be retried
/// until the producer's timeout), as InitProducerId refuses a transactional id.
fn find_coordinator(
    request: &FindCoordinatorRequest,
    version: i16,
    ctx: &Context,
) -> FindCoordinatorResponse {
    let (error, message) = if request.key_type == 0 {
        (0, None)
    } else {
        let refused = ResponseError::TransactionalIdAuthorizationFailed.code();
        (refused, Some(StrBytes::from_static_str(NO_TRANSACTIONS)))
    };
    let host = text(&ctx.advertised_host);
    let port = i32::from(ctx.advertised_port);
    if version >= 4 {
        let coordinators = request
            .coordinator_keys
            .iter()
            .map(|key| {
                CoordinatorEntry::default()
                    .with_key(key.clone())
                    .with_node_id(BrokerId(if error == 0 { NODE_ID } else { -1 }))
                    .with_host(host.clone())
                    .with_port(port)
                    .with_error_code(error)
                    .with_error_message(message.clone())
            })
            .collect();
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    FindCoordinatorResponse::default()
        .with_error_code(error)
        .with_error_message(message)
        .with_node_id(BrokerId(if error == 0 { NODE_ID } else { -1 }))
        .with_host(host)
        .with_port(port)
}

/// The topics of a consumer subscription; `None` if the metadata is not one.
fn subscribed_topics(metadata: Bytes) -> Option<Vec<String>> {
    let subscription: ConsumerProtocolSubscription = super::decode_consumer_protocol(metadata, 3)?;
    Some(subscription.topics.iter().map(|t| t.to_string()).collect())
}

/// A JoinGroup's checks before the group sees it: the group id, the timeouts, the protocols,
/// the instance id and the login's right to read every subscribed topic.
fn check_join(request: &JoinGroupRequest, session: &Session) -> Result<Vec<String>, i16> {
    group_name(&request.group_id)?;
    let session_timeout = u64::try_from(request.session_timeout_ms).unwrap_or(0);
    let allowed = GROUP_SESSION_TIMEOUT_MIN.as_millis()..=GROUP_SESSION_TIMEOUT_MAX.as_millis();
    if !allowed.contains(&u128::from(session_timeout)) {
        return Err(ResponseError::InvalidSessionTimeout.code());
    }
    if request.protocols.len() > GROUP_PROTOCOLS_MAX
        || request
            .group_instance_id
            .as_ref()
            .is_some_and(|i| i.is_empty() || i.len() > INSTANCE_ID_BYTES_MAX)
    {
        return Err(ResponseError::InvalidRequest.code());
    }
    let mut topics = BTreeSet::new();
    if request.protocol_type.as_str() == CONSUMER {
        for protocol in &request.protocols {
            topics.extend(subscribed_topics(protocol.metadata.clone()).unwrap_or_default());
        }
    }
    for topic in &topics {
        if session.authorize(topic, auth::LISTEN).is_err() {
            return Err(ResponseError::GroupAuthorizationFailed.code());
        }
    }
    Ok(topics.into_iter().collect())
}

async fn join(
    request: JoinGroupRequest,
    version: i16,
    session: &Session,
    ctx: &Context,
) -> JoinGroupResponse {
    let answer = match check_join(&request, session) {
        Err(code) => JoinAnswer {
            error: code,
            generation: -1,
            member_id: request.member_id.to_string(),
            ..JoinAnswer::default()
        },
        Ok(topics) => join_group(request, version, topics, session, ctx).await,
    };
    join_response(answer, version)
}

async fn join_group(
    request: JoinGroupRequest,
    version: i16,
    topics: Vec<String>,
    session: &Session,
    ctx: &Context,
) -> JoinAnswer {
    let session_timeout = Duration::from_millis(request.session_timeout_ms.unsigned_abs().into());
    let rebalance_timeout = if version >= 1 && request.rebalance_timeout_ms > 0 {
        Duration::from_millis(request.rebalance_timeout_ms.unsigned_abs().into())
    } else {
        session_timeout
    };
    let join = Join {
        member_id: request.member_id.to_string(),
        instance_id: request.group_instance_id.as_ref().map(|i| i.to_string()),
        client_id: session.client_id().to_owned(),
        client_host: session.client_host().to_owned(),
        session_timeout,
        rebalance_timeout: rebalance_timeout.min(GROUP_REBALANCE_TIMEOUT_MAX),
        protocol_type: request.protocol_type.to_string(),
        protocols: request
            .protocols
            .iter()
            .map(|p| Protocol {
                name: p.name.to_string(),
                metadata: p.metadata.clone(),
            })
            .collect(),
        member_id_required: version >= 4,
    };
    let member_id = join.member_id.clone();
    let name = request.group_id.0.as_str();
    let waiting = ctx
        .groups
        .with_group(name, true, &topics, |group, now| group.join(join, now));
    let unavailable = JoinAnswer {
        error: ResponseError::CoordinatorNotAvailable.code(),
        generation: -1,
        member_id,
        ..JoinAnswer::default()
    };
    match waiting {
        Some(rx) => rx.await.unwrap_or(unavailable),
        None => unavailable,
    }
}

fn join_response(answer: JoinAnswer, version: i16) -> JoinGroupResponse {
    let members = answer
        .members
        .into_iter()
        .map(|(id, instance, metadata)| {
            JoinGroupResponseMember::default()
                .with_member_id(text(&id))
                .with_group_instance_id(instance.filter(|_| version >= 5).map(|i| text(&i)))
                .with_metadata(metadata)
        })
        .collect();
    let protocol_name = match (answer.protocol_name, version >= 7) {
        (Some(name), _) => Some(text(&name)),
        (None, true) => None,
        (None, false) => Some(StrBytes::default()),
    };
    JoinGroupResponse::default()
        .with_error_code(answer.error)
        .with_generation_id(answer.generation)
        .with_protocol_type(
            answer
                .protocol_type
                .filter(|_| version >= 7)
                .map(|t| text(&t)),
        )
        .with_protocol_name(protocol_name)
        .with_leader(text(&answer.leader))
        .with_member_id(text(&answer.member_id))
        .with_members(members)
}

async fn sync(request: SyncGroupRequest, version: i16, ctx: &Context) -> SyncGroupResponse {
    let answer = match group_name(&request.group_id) {
        Err(code) => SyncAnswer {
            error: code,
            ..SyncAnswer::default()
        },
        Ok(name) => {
            let sync = Sync {
                member_id: request.member_id.to_string(),
                instance_id: request.group_instance_id.as_ref().map(|i| i.to_string()),
                generation: request.generation_id,
                protocol_type: request.protocol_type.as_ref().map(|t| t.to_string()),
                protocol_name: request.protocol_name.as_ref().map(|t| t.to_string()),
                assignments: request
                    .assignments
                    .iter()
                    .map(|a| (a.member_id.to_string(), a.assignment.clone()))
                    .collect(),
            };
            let unknown = SyncAnswer {
                error: ResponseError::UnknownMemberId.code(),
                ..SyncAnswer::default()
            };
            match ctx
                .groups
                .with_group(name, false, &[], |group, now| group.sync(sync, now))
            {
                Some(rx) => rx.await.unwrap_or(SyncAnswer {
                    error: ResponseError::CoordinatorNotAvailable.code(),
                    ..SyncAnswer::default()
                }),
                None => unknown,
            }
        }
    };
    let response = SyncGroupResponse::default()
        .with_error_code(answer.error)
        .with_assignment(answer.assignment);
    if version >= 5 {
        response
            .with_protocol_type(answer.protocol_type.map(|t| text(&t)))
            .with_protocol_name(answer.protocol_name.map(|t| text(&t)))
    } else {
        response
    }
}

fn heartbeat(request: &HeartbeatRequest, ctx: &Context) -> HeartbeatResponse {
    let beat = Beat {
        member_id: request.member_id.to_string(),
        instance_id: request.group_instance_id.as_ref().map(|i| i.to_string()),
        generation: request.generation_id,
    };
    let error = match group_name(&request.group_id) {
        Err(code) => code,
        Ok(name) => ctx
            .groups
            .with_group(name, false, &[], |group, now| group.heartbeat(&beat, now))
            .unwrap_or(ResponseError::UnknownMemberId.code()),
    };
    HeartbeatResponse::default().with_error_code(error)
}

fn leave(request: &LeaveGroupRequest, version: i16, ctx: &Context) -> LeaveGroupResponse {
    let name = match group_name(&request.group_id) {
        Ok(name) => name,
        Err(code) => return LeaveGroupResponse::default().with_error_code(code),
    };
    let leave_one = |member: &str, instance: Option<&str>| {
        ctx.groups
            .with_group(name, false, &[], |group, now| {
                group.leave(member, instance, now)
            })
            .unwrap_or(ResponseError::UnknownMemberId.code())
    };
    if version < 3 {
        let error = leave_one(request.member_id.as_str(), None);
        return LeaveGroupResponse::default().with_error_code(error);
    }
    let members = request
        .members
        .iter()
        .map(|m| {
            let instance = m.group_instance_id.as_ref().map(|i| i.as_str());
            MemberResponse::default()
                .with_member_id(m.member_id.clone())
                .with_group_instance_id(m.group_instance_id.clone())
                .with_error_code(leave_one(m.member_id.as_str(), instance))
        })
        .collect();
    LeaveGroupResponse::default().with_members(members)
}

/// Whether the login may see a group reading `topics` (any of them with Listen; a group
/// whose topics are unknown, with Listen on the namespace).
pub(crate) fn may_see(topics: &BTreeSet<String>, session: &Session) -> bool {
    if topics.is_empty() {
        return session.authorize("", auth::LISTEN).is_ok();
    }
    topics
        .iter()
        .any(|t| session.authorize(t, auth::LISTEN).is_ok())
}

async fn describe(
    request: &DescribeGroupsRequest,
    version: i16,
    session: &Session,
    ctx: &Context,
) -> DescribeGroupsResponse {
    let mut groups = Vec::with_capacity(request.groups.len());
    for id in &request.groups {
        // Authorized operations stay at the codec's default, "not asked for".
        let described = DescribedGroup::default().with_group_id(id.clone());
        let name = match group_name(id) {
            Ok(name) => name,
            Err(code) => {
                groups.push(
                    described
                        .with_error_code(code)
                        .with_group_state(text("Dead")),
                );
                continue;
            }
        };
        groups.push(describe_one(described, name, version, session, ctx).await);
    }
    DescribeGroupsResponse::default().with_groups(groups)
}

async fn describe_one(
    described: DescribedGroup,
    name: &str,
    version: i16,
    session: &Session,
    ctx: &Context,
) -> DescribedGroup {
    let denied = ResponseError::GroupAuthorizationFailed.code();
    if let Some(view) = ctx.groups.view(name) {
        if !may_see(&view.topics, session) {
            return described.with_error_code(denied);
        }
        let members = view
            .members
            .into_iter()
            .map(|m| {
                DescribedGroupMember::default()
                    .with_member_id(text(&m.id))
                    .with_group_instance_id(
                        m.instance_id.filter(|_| version >= 4).map(|i| text(&i)),
                    )
                    .with_client_id(text(&m.client_id))
                    .with_client_host(text(&m.client_host))
                    .with_member_metadata(m.metadata)
                    .with_member_assignment(m.assignment)
            })
            .collect();
        return described
            .with_group_state(text(view.state))
            .with_protocol_type(text(&view.protocol_type))
            .with_protocol_data(text(&view.protocol))
            .with_members(members);
    }
    let hubs: BTreeSet<String> = checkpoints::hubs_with_offsets(&ctx.broker, name)
        .await
        .into_iter()
        .collect();
    if hubs.is_empty() {
        return described.with_group_state(text("Dead"));
    }
    if !may_see(&hubs, session) {
        return described.with_error_code(denied);
    }
    described
        .with_group_state(text("Empty"))
        .with_protocol_type(text(CONSUMER))
}

async fn list(
    request: &ListGroupsRequest,
    version: i16,
    session: &Session,
    ctx: &Context,
) -> ListGroupsResponse {
    let mut listed: Vec<(String, &'static str, String)> = ctx
        .groups
        .views()
        .into_iter()
        .filter(|v| may_see(&v.topics, session))
        .map(|v| (v.name, v.state, v.protocol_type))
        .collect();
    let mut seen: BTreeSet<String> = listed.iter().map(|(n, _, _)| name_key(n)).collect();
    for hub in ctx.broker.list_hubs() {
        if session.authorize(&hub.name, auth::LISTEN).is_err() {
            continue;
        }
        for group in &hub.consumer_groups {
            if seen.contains(&name_key(&group.name)) {
                continue;
            }
            let has_offsets = ctx
                .broker
                .list_checkpoints(&hub.name, &group.name)
                .await
                .is_ok_and(|c| c.iter().any(|c| c.sequence_number.is_some()));
            if has_offsets {
                seen.insert(name_key(&group.name));
                listed.push((group.name.clone(), "Empty", CONSUMER.to_owned()));
            }
        }
    }
    let states: Vec<String> = request
        .states_filter
        .iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    let classic = request.types_filter.is_empty()
        || request
            .types_filter
            .iter()
            .any(|t| t.eq_ignore_ascii_case("classic"));
    let groups = listed
        .into_iter()
        .filter(|_| classic)
        .filter(|(_, state, _)| states.is_empty() || states.contains(&state.to_ascii_lowercase()))
        .map(|(name, state, protocol_type)| {
            let group = ListedGroup::default()
                .with_group_id(GroupId(text(&name)))
                .with_protocol_type(text(&protocol_type));
            let group = if version >= 4 {
                group.with_group_state(text(state))
            } else {
                group
            };
            if version >= 5 {
                group.with_group_type(text("classic"))
            } else {
                group
            }
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

async fn delete(
    request: &DeleteGroupsRequest,
    session: &Session,
    ctx: &Context,
) -> DeleteGroupsResponse {
    let mut results = Vec::with_capacity(request.groups_names.len());
    for id in &request.groups_names {
        let error = match group_name(id) {
            Ok(name) => delete_one(name, session, ctx).await,
            Err(code) => code,
        };
        results.push(
            DeletableGroupResult::default()
                .with_group_id(id.clone())
                .with_error_code(error),
        );
    }
    DeleteGroupsResponse::default().with_results(results)
}

/// Deletes consumer group `name` from every hub that has it; its error code.
async fn delete_one(name: &str, session: &Session, ctx: &Context) -> i16 {
    if is_default_consumer_group(name) {
        return ResponseError::InvalidGroupId.code();
    }
    if ctx.groups.has_members(name) {
        return ResponseError::NonEmptyGroup.code();
    }
    let key = name_key(name);
    let hubs: Vec<String> = ctx
        .broker
        .list_hubs()
        .into_iter()
        .filter(|h| h.consumer_groups.iter().any(|g| name_key(&g.name) == key))
        .map(|h| h.name)
        .collect();
    if hubs.is_empty() {
        return ResponseError::GroupIdNotFound.code();
    }
    if hubs.iter().any(|h| session.authorize(h, MANAGE).is_err()) {
        return ResponseError::GroupAuthorizationFailed.code();
    }
    for hub in hubs {
        if let Err(e) = ctx.broker.delete_consumer_group(&hub, name).await {
            tracing::debug!(%hub, group = %name, error = %e, "deleting a Kafka group's consumer group failed");
            return crate::error::code(&e);
        }
    }
    0
}
