//! Network namespaces for partition tests: each node of a test cluster in an `ip netns` of its
//! own, joined by a veth pair to one bridge in the root namespace, and faults on the links
//! between chosen pairs of nodes — the network half of a Jepsen nemesis, in miniature.
//!
//! What it guarantees:
//! - Names are unique per run (`tbn<pid>…`, pid and a per-process counter), and the subnet
//!   (`10.X.Y.0/24`) is one no route of this machine uses yet.
//! - Everything is removed when the [`Network`] is dropped, also when a test panics; a run
//!   killed before that leaves namespaces and links named after a pid that no longer runs, and
//!   the next [`Network::create`] removes those first.
//! - Creating a network that cannot be created (not root, no `ip`) is an `Err` naming the
//!   command and what it said, so a test fails with it and never skips.
//! - The root namespace (the test process: its producer and its observers) keeps an unimpaired
//!   path to every node; faults are between nodes only.
//!
//! Faults, applied to both directions of a pair: each node shapes its egress with an HTB
//! qdisc whose class per peer holds the fault (this machine's kernel has no `netem`, so delay
//! is a slow link's queue and loss a filter on packet bits):
//! - [`Fault::Drop`]: every packet to the peer dropped silently (a queue of 0 bytes), the hard
//!   case — TCP notices nothing until its own timeouts.
//! - [`Fault::Reject`]: the peer unreachable (an `unreachable` route: new connections fail at
//!   once) and the open connections to it reset (`ss -K`, which sends a RST).
//! - [`Fault::Slow`]: the link limited to a rate with a bounded byte queue: packets wait up to
//!   [`Fault::queue_delay_max`], and tail-drop beyond.
//! - [`Fault::Loss`]: one TCP segment in 2^k dropped, picked by the low bits of its checksum (a
//!   retransmission carries new timestamps, so it gets another draw).
//!
//! and [`Network::isolate`]: a node's link to the bridge set down (every peer, silently).

use std::ffi::OsStr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Every name this module gives starts with this, then the creating process's pid.
const PREFIX: &str = "tbn";
/// Per node: HTB class `1:(PEER_CLASS_BASE + peer index)` holds the faults towards one peer.
const PEER_CLASS_BASE: usize = 16;
/// The class whose queue drops everything, where the loss filters send their packets.
const DROP_CLASS: &str = "1:2";
/// The byte queue of a slow link: ten full-size packets (segmentation offload is off on the
/// nodes' interfaces, so no packet is larger than the MTU).
const SLOW_QUEUE_BYTES: u64 = 15_000;
/// The byte queue of a healthy link (every link's queue is a `bfifo`: `tc` replaces a queue
/// only by one of its kind).
const HEALTHY_QUEUE_BYTES: u64 = 4_000_000;
/// An unlimited link's rate.
const LINE_RATE: &str = "10gbit";

/// Networks created by this process, for unique names.
static CREATED: AtomicU32 = AtomicU32::new(0);

/// What goes wrong on a link between two nodes (both directions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every packet dropped silently.
    Drop,
    /// The peer unreachable and open connections reset.
    Reject,
    /// A link of this many kbit/s with a bounded queue.
    Slow {
        /// The rate.
        kbit: u32,
    },
    /// One TCP segment in `2^bits` dropped.
    Loss {
        /// log2 of one in how many segments is dropped.
        bits: u32,
    },
}

impl Fault {
    /// The longest a packet waits in this fault's queue before it is sent (zero for the
    /// faults without a queue).
    pub fn queue_delay_max(self) -> Duration {
        match self {
            Fault::Slow { kbit } => {
                Duration::from_millis(SLOW_QUEUE_BYTES * 8 / u64::from(kbit.max(1)))
            }
            Fault::Drop | Fault::Reject | Fault::Loss { .. } => Duration::ZERO,
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Drop => f.write_str("cut (silent drop)"),
            Fault::Reject => f.write_str("cut (unreachable, connections reset)"),
            Fault::Slow { kbit } => write!(f, "slow ({kbit} kbit/s, {SLOW_QUEUE_BYTES} B queue)"),
            Fault::Loss { bits } => write!(f, "loss (1 TCP segment in {})", 1u32 << bits),
        }
    }
}

