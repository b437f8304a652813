//! Pod addresses: every Pod gets its own loopback address inside the agent's
//! /16 of 127.0.0.0/8 (`127.X.0.0/16`, X chosen per environment so concurrent
//! environments never share an address). `127.X.255.N` are the Nodes' addresses.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

#[derive(Debug)]
pub struct PodNetwork {
    block: u8,
    next: u32,
    in_use: BTreeSet<Ipv4Addr>,
}

/// Usable pod addresses per block: third octet 0..=254, fourth 1..=254.
const CAPACITY: u32 = 255 * 254;

impl PodNetwork {
    pub fn new(block: u8) -> Self {
        Self { block, next: 0, in_use: BTreeSet::new() }
    }

    pub fn block(&self) -> u8 {
        self.block
    }

    /// The address of the node with 1-based `index`.
    pub fn node_ip(&self, index: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, self.block, 255, index)
    }

    /// Keeps an address a Pod already had (after an agent restart), if it is ours.
    pub fn adopt(&mut self, ip: &str) -> Option<Ipv4Addr> {
        let ip: Ipv4Addr = ip.parse().ok()?;
        let [a, b, c, _] = ip.octets();
        (a == 127 && b == self.block && c != 255 && self.in_use.insert(ip)).then_some(ip)
    }

    /// A fresh address; addresses are not reused until the block wraps, so a
    /// recreated Pod gets a new IP as it would in a real cluster.
    pub fn allocate(&mut self) -> Option<Ipv4Addr> {
        for _ in 0..CAPACITY {
            let n = self.next % CAPACITY;
            self.next = self.next.wrapping_add(1);
            let ip = Ipv4Addr::new(127, self.block, (n / 254) as u8, (n % 254 + 1) as u8);
            if self.in_use.insert(ip) {
                return Some(ip);
            }
        }
        None
    }

    pub fn release(&mut self, ip: Ipv4Addr) {
        self.in_use.remove(&ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_unique_and_outside_the_node_range() {
        let mut net = PodNetwork::new(7);
        let a = net.allocate().unwrap();
        let b = net.allocate().unwrap();
        assert_ne!(a, b);
        assert_eq!(a, Ipv4Addr::new(127, 7, 0, 1));
        assert_eq!(net.adopt("127.7.0.1"), None, "in use");
        assert_eq!(net.adopt("127.7.255.1"), None, "node range");
        assert_eq!(net.adopt("127.8.0.9"), None, "other block");
        net.release(a);
        assert_eq!(net.adopt("127.7.0.1"), Some(a));
    }
}
