//! Sequence numbers: transfer ids, delivery ids and delivery counts are 32-bit serial numbers
//! that wrap (specification 2.8.9), compared with RFC 1982 arithmetic.
//!
//! Only the engine's own counters are judged with these, in assertions; numbers a peer sends
//! are taken with wrapping arithmetic and never asserted on.

/// Half the serial-number space: RFC 1982 leaves numbers this far apart unordered.
const HALF: u32 = 1 << 31;

/// `a` precedes `b` (RFC 1982, 3.2): `b` is ahead of `a` by less than half the space.
pub(crate) fn precedes(a: u32, b: u32) -> bool {
    let ahead = b.wrapping_sub(a);
    ahead != 0 && ahead < HALF
}

/// How far `to` is ahead of `from` (the number of increments between them).
pub(crate) fn distance(from: u32, to: u32) -> u32 {
    to.wrapping_sub(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_ordered_across_the_wrap() {
        assert!(precedes(0, 1));
        assert!(precedes(u32::MAX, 0));
        assert!(precedes(u32::MAX - 5, 10));
        assert!(!precedes(1, 0));
        assert!(!precedes(7, 7));
        assert!(!precedes(0, HALF), "half the space apart: unordered");
        assert!(!precedes(HALF, 0), "half the space apart: unordered");
        assert!(precedes(0, HALF - 1));
        assert_eq!(distance(u32::MAX, 2), 3);
        assert_eq!(distance(5, 5), 0);
    }
}
