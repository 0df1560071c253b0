//! CRC-32C (Castagnoli), the checksum of every record batch, segment header, index file and
//! swap file, in one place.
//!
//! Computed with `crc-fast`, which folds the input with carry-less multiplication
//! (`VPCLMULQDQ`, `PCLMULQDQ` or the ARM equivalents, chosen at run time) rather than the
//! `crc32c` crate's interleaved `crc32` instructions: faster on a batch, and a reader verifies
//! every batch it reads (BENCHMARKS.md, "Capture: the log's checksum by carry-less
//! multiplication"). The values are the same (the tests hold it to `crc32c`).

use crc_fast::CrcAlgorithm::Crc32Iscsi;

/// The CRC-32C of `bytes`.
#[inline]
pub(crate) fn crc32c(bytes: &[u8]) -> u32 {
    // A 32-bit CRC in the low half.
    crc_fast::checksum(Crc32Iscsi, bytes) as u32
}

/// The CRC-32C of the bytes `crc` was computed over followed by `bytes`.
pub(crate) fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    let more = crc_fast::checksum(Crc32Iscsi, bytes);
    crc_fast::checksum_combine(Crc32Iscsi, u64::from(crc), more, bytes.len() as u64) as u32
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The same values as the `crc32c` crate, whole and appended at any split.
        #[test]
        fn matches_the_crc32c_crate(bytes in proptest::collection::vec(any::<u8>(), 0..4096), split in any::<prop::sample::Index>()) {
            prop_assert_eq!(crc32c(&bytes), ::crc32c::crc32c(&bytes));
            let (head, tail) = bytes.split_at(split.index(bytes.len() + 1));
            prop_assert_eq!(crc32c_append(crc32c(head), tail), ::crc32c::crc32c(&bytes));
        }
    }

    /// Batch-sized inputs at every alignment the folding code may meet.
    #[test]
    fn matches_the_crc32c_crate_on_large_unaligned_inputs() {
        let bytes: Vec<u8> = (0..300_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in 0..64 {
            for len in [65_535, 100_003, 262_144] {
                let slice = &bytes[start..start + len];
                assert_eq!(
                    crc32c(slice),
                    ::crc32c::crc32c(slice),
                    "at {start}, {len} bytes"
                );
            }
        }
    }

    #[test]
    fn the_check_value() {
        // CRC-32C's published check value, of the nine ASCII digits.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }
}
