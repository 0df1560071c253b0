//! The demo's processor instances: child processes running this same binary
//! (`tributary demo-worker`), each one event processor host of the shared consumer group.
//!
//! No orphans: each child is in its own process group (so the terminal's Ctrl-C reaches only
//! the demo, which then stops them in order), is killed if its handle is dropped, and exits by
//! itself when its standard input — a pipe from the demo — closes, which also happens when the
//! demo dies without cleaning up.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::process::{Child, ChildStdin, Command};

/// How an instance is started.
pub struct Launch {
    /// The embedded hub's connection string.
    pub connection_string: String,
    /// The hub.
    pub hub: String,
    /// The shared checkpoint store (SQLite).
    pub store: PathBuf,
    /// The shared aggregates database.
    pub aggregates: PathBuf,
    /// The children's `--log` filter.
    pub log: String,
}

/// One instance.
pub struct Instance {
    /// Its host name in the consumer group.
    pub name: String,
    /// Its process id.
    pub pid: u32,
    /// Whether it still runs (false once killed or stopped).
    pub alive: bool,
    child: Child,
    stdin: Option<ChildStdin>,
}

/// Every instance the demo started.
pub struct Fleet {
    launch: Launch,
    /// In start order.
    pub instances: Vec<Instance>,
}

/// Linux reports process CPU time in units of USER_HZ, which is 100 on every architecture the
/// kernel exports to user space (`sysconf(_SC_CLK_TCK)`).
const TICKS_PER_SECOND: f64 = 100.0;

impl Fleet {
    /// No instances yet.
    pub fn new(launch: Launch) -> Fleet {
        Fleet {
            launch,
            instances: Vec::new(),
        }
    }

    /// Starts one more instance, `instance-<n>`; returns its name.
    pub fn spawn(&mut self) -> Result<String> {
        let name = format!("instance-{}", self.instances.len() + 1);
        let exe = std::env::current_exe().context("cannot find this program's path")?;
        let launch = &self.launch;
        let mut child = Command::new(exe)
            .arg("--log")
            .arg(&launch.log)
            .arg("demo-worker")
            .arg("--hub")
            .arg(&launch.hub)
            .arg("--store")
            .arg(&launch.store)
            .arg("--aggregates")
            .arg(&launch.aggregates)
            .arg("--host-name")
            .arg(&name)
            .env("TRIBUTARY_CONNECTION_STRING", &launch.connection_string)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        let pid = child.id().context("the instance exited at once")?;
        let stdin = child.stdin.take();
        self.instances.push(Instance {
            name: name.clone(),
            pid,
            alive: true,
            child,
            stdin,
        });
        Ok(name)
    }

    /// Kills an instance with SIGKILL: no shutdown, no final checkpoint, no relinquishing.
    pub async fn kill(&mut self, name: &str) -> Result<u32> {
        let instance = self
            .instances
            .iter_mut()
            .find(|i| i.name == name && i.alive)
            .with_context(|| format!("no running instance {name}"))?;
        instance.child.kill().await?;
        instance.alive = false;
        Ok(instance.pid)
    }

    /// Stops every running instance gracefully (closes its input; it relinquishes its
    /// partitions), killing any that has not exited after 10 s.
    pub async fn stop_all(&mut self) {
        for instance in &mut self.instances {
            instance.stdin = None;
        }
        for instance in self.instances.iter_mut().filter(|i| i.alive) {
            let waited = tokio::time::timeout(Duration::from_secs(10), instance.child.wait()).await;
            if waited.is_err() {
                eprintln!("{} did not stop within 10 s; killing it", instance.name);
                let _ = instance.child.kill().await;
            }
            instance.alive = false;
        }
    }

    /// The CPU time the running instances have used so far, in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        self.instances
            .iter()
            .filter(|i| i.alive)
            .filter_map(|i| process_cpu_ticks(i.pid))
            .map(|ticks| ticks as f64 / TICKS_PER_SECOND)
            .sum()
    }
}

/// User plus system CPU time of a process (all its threads), from `/proc/<pid>/stat`.
fn process_cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after it follow its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; `rest` starts at field 3.
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(user + system)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_busy_process_cpu_time_grows() {
        let before = super::process_cpu_ticks(std::process::id()).unwrap();
        let spin = std::time::Instant::now();
        let mut after = before;
        // A tick is 10 ms of CPU; on a loaded machine that takes longer than 10 ms of wall time.
        while after == before && spin.elapsed() < std::time::Duration::from_secs(20) {
            after = super::process_cpu_ticks(std::process::id()).unwrap();
        }
        assert!(after > before, "{before} → {after}");
    }
}
