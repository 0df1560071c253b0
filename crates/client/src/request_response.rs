//! A request/response link pair to a node such as `$cbs` or `$management`.
//!
//! The pair shares one session: a sender whose target is the node, and a receiver whose source
//! is the node. Each request carries a fresh UUID `message-id` and `reply-to` = the receiver's
//! own address, which is also its link name and target — so a hub that routes replies by
//! `reply-to`, by link name or by "the session's only reply link" finds it. A response is
//! matched by `correlation-id`; stray ones are dropped. The status is read from the
//! `status-code` (any integer type) and `status-description` application properties, or their
//! camel-case spellings, as the Azure SDKs accept both.
//!
//! One request is in flight at a time (the caller holds `&mut`).

use std::collections::VecDeque;
use std::time::Duration;

use fe2o3_amqp_types::definitions::{Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{
    ApplicationProperties, Body, Message, MessageId, Outcome, Properties, Source, Target,
};
use fe2o3_amqp_types::primitives::{SimpleValue, Uuid, Value};
use tributary_amqp_engine::SessionId;
use tributary_amqp_engine::connection::attach_frame;

use crate::amqp::{AmqpConnection, ReceiverEvent, ReceiverLink, SenderLink};
use crate::error::{ClientError, clean_description};
use crate::limits::RESPONSE_CREDIT;
use tributary_eventhubs::names::management as m;
use tributary_eventhubs::receive::decode_message;

/// A response from a node.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) description: String,
    pub(crate) condition: Option<String>,
    /// Every application property of the response.
    pub(crate) properties: Option<ApplicationProperties>,
    pub(crate) body: Body<Value>,
}

impl Response {
    /// The response if its status is 2xx, else the matching error.
    pub(crate) fn success(self) -> Result<Response, ClientError> {
        if (200..300).contains(&self.status) {
            Ok(self)
        } else {
            Err(ClientError::from_status(
                self.status,
                self.condition.as_deref(),
                &self.description,
            ))
        }
    }
}

/// A sender/receiver pair bound to one node. Dropping it detaches both.
#[derive(Debug)]
pub(crate) struct RequestResponseLink {
    node: String,
    reply_to: String,
    sender: SenderLink,
    receiver: ReceiverLink,
    /// Responses that arrived and were not looked at yet.
    responses: VecDeque<bytes::Bytes>,
}

impl RequestResponseLink {
    /// Attaches the pair on `session`.
    pub(crate) async fn attach(
        connection: &AmqpConnection,
        session: SessionId,
        node: &str,
    ) -> Result<RequestResponseLink, ClientError> {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let client_node = format!("{}-{id}", node.trim_start_matches('$'));
        let sender = connection
            .attach_sender(session, format!("{client_node}-sender"), node)
            .await?;
        let mut attach = attach_frame(client_node.clone(), Role::Receiver, SenderSettleMode::Mixed);
        attach.source = Some(Box::new(Source::builder().address(node.to_owned()).build()));
        attach.target = Some(Box::new(
            Target::builder()
                .address(client_node.clone())
                .build()
                .into(),
        ));
        let receiver = connection
            .attach_receiver(session, attach, node, RESPONSE_CREDIT, false)
            .await?;
        Ok(RequestResponseLink {
            node: node.to_owned(),
            reply_to: client_node,
            sender,
            receiver,
            responses: VecDeque::new(),
        })
    }

