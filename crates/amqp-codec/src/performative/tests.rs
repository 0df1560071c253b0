//! The hand codec against the reference one (`serde_amqp` with the `fe2o3-amqp` types).

use fe2o3_amqp_types::definitions::{Handle, ReceiverSettleMode, Role};
use fe2o3_amqp_types::messaging::{Accepted, DeliveryState, Modified, Received, Released};
use fe2o3_amqp_types::performatives::{Disposition, Flow, Transfer};
use fe2o3_amqp_types::primitives::Binary as ByteBuf;
use fe2o3_amqp_types::primitives::{OrderedMap, Symbol, Value};
use proptest::prelude::*;

use super::*;

fn delivery_state() -> impl Strategy<Value = Option<DeliveryState>> {
    prop_oneof![
        Just(None),
        Just(Some(DeliveryState::Accepted(Accepted {}))),
        Just(Some(DeliveryState::Released(Released {}))),
        (any::<u32>(), any::<u64>()).prop_map(|(section_number, section_offset)| Some(
            DeliveryState::Received(Received {
                section_number,
                section_offset,
            })
        )),
        any::<bool>().prop_map(|failed| Some(DeliveryState::Modified(Modified {
            delivery_failed: Some(failed),
            undeliverable_here: None,
            message_annotations: None,
        }))),
    ]
}

fn transfer() -> impl Strategy<Value = Transfer> {
    (
        (
            any::<u32>(),
            any::<Option<u32>>(),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
            any::<Option<u32>>(),
            any::<Option<bool>>(),
            any::<bool>(),
        ),
        (
            proptest::option::of(any::<bool>()),
            delivery_state(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (handle, delivery_id, tag, message_format, settled, more),
                (second, state, resume, aborted, batchable),
            )| Transfer {
                handle: Handle(handle),
                delivery_id,
                delivery_tag: tag.map(ByteBuf::from),
                message_format,
                settled,
                more,
                rcv_settle_mode: second.map(|second| {
                    if second {
                        ReceiverSettleMode::Second
                    } else {
                        ReceiverSettleMode::First
                    }
                }),
                state,
                resume,
                aborted,
                batchable,
            },
        )
}

fn encoded<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_amqp::to_vec(value).expect("the reference encodes")
}

fn fields_of(reference: &Transfer) -> (Vec<u8>, Option<Vec<u8>>) {
    let tag = reference.delivery_tag.as_ref().map(|tag| tag.to_vec());
    let state = reference.state.as_ref().map(encoded);
    (tag.unwrap_or_default(), state)
}

fn hand_transfer<'a>(
    reference: &Transfer,
    tag: &'a [u8],
    state: Option<&'a [u8]>,
) -> TransferFields<'a> {
    TransferFields {
        handle: reference.handle.0,
        delivery_id: reference.delivery_id,
        delivery_tag: reference.delivery_tag.as_ref().map(|_| tag),
        message_format: reference.message_format,
        settled: reference.settled,
        more: reference.more,
        rcv_settle_mode: reference.rcv_settle_mode.clone().map(u8::from),
        state,
        resume: reference.resume,
        aborted: reference.aborted,
        batchable: reference.batchable,
    }
}

/// The element count of the list of the performative at the start of `body`.
fn field_count(body: &[u8]) -> u32 {
    let mut reader = Reader::new(body);
    reader.descriptor().unwrap();
    reader.list_header().unwrap().0
}

