//! What one delivery costs to write and to read: the hand codec against the reference
//! (`serde_amqp` with the `fe2o3-amqp` types, which this codec replaced on the data path).
//!
//! `cargo bench -p tributary-amqp-codec --bench codec` prints the nanoseconds to write the
//! message of a 100-byte event with the three `x-opt-*` annotations Event Hubs stamps on every
//! delivery, and to encode a pre-settled `transfer` frame carrying a 160-byte message and split
//! and decode it again (the payload copied in both cases).

use std::hint::black_box;
use std::time::Instant;

use fe2o3_amqp_types::definitions::Handle;
use fe2o3_amqp_types::messaging::message::__private::Serializable;
use fe2o3_amqp_types::messaging::{Message, MessageAnnotations};
use fe2o3_amqp_types::performatives::{Performative, Transfer};
use fe2o3_amqp_types::primitives::Binary;
use fe2o3_amqp_types::primitives::Timestamp;
use serde_amqp::read::IoReader;
use tributary_amqp_codec::TransferFields;
use tributary_amqp_codec::frame::{self, FrameType};
use tributary_amqp_codec::message::{MapSection, section, write_data_section};

const MESSAGE_BYTES: usize = 160;
const EVENT_BYTES: usize = 100;

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this without it: then a
    // few frames only, a smoke test of both paths (the figures are not measurements).
    let frames = if std::env::args().any(|a| a == "--bench") {
        2_000_000
    } else {
        1_000
    };
    let message = vec![0x5a; MESSAGE_BYTES];
    let hand = transfer_by_hand(frames, &message);
    let reference = transfer_by_reference(frames, &message);
    let body = vec![0x61; EVENT_BYTES];
    let hand_message = message_by_hand(frames, &body);
    let reference_message = message_by_reference(frames, &body);
    println!(
        "delivery message of a {EVENT_BYTES}-byte event with its three x-opt annotations, written: hand codec {hand_message:.0} ns, fe2o3-amqp Message built and serialized {reference_message:.0} ns ({frames} messages each)"
    );
    println!(
        "transfer frame of a {MESSAGE_BYTES}-byte message, encoded, split and decoded: hand codec {hand:.0} ns, serde_amqp with fe2o3-amqp types {reference:.0} ns ({frames} frames each)"
    );
}

/// A transfer frame carrying `message`, encoded, split and decoded by our codec.
fn transfer_by_hand(frames: u32, message: &[u8]) -> f64 {
    measure(frames, |id, out| {
        out.clear();
        let start = frame::start_frame(out, FrameType::Amqp, 0);
        let tag = id.to_be_bytes();
        TransferFields {
            handle: 1,
            delivery_id: Some(id),
            delivery_tag: Some(&tag),
            message_format: Some(0),
            settled: Some(true),
            ..TransferFields::default()
        }
        .encode(out);
        out.extend_from_slice(message);
        frame::finish_frame(out, start);
        let (frame, _) = frame::split_frame(out, 1 << 20).unwrap().unwrap();
        let (transfer, payload) = TransferFields::decode(frame.body).unwrap();
        assert_eq!((transfer.delivery_id, payload), (Some(id), message));
        black_box(payload.to_vec());
    })
}

/// The same transfer frame through serde_amqp and fe2o3-amqp's types.
fn transfer_by_reference(frames: u32, message: &[u8]) -> f64 {
    measure(frames, |id, out| {
        out.clear();
        let start = frame::start_frame(out, FrameType::Amqp, 0);
        let transfer = Transfer {
            handle: Handle(1),
            delivery_id: Some(id),
            delivery_tag: Some(Binary::from(id.to_be_bytes().to_vec())),
            message_format: Some(0),
            settled: Some(true),
            more: false,
            rcv_settle_mode: None,
            state: None,
            resume: false,
            aborted: false,
            batchable: false,
        };
        let mut serializer = serde_amqp::ser::Serializer::new(&mut *out);
        serde::Serialize::serialize(&Performative::Transfer(transfer), &mut serializer).unwrap();
        out.extend_from_slice(message);
        frame::finish_frame(out, start);
        let (frame, _) = frame::split_frame(out, 1 << 20).unwrap().unwrap();
        // As the engine reads a frame: the performative from an I/O reader, which consumes
        // exactly its bytes; the rest is the payload.
        let mut rest = frame.body;
        let mut deserializer = serde_amqp::de::Deserializer::new(IoReader::new(&mut rest));
        let performative: Performative =
            serde::Deserialize::deserialize(&mut deserializer).unwrap();
        drop(deserializer);
        let Performative::Transfer(transfer) = performative else {
            panic!("a transfer was written")
        };
        assert_eq!((transfer.delivery_id, rest), (Some(id), message));
        black_box(rest.to_vec());
    })
}

/// A delivery's message (the three `x-opt` annotations and a data section) written by our codec.
fn message_by_hand(frames: u32, body: &[u8]) -> f64 {
    measure(frames, |id, out| {
        out.clear();
        let mut annotations = MapSection::start(out, section::MESSAGE_ANNOTATIONS);
        annotations.entry("x-opt-sequence-number", true, |v| v.long(i64::from(id)));
        annotations.entry("x-opt-offset", true, |v| {
            v.string(&(u64::from(id) * 160).to_string())
        });
        annotations.entry("x-opt-enqueued-time", true, |v| {
            v.timestamp(1_763_800_000_000)
        });
        annotations.finish();
        write_data_section(out, body);
        black_box(out.len());
    })
}

/// The same message built and serialized with fe2o3-amqp.
fn message_by_reference(frames: u32, body: &[u8]) -> f64 {
    measure(frames, |id, out| {
        out.clear();
        let annotations = MessageAnnotations::builder()
            .insert("x-opt-sequence-number", i64::from(id))
            .insert("x-opt-offset", (u64::from(id) * 160).to_string())
            .insert(
                "x-opt-enqueued-time",
                Timestamp::from_milliseconds(1_763_800_000_000),
            )
            .build();
        let message = Message::builder()
            .message_annotations(annotations)
            .data(Binary::from(body.to_vec()))
            .build();
        let mut serializer = serde_amqp::ser::Serializer::new(&mut *out);
        serde::Serialize::serialize(&Serializable(message), &mut serializer).unwrap();
        black_box(out.len());
    })
}

/// Nanoseconds per call of `round_trip`, over `frames` calls.
fn measure(frames: u32, mut round_trip: impl FnMut(u32, &mut Vec<u8>)) -> f64 {
    let mut out = Vec::with_capacity(4096);
    for id in 0..frames / 10 {
        round_trip(id, &mut out); // warm-up
    }
    let started = Instant::now();
    for id in 0..frames {
        round_trip(id, &mut out);
    }
    started.elapsed().as_nanos() as f64 / f64::from(frames)
}
