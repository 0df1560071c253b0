//! The engine against itself: a client and a server connection wired back to back, every
//! byte passed by hand, so each test is a replayable sequence of frames.

use super::*;
use bytes::BytesMut;
use fe2o3_amqp_types::definitions::{ErrorCondition, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{Source, Target};
use fe2o3_amqp_types::primitives::Symbol;
use proptest::prelude::*;

fn config(name: &str) -> Config {
    Config::new(name)
}

/// Moves bytes both ways until neither side has anything to say. `chunk` cuts every hand-over
/// into pieces of that many bytes (0: whole), to show frames may arrive split anywhere.
fn pump_chunked(a: &mut Connection, b: &mut Connection, chunk: usize) {
    let mut to_b = Vec::new();
    let mut to_a = Vec::new();
    for _ in 0..10_000 {
        a.move_output_to(&mut to_b);
        b.move_output_to(&mut to_a);
        if to_a.is_empty() && to_b.is_empty() {
            return;
        }
        feed(b, &mut to_b, chunk);
        feed(a, &mut to_a, chunk);
    }
    panic!("the connections never went quiet");
}

/// Hands `input` to `c` as the driver does ([`Connection::receive_buf`]), in pieces of `chunk`
/// bytes (0: whole).
fn feed(c: &mut Connection, input: &mut Vec<u8>, chunk: usize) {
    let mut buffer = BytesMut::new();
    let pieces: Vec<Vec<u8>> = if chunk == 0 {
        vec![std::mem::take(input)]
    } else {
        std::mem::take(input)
            .chunks(chunk)
            .map(<[u8]>::to_vec)
            .collect()
    };
    for piece in pieces {
        buffer.extend_from_slice(&piece);
        if c.receive_buf(&mut buffer).is_err() {
            return;
        }
    }
    assert!(buffer.is_empty(), "{} bytes left unread", buffer.len());
}

fn pump(a: &mut Connection, b: &mut Connection) {
    pump_chunked(a, b, 0);
}

fn events(c: &mut Connection) -> Vec<Event> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

fn receiver_attach(name: &str, address: &str) -> Attach {
    let mut attach = attach_frame(name, Role::Receiver, SenderSettleMode::Settled);
    attach.source = Some(Box::new(Source::builder().address(address).build()));
    attach.target = Some(Box::new(Target::builder().build().into()));
    attach
}

fn sender_attach(name: &str, address: &str) -> Attach {
    let mut attach = attach_frame(name, Role::Sender, SenderSettleMode::Unsettled);
    attach.source = Some(Box::new(Source::builder().build()));
    attach.target = Some(Box::new(Target::builder().address(address).build().into()));
    attach
}

/// A client and a server with one session; returns them and the client's and server's
/// session ids.
fn connected(
    client_config: Config,
    server_config: Config,
) -> (Connection, Connection, SessionId, SessionId) {
    let mut client = Connection::client(client_config);
    let mut server = Connection::server(server_config);
    let session = client.begin().unwrap();
    pump(&mut client, &mut server);
    let server_events = events(&mut server);
    assert!(matches!(server_events[0], Event::Opened(_)));
    let Event::SessionBegun(server_session) = server_events[1] else {
        panic!("{server_events:?}")
    };
    let client_events = events(&mut client);
    assert!(matches!(client_events[0], Event::Opened(_)));
    assert_eq!(client_events[1], Event::SessionBegun(session));
    (client, server, session, server_session)
}

/// The client attaches `attach`; the server answers it as is. Returns (client link, server link).
fn attached(
    client: &mut Connection,
    server: &mut Connection,
    session: SessionId,
    attach: Attach,
) -> (LinkId, LinkId) {
    let client_link = client.attach(session, attach).unwrap();
    pump(client, server);
    let mut server_events = events(server);
    let Some(Event::Attached {
        link,
        attach,
        answer: false,
    }) = server_events.pop()
    else {
        panic!("no attach")
    };
    server.attach_answer(link, *attach).unwrap();
    pump(client, server);
    let client_events = events(client);
    assert!(
        matches!(
            client_events.as_slice(),
            [Event::Attached { answer: true, .. }]
        ),
        "{client_events:?}"
    );
    (client_link, link)
}

fn deliveries(c: &mut Connection) -> Vec<Delivery> {
    events(c)
        .into_iter()
        .filter_map(|e| match e {
            Event::Delivery(d) => Some(d),
            _ => None,
        })
        .collect()
}

#[test]
fn messages_flow_within_credit_and_no_further() {
    let (mut client, mut server, session, _) = connected(config("c"), config("s"));
    let (client_link, server_link) = attached(
        &mut client,
        &mut server,
        session,
        receiver_attach("r", "hub/p/0"),
    );
    assert_eq!(
        server.send(server_link, true, 0, |_| ()),
        Err(SendError::NoCredit)
    );
    client.flow(client_link, 3).unwrap();
    pump(&mut client, &mut server);
    assert_eq!(events(&mut server), vec![Event::Credit(server_link)]);
    assert_eq!(server.credit(server_link), 3);
    for i in 0..3u8 {
        server
            .send(server_link, true, 0, |out| out.extend_from_slice(&[i; 10]))
            .unwrap();
    }
    assert_eq!(
        server.send(server_link, true, 0, |_| ()),
        Err(SendError::NoCredit)
    );
    pump(&mut client, &mut server);
    let got = deliveries(&mut client);
    assert_eq!(got.len(), 3);
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d.payload, vec![i as u8; 10]);
        assert_eq!(d.delivery_id, i as u32);
        assert!(d.settled);
        assert_eq!(d.link, client_link);
    }
    assert_eq!(client.granted(client_link), 0);
    // More credit: the delivery count carries on.
    client.flow(client_link, 2).unwrap();
    pump(&mut client, &mut server);
    events(&mut server);
    assert_eq!(server.credit(server_link), 2);
}

