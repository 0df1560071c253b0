//! Property-test helpers shared by the crates that decode AMQP bytes from peers (this codec,
//! the server's ingest path, the client's delivery decoder). Only with the `testing` feature,
//! which those crates turn on for their tests alone.
//!
//! What they share is how untrusted bytes are damaged: every decoder's robustness property is
//! "a well-formed message, damaged like this, never panics and never decodes differently from
//! the reference".

use proptest::prelude::*;
use proptest::sample::Index;

/// A change to encoded bytes: what a torn write, a flipped bit or a lying peer does.
#[derive(Debug, Clone)]
pub enum Damage {
    /// Cut the bytes off at a point.
    Truncate(Index),
    /// Replace one byte.
    Overwrite(Index, u8),
    /// Insert one byte.
    Insert(Index, u8),
    /// Remove one byte.
    Remove(Index),
}

impl Damage {
    /// Applies the damage to `bytes` (empty bytes stay empty).
    pub fn apply(&self, bytes: &mut Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        match self {
            Damage::Truncate(at) => bytes.truncate(at.index(bytes.len())),
            Damage::Overwrite(at, byte) => {
                let at = at.index(bytes.len());
                bytes[at] = *byte;
            }
            Damage::Insert(at, byte) => bytes.insert(at.index(bytes.len() + 1), *byte),
            Damage::Remove(at) => {
                bytes.remove(at.index(bytes.len()));
            }
        }
    }
}

/// Any one [`Damage`].
pub fn damage() -> BoxedStrategy<Damage> {
    prop_oneof![
        any::<Index>().prop_map(Damage::Truncate),
        (any::<Index>(), any::<u8>()).prop_map(|(at, b)| Damage::Overwrite(at, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(at, b)| Damage::Insert(at, b)),
        any::<Index>().prop_map(Damage::Remove),
    ]
    .boxed()
}

/// Text for names, keys and values: mostly short identifiers, sometimes any characters.
pub fn text() -> BoxedStrategy<String> {
    prop_oneof![3 => "[a-z0-9-]{0,12}", 1 => ".{0,24}"].boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest! {
        #[test]
        fn damage_changes_at_most_one_byte_or_cuts(bytes in proptest::collection::vec(any::<u8>(), 0..64), damage in damage()) {
            let mut damaged = bytes.clone();
            damage.apply(&mut damaged);
            match damage {
                _ if bytes.is_empty() => prop_assert!(damaged.is_empty()),
                Damage::Truncate(_) => prop_assert!(bytes.starts_with(&damaged) && damaged.len() < bytes.len()),
                Damage::Overwrite(..) => prop_assert_eq!(damaged.len(), bytes.len()),
                Damage::Insert(..) => prop_assert_eq!(damaged.len(), bytes.len() + 1),
                Damage::Remove(_) => prop_assert_eq!(damaged.len() + 1, bytes.len()),
            }
        }
    }
}
