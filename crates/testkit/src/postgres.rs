//! A private PostgreSQL server for tests: its own data directory in a temporary directory, on a
//! free loopback port, reached by URL; many databases on one server.
//!
//! [`PostgresServer::shared`] starts one server per test binary, on first use; each test takes
//! its own database from it with [`PostgresServer::create_database`], so tests never see each
//! other's tables. The server runs under a small shell supervisor that holds a pipe from the
//! test process: when the test process ends — normally, by a panic or by `kill -9` — the pipe
//! closes, and the supervisor stops the server (fast shutdown) and removes its directory. A
//! [`PostgresServer::start`]ed server also stops when dropped.
//!
//! `initdb` refuses to run as root, so as root the server's processes run as the `postgres`
//! system user (through `runuser`) and the directory is handed to that user. The server trusts
//! every local connection (no password): it is for tests only, and listens on 127.0.0.1.
//!
//! A missing PostgreSQL is an error naming `scripts/setup-postgres`, which installs it: tests
//! fail on it, they never skip.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long the server may take to accept connections after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The superuser `initdb` creates, and whom the URLs name.
const SUPERUSER: &str = "postgres";

/// Runs the server's processes and stops it when its stdin closes, then removes the directory.
/// Arguments: the `postgres` binary, the directory, the port.
const SUPERVISOR: &str = r#"
"$1" -D "$2/data" -p "$3" -k "$2" -c listen_addresses=127.0.0.1 \
    -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 \
    >"$2/server.log" 2>&1 &
pid=$!
cat >/dev/null
kill -INT "$pid" 2>/dev/null
wait "$pid"
rm -rf "$2"
"#;

/// A running PostgreSQL server of this test process.
#[derive(Debug)]
pub struct PostgresServer {
    directory: PathBuf,
    port: u16,
    bin: PathBuf,
    run_as: Option<String>,
    supervisor: Child,
    /// Closing it stops the server.
    stop: Option<ChildStdin>,
    databases: AtomicU32,
}

impl PostgresServer {
    /// The server this test binary shares, started on first use; panics (failing the test)
    /// with what to run when PostgreSQL is missing or does not start.
    pub fn shared() -> &'static PostgresServer {
        static SHARED: OnceLock<Result<PostgresServer, String>> = OnceLock::new();
        match SHARED.get_or_init(PostgresServer::start) {
            Ok(server) => server,
            Err(error) => panic!("{error}"),
        }
    }

    /// Starts a new server on a free loopback port.
    pub fn start() -> Result<PostgresServer, String> {
        let bin = find_bin()?;
        let run_as = if running_as_root() {
            Some(SUPERUSER.to_owned())
        } else {
            None
        };
        let directory = tempfile::Builder::new()
            .prefix("tributary-postgres-")
            .tempdir()
            .map_err(|e| format!("cannot create a directory for PostgreSQL: {e}"))?
            .keep();
        if let Some(user) = &run_as {
            Command::new("chown")
                .arg(format!("{user}:"))
                .arg(&directory)
                .output_checked()?;
        }
        let initdb = command(run_as.as_deref(), &bin.join("initdb"))
            .arg("-D")
            .arg(directory.join("data"))
            .args(["-U", SUPERUSER, "--auth=trust", "--no-sync", "-E", "UTF8"])
            .args(["--locale=C"])
            .output_checked();
        if let Err(error) = initdb {
            let _ = std::fs::remove_dir_all(&directory);
            return Err(error);
        }
        let port = free_port()?;
        let mut supervisor = command(run_as.as_deref(), Path::new("sh"))
            .args(["-c", SUPERVISOR, "sh"])
            .arg(bin.join("postgres"))
            .arg(&directory)
            .arg(port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start PostgreSQL's supervisor: {e}"))?;
        let stop = supervisor.stdin.take();
        let server = PostgresServer {
            directory,
            port,
            bin,
            run_as,
            supervisor,
            stop,
            databases: AtomicU32::new(0),
        };
        server.wait_until_ready()?;
        Ok(server)
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of `database` on this server.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a new, empty database with a name unique on this server; returns its URL.
    pub fn create_database(&self, purpose: &str) -> String {
        let number = self.databases.fetch_add(1, Ordering::Relaxed);
        let clean: String = purpose
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        let name = format!("test_{number}_{clean}");
        self.sql("postgres", &format!("CREATE DATABASE \"{name}\""))
            .unwrap_or_else(|error| panic!("{error}"));
        self.url(&name)
    }

    /// Runs `sql` in `database` with `psql`; returns what it printed (unaligned, tuples only).
    pub fn sql(&self, database: &str, sql: &str) -> Result<String, String> {
        let output = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-U", SUPERUSER, "-d", database])
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-c")
            .arg(sql)
            .output_checked()?;
        Ok(output)
    }

    fn wait_until_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match self.sql("postgres", "SELECT 1") {
                Ok(_) => return Ok(()),
                Err(error) if Instant::now() >= deadline => {
                    let log = std::fs::read_to_string(self.directory.join("server.log"))
                        .unwrap_or_default();
                    return Err(format!(
                        "PostgreSQL did not accept connections within {START_TIMEOUT:?}: \
                         {error}\nserver log:\n{log}"
                    ));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Who runs the server's processes (`None`: this process's user).
    pub fn runs_as(&self) -> Option<&str> {
        self.run_as.as_deref()
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        drop(self.stop.take()); // The supervisor stops the server and removes the directory.
        let _ = self.supervisor.wait();
    }
}

/// The newest installed PostgreSQL's binaries (Debian's layout first, then the `PATH`).
fn find_bin() -> Result<PathBuf, String> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return Ok(bin);
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|dir| dir.join("initdb").exists() && dir.join("postgres").exists());
    on_path.ok_or_else(|| {
        "PostgreSQL is not installed (no initdb in /usr/lib/postgresql/*/bin or on the PATH): \
         run scripts/setup-postgres"
            .to_owned()
    })
}

/// Whether this process runs as root (the owner of `/proc/self` is the effective user).
fn running_as_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `program` as `user` (through `runuser`) when given, else as this process's user.
fn command(user: Option<&str>, program: &Path) -> Command {
    match user {
        Some(user) => {
            let mut command = Command::new("runuser");
            command.args(["-u", user, "--"]).arg(program);
            command
        }
        None => Command::new(program),
    }
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("cannot find a free port: {e}"))?;
    listener
        .local_addr()
        .map(|address| address.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

/// Running a command to its end, its failure told with what it printed.
trait OutputChecked {
    fn output_checked(&mut self) -> Result<String, String>;
}

impl OutputChecked for Command {
    fn output_checked(&mut self) -> Result<String, String> {
        let shown = format!("{self:?}");
        let output = self
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {shown}: {e} (run scripts/setup-postgres)"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            let mut said = String::from_utf8_lossy(&output.stderr).into_owned();
            said.push_str(&String::from_utf8_lossy(&output.stdout));
            Err(format!("{shown} failed ({}): {said}", output.status))
        }
    }
}