#[test]
fn the_client_sends_and_the_server_settles() {
    let (mut client, mut server, session, server_session) = connected(config("c"), config("s"));
    let (client_link, server_link) =
        attached(&mut client, &mut server, session, sender_attach("s", "hub"));
    server.flow(server_link, 100).unwrap();
    pump(&mut client, &mut server);
    assert_eq!(events(&mut client), vec![Event::Credit(client_link)]);
    let first = client
        .send(client_link, false, 0x8001_3700, |o| {
            o.extend_from_slice(b"one")
        })
        .unwrap();
    let second = client
        .send(client_link, false, 0, |o| o.extend_from_slice(b"two"))
        .unwrap();
    pump(&mut client, &mut server);
    let got = deliveries(&mut server);
    assert_eq!(
        got.iter().map(|d| &d.payload[..]).collect::<Vec<_>>(),
        [b"one", b"two"]
    );
    assert_eq!(got[0].message_format, 0x8001_3700);
    assert!(!got[0].settled);
    assert_eq!(server.granted(server_link), 98);
    let accepted = tributary_amqp_codec::performative::ACCEPTED;
    server
        .disposition(
            server_session,
            true,
            got[0].delivery_id,
            got[1].delivery_id,
            true,
            Some(accepted),
        )
        .unwrap();
    pump(&mut client, &mut server);
    assert_eq!(
        events(&mut client),
        vec![Event::Disposition {
            session,
            role_is_receiver: true,
            first,
            last: second,
            settled: true,
            state: Some(accepted.to_vec()),
        }]
    );
}

