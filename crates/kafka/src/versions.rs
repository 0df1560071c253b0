//! The API versions this door advertises, and the ApiVersions answer.
//!
//! Only versions the door decodes and answers are advertised: each range lies inside what
//! `kafka-protocol` decodes (checked by a test) and below the versions that need topic ids or
//! features this door does not have yet (Fetch ≥ 13 and Metadata ≥ 13 identify topics by id).
//! Clients pick, per API, the highest version both sides support.
//!
//! A client asking ApiVersions at a version above ours gets error 35 UNSUPPORTED_VERSION with a
//! v0 body listing our ranges; librdkafka and kafka-python then retry at our highest (KIP-511).

use kafka_protocol::messages::ApiKey;
use kafka_protocol::messages::api_versions_response::{ApiVersion, ApiVersionsResponse};

/// Every API the door answers, with the version range it advertises.
pub const ADVERTISED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 1, 12),
    // From v0: librdkafka 2.0.2 (Debian 12's, under kcat 1.7.1) sees no SASL handshake
    // at all in a range without v0 and refuses PLAIN. It, like every current client, then
    // handshakes at v1 and authenticates with SaslAuthenticate; a client that stayed at v0
    // would send its token unframed, which the door does not read (the connection closes).
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 5),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::CreateTopics, 2, 6),
    (ApiKey::DeleteTopics, 1, 5),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DescribeCluster, 0, 2),
];

/// The advertised range of `key`, if the door answers it.
pub fn advertised(key: ApiKey) -> Option<(i16, i16)> {
    ADVERTISED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, min, max)| (*min, *max))
}

/// Whether the door answers `key` at `version`.
pub fn supports(key: ApiKey, version: i16) -> bool {
    advertised(key).is_some_and(|(min, max)| (min..=max).contains(&version))
}

/// The ApiVersions answer; `error_code` 35 (with the body encoded at v0) when the client asked
/// at a version above ours.
pub fn api_versions(error_code: i16) -> ApiVersionsResponse {
    let api_keys = ADVERTISED
        .iter()
        .map(|(key, min, max)| {
            ApiVersion::default()
                .with_api_key(*key as i16)
                .with_min_version(*min)
                .with_max_version(*max)
        })
        .collect();
    ApiVersionsResponse::default()
        .with_error_code(error_code)
        .with_api_keys(api_keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_advertised_range_is_decodable() {
        for (key, min, max) in ADVERTISED {
            let valid = key.valid_versions();
            assert!(min <= max, "{key:?}");
            assert!(*min >= valid.min, "{key:?} below {valid:?}");
            assert!(*max <= valid.max, "{key:?} above {valid:?}");
        }
        assert!(supports(ApiKey::Fetch, 12));
        assert!(!supports(ApiKey::Fetch, 13));
        assert!(!supports(ApiKey::ConsumerGroupHeartbeat, 0));
    }
}
