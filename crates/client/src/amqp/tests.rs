//! The client's connection task against a scripted hub: an engine server connection driven by
//! hand over an in-memory pipe, so each test states exactly which frames the hub sends and
//! checks what the client answers.

use std::time::Duration;

use fe2o3_amqp_types::messaging::{Rejected, Source, Target};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;

const STEP: Duration = Duration::from_secs(5);

/// The hub's end: SASL accepted, then the engine's server connection.
struct Hub {
    stream: DuplexStream,
    connection: Connection,
    input: Vec<u8>,
}

impl Hub {
    /// Connects a client to a scripted hub.
    async fn start() -> (AmqpConnection, Hub) {
        let (client_end, mut hub_end) = tokio::io::duplex(1 << 20);
        let hub = tokio::spawn(async move {
            let mut input = Vec::new();
            sasl::accept(&mut hub_end, &mut input, &["ANONYMOUS"], |_| true)
                .await
                .unwrap();
            Hub {
                stream: hub_end,
                connection: Connection::server(Config::new("scripted-hub")),
                input,
            }
        });
        let endpoint = Endpoint {
            host: "hub.test",
            port: 5672,
            addresses: &[],
            tls: false,
            trusted_certificates: None,
            container_id: "client".to_owned(),
            properties: None,
        };
        let client =
            tokio::spawn(async move { AmqpConnection::open_on(client_end, &endpoint).await });
        let mut hub = hub.await.unwrap();
        assert!(matches!(hub.event().await, Event::Opened(_)));
        let client = client.await.unwrap().unwrap();
        (client, hub)
    }

    async fn flush(&mut self) {
        let out = self.connection.take_output();
        if !out.is_empty() {
            self.stream.write_all(&out).await.unwrap();
        }
    }

    /// The next event the client's frames cause (answers are sent as they are queued).
    async fn event(&mut self) -> Event {
        tokio::time::timeout(STEP, async {
            loop {
                if !self.input.is_empty() {
                    let used = self.connection.receive(&self.input).unwrap();
                    self.input.drain(..used);
                }
                self.flush().await;
                if let Some(event) = self.connection.poll_event() {
                    return event;
                }
                let read = self.stream.read_buf(&mut self.input).await.unwrap();
                assert!(read > 0, "the client hung up");
            }
        })
        .await
        .expect("the client went quiet")
    }

    /// Skips events until the client attaches a link; returns it and the client's attach.
    async fn attached(&mut self) -> (LinkId, Box<Attach>) {
        loop {
            if let Event::Attached {
                link,
                attach,
                answer: false,
            } = self.event().await
            {
                return (link, attach);
            }
        }
    }

    /// Answers the client's attach, echoing its termini (the role is set by the engine).
    async fn answer(&mut self, link: LinkId, attach: &Attach) {
        let mut answer = attach_frame(
            attach.name.clone(),
            Role::Receiver,
            SenderSettleMode::Unsettled,
        );
        answer.source = attach.source.clone();
        answer.target = attach.target.clone();
        self.connection.attach_answer(link, answer).unwrap();
        self.flush().await;
    }

    /// Skips events until the client's next delivery.
    async fn delivery(&mut self) -> tributary_amqp_engine::connection::Delivery {
        loop {
            if let Event::Delivery(delivery) = self.event().await {
                return delivery;
            }
        }
    }
}

/// Begins a session from the client, as the hub sees it.
async fn session(client: &AmqpConnection, hub: &mut Hub) -> SessionId {
    let begin = tokio::spawn({
        let client = client.clone();
        async move { client.begin().await }
    });
    while !matches!(hub.event().await, Event::SessionBegun(_)) {}
    begin.await.unwrap().unwrap()
}

/// A sender link the hub answered (without credit yet), and its id at the hub.
async fn open_sender(client: &AmqpConnection, hub: &mut Hub) -> (SenderLink, LinkId) {
    let session = session(client, hub).await;
    let attach = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .attach_sender(session, "s".to_owned(), "orders")
                .await
        }
    });
    let (link, theirs) = hub.attached().await;
    hub.answer(link, &theirs).await;
    (attach.await.unwrap().unwrap(), link)
}

fn receiver_attach() -> Attach {
    let mut attach = attach_frame("r", Role::Receiver, SenderSettleMode::Mixed);
    attach.source = Some(Box::new(
        Source::builder()
            .address("orders/ConsumerGroups/$Default/Partitions/0")
            .build(),
    ));
    attach.target = Some(Box::new(Target::builder().address("r").build().into()));
    attach
}