#[test]
fn messages_larger_than_a_frame_are_split_and_joined() {
    let mut small = config("c");
    small.max_frame_size = 512;
    let (mut client, mut server, session, _) = connected(small, config("s"));
    let (client_link, server_link) =
        attached(&mut client, &mut server, session, receiver_attach("r", "a"));
    client.flow(client_link, 2).unwrap();
    pump(&mut client, &mut server);
    events(&mut server);
    let big: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    server
        .send(server_link, true, 0, |o| o.extend_from_slice(&big))
        .unwrap();
    server
        .send(server_link, true, 0, |o| o.extend_from_slice(b"small"))
        .unwrap();
    let output = server.take_output();
    let mut at = 0;
    let mut frames = 0;
    while at < output.len() {
        let size = u32::from_be_bytes(output[at..at + 4].try_into().unwrap()) as usize;
        assert!(size <= 512, "a frame of {size} bytes");
        at += size;
        frames += 1;
    }
    assert!(frames >= 11, "{frames} frames");
    feed(&mut client, &mut output.clone(), 7);
    let got = deliveries(&mut client);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].payload, big);
    assert_eq!(got[1].payload, &b"small"[..]);
}

#[test]
fn transfers_wait_for_the_peer_window_and_keep_their_order() {
    let mut narrow = config("c");
    narrow.session_window = 4;
    let (mut client, mut server, session, _) = connected(narrow, config("s"));
    let (client_link, server_link) =
        attached(&mut client, &mut server, session, receiver_attach("r", "a"));
    client.flow(client_link, 50).unwrap();
    pump(&mut client, &mut server);
    events(&mut server);
    for i in 0..50u32 {
        server
            .send(server_link, true, 0, |o| {
                o.extend_from_slice(&i.to_be_bytes())
            })
            .unwrap();
    }
    assert!(
        server.blocked_bytes() > 0,
        "beyond a window of 4 frames, transfers wait"
    );
    pump(&mut client, &mut server);
    let got = deliveries(&mut client);
    let ids: Vec<u32> = got
        .iter()
        .map(|d| u32::from_be_bytes(d.payload[..].try_into().unwrap()))
        .collect();
    assert_eq!(ids, (0..50).collect::<Vec<_>>());
    assert_eq!(server.blocked_bytes(), 0);
}

#[test]
fn a_sender_sees_the_window_close_and_is_told_when_it_opens() {
    let mut narrow = config("c");
    narrow.session_window = 4;
    let (mut client, mut server, session, _) = connected(narrow, config("s"));
    let (client_link, server_link) =
        attached(&mut client, &mut server, session, receiver_attach("r", "a"));
    client.flow(client_link, 50).unwrap();
    pump(&mut client, &mut server);
    events(&mut server);
    let mut sent = 0;
    while server.window_open(server_link.session) {
        server.send(server_link, true, 0, |o| o.push(7)).unwrap();
        sent += 1;
    }
    assert_eq!(sent, 4, "the window takes 4 frames");
    assert_eq!(server.blocked_bytes(), 0, "nothing was sent to wait");
    assert_eq!(server.credit(server_link), 46, "credit is not the limit");
    pump(&mut client, &mut server);
    assert_eq!(deliveries(&mut client).len(), 4);
    assert!(events(&mut server).contains(&Event::Credit(server_link)));
    assert!(server.window_open(server_link.session));
    let unmapped = SessionId(server_link.session.0 + 1);
    assert!(!server.window_open(unmapped));
}

