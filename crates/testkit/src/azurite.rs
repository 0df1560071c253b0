//! Azurite's blob service for tests: in memory, on a free loopback port, killed when dropped.
//!
//! Azurite comes from `<repo>/.interop/node_modules` (`scripts/setup-js-interop`); a missing
//! Azurite FAILS the test with a message naming that script, it never skips it.

use std::net::TcpListener;
use std::time::{Duration, Instant};

/// The well-known development account every Azurite serves.
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";

/// The well-known key of [`AZURITE_ACCOUNT`] (public: Azurite's documentation prints it).
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Azurite's blob service, in memory, on a free loopback port; killed when dropped.
#[derive(Debug)]
pub struct Azurite {
    child: tokio::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Azurite {
    /// Starts Azurite and waits until it listens.
    pub async fn start() -> Azurite {
        Azurite::start_logging(None).await
    }

    /// [`Azurite::start`], writing Azurite's debug log — one line per request, with its
    /// method, URL and headers — to `debug_log`: how a benchmark counts the requests of a
    /// client it cannot instrument.
    pub async fn start_with_debug_log(debug_log: &std::path::Path) -> Azurite {
        Azurite::start_logging(Some(debug_log)).await
    }

    async fn start_logging(debug_log: Option<&std::path::Path>) -> Azurite {
        let bin = crate::node_modules().join(".bin/azurite-blob");
        assert!(
            bin.exists(),
            "Azurite is not installed: run scripts/setup-js-interop (expected {})",
            bin.display()
        );
        // A free port: bound, read and released; Azurite binds it a moment later.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let mut command = tokio::process::Command::new(&bin);
        if let Some(log) = debug_log {
            command.arg("--debug").arg(log);
        }
        let child = command
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .args([
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--disableTelemetry",
                "--silent",
            ])
            // In memory, so no --location (Azurite refuses both); its working directory is a
            // temporary one for whatever else it writes.
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("Azurite ({}) did not start: {e}", bin.display()));
        let mut azurite = Azurite {
            child,
            port,
            _dir: dir,
        };
        azurite.wait_listening().await;
        azurite
    }

    async fn wait_listening(&mut self) {
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("Azurite exited at start: {status}");
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("Azurite is not listening on {} after 30 s", self.port);
    }

    /// The blob endpoint, path-style: `http://127.0.0.1:{port}/devstoreaccount1`.
    pub fn blob_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{AZURITE_ACCOUNT}", self.port)
    }

    /// The connection string the SDKs take.
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};BlobEndpoint={};",
            self.blob_endpoint()
        )
    }

    /// Kills Azurite and waits for it to exit.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
