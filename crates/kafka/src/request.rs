//! A request frame into its API, version, correlation id and body: the door's one decoder of
//! what a client sends (the fuzz target `kafka_request` runs it as the door does).
//!
//! # Guarantees
//! - The header is read at the version `ApiKey::request_header_version` gives for the request's
//!   API and version (v2, with tagged fields, for flexible versions), never assumed.
//! - Before authentication only ApiVersions, SaslHandshake and SaslAuthenticate are decoded;
//!   any other API is an error before its body is read.
//! - An API or version the door does not advertise is an error, except ApiVersions above our
//!   range, which is [`Body::ApiVersionsTooNew`] (answered with UNSUPPORTED_VERSION and our
//!   ranges, KIP-511).
//! - A body is decoded only after a probe showed that none of its arrays claims more elements
//!   than its bytes could hold ([`crate::bounded`]): the codec reserves memory for claimed
//!   counts, so a short body cannot make it reserve gigabytes.
//! - Every error is a sentence for the debug log, with nothing of the body in it.

use bytes::Bytes;
use kafka_protocol::messages::{self, ApiKey, RequestHeader, RequestKind};
use kafka_protocol::protocol::Decodable;

use crate::bounded;
use crate::versions;

/// A decoded request.
#[derive(Debug)]
pub struct Request {
    /// Its API.
    pub key: ApiKey,
    /// The API version the client chose.
    pub version: i16,
    /// What the response must carry.
    pub correlation_id: i32,
    /// The client's id from the request header (librdkafka's `client.id`), if it sent one.
    pub client_id: Option<String>,
    /// Its body.
    pub body: Body,
}

/// A request's body.
#[derive(Debug)]
pub enum Body {
    /// Decoded at the request's version (boxed: a request's body is some hundred bytes).
    Decoded(Box<RequestKind>),
    /// ApiVersions at a version above the advertised range: not decoded.
    ApiVersionsTooNew,
}

/// Whether `key` is answered before authentication.
pub fn answered_before_sasl(key: ApiKey) -> bool {
    matches!(
        key,
        ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
    )
}

