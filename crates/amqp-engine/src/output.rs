//! What a connection sends: its encoded frames, with message bodies spliced in uncopied.
//!
//! A large body a sender holds as [`Bytes`] (a stored event's, read from the log) is not copied
//! into the frame buffer: the frame's header, performative and message head are written, and
//! the body is noted as a [`Splice`] to follow them. The driver writes the frames and the
//! bodies to the socket together with vectored writes ([`Output::slices`]), so a body is
//! copied once, by the kernel.
//!
//! # Guarantees
//! - The byte stream is `bytes[..splices[0].at]`, `splices[0].body`, `bytes[splices[0].at
//!   ..splices[1].at]`, `splices[1].body`, …, `bytes[last.at..]`: splices are in order of `at`
//!   and no body is empty.
//! - [`Output::slices`] and [`Output::advance`] walk that stream: after `advance(n)`, the next
//!   slices start `n` bytes further on, whatever the split of `n` across frames and bodies.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::Bytes;

/// A body sent right after `bytes[..at]` of the output it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Splice {
    /// Where in the frame bytes the body goes.
    pub(crate) at: usize,
    /// The body; never empty.
    pub(crate) body: Bytes,
}

/// Bytes waiting for the socket, and how far they were written.
#[derive(Debug, Default)]
pub(crate) struct Output {
    bytes: Vec<u8>,
    splices: VecDeque<Splice>,
    /// Bytes of `bytes` written.
    written: usize,
    /// Bytes of the first splice's body written (while `written` is at its `at`).
    body_written: usize,
    /// Bytes of bodies not written yet.
    body_bytes: usize,
}

impl Output {
    /// Appends `bytes` and the bodies spliced into them (their `at` counted in `bytes`),
    /// leaving both empty; `bytes` keeps its capacity when this output was empty.
    pub(crate) fn append(&mut self, bytes: &mut Vec<u8>, splices: &mut Vec<Splice>) {
        let offset = self.bytes.len();
        if offset == 0 {
            std::mem::swap(&mut self.bytes, bytes);
        } else {
            self.bytes.append(bytes);
        }
        for splice in splices.drain(..) {
            debug_assert!(!splice.body.is_empty());
            self.body_bytes += splice.body.len();
            self.splices.push_back(Splice {
                at: splice.at + offset,
                body: splice.body,
            });
        }
    }

    /// Bytes not written yet.
    pub(crate) fn pending(&self) -> usize {
        self.bytes.len() - self.written + self.body_bytes - self.body_written
    }

    /// Whether everything was written.
    pub(crate) fn is_flushed(&self) -> bool {
        self.pending() == 0
    }