#[test]
fn a_payload_read_from_a_buffer_is_a_view_of_it_and_a_partial_frame_stays() {
    let (mut client, mut server, session, _) = connected(config("c"), config("s"));
    let (client_link, server_link) =
        attached(&mut client, &mut server, session, receiver_attach("r", "a"));
    client.flow(client_link, 2).unwrap();
    pump(&mut client, &mut server);
    events(&mut server);
    for byte in [1u8, 2] {
        server
            .send(server_link, true, 0, |o| o.extend([byte; 300]))
            .unwrap();
    }
    let bytes = server.take_output();
    let mut buffer = BytesMut::from(&bytes[..bytes.len() - 3]);
    let read = buffer.as_ptr() as usize..buffer.as_ptr() as usize + buffer.len();
    client.receive_buf(&mut buffer).unwrap();
    let first = deliveries(&mut client);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].payload, vec![1; 300]);
    assert!(
        read.contains(&(first[0].payload.as_ptr() as usize)),
        "the payload is not a copy"
    );
    let first_frame = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
    assert_eq!(
        buffer.len(),
        bytes.len() - first_frame - 3,
        "the second frame's start waits"
    );
    buffer.extend_from_slice(&bytes[bytes.len() - 3..]);
    client.receive_buf(&mut buffer).unwrap();
    assert!(buffer.is_empty());
    assert_eq!(deliveries(&mut client)[0].payload, vec![2; 300]);
}

/// A client receiving from the server on a session window of `window` frames and frames of
/// at most 4096 bytes, with credit for 100 messages: the two and the server's sending link.
fn narrow_receiver(window: u32) -> (Connection, Connection, LinkId) {
    let mut narrow = config("c");
    narrow.session_window = window;
    narrow.max_frame_size = 4096;
    let (mut client, mut server, session, _) = connected(narrow, config("s"));
    let (client_link, server_link) =
        attached(&mut client, &mut server, session, receiver_attach("r", "a"));
    client.flow(client_link, 100).unwrap();
    pump(&mut client, &mut server);
    events(&mut server);
    (client, server, server_link)
}

/// The payloads of what `client` receives once the two have exchanged all they can.
fn received(client: &mut Connection, server: &mut Connection) -> Vec<Bytes> {
    pump(client, server);
    deliveries(client).into_iter().map(|d| d.payload).collect()
}

#[test]
fn a_message_sent_in_parts_arrives_whole_its_long_body_uncopied_where_it_fits() {
    let (mut client, mut server, server_link) = narrow_receiver(4);
    let head = b"head".as_slice();
    // Short, long, too long for one frame (and beyond the window of 4 frames), then one that
    // finds the window closed.
    let sizes = [0, SPLICE_MIN_BYTES - 1, SPLICE_MIN_BYTES, 3000, 9000, 2000];
    let mut sent = Vec::new();
    for (i, size) in sizes.into_iter().enumerate() {
        let body = Bytes::from(vec![i as u8; size]);
        server
            .send_parts(server_link, true, 0, head, &body)
            .unwrap();
        sent.push([head, &body[..]].concat());
    }
    let spliced: Vec<usize> = server.spliced.iter().map(|s| s.body.len()).collect();
    assert_eq!(
        spliced,
        [SPLICE_MIN_BYTES, 3000],
        "long bodies that fit are not copied"
    );
    assert!(
        server.blocked_bytes() > 0,
        "the last frames wait for the window"
    );
    assert_eq!(received(&mut client, &mut server), sent);
}

#[test]
fn a_message_sent_as_bytes_arrives_whole_its_long_frames_uncopied_where_the_window_takes_them() {
    let (mut client, mut server, server_link) = narrow_receiver(6);
    // Empty, short, long, three frames, then five frames when the window takes none of
    // them: copied, waiting for it.
    let sizes = [0, SPLICE_MIN_BYTES - 1, SPLICE_MIN_BYTES, 9000, 18_000];
    let mut sent = Vec::new();
    for (i, size) in sizes.into_iter().enumerate() {
        let payload = Bytes::from(
            (0..size)
                .map(|n| (n % 251) as u8 ^ i as u8)
                .collect::<Vec<_>>(),
        );
        server.send_bytes(server_link, true, 0, &payload).unwrap();
        sent.push(payload);
    }
    let spliced: Vec<usize> = server.spliced.iter().map(|s| s.body.len()).collect();
    assert_eq!(spliced.len(), 4, "{spliced:?}");
    assert_eq!(
        spliced[0], SPLICE_MIN_BYTES,
        "a long message that fits is not copied"
    );
    assert_eq!(
        spliced[1..].iter().sum::<usize>(),
        9000,
        "none of the three-frame message's shares is copied: {spliced:?}"
    );
    assert!(
        server.blocked_bytes() > 0,
        "the frames beyond the window wait for it"
    );
    assert_eq!(received(&mut client, &mut server), sent);
}

