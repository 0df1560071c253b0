//! [`ProducerClient`]: sends events to a hub, a partition, or by partition key.
//!
//! # Guarantees
//! - **Acknowledged means stored.** [`ProducerClient::send`] returns `Ok` only after the hub
//!   settled the transfer as `accepted`, which a Tributary hub does once the events are durable
//!   under its configured durability.
//! - **All or nothing.** The events of one call travel as one transfer (a batch when there is
//!   more than one) and land in one partition, consecutively, in the order given — or none do.
//! - **No hidden retries.** A send that fails is not repeated behind the caller's back; if it
//!   failed after the transfer left (a lost connection, a timeout) the events may or may not have
//!   been stored. The next call reconnects if the connection dropped.
//!
//! One sender link is kept per target address and reused. Concurrent sends pipeline: each
//! call's transfer leaves on the link in the order the calls reached it, and the hub's
//! settlement is awaited without holding the link, so a producer keeps as many batches in
//! flight per partition as it has concurrent `send` calls (the hub appends them in transfer
//! order). Sends to different addresses run concurrently.

use std::collections::HashMap;
use std::sync::Arc;

use fe2o3_amqp_types::messaging::Outcome;
use tokio::sync::Mutex;
use tributary_event::{EventData, SendTarget};

use crate::amqp::{SenderLink, Settlement};
use tributary_eventhubs::address::sender_address;

use crate::connection::{ClientOptions, Connector, Target};
use crate::error::ClientError;
use crate::limits::{MESSAGE_BYTES_MAX_DEFAULT, SEND_EVENTS_MAX};
use crate::management::{self, EventHubProperties, PartitionProperties};
use tributary_eventhubs::send::{Stamped, encode_outgoing_stamped};

/// A sender link and the connection generation it was attached on.
#[derive(Default)]
struct SenderSlot {
    generation: u64,
    /// Counts attaches, so a failed settlement drops only the link it was sent on.
    attached: u64,
    sender: Option<SenderLink>,
}

impl std::fmt::Debug for SenderSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderSlot")
            .field("generation", &self.generation)
            .field("attached", &self.attached)
            .field("live", &self.sender.is_some())
            .finish()
    }
}

/// Sends events to one event hub. Cheap to clone; clones share the connection and links.
#[derive(Debug, Clone)]
pub struct ProducerClient {
    connector: Arc<Connector>,
    senders: Arc<Mutex<HashMap<String, Arc<Mutex<SenderSlot>>>>>,
}

impl ProducerClient {
    /// Connects to `event_hub` with the credentials of `connection_string` and checks them
    /// (a wrong key fails here with [`ClientError::Unauthorized`]).
    pub async fn connect(connection_string: &str, event_hub: &str) -> Result<Self, ClientError> {
        Self::connect_with_options(connection_string, Some(event_hub), ClientOptions::default())
            .await
    }

    /// Like [`ProducerClient::connect`]; without `event_hub` the connection string's
    /// `EntityPath` names the hub.
    pub async fn connect_with_options(
        connection_string: &str,
        event_hub: Option<&str>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let target = Target::new(connection_string, event_hub, options)?;
        Ok(ProducerClient {
            connector: Connector::connect(target).await?,
            senders: Arc::default(),
        })
    }

    /// The event hub's name.
    pub fn event_hub_name(&self) -> &str {
        &self.connector.target.hub
    }

    /// The namespace's host name.
    pub fn fully_qualified_namespace(&self) -> &str {
        self.connector.target.connection_string.host()
    }

    /// With a hub alias ([`crate::failover`]), the endpoint in use or tried next; `None`
    /// without one.
    pub async fn active_endpoint(&self) -> Option<crate::AliasEndpoint> {
        self.connector.active_endpoint().await
    }

    /// Sends `events` to `target` as one unit; see the module docs for the guarantees.
    ///
    /// Fails with [`ClientError::InvalidArgument`] for no events, more than
    /// [`SEND_EVENTS_MAX`], an event whose own partition key disagrees with `target`, or a
    /// malformed partition id; with [`ClientError::MessageTooLarge`] when the encoded events
    /// exceed the hub's message size (send fewer per call); with [`ClientError::NotFound`] for
    /// an unknown hub or partition.
    pub async fn send(&self, events: &[EventData], target: SendTarget) -> Result<(), ClientError> {
        self.send_stamped(events, None, target).await
    }

