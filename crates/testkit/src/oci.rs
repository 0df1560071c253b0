//! The HTTP front door under test: a broker on a temporary directory with the server on
//! 127.0.0.1:0 (HTTPS with a development certificate when asked), an RSA key pair registered
//! with it, the runner of the `oci` SDK scripts (`tests/oci/`), and a minimal HTTP/1.1 client
//! for raw requests.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rsa::RsaPrivateKey;
use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tributary_broker::{Broker, BrokerConfig, Durability};
use tributary_event::Clock;
use tributary_http::{AuthConfig, HttpConfig, RateLimits, RunningHttpServer};

/// The keyId the Python helpers sign with (`tributary_oci.KEY_ID`).
pub const KEY_ID: &str = "ocid1.tenancy.oc1..aaaatributarytest/ocid1.user.oc1..aaaatributarytest/11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff:00";

/// A generated key pair in PEM (PKCS#8 private, SPKI public).
#[derive(Debug)]
pub struct KeyPair {
    /// The private key, for the client (`OCI_KEY_FILE`).
    pub private_pem: String,
    /// The public key, registered with the server.
    pub public_pem: String,
}

/// One key pair per test binary: generating RSA keys in a debug build takes seconds.
pub fn key_pair() -> &'static KeyPair {
    static KEYS: OnceLock<KeyPair> = OnceLock::new();
    KEYS.get_or_init(|| {
        let key = RsaPrivateKey::new(&mut rand::thread_rng(), 2048).expect("RSA key generation");
        KeyPair {
            private_pem: key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string(),
            public_pem: key
                .to_public_key()
                .to_public_key_pem(LineEnding::LF)
                .unwrap(),
        }
    })
}

/// How a test server is set up.
#[derive(Debug)]
pub struct Setup {
    /// Requests must be signed (with [`key_pair`]); false: development mode.
    pub signed: bool,
    /// The broker's clock (default: the system's).
    pub clock: Option<Arc<dyn Clock>>,
    /// Throttling.
    pub rate_limits: RateLimits,
    /// The log's event size limit (default: the log's).
    pub event_bytes_max: Option<u32>,
    /// How far a request's date may be from the server's clock.
    pub clock_skew_ms_max: i64,
    /// `None` unless a test is about syncs: fsync is slow on a busy CI disk.
    pub durability: Durability,
    /// Serve HTTPS with a development authority's certificate, made in `<dir>/tls`.
    pub tls: bool,
    /// Where AMQP over WebSockets connections go.
    pub websocket_amqp: Option<tributary_http::AmqpOverWebSockets>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            signed: true,
            clock: None,
            rate_limits: RateLimits::default(),
            event_bytes_max: None,
            clock_skew_ms_max: 300_000,
            durability: Durability::None,
            tls: false,
            websocket_amqp: None,
        }
    }
}

/// A running broker and server on a temporary directory.
#[derive(Debug)]
pub struct Server {
    /// The data directory (and the client key, the TLS files).
    pub dir: tempfile::TempDir,
    /// The broker.
    pub broker: Broker,
    /// The HTTP front door.
    pub http: RunningHttpServer,
    /// Where clients reach it (`https://localhost:…` with TLS).
    pub url: String,
}

/// Opens a broker on `dir` as `setup` says.
pub async fn open_broker(dir: &Path, setup: &Setup) -> Broker {
    let mut config = BrokerConfig::new(dir);
    config.log.durability = setup.durability;
    if let Some(max) = setup.event_bytes_max {
        config.log.event_bytes_max = max;
    }
    match &setup.clock {
        Some(clock) => Broker::open_with_clock(config, clock.clone())
            .await
            .unwrap(),
        None => Broker::open(config).await.unwrap(),
    }
}