/// Nodes in namespaces on one bridge; removed on drop.
#[derive(Debug)]
pub struct Network {
    pid: u32,
    run: u32,
    /// `10.X.Y`: node `i` is `10.X.Y.(10 + i)`, the root namespace `10.X.Y.1`.
    subnet: String,
    nodes: Vec<String>,
}

impl Network {
    /// A namespace per name in `nodes` (at most 10), each with `eth0` on one bridge and the
    /// fault classes set up; leftovers of dead earlier runs removed first.
    pub fn create(nodes: &[&str]) -> Result<Network, String> {
        assert!(!nodes.is_empty());
        assert!(
            nodes.len() <= 10,
            "node indexes are one digit in link names"
        );
        remove_stale();
        let pid = std::process::id();
        let run = CREATED.fetch_add(1, Ordering::Relaxed);
        assert!(run < 100, "run numbers are two digits in link names");
        let network = Network {
            pid,
            run,
            subnet: free_subnet(pid, run)?,
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
        };
        let bridge = network.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        ip(&["link", "set", &bridge, "up"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}.1/24", network.subnet),
            "dev",
            &bridge,
        ])?;
        for index in 0..nodes.len() {
            network.add_node(index)?;
        }
        Ok(network)
    }

    fn bridge(&self) -> String {
        format!("{PREFIX}{}b{}", self.pid, self.run)
    }

    fn veth(&self, index: usize) -> String {
        format!("{PREFIX}{}v{}{index}", self.pid, self.run)
    }

    fn namespace_of(&self, index: usize) -> String {
        format!("{PREFIX}{}-{}-{}", self.pid, self.run, self.nodes[index])
    }

    fn index(&self, node: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n == node)
            .unwrap_or_else(|| panic!("no node {node:?} in {:?}", self.nodes))
    }

    /// The namespace `node` runs in.
    pub fn namespace(&self, node: &str) -> String {
        self.namespace_of(self.index(node))
    }

    /// `node`'s address.
    pub fn ip(&self, node: &str) -> String {
        format!("{}.{}", self.subnet, 10 + self.index(node))
    }

    /// `program` to be run in `node`'s namespace (`ip netns exec`, which execs it: the child's
    /// pid is the program's).
    pub fn command(&self, node: &str, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.namespace(node)])
            .arg(program);
        command
    }

    fn add_node(&self, index: usize) -> Result<(), String> {
        let (ns, veth) = (self.namespace_of(index), self.veth(index));
        ip(&["netns", "add", &ns])?;
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        ip(&["link", "set", &veth, "master", &self.bridge(), "up"])?;
        let address = format!("{}.{}/24", self.subnet, 10 + index);
        ip(&["-n", &ns, "addr", "add", &address, "dev", "eth0"])?;
        // Packets no larger than the MTU, so a slow link's byte queue bounds its delay.
        ip(&[
            "-n",
            &ns,
            "link",
            "set",
            "dev",
            "eth0",
            "gso_max_size",
            "1500",
        ])?;
        ip(&["-n", &ns, "link", "set", "dev", "eth0", "gso_max_segs", "1"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let tc = |args: &[&str]| run("tc", &[&["-n", &ns], args].concat());
        tc(&[
            "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "1",
        ])?;
        tc(&[
            "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb", "rate",
            LINE_RATE,
        ])?;
        tc(&[
            "class", "add", "dev", "eth0", "parent", "1:", "classid", DROP_CLASS, "htb", "rate",
            LINE_RATE,
        ])?;
        tc(&[
            "qdisc", "add", "dev", "eth0", "parent", DROP_CLASS, "pfifo", "limit", "0",
        ])?;
        for peer in (0..self.nodes.len()).filter(|&peer| peer != index) {
            let class = format!("1:{}", PEER_CLASS_BASE + peer);
            tc(&[
                "class", "add", "dev", "eth0", "parent", "1:", "classid", &class, "htb", "rate",
                LINE_RATE,
            ])?;
            self.set_queue(
                index,
                peer,
                &["bfifo", "limit", &HEALTHY_QUEUE_BYTES.to_string()],
            )?;
            let dst = format!("{}.{}/32", self.subnet, 10 + peer);
            tc(&[
                "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "2",
                "u32", "match", "ip", "dst", &dst, "flowid", &class,
            ])?;
        }
        Ok(())
    }

    /// Replaces the queue of `index`'s class towards `peer`.
    fn set_queue(&self, index: usize, peer: usize, queue: &[&str]) -> Result<(), String> {
        let class = format!("1:{}", PEER_CLASS_BASE + peer);
        let handle = format!("{}:", PEER_CLASS_BASE + peer);
        let ns = self.namespace_of(index);
        let args = [
            &["-n", &ns, "qdisc", "replace", "dev", "eth0"][..],
            &["parent", &class, "handle", &handle],
            queue,
        ]
        .concat();
        run("tc", &args)
    }

    fn set_rate(&self, index: usize, peer: usize, rate: &str) -> Result<(), String> {
        let class = format!("1:{}", PEER_CLASS_BASE + peer);
        let ns = self.namespace_of(index);
        run(
            "tc",
            &[
                "-n", &ns, "class", "change", "dev", "eth0", "parent", "1:", "classid", &class,
                "htb", "rate", rate, "ceil", rate,
            ],
        )
    }

    /// Starts `fault` on the link between `a` and `b`, both directions.
    pub fn start(&self, a: &str, b: &str, fault: Fault) -> Result<(), String> {
        let (a, b) = (self.index(a), self.index(b));
        assert_ne!(a, b);
        for (from, to) in [(a, b), (b, a)] {
            self.start_one_way(from, to, fault)?;
        }
        if fault == Fault::Reject {
            // Both ends' connections reset once both routes are gone, so no reconnect slips in.
            for (from, to) in [(a, b), (b, a)] {
                let peer = format!("{}.{}", self.subnet, 10 + to);
                run(
                    "ip",
                    &[
                        "netns",
                        "exec",
                        &self.namespace_of(from),
                        "ss",
                        "-K",
                        "dst",
                        &peer,
                    ],
                )?;
            }
        }
        Ok(())
    }

    fn start_one_way(&self, from: usize, to: usize, fault: Fault) -> Result<(), String> {
        let ns = self.namespace_of(from);
        let peer = format!("{}.{}/32", self.subnet, 10 + to);
        match fault {
            Fault::Drop => self.set_queue(from, to, &["bfifo", "limit", "0"]),
            Fault::Reject => ip(&["-n", &ns, "route", "add", "unreachable", &peer]),
            Fault::Slow { kbit } => {
                self.set_rate(from, to, &format!("{kbit}kbit"))?;
                self.set_queue(from, to, &["bfifo", "limit", &SLOW_QUEUE_BYTES.to_string()])
            }
            Fault::Loss { bits } => {
                let mask = format!("{:#06x}", (1u32 << bits) - 1);
                let prio = (100 + to).to_string();
                // The TCP checksum: 16 bytes into a TCP header after a 20-byte IP header.
                run(
                    "tc",
                    &[
                        "-n", &ns, "filter", "add", "dev", "eth0", "parent", "1:", "protocol",
                        "ip", "prio", &prio, "u32", "match", "ip", "dst", &peer, "match", "ip",
                        "protocol", "6", "0xff", "match", "u16", "0", &mask, "at", "36", "flowid",
                        DROP_CLASS,
                    ],
                )
            }
        }
    }

    /// Ends every fault on the link between `a` and `b`.
    pub fn heal(&self, a: &str, b: &str) -> Result<(), String> {
        let (a, b) = (self.index(a), self.index(b));
        for (from, to) in [(a, b), (b, a)] {
            self.heal_one_way(from, to)?;
        }
        Ok(())
    }

    fn heal_one_way(&self, from: usize, to: usize) -> Result<(), String> {
        let ns = self.namespace_of(from);
        let peer = format!("{}.{}/32", self.subnet, 10 + to);
        let prio = (100 + to).to_string();
        // Each of these may have nothing to remove.
        let _ = ip(&["-n", &ns, "route", "del", "unreachable", &peer]);
        let _ = run(
            "tc",
            &[
                "-n", &ns, "filter", "del", "dev", "eth0", "parent", "1:", "prio", &prio,
            ],
        );
        self.set_rate(from, to, LINE_RATE)?;
        self.set_queue(
            from,
            to,
            &["bfifo", "limit", &HEALTHY_QUEUE_BYTES.to_string()],
        )
    }

    /// Sets `node`'s link to the bridge down: it reaches nobody, silently.
    pub fn isolate(&self, node: &str) -> Result<(), String> {
        ip(&["link", "set", &self.veth(self.index(node)), "down"])
    }

    /// Sets `node`'s link to the bridge up again.
    pub fn rejoin(&self, node: &str) -> Result<(), String> {
        ip(&["link", "set", &self.veth(self.index(node)), "up"])
    }

    /// Ends every fault: every link up and unimpaired.
    pub fn heal_all(&self) -> Result<(), String> {
        for a in 0..self.nodes.len() {
            ip(&["link", "set", &self.veth(a), "up"])?;
            for b in (0..self.nodes.len()).filter(|&b| b != a) {
                self.heal_one_way(a, b)?;
            }
        }
        Ok(())
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for index in 0..self.nodes.len() {
            let _ = ip(&["netns", "del", &self.namespace_of(index)]);
            let _ = ip(&["link", "del", &self.veth(index)]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }
}

/// Runs `program ARGS…`; its failure as a message naming the command and what it said.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program} {}: {e}", args.join(" ")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{program} {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args)
}

fn output_of(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program} {}: {e}", args.join(" ")))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A `10.X.Y` no address or route of the root namespace is in.
fn free_subnet(pid: u32, run: u32) -> Result<String, String> {
    let routes = output_of("ip", &["-4", "route", "show", "table", "all"])?;
    let addresses = output_of("ip", &["-4", "addr"])?;
    let x = 100 + pid % 100;
    for step in 0..256 {
        let subnet = format!("10.{x}.{}", (pid / 100 + run + step) % 256);
        let taken = |text: &str| text.contains(&format!("{subnet}."));
        if !taken(&routes) && !taken(&addresses) {
            return Ok(subnet);
        }
    }
    Err(format!("no free 10.{x}.Y.0/24 subnet"))
}

/// The pid a name of ours carries, if it is one of ours.
fn creator_of(name: &str) -> Option<u32> {
    let digits: String = name
        .strip_prefix(PREFIX)?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Removes the namespaces and links of runs whose process is gone.
fn remove_stale() {
    let dead = |name: &str| {
        creator_of(name).is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
    };
    let namespaces = output_of("ip", &["netns", "list"]).unwrap_or_default();
    for name in namespaces
        .lines()
        .filter_map(|l| l.split_whitespace().next())
    {
        if dead(name) {
            let _ = ip(&["netns", "del", name]);
        }
    }
    let links = output_of("ip", &["-o", "link"]).unwrap_or_default();
    for line in links.lines() {
        // `7: tbn123b0: <…` or `8: tbn123v01@if2: <…`
        let name = line.split(':').nth(1).unwrap_or("").trim();
        let name = name.split('@').next().unwrap_or("");
        if dead(name) {
            let _ = ip(&["link", "del", name]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_creating_pid() {
        assert_eq!(creator_of("tbn4194304v121"), Some(4_194_304));
        assert_eq!(creator_of("tbn77-0-hub"), Some(77));
        assert_eq!(creator_of("eth0"), None);
        assert_eq!(creator_of("tbnx"), None);
    }

    #[test]
    fn a_slow_link_delays_by_its_queue() {
        assert_eq!(
            Fault::Slow { kbit: 1000 }.queue_delay_max(),
            Duration::from_millis(120)
        );
        assert_eq!(Fault::Drop.queue_delay_max(), Duration::ZERO);
    }
}