#[test]
fn a_peer_beyond_our_window_is_a_window_violation() {
    let mut narrow = config("s");
    narrow.session_window = 2;
    let (mut client, mut server, session, _) = connected(config("c"), narrow);
    let (client_link, server_link) =
        attached(&mut client, &mut server, session, sender_attach("s", "hub"));
    server.flow(server_link, 10).unwrap();
    pump(&mut client, &mut server);
    // Pretend the server had opened a wide window: the client sends 3 frames at once.
    client
        .session_mut(session.0)
        .widen_remote_window_for_test(10);
    for _ in 0..3 {
        client.send(client_link, false, 0, |o| o.push(1)).unwrap();
    }
    let mut bytes = client.take_output();
    let error = server.receive(&bytes).unwrap_err();
    assert_eq!(error.condition, condition::WINDOW_VIOLATION);
    assert!(server.is_closed());
    // Nothing more is read after the close.
    bytes.truncate(0);
    assert_eq!(server.receive(&[0, 0, 0, 8, 2, 0, 0, 0]).unwrap(), 0);
}

#[test]
fn transfers_beyond_credit_detach_the_link() {
    let (mut client, mut server, session, _) = connected(config("c"), config("s"));
    let (client_link, server_link) =
        attached(&mut client, &mut server, session, sender_attach("s", "hub"));
    server.flow(server_link, 1).unwrap();
    pump(&mut client, &mut server);
    events(&mut client);
    client.send(client_link, false, 0, |o| o.push(1)).unwrap();
    // The client forgets its credit is spent.
    client
        .session_mut(session.0)
        .link_mut(client_link.handle)
        .unwrap()
        .force_credit_for_test(1);
    client.send(client_link, false, 0, |o| o.push(2)).unwrap();
    pump(&mut client, &mut server);
    let server_events = events(&mut server);
    assert!(matches!(&server_events[0], Event::Delivery(_)));
    let Event::Detached {
        error: Some(error), ..
    } = &server_events[1]
    else {
        panic!("{server_events:?}")
    };
    assert_eq!(
        error.condition,
        ErrorCondition::Custom(Symbol::from(condition::TRANSFER_LIMIT_EXCEEDED))
    );
    let client_events = events(&mut client);
    assert!(
        matches!(&client_events[0], Event::Detached { link, error: Some(_), .. } if *link == client_link),
        "{client_events:?}"
    );
    // Both sides detached: the handles are free for a new link.
    let (again, _) = attached(
        &mut client,
        &mut server,
        session,
        sender_attach("s2", "hub"),
    );
    assert_eq!(again.handle, client_link.handle);
}

#[test]
fn a_delivery_keeps_its_tag_and_a_tag_beyond_32_bytes_is_refused() {
    let (mut client, mut server, session, _) = connected(config("c"), config("s"));
    let (client_link, server_link) =
        attached(&mut client, &mut server, session, sender_attach("s", "hub"));
    server.flow(server_link, 2).unwrap();
    pump(&mut client, &mut server);
    events(&mut client);
    let id = client.send(client_link, false, 0, |o| o.push(1)).unwrap();
    pump(&mut client, &mut server);
    let got = deliveries(&mut server);
    assert_eq!(got[0].tag.as_bytes(), id.to_be_bytes());
    // A transfer with a 33-byte tag, written by hand (the engine never sends one).
    let mut out = Vec::new();
    let start = frame::start_frame(&mut out, FrameType::Amqp, session.0);
    tributary_amqp_codec::performative::TransferFields {
        handle: client_link.handle,
        delivery_id: Some(id + 1),
        delivery_tag: Some(&[7; 33]),
        message_format: Some(0),
        settled: Some(false),
        ..Default::default()
    }
    .encode(&mut out);
    out.push(2);
    frame::finish_frame(&mut out, start);
    let error = server.receive(&out).unwrap_err();
    assert_eq!(
        error.to_amqp().condition,
        ErrorCondition::Custom(Symbol::from(condition::INVALID_FIELD))
    );
    assert!(deliveries(&mut server).is_empty());
    assert_eq!(DeliveryTag::new(&[1; 32]).unwrap().as_bytes(), [1; 32]);
    assert!(DeliveryTag::new(&[1; 33]).is_none());
}