    /// Sends a request with these application properties and body and waits up to `timeout`
    /// for its response.
    pub(crate) async fn call(
        &mut self,
        application_properties: ApplicationProperties,
        body: Body<Value>,
        timeout: Duration,
    ) -> Result<Response, ClientError> {
        let operation_timeout = || ClientError::Timeout {
            operation: "a request to the hub's $cbs or $management node",
            waited_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        tokio::time::timeout(timeout, self.call_inner(application_properties, body))
            .await
            .map_err(|_| operation_timeout())?
    }

    async fn call_inner(
        &mut self,
        application_properties: ApplicationProperties,
        body: Body<Value>,
    ) -> Result<Response, ClientError> {
        let message_id = MessageId::Uuid(Uuid::from(*uuid::Uuid::new_v4().as_bytes()));
        let message = Message {
            header: None,
            delivery_annotations: None,
            message_annotations: None,
            properties: Some(Properties {
                message_id: Some(message_id.clone()),
                reply_to: Some(self.reply_to.clone()),
                to: Some(self.node.clone()),
                ..Properties::default()
            }),
            application_properties: Some(application_properties),
            body,
            footer: None,
        };
        let payload = tributary_eventhubs::message::encode_message(&message).map_err(|e| {
            ClientError::InvalidArgument(format!("the request could not be encoded: {e}"))
        })?;
        let outcome = self.sender.send(payload, 0)?.outcome();
        tokio::pin!(outcome);
        let mut settled = false;
        loop {
            while let Some(payload) = self.responses.pop_front() {
                self.receiver.grant(1);
                let message = decode_message(&payload)?;
                let correlation = message
                    .properties
                    .as_ref()
                    .and_then(|p| p.correlation_id.as_ref());
                if correlation == Some(&message_id) {
                    return Ok(read_response(message));
                }
                tracing::debug!(node = %self.node, "dropping a response to another request");
            }
            tokio::select! {
                result = &mut outcome, if !settled => {
                    settled = true;
                    if let Outcome::Rejected(rejected) = result? {
                        return Err(match &rejected.error {
                            Some(error) => ClientError::from_amqp(error),
                            None => ClientError::Refused {
                                condition: "rejected".to_owned(),
                                description: format!("the {} node rejected the request", self.node),
                            },
                        });
                    }
                }
                event = self.receiver.next() => match event {
                    ReceiverEvent::Messages(batch) => self.responses.extend(batch),
                    ReceiverEvent::Ended(error) => return Err(error),
                },
            }
        }
    }
}

fn status_property<'a>(
    properties: Option<&'a ApplicationProperties>,
    names: [&str; 2],
) -> Option<&'a SimpleValue> {
    let properties = &properties?.0;
    names.iter().find_map(|name| properties.get(*name))
}

fn read_response(message: Message<Body<Value>>) -> Response {
    let properties = message.application_properties.as_ref();
    let status = match status_property(properties, [m::STATUS_CODE, m::STATUS_CODE_CAMEL]) {
        Some(SimpleValue::Int(v)) => u16::try_from(*v).unwrap_or(0),
        Some(SimpleValue::Long(v)) => u16::try_from(*v).unwrap_or(0),
        Some(SimpleValue::Uint(v)) => u16::try_from(*v).unwrap_or(0),
        Some(SimpleValue::Ulong(v)) => u16::try_from(*v).unwrap_or(0),
        Some(SimpleValue::Short(v)) => u16::try_from(*v).unwrap_or(0),
        Some(SimpleValue::Ushort(v)) => *v,
        Some(SimpleValue::String(v)) => v.trim().parse().unwrap_or(0),
        _ => 0,
    };
    let text = |names| match status_property(properties, names) {
        Some(SimpleValue::String(s)) => Some(s.clone()),
        Some(SimpleValue::Symbol(s)) => Some(s.0.clone()),
        _ => None,
    };
    let description = clean_description(
        &text([m::STATUS_DESCRIPTION, m::STATUS_DESCRIPTION_CAMEL]).unwrap_or_default(),
        if status == 0 {
            "the response has no status-code"
        } else {
            ""
        },
    );
    Response {
        status,
        description,
        condition: text([m::ERROR_CONDITION, m::ERROR_CONDITION_CAMEL]),
        properties: message.application_properties.clone(),
        body: message.body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(properties: &[(&str, SimpleValue)]) -> Response {
        let mut map = ApplicationProperties::default();
        for (key, value) in properties {
            map.0.insert((*key).to_owned(), value.clone());
        }
        read_response(Message {
            header: None,
            delivery_annotations: None,
            message_annotations: None,
            properties: None,
            application_properties: Some(map),
            body: Body::Empty,
            footer: None,
        })
    }

    #[test]
    fn reads_status_in_any_integer_type_and_spelling() {
        assert_eq!(
            response(&[("status-code", SimpleValue::Int(200))]).status,
            200
        );
        assert_eq!(
            response(&[("status-code", SimpleValue::Long(202))]).status,
            202
        );
        assert_eq!(
            response(&[("statusCode", SimpleValue::Uint(404))]).status,
            404
        );
        assert_eq!(response(&[]).status, 0);
        let failed = response(&[
            ("status-code", SimpleValue::Int(401)),
            (
                "status-description",
                SimpleValue::String("bad signature".to_owned()),
            ),
        ]);
        assert_eq!(failed.description, "bad signature");
        assert!(matches!(
            failed.success(),
            Err(ClientError::Unauthorized { .. })
        ));
        assert!(
            response(&[("status-code", SimpleValue::Int(200))])
                .success()
                .is_ok()
        );
        assert!(response(&[]).success().is_err());
    }
}
