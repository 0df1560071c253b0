//! What the two fast message walkers share: [`ingest`](crate::ingest) (a producer's message,
//! on the server) and [`receive`](crate::receive) (a hub's delivery, on the client).
//!
//! Both read a message section by section with the strict
//! [`Reader`](tributary_amqp_codec::value::Reader), borrowing, and give up — [`Fallback`] — on
//! anything their general path must decide. What they read alike lives here: the next section's
//! descriptor, the `header` list and a map's header with the count `serde_amqp` accepts. The
//! annotations, properties and application properties differ between the two directions (which
//! keys count, which values are kept, how a repeated key is treated), so each keeps its own.

use fe2o3_amqp_types::messaging::{Header, Priority};
use tributary_amqp_codec::CodecError;
use tributary_amqp_codec::message::section_code::{DATA, HEADER, HEADER_FIELDS};
use tributary_amqp_codec::value::Reader;

/// The fast path cannot read this message exactly as the general path would; take that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fallback;

impl From<CodecError> for Fallback {
    fn from(_: CodecError) -> Self {
        Fallback
    }
}

/// The next section's numeric descriptor (header to data), or `None` at the end of the bytes.
/// Symbolic descriptors of sections are not among those `descriptor` knows, so they fall back;
/// numeric ones may be in any `ulong` encoding, as in the general paths. A footer or a
/// non-`data` body falls back too.
pub(crate) fn next_section(reader: &mut Reader<'_>) -> Result<Option<u64>, Fallback> {
    if reader.is_at_end() {
        return Ok(None);
    }
    match reader.descriptor()? {
        code @ HEADER..=DATA => Ok(Some(code)),
        _ => Err(Fallback),
    }
}

/// A `header` list: durable, priority, ttl, first-acquirer, delivery-count, each null (its
/// default) or of its type.
pub(crate) fn header(reader: &mut Reader<'_>) -> Result<Header, Fallback> {
    let (count, end) = reader.list_header()?;
    if count > HEADER_FIELDS {
        return Err(Fallback);
    }
    let mut header = Header::default();
    for field in 0..count {
        if reader.null()? {
            continue;
        }
        match field {
            0 => header.durable = reader.boolean()?,
            1 => header.priority = Priority(reader.ubyte()?),
            2 => header.ttl = Some(reader.uint()?),
            3 => header.first_acquirer = reader.boolean()?,
            _ => header.delivery_count = reader.uint()?,
        }
    }
    reader.expect_at(end, "header fields overrun the list")?;
    Ok(header)
}

/// A map's header, with the count `serde_amqp` accepts: a larger map is an error there, so it
/// is left to the general path to refuse. Returns the number of entries and where they end.
pub(crate) fn map_entries(reader: &mut Reader<'_>) -> Result<(u32, usize), Fallback> {
    let (count, end) = reader.map_header()?;
    if count as usize > serde_amqp::de::MAX_ARRAY_COUNT {
        return Err(Fallback);
    }
    Ok((count / 2, end))
}