/// Starts attaching a receiver with `credit`; the hub gets the attach.
async fn start_receiver(
    client: &AmqpConnection,
    hub: &mut Hub,
    credit: u32,
) -> (
    tokio::task::JoinHandle<Result<ReceiverLink, ClientError>>,
    LinkId,
    Box<Attach>,
) {
    let session = session(client, hub).await;
    let attach = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .attach_receiver(session, receiver_attach(), "orders/0", credit, true)
                .await
        }
    });
    let (link, theirs) = hub.attached().await;
    (attach, link, theirs)
}

/// The state bytes of an outcome.
fn state(outcome: &DeliveryState) -> Vec<u8> {
    serde_amqp::to_vec(outcome).unwrap()
}

#[tokio::test]
async fn sends_wait_for_credit_and_leave_in_call_order_with_their_outcomes() {
    let (client, mut hub) = Hub::start().await;
    let (sender, link) = open_sender(&client, &mut hub).await;
    assert_eq!(hub.connection.granted(link), 0);
    let settlements: Vec<Settlement> = (1..=3u8)
        .map(|i| {
            sender
                .send(vec![0x00, 0x53, 0x77, 0xa1, 1, b'0' + i], 0)
                .unwrap()
        })
        .collect();
    // Nothing may leave before the hub grants credit.
    let quiet = tokio::time::timeout(Duration::from_millis(100), hub.delivery()).await;
    assert!(quiet.is_err(), "a transfer left without credit");

    hub.connection.flow(link, 2).unwrap();
    hub.flush().await;
    let first = hub.delivery().await;
    let second = hub.delivery().await;
    assert_eq!(first.payload.last(), Some(&b'1'));
    assert_eq!(second.payload.last(), Some(&b'2'));
    assert!(!first.settled && !second.settled);
    let rejected = DeliveryState::Rejected(Rejected {
        error: Some(amqp_error("amqp:not-found", "no such hub")),
    });
    let session = first.link.session;
    hub.connection
        .disposition(
            session,
            true,
            first.delivery_id,
            first.delivery_id,
            true,
            Some(&ACCEPTED),
        )
        .unwrap();
    hub.connection
        .disposition(
            session,
            true,
            second.delivery_id,
            second.delivery_id,
            true,
            Some(&state(&rejected)),
        )
        .unwrap();
    hub.flush().await;
    let mut settlements = settlements.into_iter();
    let accepted = settlements.next().unwrap().outcome().await.unwrap();
    assert!(matches!(accepted, Outcome::Accepted(_)));
    match settlements.next().unwrap().outcome().await.unwrap() {
        Outcome::Rejected(r) => {
            let error = ClientError::from_amqp(r.error.as_ref().unwrap());
            assert!(matches!(error, ClientError::NotFound { .. }), "{error}");
        }
        other => panic!("{other:?}"),
    }

    // The third waited for credit and leaves once there is some.
    hub.connection.flow(link, 1).unwrap();
    hub.flush().await;
    assert_eq!(hub.delivery().await.payload.last(), Some(&b'3'));
}

#[tokio::test]
async fn unsettled_deliveries_are_accepted_in_one_disposition_and_credit_stays_exact() {
    let (client, mut hub) = Hub::start().await;
    let (attaching, link, theirs) = start_receiver(&client, &mut hub, 3).await;
    let mut answer = attach_frame("r", Role::Sender, SenderSettleMode::Unsettled);
    answer.source = theirs.source.clone();
    answer.target = theirs.target.clone();
    hub.connection.attach_answer(link, answer).unwrap();
    hub.flush().await;
    let mut receiver = attaching.await.unwrap().unwrap();
    while !matches!(hub.event().await, Event::Credit(_)) {}
    assert_eq!(
        hub.connection.credit(link),
        3,
        "the first grant is the asked credit"
    );

    for i in 0..3u8 {
        hub.connection
            .send(link, false, 0, |out| {
                out.extend_from_slice(&[0x00, 0x53, 0x75, 0xa0, 1, i])
            })
            .unwrap();
    }
    assert!(
        hub.connection.send(link, false, 0, |_| {}).is_err(),
        "the hub has no fourth credit"
    );
    hub.flush().await;
    let mut messages = Vec::new();
    while messages.len() < 3 {
        match tokio::time::timeout(STEP, receiver.next()).await.unwrap() {
            ReceiverEvent::Messages(batch) => messages.extend(batch),
            ReceiverEvent::Ended(error) => panic!("{error}"),
        }
    }
    let ends: Vec<u8> = messages.iter().map(|m| *m.last().unwrap()).collect();
    assert_eq!(ends, [0, 1, 2]);
    // All three arrived in one write: one ranged disposition accepts them.
    match hub.event().await {
        Event::Disposition {
            first,
            last,
            settled,
            state,
            role_is_receiver: true,
            ..
        } => {
            assert_eq!((first, last, settled), (0, 2, true));
            assert_eq!(state.as_deref(), Some(&ACCEPTED[..]));
        }
        other => panic!("{other:?}"),
    }
    // Credit comes back only as granted.
    receiver.grant(2);
    while !matches!(hub.event().await, Event::Credit(_)) {}
    assert_eq!(hub.connection.credit(link), 2);
}