#[test]
fn messages_beyond_max_message_size_detach_the_link() {
    let (mut client, mut server, session, _) = connected(config("c"), config("s"));
    let client_link = client.attach(session, sender_attach("s", "hub")).unwrap();
    pump(&mut client, &mut server);
    let Some(Event::Attached { link, attach, .. }) = events(&mut server).pop() else {
        panic!()
    };
    let mut answer = *attach;
    answer.max_message_size = Some(100);
    server.attach_answer(link, answer).unwrap();
    server.flow(link, 5).unwrap();
    pump(&mut client, &mut server);
    events(&mut client);
    client
        .send(client_link, false, 0, |o| o.extend_from_slice(&[0; 100]))
        .unwrap();
    client
        .send(client_link, false, 0, |o| o.extend_from_slice(&[0; 101]))
        .unwrap();
    pump(&mut client, &mut server);
    let server_events = events(&mut server);
    assert!(matches!(&server_events[0], Event::Delivery(d) if d.payload.len() == 100));
    let Event::Detached {
        error: Some(error), ..
    } = &server_events[1]
    else {
        panic!("{server_events:?}")
    };
    assert_eq!(
        error.condition,
        ErrorCondition::Custom(Symbol::from(condition::MESSAGE_SIZE_EXCEEDED))
    );
}

#[test]
fn detach_end_and_close_are_answered() {
    let (mut client, mut server, session, server_session) = connected(config("c"), config("s"));
    let (client_link, server_link) =
        attached(&mut client, &mut server, session, receiver_attach("r", "a"));
    let error = amqp_error("com.example:displaced", "a higher epoch");
    server.detach(server_link, true, Some(error.clone()));
    pump(&mut client, &mut server);
    assert_eq!(
        events(&mut client),
        vec![Event::Detached {
            link: client_link,
            closed: true,
            error: Some(error)
        }]
    );
    assert!(
        events(&mut server).is_empty(),
        "the answer to our detach is not an event"
    );
    client.end(session, None);
    pump(&mut client, &mut server);
    assert_eq!(
        events(&mut server),
        vec![Event::SessionEnded {
            session: server_session,
            error: None
        }]
    );
    assert!(events(&mut client).is_empty());
    assert_eq!(client.begin(), Ok(session), "the channel is free again");
    client.close(None);
    pump(&mut client, &mut server);
    let server_events = events(&mut server);
    assert_eq!(
        server_events.last(),
        Some(&Event::Closed { error: None }),
        "{server_events:?}"
    );
    assert!(server.is_finished());
    assert_eq!(
        events(&mut client),
        vec![Event::SessionBegun(session), Event::Closed { error: None }]
    );
    assert!(client.is_finished());
    assert_eq!(
        client.send(client_link, true, 0, |_| ()),
        Err(SendError::Closed)
    );
}

#[test]
fn a_wrong_header_or_a_first_frame_other_than_open_is_refused() {
    let mut server = Connection::server(config("s"));
    let error = server.receive(b"HTTP/1.1 200").unwrap_err();
    assert_eq!(error.condition, condition::NOT_ALLOWED);
    let mut server = Connection::server(config("s"));
    let mut client = Connection::client(config("c"));
    client.take_output();
    let mut bytes = AMQP_HEADER.to_vec();
    client.begin().unwrap();
    bytes.extend(client.take_output());
    assert_eq!(
        server.receive(&bytes).unwrap_err().description,
        "the first frame must be open"
    );
}