    /// [`send`](Self::send), each message carrying after its event's own application
    /// properties those of `stamped` (see `tributary_eventhubs::send::Stamp`): what a
    /// replication task sends, its stamp encoded once per batch.
    pub async fn send_stamped(
        &self,
        events: &[EventData],
        stamped: Option<Stamped<'_>>,
        target: SendTarget,
    ) -> Result<(), ClientError> {
        let (address, partition_key) = self.route(events, &target)?;
        // Encoded in the caller's task, before any lock: concurrent sends encode in parallel.
        let (payload, format) = encode_outgoing_stamped(events, stamped, partition_key.as_deref())?;
        let slot = self.slot(&address).await;
        let connector = &self.connector;
        connector
            .target
            .timed("sending events", async {
                // The transfer is queued under the slot's lock, so concurrent sends to one
                // address keep their order; the settlement is awaited without it, so they
                // pipeline.
                let (settlement, attached_as) = {
                    let mut slot = slot.lock().await;
                    let sender = attached(connector, &mut slot, &address).await?;
                    match start_transfer(sender, &address, payload, format) {
                        Ok(settlement) => (settlement, slot.attached),
                        Err(failed) => {
                            if failed.link_is_dead {
                                // Attaching a fresh link next time costs one round trip.
                                slot.sender = None;
                            }
                            return Err(failed.error);
                        }
                    }
                };
                let result = settled(settlement, &address).await;
                if let Err(failed) = &result
                    && failed.link_is_dead
                {
                    // Only the link this send used: a newer one may carry other sends.
                    let mut slot = slot.lock().await;
                    if slot.attached == attached_as {
                        slot.sender = None;
                    }
                }
                result.map_err(|failed| failed.error)
            })
            .await
    }

    /// The largest transfer the hub takes for sends to `target`: the `max-message-size` of the
    /// sender link (attached now if it is not yet), or the Event Hubs default when the hub
    /// advertises none. With `tributary_eventhubs::send::BatchSizer` a caller cuts batches that
    /// fit before sending them.
    pub async fn max_message_bytes(&self, target: &SendTarget) -> Result<u64, ClientError> {
        let (address, _) = self.route(&[EventData::default()], target)?;
        let slot = self.slot(&address).await;
        let connector = &self.connector;
        connector
            .target
            .timed("attaching a sender", async {
                let mut slot = slot.lock().await;
                let sender = attached(connector, &mut slot, &address).await?;
                Ok(sender
                    .max_message_size()
                    .unwrap_or(MESSAGE_BYTES_MAX_DEFAULT))
            })
            .await
    }

    /// The hub's name, creation time and partition ids.
    pub async fn hub_properties(&self) -> Result<EventHubProperties, ClientError> {
        management::hub_properties(&self.connector).await
    }

    /// One partition's sequence numbers, last offset and enqueued time.
    pub async fn partition_properties(
        &self,
        partition: &str,
    ) -> Result<PartitionProperties, ClientError> {
        management::partition_properties(&self.connector, partition).await
    }

    /// Detaches the sender links and closes the connection. Clones share it, so they are
    /// closed too (their next call reconnects).
    pub async fn close(&self) {
        let slots: Vec<_> = self
            .senders
            .lock()
            .await
            .drain()
            .map(|(_, slot)| slot)
            .collect();
        for slot in slots {
            // Dropping the link detaches it.
            slot.lock().await.sender = None;
        }
        self.connector.close().await;
    }

    fn route(
        &self,
        events: &[EventData],
        target: &SendTarget,
    ) -> Result<(String, Option<String>), ClientError> {
        if events.is_empty() {
            return Err(ClientError::InvalidArgument("no events to send".to_owned()));
        }
        if events.len() > SEND_EVENTS_MAX {
            return Err(ClientError::InvalidArgument(format!(
                "{} events in one send; at most {SEND_EVENTS_MAX}",
                events.len()
            )));
        }
        let hub = &self.connector.target.hub;
        let wanted_key = match target {
            SendTarget::PartitionKey(key) => Some(key.as_str()),
            _ => None,
        };
        let own_key = events.iter().find_map(|e| e.partition_key.as_deref());
        if let Some(own) = own_key.filter(|own| Some(*own) != wanted_key) {
            return Err(ClientError::InvalidArgument(format!(
                "an event carries partition key {own:?} but the send targets {target:?}; send it with SendTarget::PartitionKey({own:?})"
            )));
        }
        match target {
            SendTarget::Partition(id) => {
                check_partition_id(id)?;
                Ok((sender_address(hub, Some(id)), None))
            }
            SendTarget::PartitionKey(key) => Ok((sender_address(hub, None), Some(key.clone()))),
            SendTarget::RoundRobin => Ok((sender_address(hub, None), None)),
        }
    }

