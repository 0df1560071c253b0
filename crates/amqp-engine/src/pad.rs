//! Encodes the rare performatives and SASL frames with every field present.
//!
//! AMQP 1.0 lets an encoder omit trailing null fields of a described list, and `serde_amqp`
//! does (it also omits trailing fields equal to their default). The Python SDK's `pyamqp`
//! indexes performative fields by position (`open[9]`, `attach[13]`, …) and fails on a short
//! list, so [`write_performative`] re-encodes the list with the omitted fields as explicit
//! nulls — the same values, the shape the Microsoft stack sends.

use serde::Serialize;

/// The number of fields of each performative and SASL frame body, by descriptor code.
pub(crate) fn arity(code: u8) -> Option<usize> {
    Some(match code {
        0x10 => 10, // open
        0x11 => 8,  // begin
        0x12 => 14, // attach
        0x13 => 11, // flow
        0x14 => 11, // transfer
        0x15 => 6,  // disposition
        0x16 => 3,  // detach
        0x17 => 1,  // end
        0x18 => 1,  // close
        0x40 => 1,  // sasl-mechanisms
        0x41 => 3,  // sasl-init
        0x42 => 1,  // sasl-challenge
        0x43 => 1,  // sasl-response
        0x44 => 2,  // sasl-outcome
        _ => return None,
    })
}

/// Appends `value` (a performative or SASL frame body, as `fe2o3-amqp-types` defines it)
/// encoded with all its fields.
///
/// Panics if `value` is not one of those types: the engine only ever passes its own frames.
pub(crate) fn write_performative<T: Serialize>(value: &T, out: &mut Vec<u8>) {
    let encoded = serde_amqp::to_vec(value).expect("performatives always encode");
    let (code, list_at) = match encoded.as_slice() {
        [0x00, 0x53, code, ..] => (*code, 3),
        _ => panic!("performatives are encoded with a small numeric descriptor"),
    };
    let fields = arity(code).expect("a known performative");
    let (count, elements) = read_list(&encoded[list_at..]).expect("serde_amqp writes lists");
    if count >= fields {
        out.extend_from_slice(&encoded);
        return;
    }
    let missing = fields - count;
    let size = u32::try_from(4 + elements.len() + missing).expect("performatives are small");
    out.extend_from_slice(&encoded[..list_at]);
    out.push(0xd0);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&(fields as u32).to_be_bytes());
    out.extend_from_slice(elements);
    out.extend(std::iter::repeat_n(0x40, missing));
}

/// A list's element count and element bytes.
fn read_list(list: &[u8]) -> Option<(usize, &[u8])> {
    match *list.first()? {
        0x45 => Some((0, &[])),
        0xc0 => {
            let size = usize::from(*list.get(1)?);
            let count = usize::from(*list.get(2)?);
            Some((count, list.get(3..2 + size)?))
        }
        0xd0 => {
            let size = u32::from_be_bytes(list.get(1..5)?.try_into().ok()?);
            let count = u32::from_be_bytes(list.get(5..9)?.try_into().ok()?);
            let end = 5usize.checked_add(usize::try_from(size).ok()?)?;
            Some((usize::try_from(count).ok()?, list.get(9..end)?))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp_types::performatives::{Close, Detach, End, Open};

    fn count(encoded: &[u8]) -> usize {
        read_list(&encoded[3..]).unwrap().0
    }

    #[test]
    fn performatives_are_padded_and_still_decode() {
        let open = Open {
            container_id: "c".into(),
            hostname: None,
            max_frame_size: 65536.into(),
            channel_max: 255.into(),
            idle_time_out: None,
            outgoing_locales: None,
            incoming_locales: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        };
        let mut out = Vec::new();
        write_performative(&open, &mut out);
        assert_eq!(count(&out), 10);
        assert_eq!(serde_amqp::from_slice::<Open>(&out).unwrap(), open);

        let close = Close { error: None };
        let mut out = Vec::new();
        write_performative(&close, &mut out);
        assert_eq!(count(&out), 1);
        assert_eq!(serde_amqp::from_slice::<Close>(&out).unwrap(), close);

        let end = End { error: None };
        let mut out = Vec::new();
        write_performative(&end, &mut out);
        assert_eq!(serde_amqp::from_slice::<End>(&out).unwrap(), end);

        let detach = Detach {
            handle: 3.into(),
            closed: true,
            error: None,
        };
        let mut out = Vec::new();
        write_performative(&detach, &mut out);
        assert_eq!(count(&out), 3);
        assert_eq!(serde_amqp::from_slice::<Detach>(&out).unwrap(), detach);
    }
}
