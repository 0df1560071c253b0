//! Connection caps every front door applies: at most so many connections in all, and so many
//! from one source IP address.
//!
//! [`Admission`] counts the connections a door holds; a connection over a cap gets no [`Slot`]
//! and the door refuses it, in its own protocol's words ([`Full::description`] says which cap
//! and never names the address). A slot is given back when it is dropped, however the
//! connection ends.
//!
//! # Guarantees
//! - The counts never exceed the caps, and every slot given out is returned exactly once.
//! - IPv4 addresses seen through an IPv6 socket count as the IPv4 address.
//! - Nothing is kept for a refused connection, nor for an address once its last slot is back.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

/// The caps of one door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCaps {
    /// The most connections at once.
    pub total: usize,
    /// The most connections at once from one source IP address.
    pub per_address: usize,
}

/// Connection counts against [`ConnectionCaps`]. Cheap to clone; clones share the counts.
#[derive(Debug, Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    caps: ConnectionCaps,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The door holds its most connections.
    Total(usize),
    /// The peer's address holds its most connections.
    PerAddress(usize),
}

impl Full {
    /// The refusal's description, as the client reads it (never naming the address).
    pub fn description(self) -> String {
        match self {
            Full::Total(max) => {
                format!("the server holds its maximum of {max} connections; retry later")
            }
            Full::PerAddress(max) => format!(
                "this source address holds its maximum of {max} connections; close some first"
            ),
        }
    }
}

/// One connection's place in the counts, given back on drop.
#[derive(Debug)]
pub struct Slot {
    inner: Arc<Inner>,
    address: IpAddr,
}

impl Admission {
    /// Counts against `caps`, starting from none held.
    pub fn new(caps: ConnectionCaps) -> Self {
        Admission {
            inner: Arc::new(Inner {
                caps,
                counts: Mutex::new(Counts::default()),
            }),
        }
    }

    /// A slot for a connection from `peer`, or which cap it is over.
    pub fn admit(&self, peer: SocketAddr) -> Result<Slot, Full> {
        let caps = &self.inner.caps;
        let mut counts = self.inner.counts.lock().expect("admission counts");
        if counts.total >= caps.total {
            return Err(Full::Total(caps.total));
        }
        let address = peer.ip().to_canonical();
        let held = counts.per_address.entry(address).or_insert(0);
        if *held >= caps.per_address {
            return Err(Full::PerAddress(caps.per_address));
        }
        *held += 1;
        counts.total += 1;
        Ok(Slot {
            inner: self.inner.clone(),
            address,
        })
    }

    /// How many connections hold a slot.
    pub fn held(&self) -> usize {
        self.inner.counts.lock().expect("admission counts").total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.inner.counts.lock().expect("admission counts");
        counts.total -= 1;
        if let Some(held) = counts.per_address.get_mut(&self.address) {
            *held -= 1;
            if *held == 0 {
                counts.per_address.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_hold_per_address_and_in_total_and_slots_come_back() {
        let admission = Admission::new(ConnectionCaps {
            total: 3,
            per_address: 2,
        });
        let a: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:1000".parse().unwrap();
        let c: SocketAddr = "10.0.0.3:1000".parse().unwrap();
        let a1 = admission.admit(a).unwrap();
        let a2 = admission.admit(a).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Full::PerAddress(2));
        let b1 = admission.admit(b).unwrap();
        assert_eq!(admission.admit(c).unwrap_err(), Full::Total(3));
        drop(a1);
        assert_eq!(admission.held(), 2);
        let c1 = admission.admit(c).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Full::Total(3));
        drop((a2, b1, c1));
        assert_eq!(admission.held(), 0);
        assert!(
            admission
                .inner
                .counts
                .lock()
                .unwrap()
                .per_address
                .is_empty()
        );
        // IPv4 seen through an IPv6 socket counts as the same address.
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:1".parse().unwrap();
        let _x = admission.admit(a).unwrap();
        let _y = admission.admit(mapped).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Full::PerAddress(2));
    }
}