/// Decodes one request frame (without its length prefix); `authenticated` says whether the
/// connection has logged in (see the module docs).
pub fn decode(mut frame: Bytes, authenticated: bool) -> Result<Request, String> {
    if frame.len() < 4 {
        return Err("a request shorter than its header".into());
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let key = ApiKey::try_from(raw_key).map_err(|()| format!("unknown API key {raw_key}"))?;
    if !authenticated && !answered_before_sasl(key) {
        return Err(format!("{key:?} before authenticating (SASL PLAIN)"));
    }
    let header = RequestHeader::decode(&mut frame, key.request_header_version(version))
        .map_err(|e| format!("{key:?} v{version}: bad request header: {e}"))?;
    let correlation_id = header.correlation_id;
    let client_id = header.client_id.map(|id| id.to_string());
    let body = if key == ApiKey::ApiVersions && !versions::supports(key, version) {
        Body::ApiVersionsTooNew
    } else if !versions::supports(key, version) {
        return Err(format!("{key:?} v{version} is not supported"));
    } else {
        probe(key, &frame, version)
            .map_err(|e| format!("{key:?} v{version}: the body does not decode: {e}"))?;
        let body = RequestKind::decode(key, &mut frame, version)
            .map_err(|e| format!("{key:?} v{version}: the body does not decode: {e}"))?;
        Body::Decoded(Box::new(body))
    };
    Ok(Request {
        key,
        version,
        correlation_id,
        client_id,
        body,
    })
}

/// The requests [`probe`] knows; an API the door advertises must be here (a test checks).
macro_rules! probed {
    ($($key:ident => $request:ident,)*) => {
        /// Whether [`probe`] knows `key`'s request type.
        pub fn probed(key: ApiKey) -> bool {
            matches!(key, $(ApiKey::$key)|*)
        }

        /// The bounded probe of a request body (see [`crate::bounded`]): an error when it does
        /// not decode with its counts held to its bytes, or when its API is not listed here.
        fn probe(key: ApiKey, body: &Bytes, version: i16) -> anyhow::Result<()> {
            match key {
                $(ApiKey::$key => bounded::probe::<messages::$request>(body, version),)*
                other => anyhow::bail!("{other:?} has no bounded probe"),
            }
        }
    };
}

probed! {
    Produce => ProduceRequest,
    Fetch => FetchRequest,
    ListOffsets => ListOffsetsRequest,
    Metadata => MetadataRequest,
    OffsetCommit => OffsetCommitRequest,
    OffsetFetch => OffsetFetchRequest,
    FindCoordinator => FindCoordinatorRequest,
    JoinGroup => JoinGroupRequest,
    Heartbeat => HeartbeatRequest,
    LeaveGroup => LeaveGroupRequest,
    SyncGroup => SyncGroupRequest,
    DescribeGroups => DescribeGroupsRequest,
    ListGroups => ListGroupsRequest,
    SaslHandshake => SaslHandshakeRequest,
    ApiVersions => ApiVersionsRequest,
    CreateTopics => CreateTopicsRequest,
    DeleteTopics => DeleteTopicsRequest,
    DeleteRecords => DeleteRecordsRequest,
    InitProducerId => InitProducerIdRequest,
    OffsetForLeaderEpoch => OffsetForLeaderEpochRequest,
    AddPartitionsToTxn => AddPartitionsToTxnRequest,
    AddOffsetsToTxn => AddOffsetsToTxnRequest,
    EndTxn => EndTxnRequest,
    TxnOffsetCommit => TxnOffsetCommitRequest,
    DescribeConfigs => DescribeConfigsRequest,
    AlterConfigs => AlterConfigsRequest,
    SaslAuthenticate => SaslAuthenticateRequest,
    CreatePartitions => CreatePartitionsRequest,
    DeleteGroups => DeleteGroupsRequest,
    IncrementalAlterConfigs => IncrementalAlterConfigsRequest,
    OffsetDelete => OffsetDeleteRequest,
    DescribeCluster => DescribeClusterRequest,
    DescribeProducers => DescribeProducersRequest,
    ConsumerGroupHeartbeat => ConsumerGroupHeartbeatRequest,
    ConsumerGroupDescribe => ConsumerGroupDescribeRequest,
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, BytesMut};
    use kafka_protocol::messages::{FetchRequest, MetadataRequest, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    use super::*;

    /// A frame (without its length) of `request` at `version`.
    fn frame<R: Encodable>(key: ApiKey, version: i16, request: &R) -> Bytes {
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .with_client_id(Some(StrBytes::from_static_str("test")))
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        request.encode(&mut buf, version).unwrap();
        buf.freeze()
    }

    #[test]
    fn every_advertised_api_has_a_bounded_probe() {
        for (key, _, _) in versions::ADVERTISED {
            assert!(probed(*key), "{key:?} is advertised but not probed");
        }
    }

    #[test]
    fn real_requests_pass_the_probe_at_every_advertised_version() {
        let topic = |name: &'static str| {
            messages::metadata_request::MetadataRequestTopic::default()
                .with_name(Some(TopicName(StrBytes::from_static_str(name))))
        };
        let metadata = MetadataRequest::default().with_topics(Some(vec![topic("a"), topic("b")]));
        let (min, max) = versions::advertised(ApiKey::Metadata).unwrap();
        for version in min..=max {
            let decoded = decode(frame(ApiKey::Metadata, version, &metadata), true).unwrap();
            let Body::Decoded(body) = decoded.body else {
                panic!("v{version} not decoded")
            };
            let RequestKind::Metadata(body) = *body else {
                panic!("v{version} decoded as another API")
            };
            assert_eq!(body.topics.map(|t| t.len()), Some(2), "v{version}");
        }
        // Large values that are not counts (a 50 MiB byte limit, a 30 s wait) are not mistaken
        // for counts.
        let fetch = FetchRequest::default()
            .with_max_wait_ms(30_000)
            .with_max_bytes(50 * 1024 * 1024)
            .with_replica_id(kafka_protocol::messages::BrokerId(-1));
        let (min, max) = versions::advertised(ApiKey::Fetch).unwrap();
        for version in min..=max {
            let decoded = decode(frame(ApiKey::Fetch, version, &fetch), true).unwrap();
            let Body::Decoded(body) = decoded.body else {
                panic!("v{version} not decoded")
            };
            let RequestKind::Fetch(body) = *body else {
                panic!("v{version} decoded as another API")
            };
            assert_eq!(
                (body.max_wait_ms, body.max_bytes),
                (30_000, 50 * 1024 * 1024)
            );
        }
    }

    /// A Metadata request whose topic array claims `count` elements and carries none.
    fn metadata_claiming(version: i16, count: u32) -> Bytes {
        let key = ApiKey::Metadata;
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .encode(&mut buf, key.request_header_version(version))
            .unwrap();
        if version >= 9 {
            // Flexible: a compact array's length is the count plus one, as a varint.
            let mut n = count + 1;
            while n >= 0x80 {
                buf.put_u8((n as u8) | 0x80);
                n >>= 7;
            }
            buf.put_u8(n as u8);
        } else {
            buf.put_i32(count as i32);
        }
        buf.put_bytes(0, 16);
        buf.freeze()
    }

    #[test]
    fn an_array_claiming_billions_of_elements_is_refused_before_the_codec_reserves_them() {
        // Without the probe the codec reserves count × the element's size and the process
        // aborts when the allocation fails; with it the request is an error.
        for version in [4, 8, 9, 12] {
            for count in [i32::MAX as u32, 1 << 28, 1000] {
                let error = decode(metadata_claiming(version, count), true).unwrap_err();
                assert!(
                    error.contains("does not decode"),
                    "v{version} {count}: {error}"
                );
            }
        }
    }
}