proptest! {
    #[test]
    fn transfers_the_reference_writes_read_back(reference in transfer(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut body = encoded(&reference);
        body.extend_from_slice(&payload);
        let (tag, state) = fields_of(&reference);
        let (decoded, rest) = TransferFields::decode(&body).unwrap();
        prop_assert_eq!(decoded, hand_transfer(&reference, &tag, state.as_deref()));
        prop_assert_eq!(rest, &payload[..]);
    }

    #[test]
    fn transfers_written_by_hand_read_back_in_the_reference(reference in transfer()) {
        let (tag, state) = fields_of(&reference);
        let mut body = Vec::new();
        hand_transfer(&reference, &tag, state.as_deref()).encode(&mut body);
        // All 11, trailing nulls included: the Python SDK's pyamqp needs them (see `encode`).
        prop_assert_eq!(field_count(&body), 11);
        let decoded: Transfer = serde_amqp::from_slice(&body).unwrap();
        prop_assert_eq!(decoded, reference);
    }

    /// Every transfer this crate writes reads back as written: the ones with one-byte trailing
    /// fields as a block, the others (a settle mode, a state, a `true` of the long form) field
    /// by field; a payload after either is left whole.
    #[test]
    fn transfers_written_by_hand_read_back_by_hand(reference in transfer(), payload in proptest::collection::vec(any::<u8>(), 0..16)) {
        let (tag, state) = fields_of(&reference);
        let written = hand_transfer(&reference, &tag, state.as_deref());
        let mut body = Vec::new();
        written.encode(&mut body);
        body.extend_from_slice(&payload);
        let (decoded, rest) = TransferFields::decode(&body).unwrap();
        prop_assert_eq!(decoded, written);
        prop_assert_eq!(rest, &payload[..]);
    }

    #[test]
    fn flows_round_trip_both_ways(
        ids in (any::<Option<u32>>(), any::<u32>(), any::<u32>(), any::<u32>()),
        link in (any::<Option<u32>>(), any::<Option<u32>>(), any::<Option<u32>>(), any::<Option<u32>>()),
        (drain, echo) in (any::<bool>(), any::<bool>()),
        property in proptest::option::of("[a-z]{1,8}"),
    ) {
        let properties = property.map(|key| {
            let mut map = OrderedMap::new();
            map.insert(Symbol::from(key.as_str()), Value::String(key.clone()));
            map
        });
        let reference = Flow {
            next_incoming_id: ids.0,
            incoming_window: ids.1,
            next_outgoing_id: ids.2,
            outgoing_window: ids.3,
            handle: link.0.map(Handle),
            delivery_count: link.1,
            link_credit: link.2,
            available: link.3,
            drain,
            echo,
            properties: properties.clone(),
        };
        let properties_encoded = properties.as_ref().map(encoded);
        let hand = FlowFields {
            next_incoming_id: ids.0,
            incoming_window: ids.1,
            next_outgoing_id: ids.2,
            outgoing_window: ids.3,
            handle: link.0,
            delivery_count: link.1,
            link_credit: link.2,
            available: link.3,
            drain,
            echo,
            properties: properties_encoded.as_deref(),
        };
        let reference_body = encoded(&reference);
        prop_assert_eq!(FlowFields::decode(&reference_body).unwrap(), hand);
        let mut body = Vec::new();
        hand.encode(&mut body);
        prop_assert_eq!(field_count(&body), 11);
        prop_assert_eq!(serde_amqp::from_slice::<Flow>(&body).unwrap(), reference);
    }

    #[test]
    fn dispositions_round_trip_both_ways(
        receiver in any::<bool>(),
        (first, last) in (any::<u32>(), any::<Option<u32>>()),
        (settled, batchable) in (any::<bool>(), any::<bool>()),
        state in delivery_state(),
    ) {
        let reference = Disposition {
            role: if receiver { Role::Receiver } else { Role::Sender },
            first,
            last,
            settled,
            state: state.clone(),
            batchable,
        };
        let state_encoded = state.as_ref().map(encoded);
        let hand = DispositionFields {
            role_is_receiver: receiver,
            first,
            last,
            settled,
            state: state_encoded.as_deref(),
            batchable,
        };
        let reference_body = encoded(&reference);
        prop_assert_eq!(DispositionFields::decode(&reference_body).unwrap(), hand);
        let mut body = Vec::new();
        hand.encode(&mut body);
        prop_assert_eq!(field_count(&body), 6);
        prop_assert_eq!(serde_amqp::from_slice::<Disposition>(&body).unwrap(), reference);
    }

    /// Any single byte changed, or the body cut anywhere: an error or a value, never a panic,
    /// and a payload that is a suffix of the input.
    #[test]
    fn damaged_performatives_never_panic(reference in transfer(), flip in any::<(usize, u8)>(), cut in any::<usize>()) {
        let mut body = encoded(&reference);
        body.extend_from_slice(b"payload");
        let at = flip.0 % body.len();
        body[at] ^= flip.1.max(1);
        let body = &body[..cut % (body.len() + 1)];
        if let Ok((_, payload)) = TransferFields::decode(body) {
            prop_assert!(body.ends_with(payload));
        }
        let _ = FlowFields::decode(body);
        let _ = DispositionFields::decode(body);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
        let _ = TransferFields::decode(&bytes);
        let _ = FlowFields::decode(&bytes);
        let _ = DispositionFields::decode(&bytes);
        let mut reader = Reader::new(&bytes);
        while !reader.rest().is_empty() && reader.skip(0).is_ok() {}
    }

    /// Skipping a value consumes exactly its encoding, whatever its type.
    #[test]
    fn any_value_is_skipped_exactly(value in any_value(), tail in proptest::collection::vec(any::<u8>(), 0..8)) {
        let mut bytes = encoded(&value);
        let length = bytes.len();
        bytes.extend_from_slice(&tail);
        let mut reader = Reader::new(&bytes);
        reader.skip(0).unwrap();
        prop_assert_eq!(reader.position(), length);
    }
}

fn any_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u8>().prop_map(Value::Ubyte),
        any::<u16>().prop_map(Value::Ushort),
        any::<u32>().prop_map(Value::Uint),
        any::<u64>().prop_map(Value::Ulong),
        any::<i8>().prop_map(Value::Byte),
        any::<i16>().prop_map(Value::Short),
        any::<i32>().prop_map(Value::Int),
        any::<i64>().prop_map(Value::Long),
        any::<char>().prop_map(Value::Char),
        "[a-z]{0,300}".prop_map(Value::String),
        "[a-z]{0,20}".prop_map(|s| Value::Symbol(Symbol::from(s))),
        proptest::collection::vec(any::<u8>(), 0..300)
            .prop_map(|b| Value::Binary(ByteBuf::from(b))),
        any::<[u8; 16]>().prop_map(|u| Value::Uuid(u.into())),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::List),
            proptest::collection::vec(("[a-z]{1,6}", inner), 0..4).prop_map(|pairs| {
                let mut map = OrderedMap::new();
                for (key, value) in pairs {
                    map.insert(Value::String(key), value);
                }
                Value::Map(map)
            }),
        ]
    })
}

