//! AMQP targets: frames, the per-message performatives, values, and a whole server connection.

use tributary_amqp_codec::frame::{
    HEADER_BYTES, MIN_MAX_FRAME_SIZE, finish_frame, split_frame, start_frame,
};
use tributary_amqp_codec::performative::{ACCEPTED, performative_code};
use tributary_amqp_codec::value::{Reader, check_well_formed};
use tributary_amqp_codec::{DispositionFields, FlowFields, TransferFields};
use tributary_amqp_engine::connection::AMQP_HEADER;
use tributary_amqp_engine::{Config, Connection, Event};

/// Splits a stream of frames. The first two bytes choose the `max-frame-size`. Every frame taken
/// lies within the input and the maximum, re-encodes to a frame that splits back the same, and
/// "incomplete" is said only of a buffer that is.
pub fn frame(data: &[u8]) {
    let Some((max, mut rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let max_frame_size = MIN_MAX_FRAME_SIZE.max(u32::from(u16::from_be_bytes(*max)) * 8);
    loop {
        match split_frame(rest, max_frame_size) {
            Err(_) => return,
            Ok(None) => {
                if let Some(header) = rest.first_chunk::<HEADER_BYTES>() {
                    let size = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
                    assert!(
                        rest.len() < size as usize,
                        "a whole frame was called incomplete"
                    );
                }
                return;
            }
            Ok(Some((frame, used))) => {
                assert!(used >= HEADER_BYTES, "a frame is at least its header");
                assert!(used <= rest.len(), "a frame ends within its buffer");
                assert!(
                    used as u64 <= u64::from(max_frame_size),
                    "frames fit the maximum"
                );
                assert!(
                    rest[..used].ends_with(frame.body),
                    "the body ends the frame"
                );
                let mut again = Vec::new();
                let start = start_frame(&mut again, frame.frame_type, frame.channel);
                again.extend_from_slice(frame.body);
                finish_frame(&mut again, start);
                let (reread, reused) = split_frame(&again, u32::MAX)
                    .expect("a frame we wrote splits")
                    .expect("a frame we wrote is complete");
                assert_eq!(reread, frame);
                assert_eq!(reused, again.len());
                rest = &rest[used..];
            }
        }
    }
}

/// Decodes a frame body as `transfer`, `flow` or `disposition` (chosen by the first byte); what
/// is accepted re-encodes to bytes that decode to the same fields (and the same payload).
pub fn performative(data: &[u8]) {
    let Some((&choice, body)) = data.split_first() else {
        return;
    };
    let _ = performative_code(body);
    match choice % 3 {
        0 => {
            if let Ok((transfer, payload)) = TransferFields::decode(body) {
                assert!(body.ends_with(payload), "the payload ends the body");
                let mut again = Vec::new();
                transfer.encode(&mut again);
                again.extend_from_slice(payload);
                let (reread, repayload) =
                    TransferFields::decode(&again).expect("a transfer we wrote decodes");
                assert_eq!(reread, transfer);
                assert_eq!(repayload, payload);
            }
        }
        1 => {
            if let Ok(flow) = FlowFields::decode(body) {
                let mut again = Vec::new();
                flow.encode(&mut again);
                assert_eq!(FlowFields::decode(&again), Ok(flow));
            }
        }
        _ => {
            if let Ok(disposition) = DispositionFields::decode(body) {
                let mut again = Vec::new();
                disposition.encode(&mut again);
                assert_eq!(DispositionFields::decode(&again), Ok(disposition));
            }
        }
    }
}

/// Reads values: the checked skip and the trusting skip agree wherever the checked one passes;
/// a well-formed buffer is all checked values; primitives never read past the input.
pub fn value(data: &[u8]) {
    let well_formed = check_well_formed(data).is_ok();
    let mut checked = Reader::new(data);
    let mut trusting = Reader::new(data);
    while !checked.is_at_end() {
        if checked.skip_checked(0).is_err() {
            break;
        }
        trusting
            .skip(0)
            .expect("a value that passes the check can be skipped");
        assert_eq!(checked.position(), trusting.position());
    }
    if well_formed {
        assert!(checked.is_at_end(), "well-formed bytes are whole values");
    }
    let mut reader = Reader::new(data);
    while !reader.is_at_end() {
        let before = reader.position();
        if reader.primitive().is_err() {
            break;
        }
        assert!(
            reader.position() > before,
            "a value takes at least one byte"
        );
        assert!(
            reader.position() <= data.len(),
            "a value ends within the input"
        );
    }
}

/// Feeds bytes to a server connection (after the AMQP header, unless the first byte is odd),
/// in chunks whose size the first byte chooses, answering as an application would. Each call uses no more than it was given, the
/// connection's output is whole frames after its header, and after an error nothing more is
/// read.
pub fn connection(data: &[u8]) {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let mut input = Vec::new();
    if choice % 2 == 0 {
        input.extend_from_slice(&AMQP_HEADER);
    }
    input.extend_from_slice(rest);
    let chunk = 1 + usize::from(choice / 2) * 8;
    let mut connection = Connection::server(Config::new("fuzz"));
    let (mut buffer, mut output, mut fed) = (Vec::new(), Vec::new(), 0);
    while fed < input.len() {
        let end = input.len().min(fed + chunk);
        buffer.extend_from_slice(&input[fed..end]);
        fed = end;
        let result = connection.receive(&buffer);
        answer(&mut connection);
        connection.move_output_to(&mut output);
        match result {
            Ok(used) => {
                assert!(used <= buffer.len(), "receive used more than it was given");
                buffer.drain(..used);
            }
            Err(_) => {
                assert!(connection.is_closed(), "an error closes the connection");
                assert_eq!(
                    connection.receive(&buffer).ok(),
                    Some(0),
                    "read after an error"
                );
                connection.move_output_to(&mut output);
                break;
            }
        }
    }
    assert_whole_frames(&output);
}

/// Plays the application, as the hub does: accepts every link, grants credit to the peer's
/// senders, sends on the links the peer receives on, settles every delivery. Refusals of these
/// calls are the engine's to make (a closed connection, a detached link).
fn answer(connection: &mut Connection) {
    while let Some(event) = connection.poll_event() {
        match event {
            Event::Attached {
                link,
                attach,
                answer: false,
            } => {
                let _ = connection.attach_answer(link, *attach);
                let _ = connection.flow(link, 8);
            }
            Event::Credit(link) => {
                for _ in 0..connection.credit(link).min(4) {
                    let _ = connection.send(link, false, 0, |out| out.extend_from_slice(b"event"));
                }
            }
            Event::Delivery(delivery) => {
                let (id, session) = (delivery.delivery_id, delivery.link.session);
                let _ = connection.disposition(session, true, id, id, true, Some(ACCEPTED));
            }
            _ => {}
        }
    }
}

fn assert_whole_frames(output: &[u8]) {
    let mut rest = output.strip_prefix(&AMQP_HEADER[..]).unwrap_or(output);
    while !rest.is_empty() {
        let (_, used) = split_frame(rest, u32::MAX)
            .expect("the engine writes valid frame headers")
            .expect("the engine writes whole frames");
        rest = &rest[used..];
    }
}
