//! Partition-key routing, the same way Azure Event Hubs does it.
//!
//! Event Hubs maps a partition key to a partition with Bob Jenkins' lookup3 `hashlittle2` over the
//! key's UTF-8 bytes (both seeds 0), folds the two 32-bit results to a signed 16-bit value
//! (`(c ^ b) as i16`) and takes its absolute remainder by the partition count. The Azure SDKs'
//! buffered producers compute the same function client-side; matching it means a key lands on
//! the partition it would land on in Azure, so moving a pipeline between the two keeps per-key
//! partitions stable.
//!
//! Written out here because lookup3 is a few dozen lines and the crates that carry it do not
//! expose `hashlittle2`'s pair of outputs, which the fold needs.

/// The 16-bit signed hash Event Hubs derives from a partition key.
pub fn partition_key_hash(key: &str) -> i16 {
    let (b, c) = hashlittle2(key.as_bytes());
    // Truncation to the low 16 bits, read as signed, is the definition.
    (c ^ b) as u16 as i16
}

/// The partition (0-based) that `key` routes to in a hub with `partition_count` partitions.
///
/// # Panics
/// If `partition_count` is 0 (a hub always has at least one partition).
pub fn partition_for_key(key: &str, partition_count: u32) -> u32 {
    assert!(partition_count > 0, "a hub has at least one partition");
    let hash = i32::from(partition_key_hash(key));
    let count = i32::try_from(partition_count).unwrap_or(i32::MAX);
    // `%` keeps the dividend's sign, as in the SDKs; the absolute value is then < count.
    (hash % count).unsigned_abs()
}

fn read_u32(data: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

/// lookup3 `hashlittle2` with `pc = pb = 0`; returns `(b, c)`.
fn hashlittle2(data: &[u8]) -> (u32, u32) {
    // The length enters the hash modulo 2^32, exactly as the C and JS versions add it.
    let initial = 0xdead_beef_u32.wrapping_add(data.len() as u32);
    let (mut a, mut b, mut c) = (initial, initial, initial);
    let mut rest = data;
    while rest.len() > 12 {
        a = a.wrapping_add(read_u32(rest, 0));
        b = b.wrapping_add(read_u32(rest, 4));
        c = c.wrapping_add(read_u32(rest, 8));
        mix(&mut a, &mut b, &mut c);
        rest = &rest[12..];
    }
    if rest.is_empty() {
        return (b, c);
    }
    // The tail: up to 12 bytes added little-endian into a, b, c (zero-padded).
    let mut tail = [0u8; 12];
    tail[..rest.len()].copy_from_slice(rest);
    a = a.wrapping_add(read_u32(&tail, 0));
    b = b.wrapping_add(read_u32(&tail, 4));
    c = c.wrapping_add(read_u32(&tail, 8));
    final_mix(&mut a, &mut b, &mut c);
    (b, c)
}

fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

fn final_mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors computed with the `@azure/event-hubs` JavaScript SDK's own partition-key mapper
    /// (key, hash, partition in a 32-partition hub).
    const SDK_VECTORS: &[(&str, i16, u32)] = &[
        ("", 0, 0),
        ("a", -16220, 28),
        ("ab", 2093, 13),
        ("abc", -14161, 17),
        ("abcd", 23398, 6),
        ("device-17", -8360, 8),
        ("12characters", -15330, 2),
        ("thirteen-char", -24856, 24),
        ("sensor/kitchen/door", -8053, 21),
        ("über-ünïcødé-schlüssel", -23803, 27),
        ("The quick brown fox jumps over the lazy dog", -31937, 1),
        ("0", 28433, 17),
        ("1", 3270, 6),
        ("partition-key-0042", 3448, 24),
        ("xxxxxxxxxxxxxxxxxxxxxxxx", -20573, 29),
        ("yyyyyyyyyyyyyyyyyyyyyyyyy", -9726, 30),
    ];

    #[test]
    fn matches_the_azure_sdk_mapper() {
        for &(key, hash, partition) in SDK_VECTORS {
            assert_eq!(partition_key_hash(key), hash, "hash of {key:?}");
            assert_eq!(
                partition_for_key(key, 32),
                partition,
                "partition of {key:?}"
            );
        }
    }

    #[test]
    fn every_key_lands_inside_the_hub() {
        proptest::proptest!(|(key in ".{0,64}", count in 1u32..=1024)| {
            proptest::prop_assert!(partition_for_key(&key, count) < count);
        });
    }

    #[test]
    fn the_same_key_always_lands_on_the_same_partition() {
        for count in [1, 2, 4, 16, 32, 1024] {
            assert_eq!(
                partition_for_key("device-17", count),
                partition_for_key("device-17", count)
            );
        }
    }
}