/// Found by the `amqp_connection` fuzz target: an `open` whose list count is `u32::MAX` made
/// `serde_amqp` overflow its field counter (a panic in debug builds, a misread in release).
#[test]
fn a_performative_whose_list_count_lies_is_a_decode_error() {
    let mut server = Connection::server(config("s"));
    let mut bytes = AMQP_HEADER.to_vec();
    // A frame holding `open` (descriptor 0x10) as a list32 of size 0x20 and count u32::MAX.
    bytes.extend_from_slice(&[0, 0, 0, 0x30, 2, 0, 0, 0, 0x00, 0x53, 0x10, 0xd0]);
    bytes.extend_from_slice(&[0, 0, 0, 0x20, 0xff, 0xff, 0xff, 0xff]);
    bytes.extend_from_slice(&[0xa1, 0x0b]);
    bytes.extend_from_slice(b"fuzz-client");
    bytes.extend_from_slice(&[0x40; 15]);
    assert_eq!(bytes.len(), 8 + 0x30);
    let error = server.receive(&bytes).unwrap_err();
    assert_eq!(error.condition, condition::DECODE_ERROR);
    assert!(server.is_closed());
}

#[test]
fn credit_withdrawn_while_a_delivery_arrives_does_not_underflow() {
    let mut small = config("c");
    small.max_frame_size = 512;
    let (mut client, mut server, session, _) = connected(small, config("s"));
    let (client_link, server_link) =
        attached(&mut client, &mut server, session, receiver_attach("r", "a"));
    client.flow(client_link, 1).unwrap();
    pump(&mut client, &mut server);
    events(&mut server);
    server
        .send(server_link, true, 0, |o| o.extend_from_slice(&[7; 2000]))
        .unwrap();
    let output = server.take_output();
    let first = u32::from_be_bytes(output[..4].try_into().unwrap()) as usize;
    assert!(first < output.len(), "the message takes several frames");
    assert_eq!(client.receive(&output[..first]), Ok(first));
    assert_eq!(
        client.granted(client_link),
        0,
        "a delivery spends its credit at its first frame"
    );
    // The application takes its grant back before the rest arrives.
    client.flow(client_link, 0).unwrap();
    let rest = &output[first..];
    assert_eq!(client.receive(rest), Ok(rest.len()));
    let got = deliveries(&mut client);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, vec![7; 2000]);
    assert_eq!(client.granted(client_link), 0);
}

#[test]
fn nothing_is_written_after_this_side_closed() {
    let (mut client, mut server, session, _) = connected(config("c"), config("s"));
    let (client_link, server_link) =
        attached(&mut client, &mut server, session, sender_attach("s", "hub"));
    server.flow(server_link, 10).unwrap();
    pump(&mut client, &mut server);
    events(&mut client);
    server.close(None);
    server.take_output();
    // Before the server's close reaches it, the client begins, sends, detaches and ends.
    client.begin().unwrap();
    client.send(client_link, false, 0, |o| o.push(1)).unwrap();
    client.detach(client_link, true, None);
    client.end(session, None);
    let bytes = client.take_output();
    assert_eq!(server.receive(&bytes), Ok(bytes.len()));
    assert!(
        !server.has_output(),
        "no answer, flow or window top-up follows the close"
    );
}