    /// The next bytes to write, in order: at most `max` slices.
    pub(crate) fn slices(&self, max: usize) -> Vec<IoSlice<'_>> {
        let mut slices = Vec::with_capacity(max.min(2 * self.splices.len() + 1));
        let mut at = self.written;
        let mut body_from = self.body_written;
        for splice in &self.splices {
            if slices.len() + 2 > max {
                return slices;
            }
            if splice.at > at {
                slices.push(IoSlice::new(&self.bytes[at..splice.at]));
                at = splice.at;
            }
            slices.push(IoSlice::new(&splice.body[body_from..]));
            body_from = 0;
        }
        if at < self.bytes.len() && slices.len() < max {
            slices.push(IoSlice::new(&self.bytes[at..]));
        }
        slices
    }

    /// `n` more bytes reached the socket. Once everything is written the buffer is cleared,
    /// keeping its capacity.
    pub(crate) fn advance(&mut self, mut n: usize) {
        assert!(n <= self.pending(), "more written than was pending");
        while n > 0 {
            match self.splices.front() {
                Some(splice) if splice.at == self.written => {
                    let left = splice.body.len() - self.body_written;
                    if n < left {
                        self.body_written += n;
                        return;
                    }
                    n -= left;
                    self.body_bytes -= splice.body.len();
                    self.body_written = 0;
                    self.splices.pop_front();
                }
                Some(splice) => {
                    let step = n.min(splice.at - self.written);
                    self.written += step;
                    n -= step;
                }
                None => {
                    self.written += n;
                    n = 0;
                }
            }
        }
        if self.is_flushed() {
            self.clear();
        }
    }

    /// Forgets everything, written or not; the buffer keeps its capacity.
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.splices.clear();
        self.written = 0;
        self.body_written = 0;
        self.body_bytes = 0;
    }

    /// Gives the buffer's capacity back if nothing is pending.
    pub(crate) fn release(&mut self) {
        if self.is_flushed() {
            *self = Output::default();
        }
    }

    /// The buffer's capacity.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.bytes.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The stream an output stands for.
    fn stream(bytes: &[u8], splices: &[Splice]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = 0;
        for splice in splices {
            out.extend_from_slice(&bytes[at..splice.at]);
            out.extend_from_slice(&splice.body);
            at = splice.at;
        }
        out.extend_from_slice(&bytes[at..]);
        out
    }

    /// Frame bytes of `len` bytes with bodies spliced in at sorted positions.
    fn parts() -> impl Strategy<Value = (Vec<u8>, Vec<Splice>)> {
        (0usize..200).prop_flat_map(|len| {
            let bytes = proptest::collection::vec(any::<u8>(), len);
            let splices = proptest::collection::vec(
                (0..=len, proptest::collection::vec(any::<u8>(), 1..50)),
                0..6,
            );
            (bytes, splices).prop_map(|(bytes, mut splices)| {
                splices.sort_by_key(|(at, _)| *at);
                let splices = splices
                    .into_iter()
                    .map(|(at, body)| Splice {
                        at,
                        body: Bytes::from(body),
                    })
                    .collect();
                (bytes, splices)
            })
        })
    }

    proptest! {
        /// Written in any steps, with any cap on the slices, an output yields its stream
        /// exactly once, in order, also when more is appended part-way.
        #[test]
        fn writes_in_any_steps_yield_the_stream(
            (first, first_splices) in parts(),
            (second, second_splices) in parts(),
            steps in proptest::collection::vec(1usize..40, 1..200),
            max in 2usize..8,
        ) {
            let mut expected = stream(&first, &first_splices);
            expected.extend(stream(&second, &second_splices));
            let mut output = Output::default();
            output.append(&mut first.clone(), &mut first_splices.clone());
            let mut got = Vec::new();
            let mut appended = false;
            let mut steps = steps.into_iter().cycle();
            while !output.is_flushed() || !appended {
                if !appended && (output.is_flushed() || got.len() > expected.len() / 3) {
                    output.append(&mut second.clone(), &mut second_splices.clone());
                    appended = true;
                    continue;
                }
                let slices = output.slices(max);
                prop_assert!(!slices.is_empty() && slices.len() <= max);
                let mut n = steps.next().expect("cycled");
                let mut wrote = 0;
                for slice in &slices {
                    let take = n.min(slice.len());
                    got.extend_from_slice(&slice[..take]);
                    wrote += take;
                    n -= take;
                }
                output.advance(wrote);
            }
            prop_assert_eq!(got, expected);
            prop_assert_eq!(output.pending(), 0);
        }
    }

    #[test]
    fn a_flushed_output_keeps_its_capacity_until_released() {
        let mut output = Output::default();
        let body = Bytes::from(vec![9; 100]);
        let splices = vec![Splice { at: 3, body }];
        output.append(&mut vec![1; 10], &mut splices.clone());
        assert_eq!(output.pending(), 110);
        assert_eq!(output.slices(8).len(), 3);
        output.advance(110);
        assert!(output.is_flushed());
        assert!(output.capacity() >= 10);
        output.release();
        assert_eq!(output.capacity(), 0);
    }
}