#[tokio::test]
async fn a_refused_attach_fails_with_the_detach_error() {
    let (client, mut hub) = Hub::start().await;
    let (attaching, link, theirs) = start_receiver(&client, &mut hub, 10).await;
    // Specification 2.6.3: a null source, then the detach with the reason.
    let answer = attach_frame(
        theirs.name.clone(),
        Role::Sender,
        SenderSettleMode::Unsettled,
    );
    hub.connection.attach_answer(link, answer).unwrap();
    hub.connection.detach(
        link,
        true,
        Some(amqp_error(
            "amqp:link:stolen",
            "a receiver with a higher epoch took it",
        )),
    );
    hub.flush().await;
    let error = attaching.await.unwrap().unwrap_err();
    assert!(
        matches!(error, ClientError::OwnershipLost { .. }),
        "{error}"
    );
}

#[tokio::test]
async fn the_hub_closing_fails_sends_and_receivers_with_its_error() {
    let (client, mut hub) = Hub::start().await;
    let (sender, link) = open_sender(&client, &mut hub).await;
    hub.connection.flow(link, 1).unwrap();
    hub.flush().await;
    let sent = sender.send(vec![0x00, 0x53, 0x77, 0x40], 0).unwrap();
    hub.delivery().await;
    let (attaching, rlink, theirs) = start_receiver(&client, &mut hub, 1).await;
    hub.answer(rlink, &theirs).await;
    let mut receiver = attaching.await.unwrap().unwrap();

    hub.connection.close(Some(amqp_error(
        "amqp:unauthorized-access",
        "the token expired",
    )));
    hub.flush().await;
    let error = sent.outcome().await.unwrap_err();
    assert!(matches!(error, ClientError::Unauthorized { .. }), "{error}");
    match tokio::time::timeout(STEP, receiver.next()).await.unwrap() {
        ReceiverEvent::Ended(error) => {
            assert!(matches!(error, ClientError::Unauthorized { .. }), "{error}");
        }
        ReceiverEvent::Messages(m) => panic!("{m:?}"),
    }
    assert!(!client.is_usable(SessionId(0)));
    // Whatever comes later fails at once with the same reason.
    let later = sender.send(vec![], 0);
    let later = match later {
        Ok(settlement) => settlement.outcome().await.unwrap_err(),
        Err(error) => error,
    };
    assert!(matches!(later, ClientError::Unauthorized { .. }), "{later}");
}

#[test]
fn delivery_states_map_to_outcomes_and_bad_ones_are_errors() {
    assert!(matches!(delivery_outcome(None), Ok(Outcome::Accepted(_))));
    assert!(matches!(
        delivery_outcome(Some(&ACCEPTED)),
        Ok(Outcome::Accepted(_))
    ));
    let released = state(&DeliveryState::Released(
        fe2o3_amqp_types::messaging::Released {},
    ));
    assert!(matches!(
        delivery_outcome(Some(&released)),
        Ok(Outcome::Released(_))
    ));
    let received = state(&DeliveryState::Received(
        fe2o3_amqp_types::messaging::Received {
            section_number: 0,
            section_offset: 0,
        },
    ));
    assert!(matches!(
        delivery_outcome(Some(&received)),
        Err(ClientError::Protocol { .. })
    ));
    for bad in [
        &[0x00, 0x53][..],
        &[0xff],
        &[0x00, 0x53, 0x25, 0xc0, 0xff, 0x01],
    ] {
        assert!(
            matches!(
                delivery_outcome(Some(bad)),
                Err(ClientError::Protocol { .. })
            ),
            "{bad:?}"
        );
    }
}