/// One step of an application driving both ends of a link.
#[derive(Debug, Clone)]
enum Step {
    /// The receiver grants this many more (credit in flight is never withdrawn: transfers
    /// beyond the credit detach the link, as `transfers_beyond_credit_detach_the_link` shows).
    Grant(u32),
    /// The sender sends a message of this many bytes, if it has credit.
    Send(usize),
    /// Bytes move both ways, cut into pieces of this size.
    Pump(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u32..6).prop_map(Step::Grant),
        (0usize..1500).prop_map(Step::Send),
        (0usize..40).prop_map(Step::Pump),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the application does in whatever order, the engine's own assertions hold and
    /// every message sent arrives, whole and in order, within the credit granted and the
    /// session window.
    #[test]
    fn any_order_of_grants_and_sends_keeps_the_counters(
        steps in proptest::collection::vec(step(), 1..40),
        window in 1u32..6,
    ) {
        let mut small = config("c");
        small.max_frame_size = 600;
        small.session_window = window;
        let (mut client, mut server, session, _) = connected(small, config("s"));
        let (client_link, server_link) =
            attached(&mut client, &mut server, session, receiver_attach("r", "a"));
        let mut sent = Vec::new();
        let mut got = Vec::new();
        for step in steps {
            match step {
                Step::Grant(more) => {
                    let credit = client.granted(client_link) + more;
                    client.flow(client_link, credit).unwrap();
                }
                Step::Send(size) => {
                    let byte = sent.len() as u8;
                    match server.send(server_link, true, 0, |o| o.extend(std::iter::repeat_n(byte, size))) {
                        Ok(_) => sent.push(vec![byte; size]),
                        Err(error) => prop_assert_eq!(error, SendError::NoCredit),
                    }
                }
                Step::Pump(chunk) => pump_chunked(&mut client, &mut server, chunk),
            }
            events(&mut server);
            got.extend(deliveries(&mut client).into_iter().map(|d| d.payload));
        }
        pump(&mut client, &mut server);
        got.extend(deliveries(&mut client).into_iter().map(|d| d.payload));
        prop_assert_eq!(got, sent);
        prop_assert_eq!(server.blocked_bytes(), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever a peer sends after the handshake, the engine neither panics nor reads on
    /// after failing.
    #[test]
    fn arbitrary_frames_never_panic(garbage in proptest::collection::vec(any::<u8>(), 0..600)) {
        let (mut client, mut server, session, _) = connected(config("c"), config("s"));
        let _ = attached(&mut client, &mut server, session, sender_attach("s", "hub"));
        let mut bytes = garbage.clone();
        let _ = server.receive(&bytes);
        // With a valid frame header around it too.
        bytes = ((garbage.len() + 8) as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(&[2, 0, 0, 0]);
        bytes.extend_from_slice(&garbage);
        let mut server2 = Connection::server(config("s"));
        let mut start = AMQP_HEADER.to_vec();
        let mut c = Connection::client(config("c"));
        start.clear();
        start.extend(c.take_output());
        let _ = server2.receive(&start);
        let _ = server2.receive(&bytes);
        let _ = server.receive(&bytes);
    }

    /// Frames split at any byte give the same deliveries.
    #[test]
    fn frames_split_anywhere_read_the_same(chunk in 1usize..64, sizes in proptest::collection::vec(0usize..2000, 1..12)) {
        let mut small = config("c");
        small.max_frame_size = 700;
        let (mut client, mut server, session, _) = connected(small, config("s"));
        let (client_link, server_link) = attached(&mut client, &mut server, session, receiver_attach("r", "a"));
        client.flow(client_link, sizes.len() as u32).unwrap();
        pump(&mut client, &mut server);
        events(&mut server);
        for (i, size) in sizes.iter().enumerate() {
            server.send(server_link, true, 0, |o| o.extend(std::iter::repeat_n(i as u8, *size))).unwrap();
        }
        pump_chunked(&mut client, &mut server, chunk);
        let got = deliveries(&mut client);
        prop_assert_eq!(got.len(), sizes.len());
        for (i, (d, size)) in got.iter().zip(&sizes).enumerate() {
            prop_assert_eq!(&d.payload, &vec![i as u8; *size]);
        }
    }
}