#[test]
fn symbolic_descriptors_are_understood() {
    let mut body = vec![0x00, 0xa3, 18];
    body.extend_from_slice(b"amqp:transfer:list");
    body.extend_from_slice(&[0xc0, 0x04, 0x02, 0x52, 0x07, 0x43]);
    body.extend_from_slice(b"payload");
    let (transfer, payload) = TransferFields::decode(&body).unwrap();
    assert_eq!((transfer.handle, transfer.delivery_id), (7, Some(0)));
    assert_eq!(payload, b"payload");
}

#[test]
fn a_null_mandatory_field_is_refused() {
    // flow with incoming-window null
    let body = [0x00, 0x53, 0x13, 0xc0, 0x05, 0x04, 0x43, 0x40, 0x43, 0x43];
    let error = FlowFields::decode(&body).unwrap_err();
    assert_eq!(error.reason, "a flow needs incoming-window");
    // transfer with an empty list
    let error = TransferFields::decode(&[0x00, 0x53, 0x14, 0x45]).unwrap_err();
    assert_eq!(error.reason, "a transfer needs a handle");
}

#[test]
fn a_list_whose_size_disagrees_with_its_fields_is_refused() {
    // disposition (role, first) with a size one byte too large, then one more byte
    let body = [0x00, 0x53, 0x15, 0xc0, 0x05, 0x02, 0x41, 0x52, 0x01, 0x40];
    let error = DispositionFields::decode(&body).unwrap_err();
    assert_eq!(error.reason, "the list's size disagrees with its fields");
}

#[test]
fn the_wrong_performative_is_refused() {
    let mut body = Vec::new();
    FlowFields::default().encode(&mut body);
    assert_eq!(
        TransferFields::decode(&body).unwrap_err().reason,
        "not a transfer"
    );
    assert_eq!(performative_code(&body), Ok(code::FLOW));
}

#[test]
fn a_large_transfer_uses_a_list32() {
    let tag = [7u8; 300];
    let transfer = TransferFields {
        handle: 1,
        delivery_tag: Some(&tag),
        ..TransferFields::default()
    };
    let mut body = Vec::new();
    transfer.encode(&mut body);
    assert_eq!(body[3], 0xd0);
    let decoded: Transfer = serde_amqp::from_slice(&body).unwrap();
    assert_eq!(decoded.delivery_tag.unwrap().as_ref(), &tag[..]);
    assert_eq!(TransferFields::decode(&body).unwrap().0, transfer);
}