    async fn slot(&self, address: &str) -> Arc<Mutex<SenderSlot>> {
        let mut senders = self.senders.lock().await;
        Arc::clone(senders.entry(address.to_owned()).or_default())
    }
}

/// Partition ids are decimal numbers; anything else would change the link address.
pub(crate) fn check_partition_id(id: &str) -> Result<(), ClientError> {
    let ok = !id.is_empty() && id.len() <= 10 && id.bytes().all(|b| b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(ClientError::InvalidArgument(format!(
            "partition id {id:?} is not a partition number such as \"0\""
        )))
    }
}

/// The slot's sender, attached on the live connection (again, if the connection changed).
async fn attached<'a>(
    connector: &Connector,
    slot: &'a mut SenderSlot,
    address: &str,
) -> Result<&'a SenderLink, ClientError> {
    let (generation, connection, session) = {
        let live = connector.live().await?;
        (live.generation, live.connection.clone(), live.session)
    };
    if slot.generation != generation || slot.sender.is_none() {
        slot.sender = None;
        let name = format!("sender-{}", uuid::Uuid::new_v4().simple());
        let sender = connection.attach_sender(session, name, address).await?;
        slot.generation = generation;
        slot.attached += 1;
        slot.sender = Some(sender);
    }
    slot.sender
        .as_ref()
        .ok_or_else(|| unreachable!("the sender was just attached"))
}

/// A failed send, and whether its link is unusable for the sends after it. A local refusal
/// (too large) or a refused outcome leaves the link as it was, and dropping it would fail the
/// other sends in flight on it.
struct SendFailure {
    error: ClientError,
    link_is_dead: bool,
}

impl SendFailure {
    fn refused(error: ClientError) -> Self {
        SendFailure {
            error,
            link_is_dead: false,
        }
    }

    fn dead(error: ClientError) -> Self {
        SendFailure {
            error,
            link_is_dead: true,
        }
    }
}

/// Puts the payload on the link; the returned settlement resolves with the hub's outcome.
fn start_transfer(
    sender: &SenderLink,
    address: &str,
    payload: Vec<u8>,
    format: u32,
) -> Result<Settlement, SendFailure> {
    // The hub's advertised maximum, or the Event Hubs default when it advertises none.
    let max = sender
        .max_message_size()
        .unwrap_or(MESSAGE_BYTES_MAX_DEFAULT);
    let size = payload.len() as u64;
    if size > max {
        return Err(SendFailure::refused(ClientError::MessageTooLarge {
            description: format!(
                "the events encode to {size} bytes; the hub accepts at most {max} bytes per send on {address}; send fewer or smaller events per call"
            ),
        }));
    }
    sender.send(payload, format).map_err(SendFailure::dead)
}

/// Waits for the hub's settlement of a transfer and maps its outcome.
async fn settled(settlement: Settlement, address: &str) -> Result<(), SendFailure> {
    let outcome = settlement.outcome().await.map_err(SendFailure::dead)?;
    let refusal = match outcome {
        Outcome::Accepted(_) => return Ok(()),
        Outcome::Rejected(rejected) => match rejected.error {
            Some(error) => ClientError::from_amqp(&error),
            None => ClientError::Refused {
                condition: "rejected".to_owned(),
                description: format!("the hub rejected the events sent to {address}"),
            },
        },
        Outcome::Released(_) | Outcome::Modified(_) => ClientError::ServerBusy {
            condition: "released".to_owned(),
            description: format!(
                "the hub released the events sent to {address} without storing them"
            ),
        },
        #[allow(unreachable_patterns)]
        _ => ClientError::Protocol {
            description: format!("the hub settled a send to {address} with an unexpected outcome"),
        },
    };
    Err(SendFailure::refused(refusal))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_ids_are_numbers() {
        assert!(check_partition_id("0").is_ok());
        assert!(check_partition_id("31").is_ok());
        for bad in ["", "a", "1/2", "../x", "-1", "12345678901"] {
            assert!(check_partition_id(bad).is_err(), "{bad}");
        }
    }
}
