//! The receiver rules of Event Hubs, per (event hub, consumer group, partition).
//!
//! Exactly the rules of the Event Processor Host documentation (seed 000):
//! 1. With no receiver, a receiver with any epoch (or none) may open.
//! 2. A new epoch receiver `e2` with `e2 >= e1` (the current epoch receiver's) disconnects `e1`
//!    and opens. Equal epochs: the later one wins.
//! 3. A new epoch receiver `e2 < e1` is refused.
//! 4. A non-epoch receiver is refused while an epoch receiver is open.
//! 5. A new epoch receiver disconnects every non-epoch receiver.
//! 6. At most five non-epoch receivers are open at once; the sixth is refused.
//!
//! This module is pure bookkeeping: it decides, and returns whom to disconnect. The broker
//! delivers the disconnects.

use std::collections::BTreeMap;

/// The most non-epoch receivers one (hub, group, partition) may have, as in Event Hubs.
pub const NON_EPOCH_RECEIVERS_MAX: usize = 5;

/// Identifies one open receiver inside the broker.
pub type ReceiverId = u64;

/// Why a receiver may not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenRefusal {
    /// An epoch receiver with a higher epoch is open (rule 3).
    EpochTooLow {
        /// The open receiver's epoch.
        current: i64,
        /// The epoch asked for.
        requested: i64,
    },
    /// A non-epoch receiver asked to open while an epoch receiver is open (rule 4).
    EpochReceiverActive {
        /// The open receiver's epoch.
        current: i64,
    },
    /// Five non-epoch receivers are already open (rule 6).
    TooManyReceivers {
        /// The names of the open receivers (`None` where they gave none).
        open: Vec<Option<String>>,
    },
}

/// Whom opening a receiver displaced, and why.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Displaced {
    /// Receivers to disconnect.
    pub receivers: Vec<ReceiverId>,
}

#[derive(Debug, Clone)]
struct OpenReceiver {
    epoch: Option<i64>,
    name: Option<String>,
}

/// The receivers open on one (hub, consumer group, partition).
#[derive(Debug, Default)]
pub struct EpochRegistry {
    open: BTreeMap<ReceiverId, OpenReceiver>,
}

impl EpochRegistry {
    /// Applies the rules to a receiver that wants to open with `epoch`; on success records it
    /// under `id` and returns the receivers it displaces (already forgotten here).
    pub fn open(
        &mut self,
        id: ReceiverId,
        epoch: Option<i64>,
        name: Option<String>,
    ) -> Result<Displaced, OpenRefusal> {
        assert!(!self.open.contains_key(&id), "receiver ids are unique");
        let current = self.current_epoch();
        let displaced = match (epoch, current) {
            (Some(requested), Some(current)) if requested < current => {
                return Err(OpenRefusal::EpochTooLow { current, requested });
            }
            (None, Some(current)) => return Err(OpenRefusal::EpochReceiverActive { current }),
            (None, None) => {
                if self.open.len() >= NON_EPOCH_RECEIVERS_MAX {
                    let open = self.open.values().map(|r| r.name.clone()).collect();
                    return Err(OpenRefusal::TooManyReceivers { open });
                }
                Vec::new()
            }
            // Rules 2 and 5: an epoch receiver displaces everyone else.
            (Some(_), _) => std::mem::take(&mut self.open).into_keys().collect(),
        };
        self.open.insert(id, OpenReceiver { epoch, name });
        self.check_invariants();
        Ok(Displaced {
            receivers: displaced,
        })
    }

    /// Forgets a receiver that closed (or was disconnected). Unknown ids are ignored.
    pub fn close(&mut self, id: ReceiverId) {
        self.open.remove(&id);
    }

    /// Forgets every receiver, returning them (for disconnecting all, e.g. on delete).
    pub fn take_all(&mut self) -> Vec<ReceiverId> {
        std::mem::take(&mut self.open).into_keys().collect()
    }

    /// The epoch of the open epoch receiver, if one is open.
    pub fn current_epoch(&self) -> Option<i64> {
        self.open.values().find_map(|r| r.epoch)
    }

    /// The open receivers' epochs and names, in the order they opened.
    pub fn receivers(&self) -> impl Iterator<Item = (Option<i64>, Option<&str>)> {
        self.open.values().map(|r| (r.epoch, r.name.as_deref()))
    }

    /// How many receivers are open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// Whether no receiver is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    fn check_invariants(&self) {
        let epoch_receivers = self.open.values().filter(|r| r.epoch.is_some()).count();
        assert!(epoch_receivers <= 1, "at most one epoch receiver");
        if epoch_receivers == 1 {
            assert_eq!(self.open.len(), 1, "an epoch receiver is alone");
        }
        assert!(self.open.len() <= NON_EPOCH_RECEIVERS_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_1_with_no_receiver_any_epoch_opens() {
        for epoch in [None, Some(-5), Some(0), Some(i64::MAX)] {
            let mut r = EpochRegistry::default();
            assert_eq!(r.open(1, epoch, None), Ok(Displaced::default()));
        }
    }

    #[test]
    fn rule_2_a_higher_or_equal_epoch_disconnects_the_current() {
        let mut r = EpochRegistry::default();
        r.open(1, Some(3), None).unwrap();
        assert_eq!(r.open(2, Some(3), None).unwrap().receivers, vec![1]);
        assert_eq!(r.open(3, Some(7), None).unwrap().receivers, vec![2]);
        assert_eq!(r.current_epoch(), Some(7));
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn rule_3_a_lower_epoch_is_refused() {
        let mut r = EpochRegistry::default();
        r.open(1, Some(5), None).unwrap();
        assert_eq!(
            r.open(2, Some(4), None),
            Err(OpenRefusal::EpochTooLow {
                current: 5,
                requested: 4
            })
        );
        assert_eq!(r.current_epoch(), Some(5));
    }

    #[test]
    fn rule_4_a_non_epoch_receiver_is_refused_while_an_epoch_receiver_is_open() {
        let mut r = EpochRegistry::default();
        r.open(1, Some(0), None).unwrap();
        assert_eq!(
            r.open(2, None, None),
            Err(OpenRefusal::EpochReceiverActive { current: 0 })
        );
        // Once the epoch receiver has gone, non-epoch receivers may open again.
        r.close(1);
        assert!(r.open(3, None, None).is_ok());
    }

    #[test]
    fn rule_5_an_epoch_receiver_disconnects_all_non_epoch_receivers() {
        let mut r = EpochRegistry::default();
        for id in 1..=3 {
            r.open(id, None, None).unwrap();
        }
        let mut displaced = r.open(9, Some(1), None).unwrap().receivers;
        displaced.sort_unstable();
        assert_eq!(displaced, vec![1, 2, 3]);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn rule_6_the_sixth_non_epoch_receiver_is_refused() {
        let mut r = EpochRegistry::default();
        for id in 1..=5 {
            r.open(id, None, Some(format!("r{id}"))).unwrap();
        }
        match r.open(6, None, None) {
            Err(OpenRefusal::TooManyReceivers { open }) => assert_eq!(open.len(), 5),
            other => panic!("expected the sixth to be refused, got {other:?}"),
        }
        r.close(2);
        assert!(r.open(6, None, None).is_ok());
    }
}