/// Starts the HTTP front door over `broker` as `setup` says (the client's public key
/// registered when signing is on).
pub async fn start_http(broker: &Broker, setup: &Setup) -> RunningHttpServer {
    let dir = broker.config().data_dir.clone();
    let auth = if setup.signed {
        let keys = serde_json::json!({ KEY_ID: key_pair().public_pem });
        tributary_http::write_key_file(&dir.join("oci-api-keys.json"), keys.to_string().as_bytes())
            .unwrap();
        AuthConfig::Signatures {
            keys_file: None,
            clock_skew_ms_max: setup.clock_skew_ms_max,
        }
    } else {
        AuthConfig::DevelopmentUnauthenticated
    };
    let mut config = HttpConfig::new("127.0.0.1:0".parse().unwrap(), auth);
    config.rate_limits = setup.rate_limits.clone();
    config.websocket_amqp = setup.websocket_amqp.clone();
    if setup.tls {
        let hosts = ["localhost".to_owned(), "127.0.0.1".to_owned()];
        let certs =
            tributary_tls::write_development_certificates(&dir.join("tls"), &hosts).unwrap();
        config.tls = Some(
            tributary_tls::ServerTls::from_pem_files(&certs.server_cert, &certs.server_key)
                .unwrap(),
        );
    }
    tributary_http::start(broker.clone(), config).await.unwrap()
}

/// A broker and its HTTP front door on a fresh temporary directory.
pub async fn start(setup: Setup) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let broker = open_broker(dir.path(), &setup).await;
    let http = start_http(&broker, &setup).await;
    let url = if setup.tls {
        format!("https://localhost:{}", http.local_addr().port())
    } else {
        format!("http://{}", http.local_addr())
    };
    if setup.signed {
        std::fs::write(dir.path().join("client-key.pem"), &key_pair().private_pem).unwrap();
    }
    Server {
        dir,
        broker,
        http,
        url,
    }
}

/// Runs `tests/oci/<script>` with the server's URL and the client key; panics with its output
/// unless it exits 0. Returns its standard output.
pub async fn run_oci_script(
    server: &Server,
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> String {
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oci");
    let mut command = tokio::process::Command::new(crate::sdk::python());
    command
        .arg(scripts.join(script))
        .args(args)
        .current_dir(&scripts)
        .env("TRIBUTARY_URL", &server.url)
        .env("OCI_KEY_FILE", server.dir.path().join("client-key.pem"))
        .env("WORK_DIR", server.dir.path())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .kill_on_drop(true);
    let authority = server.dir.path().join("tls/ca.pem");
    if authority.exists() {
        // What the SDK's HTTP session (requests) trusts: our development authority.
        command.env("REQUESTS_CA_BUNDLE", authority);
    }
    for (k, v) in env {
        command.env(k, v);
    }
    let output = tokio::time::timeout(std::time::Duration::from_secs(300), command.output())
        .await
        .expect("the Python script finishes within 5 minutes")
        .expect("the Python interpreter starts (run scripts/setup-oci-interop)");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    println!("--- {script} {args:?} stdout:\n{stdout}--- stderr:\n{stderr}");
    assert!(
        output.status.success(),
        "{script} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    stdout
}

/// A value printed by a script as `NAME=value`.
pub fn printed(stdout: &str, name: &str) -> String {
    let prefix = format!("{name}=");
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("the script printed no {name}"))
        .to_owned()
}

/// A raw HTTP answer.
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The headers, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Answer {
    /// A header's value (names compare case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (panics when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts an OCI error answer.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{}", self.text());
        assert_eq!(self.json()["code"], code, "{}", self.text());
        assert!(
            self.json()["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        assert!(self.header("opc-request-id").is_some());
    }
}

/// Sends one HTTP/1.1 request on a fresh connection (`Connection: close`) and reads the answer.
pub async fn request(
    server: &Server,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(server.http.local_addr())
        .await
        .unwrap();
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\ncontent-length: {}\r\n",
        server.http.local_addr(),
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let _ = stream.write_all(body).await;
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> Answer {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete header");
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Answer {
        status,
        headers,
        body,
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..line_end]).unwrap().trim(), 16)
            .unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[line_end + 2..line_end + 2 + size]);
        raw = &raw[line_end + 2 + size + 2..];
    }
}
