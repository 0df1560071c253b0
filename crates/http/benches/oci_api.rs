//! Benchmarks of the HTTP front door over loopback: a broker with `fsync` durability and the
//! server in one runtime, a lean keep-alive HTTP/1.1 client (hyper's connection API) in another,
//! and real OCI request signatures (RSA-SHA256, a generated key registered in the key file)
//! unless a line says `auth=unsigned` (development mode: nothing signed or checked).
//!
//! The client signs with `ring` (RSA-2048, PKCS#1 v1.5, SHA-256), about as fast as the OpenSSL
//! the official SDKs sign with; `TRIBUTARY_BENCH_SIGNER=rsa` signs with the `rsa` crate (the
//! one the server verifies with), about three times slower. Both costs are printed alone first.
//!
//! Scenarios, each figure printed on one line with its conditions:
//! 1. GetMessages latency: one partition pre-filled with 10,000 × 1 KiB messages; GetMessages
//!    with `limit=10000` from the same partition cursor (the start), repeated. An answer carries
//!    at most 1 MiB of keys and values (`GET_RESPONSE_BYTES_MAX`, OCI's limit), so 1,024 of
//!    them; the cursor chain that reads all 10,000 is timed too.
//! 2. PutMessages throughput: 100-byte values, null keys (spread round-robin over the stream's
//!    partitions), several connections each sending back to back.
//! 3. Group rebalance: three instances of one group on a 10-partition stream; one stops, and the
//!    two others keep getting until their gets return the stopped one's partitions.
//!
//! Client and server share this machine's cores, so each line also gives the CPU time the
//! server's threads (and, apart, the client's) spent per request or message: unlike rates, that
//! holds up when other work runs on the machine.
//!
//! Run with `cargo bench -p tributary-http --bench oci_api`. Data goes to a temporary directory
//! under `$TRIBUTARY_BENCH_DIR` (default `/work/bench-data` when it exists, else the system
//! temporary directory; a tmpfs there would make fsync free). Other knobs:
//! `TRIBUTARY_BENCH_WARM_GIB` (default 4) how much memory is touched first;
//! `TRIBUTARY_BENCH_SECONDS` (default 5) how long each PutMessages run lasts;
//! `TRIBUTARY_BENCH_PUT` which PutMessages runs (see [`put_runs`]); `TRIBUTARY_BENCH_ONLY` which
//! modes and scenarios (see [`selected`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{HeaderMap, Method, Request};
use hyper_util::rt::TokioIo;
use rsa::RsaPrivateKey;
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use rsa::signature::{SignatureEncoding, Signer};
use sha2::{Digest, Sha256};
use tokio::runtime::Runtime;
use tributary_broker::{Broker, BrokerConfig, Durability, HubSpec, SendTarget};
use tributary_event::EventData;
use tributary_http::{AuthConfig, HttpConfig, RunningHttpServer};

/// The allocator `tributary` ships with, so the server's figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const KEY_ID: &str = "ocid1.tenancy.oc1..aaaabench/ocid1.user.oc1..aaaabench/12:34:56:78:9a:bc:de:f0:12:34:56:78:9a:bc:de:f0";

/// Messages pre-filled for the GetMessages scenario, and their size.
const GET_PREFILL_MESSAGES: usize = 10_000;
const GET_MESSAGE_BYTES: usize = 1024;
/// GetMessages requests timed per run (each from the start of the partition).
const GET_REPEATS: usize = 200;
const PUT_MESSAGE_BYTES: usize = 100;
const REBALANCE_PARTITIONS: u32 = 10;
const REBALANCE_TIMEOUT_MS: u64 = 1_000;
const REBALANCE_POLL_MS: u64 = 100;

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this without it: then a
    // short smoke run keeps the code exercised, and its figures are not measurements.
    let measuring = std::env::args().any(|a| a == "--bench");
    if !measuring {
        println!("# smoke run (cargo test): the figures below are not measurements");
    }
    let warm_gib = if measuring {
        env_u64("TRIBUTARY_BENCH_WARM_GIB", 4)
    } else {
        0
    };
    warm_memory(warm_gib);
    let seconds = if measuring {
        env_u64("TRIBUTARY_BENCH_SECONDS", 5)
    } else {
        1
    };
    let root = bench_root();
    println!("# data under {}; durability=fsync", root.display());
    let key = generate_key();
    signature_costs(&key);
    let signer = Arc::new(RequestSigner::new(&key));
    println!("# requests are signed with {}", signer.name());
    for signed in [true, false] {
        let auth = if signed { "signed" } else { "unsigned" };
        if !selected(auth) {
            continue;
        }
        println!("# --- auth={auth} ---");
        let signer = signed.then(|| signer.clone());
        run_suite(&root, &key, signer, Duration::from_secs(seconds));
    }
}

/// Whether `TRIBUTARY_BENCH_ONLY` (a comma-separated list of `signed`, `unsigned`, `get`, `put`,
/// `rebalance`; default all) selects `what`: an auth mode or scenario is run unless the list
/// names others of its kind but not it.
fn selected(what: &str) -> bool {
    let Ok(only) = std::env::var("TRIBUTARY_BENCH_ONLY") else {
        return true;
    };
    let names: Vec<&str> = only.split(',').map(str::trim).collect();
    let kind: &[&str] = if matches!(what, "signed" | "unsigned") {
        &["signed", "unsigned"]
    } else {
        &["get", "put", "rebalance"]
    };
    names.contains(&what) || !names.iter().any(|n| kind.contains(n))
}

/// One PutMessages run.
#[derive(Debug, Clone, Copy)]
struct PutRun {
    batch: usize,
    conns: usize,
    partitions: u32,
}

/// The PutMessages runs: `TRIBUTARY_BENCH_PUT`, a comma-separated list of
/// `BATCHxCONNECTIONS[pPARTITIONS]` (4 partitions when not given), by default
/// `100x8,100x32,1000x8,1000x2,100x8p1`.
fn put_runs() -> Vec<PutRun> {
    let spec = std::env::var("TRIBUTARY_BENCH_PUT")
        .unwrap_or_else(|_| "100x8,100x32,1000x8,1000x2,100x8p1".into());
    spec.split(',')
        .map(|run| {
            let (batch, rest) = run
                .trim()
                .split_once('x')
                .expect("BATCHxCONNS[pPARTITIONS]");
            let (conns, partitions) = rest.split_once('p').unwrap_or((rest, "4"));
            let run = PutRun {
                batch: batch.parse().expect("a batch size"),
                conns: conns.parse().expect("a connection count"),
                partitions: partitions.parse().expect("a partition count"),
            };
            assert!(
                run.batch > 0 && run.conns > 0 && run.partitions > 0,
                "{run:?}"
            );
            run
        })
        .collect()
}

/// What one request signature costs the client (RSA-2048 PKCS#1 v1.5 signing) and the server
/// (verifying), measured alone.
fn signature_costs(key: &RsaPrivateKey) {
    use rsa::signature::Verifier;
    let signing = SigningKey::<Sha256>::new(key.clone());
    let verifying = rsa::pkcs1v15::VerifyingKey::<Sha256>::new(key.to_public_key());
    let text = "date: Thu, 01 Jan 2026 00:00:00 GMT\n(request-target): get /20180418/streams/s/messages?cursor=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA&limit=10000\nhost: 127.0.0.1:12345";
    let rounds = 100u32;
    let started = Instant::now();
    let mut signature = signing.sign(text.as_bytes());
    for _ in 1..rounds {
        signature = signing.sign(std::hint::black_box(text).as_bytes());
    }
    let sign = started.elapsed() / rounds;
    let started = Instant::now();
    for _ in 0..rounds {
        verifying
            .verify(std::hint::black_box(text).as_bytes(), &signature)
            .expect("verifies");
    }
    let verify = started.elapsed() / rounds;
    // What the server uses: ring's verification with the key's modulus and exponent.
    let public = {
        use rsa::traits::PublicKeyParts;
        let public = key.to_public_key();
        (public.n().to_bytes_be(), public.e().to_bytes_be())
    };
    let signature_bytes = rsa::signature::SignatureEncoding::to_vec(&signature);
    let started = Instant::now();
    for _ in 0..rounds {
        let components = ring::signature::RsaPublicKeyComponents {
            n: &public.0,
            e: &public.1,
        };
        components
            .verify(
                &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                std::hint::black_box(text).as_bytes(),
                &signature_bytes,
            )
            .expect("verifies");
    }
    let ring_verify = started.elapsed() / rounds;
    let ring = RequestSigner::ring(key);
    let started = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(ring.sign(std::hint::black_box(text).as_bytes()));
    }
    let ring_sign = started.elapsed() / rounds;
    println!(
        "signature_cost rsa=2048 pkcs1v15-sha256 one thread: client sign {:.3} ms (ring) or {:.3} ms (rsa crate); verify {:.3} ms (ring, as the server does) or {:.3} ms (rsa crate) per request",
        ms(ring_sign),
        ms(sign),
        ms(ring_verify),
        ms(verify)
    );
}

/// How the client signs: `ring` by default, the `rsa` crate with `TRIBUTARY_BENCH_SIGNER=rsa`.
enum RequestSigner {
    Ring(Box<ring::signature::RsaKeyPair>),
    Rsa(Box<SigningKey<Sha256>>),
}

impl RequestSigner {
    fn new(key: &RsaPrivateKey) -> Self {
        match std::env::var("TRIBUTARY_BENCH_SIGNER").as_deref() {
            Ok("rsa") => RequestSigner::Rsa(Box::new(SigningKey::new(key.clone()))),
            _ => RequestSigner::ring(key),
        }
    }

    fn ring(key: &RsaPrivateKey) -> Self {
        let der = key.to_pkcs8_der().expect("PKCS#8");
        let pair = ring::signature::RsaKeyPair::from_pkcs8(der.as_bytes()).expect("ring key");
        RequestSigner::Ring(Box::new(pair))
    }

    fn name(&self) -> &'static str {
        match self {
            RequestSigner::Ring(_) => "ring",
            RequestSigner::Rsa(_) => "the rsa crate",
        }
    }

    /// RSASSA-PKCS1-v1_5 with SHA-256 over `text`.
    fn sign(&self, text: &[u8]) -> Vec<u8> {
        match self {
            RequestSigner::Ring(pair) => {
                let mut signature = vec![0; pair.public().modulus_len()];
                pair.sign(
                    &ring::signature::RSA_PKCS1_SHA256,
                    &ring::rand::SystemRandom::new(),
                    text,
                    &mut signature,
                )
                .expect("ring signs");
                signature
            }
            RequestSigner::Rsa(key) => key.sign(text).to_vec(),
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn bench_root() -> PathBuf {
    if let Ok(dir) = std::env::var("TRIBUTARY_BENCH_DIR") {
        return PathBuf::from(dir);
    }
    let work = PathBuf::from("/work/bench-data");
    if work.is_dir() {
        work
    } else {
        std::env::temp_dir()
    }
}

/// Touches `gib` GiB at once, then frees it: on this VM the host backs a page lazily on first
/// touch, which a long-running server has long paid; without this the first runs pay it.
fn warm_memory(gib: u64) {
    let started = Instant::now();
    let blocks: Vec<Vec<u8>> = (0..gib).map(|_| vec![1u8; 1 << 30]).collect();
    std::hint::black_box(&blocks);
    drop(blocks);
    println!(
        "# warmed {gib} GiB of memory (allocated and touched once, then freed) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

fn generate_key() -> RsaPrivateKey {
    let started = Instant::now();
    let key = RsaPrivateKey::new(&mut rand::thread_rng(), 2048).expect("RSA key generation");
    println!(
        "# generated a 2048-bit RSA key in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    key
}

/// A broker and server on a fresh directory, and the runtimes they and the clients run on.
struct Bench {
    _dir: tempfile::TempDir,
    server_rt: Runtime,
    client_rt: Runtime,
    broker: Broker,
    http: Option<RunningHttpServer>,
    target: Target,
}

fn run_suite(
    root: &std::path::Path,
    key: &RsaPrivateKey,
    signer: Option<Arc<RequestSigner>>,
    put_run: Duration,
) {
    let bench = Bench::start(root, key, signer);
    let auth = bench.target.auth_label();
    if selected("get") {
        bench.get_scenario(auth);
    }
    if selected("put") {
        for run in put_runs() {
            bench.put_scenario(auth, run, put_run);
        }
    }
    if selected("rebalance") {
        bench.rebalance_scenario(auth);
    }
    bench.stop();
}

impl Bench {
    fn start(
        root: &std::path::Path,
        key: &RsaPrivateKey,
        signer: Option<Arc<RequestSigner>>,
    ) -> Bench {
        let dir = tempfile::Builder::new()
            .prefix("tributary-httpbench-")
            .tempdir_in(root)
            .expect("a temporary directory");
        let server_rt = runtime("server");
        let client_rt = runtime("client");
        let signed = signer.is_some();
        if signed {
            let pem = key
                .to_public_key()
                .to_public_key_pem(LineEnding::LF)
                .expect("PEM");
            let keys = serde_json::json!({ KEY_ID: pem });
            let path = dir.path().join("oci-api-keys.json");
            tributary_http::write_key_file(&path, keys.to_string().as_bytes())
                .expect("write the key file");
        }
        let (broker, http) = server_rt.block_on(async {
            let mut config = BrokerConfig::new(dir.path());
            config.log.durability = Durability::Fsync;
            let broker = Broker::open(config).await.expect("broker opens");
            let auth = if signed {
                AuthConfig::signatures()
            } else {
                AuthConfig::DevelopmentUnauthenticated
            };
            let config = HttpConfig::new("127.0.0.1:0".parse().expect("address"), auth);
            let http = tributary_http::start(broker.clone(), config)
                .await
                .expect("server starts");
            (broker, http)
        });
        let target = Target {
            addr: http.local_addr(),
            signer,
        };
        Bench {
            _dir: dir,
            server_rt,
            client_rt,
            broker,
            http: Some(http),
            target,
        }
    }

    fn create_hub(&self, name: &str, partitions: u32) {
        self.server_rt.block_on(async {
            self.broker
                .create_hub(HubSpec::new(name, partitions))
                .await
                .expect("hub created");
        });
    }

    /// Appends `count` messages of `bytes` to one partition, straight through the broker.
    fn prefill(&self, hub: &str, partition: u32, count: usize, bytes: usize) {
        self.server_rt.block_on(async {
            let mut left = count;
            while left > 0 {
                let n = left.min(500);
                let events = (0..n)
                    .map(|i| EventData::new(payload(bytes, (count - left + i) as u64)))
                    .collect();
                let target = SendTarget::Partition(partition.to_string());
                self.broker
                    .send(hub, target, events)
                    .await
                    .expect("prefill");
                left -= n;
            }
        });
    }

    fn stop(mut self) {
        if let Some(http) = self.http.take() {
            self.server_rt.block_on(async {
                http.shutdown().await.expect("server stops");
                self.broker.shutdown().await.expect("broker stops");
            });
        }
        self.client_rt.shutdown_background();
        self.server_rt.shutdown_background();
    }
}

fn runtime(name: &str) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .thread_name(format!("bench-{name}"))
        .enable_all()
        .build()
        .expect("a runtime")
}

/// `bytes` bytes, different per `seed`.
fn payload(bytes: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The client.

/// Where the server is and how to sign for it.
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    signer: Option<Arc<RequestSigner>>,
}

impl Target {
    fn auth_label(&self) -> &'static str {
        if self.signer.is_some() {
            "signed"
        } else {
            "unsigned"
        }
    }
}

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    send: SendRequest<Full<Bytes>>,
    target: Target,
    host: String,
}

/// An answer, read whole.
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "answer {} is not JSON ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn expect_ok(self, what: &str) -> Answer {
        assert_eq!(
            self.status,
            200,
            "{what}: {}",
            String::from_utf8_lossy(&self.body)
        );
        self
    }

    fn next_cursor(&self) -> String {
        self.headers
            .get("opc-next-cursor")
            .and_then(|v| v.to_str().ok())
            .expect("opc-next-cursor")
            .to_owned()
    }
}

impl Conn {
    async fn open(target: &Target) -> Conn {
        let stream = tokio::net::TcpStream::connect(target.addr)
            .await
            .expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("HTTP handshake");
        tokio::spawn(connection);
        Conn {
            send,
            target: target.clone(),
            host: target.addr.to_string(),
        }
    }

    /// Sends a request and reads the whole answer. `sign_body`: the signature covers the body
    /// headers (every body request but PutMessages, as the OCI SDKs sign).
    async fn request(
        &mut self,
        method: Method,
        path_and_query: &str,
        body: Bytes,
        sign_body: bool,
    ) -> Answer {
        let request = self.build(method, path_and_query, body, sign_body);
        self.send.ready().await.expect("connection ready");
        let response = self.send.send_request(request).await.expect("an answer");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("the answer's body").to_bytes();
        Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        }
    }

    fn build(
        &self,
        method: Method,
        path_and_query: &str,
        body: Bytes,
        sign_body: bool,
    ) -> Request<Full<Bytes>> {
        let date = httpdate::fmt_http_date(SystemTime::now());
        let has_body = method != Method::GET;
        let mut builder = Request::builder()
            .method(method.clone())
            .uri(path_and_query)
            .header("host", &self.host)
            .header("date", &date)
            .header("accept", "application/json");
        let mut signed: Vec<(&str, String)> = vec![
            ("date", date.clone()),
            (
                "(request-target)",
                format!("{} {path_and_query}", method.as_str().to_ascii_lowercase()),
            ),
            ("host", self.host.clone()),
        ];
        if has_body {
            let length = body.len().to_string();
            builder = builder
                .header("content-type", "application/json")
                .header("content-length", &length);
            if sign_body {
                let digest = STANDARD.encode(Sha256::digest(&body));
                builder = builder.header("x-content-sha256", &digest);
                signed.push(("content-length", length));
                signed.push(("content-type", "application/json".to_owned()));
                signed.push(("x-content-sha256", digest));
            }
        }
        if let Some(key) = &self.target.signer {
            builder = builder.header("authorization", authorization(key, &signed));
        }
        builder.body(Full::new(body)).expect("a valid request")
    }
}

/// The OCI `Authorization: Signature …` header over `signed` (name, value) in order.
fn authorization(key: &RequestSigner, signed: &[(&str, String)]) -> String {
    let names: Vec<&str> = signed.iter().map(|(n, _)| *n).collect();
    let text: Vec<String> = signed.iter().map(|(n, v)| format!("{n}: {v}")).collect();
    let signature = key.sign(text.join("\n").as_bytes());
    format!(
        "Signature version=\"1\",keyId=\"{KEY_ID}\",algorithm=\"rsa-sha256\",headers=\"{}\",signature=\"{}\"",
        names.join(" "),
        STANDARD.encode(signature)
    )
}

fn streams(stream: &str, rest: &str) -> String {
    format!("/20180418/streams/{stream}/{rest}")
}

/// CreateCursor at the start of a partition.
async fn trim_horizon_cursor(conn: &mut Conn, stream: &str, partition: u32) -> String {
    let body = format!(r#"{{"partition": "{partition}", "type": "TRIM_HORIZON"}}"#);
    let answer = conn
        .request(Method::POST, &streams(stream, "cursors"), body.into(), true)
        .await
        .expect_ok("CreateCursor");
    answer.json()["value"]
        .as_str()
        .expect("a cursor value")
        .to_owned()
}

// ---------------------------------------------------------------------------------------------
// Statistics.

struct Latencies(Vec<Duration>);

impl Latencies {
    fn new(mut samples: Vec<Duration>) -> Self {
        assert!(!samples.is_empty());
        samples.sort();
        Latencies(samples)
    }

    fn quantile(&self, q: f64) -> Duration {
        let rank = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1]
    }

    fn summary(&self) -> String {
        format!(
            "p50={:.2} ms p99={:.2} ms max={:.2} ms (n={})",
            ms(self.quantile(0.50)),
            ms(self.quantile(0.99)),
            ms(*self.0.last().expect("samples")),
            self.0.len()
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// CPU time used so far by this process's threads, by role, from `/proc/self/task`: the server
/// (its runtime's workers and blocking threads, and the log's group-commit thread) and the
/// client. Robust against other load on the machine, unlike rates; 10 ms granularity per thread.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    server_s: f64,
    client_s: f64,
}

impl Cpu {
    fn now() -> Cpu {
        let mut cpu = Cpu::default();
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return cpu;
        };
        for task in tasks.flatten() {
            let path = task.path();
            let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(path.join("stat")).unwrap_or_default();
            // Fields after the command's closing parenthesis start at field 3; utime and stime
            // are fields 14 and 15, in clock ticks (100 per second on Linux).
            let after = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
            let fields: Vec<&str> = after.split_whitespace().collect();
            let ticks: u64 = [11, 12]
                .iter()
                .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
                .sum();
            let seconds = ticks as f64 / 100.0;
            if comm.starts_with("bench-server") || comm.starts_with("tributary") {
                cpu.server_s += seconds;
            } else if comm.starts_with("bench-client") {
                cpu.client_s += seconds;
            }
        }
        cpu
    }

    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            server_s: self.server_s - before.server_s,
            client_s: self.client_s - before.client_s,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. GetMessages latency.

impl Bench {
    fn get_scenario(&self, auth: &str) {
        let stream = "reads";
        self.create_hub(stream, 1);
        self.prefill(stream, 0, GET_PREFILL_MESSAGES, GET_MESSAGE_BYTES);
        let target = self.target.clone();
        self.client_rt.block_on(async move {
            let mut conn = Conn::open(&target).await;
            let cursor = trim_horizon_cursor(&mut conn, stream, 0).await;
            let path = streams(stream, &format!("messages?cursor={cursor}&limit=10000"));
            let first = conn.request(Method::GET, &path, Bytes::new(), false).await;
            let (count, body_bytes) = check_get_answer(&first.expect_ok("GetMessages"));
            for conns in [1, 4] {
                let before = Cpu::now();
                let samples = get_latencies(&target, &path, conns, GET_REPEATS).await;
                let cpu = Cpu::now().since(before);
                let requests = (samples.len() + conns) as f64;
                println!(
                    "get_messages auth={auth} durability=fsync message=1KiB partition_prefill={GET_PREFILL_MESSAGES} limit=10000 answer={count} messages/{:.2} MB JSON from_start=yes conns={conns}: {}; CPU per request: server {:.2} ms, client {:.2} ms",
                    body_bytes as f64 / 1e6,
                    Latencies::new(samples).summary(),
                    cpu.server_s * 1e3 / requests,
                    cpu.client_s * 1e3 / requests,
                );
            }
            read_whole_partition(&mut conn, stream, auth).await;
        });
    }
}

/// Checks an answer from the start of the pre-filled partition; returns its message count and
/// body size.
fn check_get_answer(answer: &Answer) -> (usize, usize) {
    let json = answer.json();
    let messages = json.as_array().expect("an array of messages");
    assert!(!messages.is_empty(), "the partition was pre-filled");
    for (i, m) in messages.iter().enumerate() {
        assert_eq!(m["offset"].as_i64(), Some(i as i64), "offsets in order");
    }
    let value = STANDARD
        .decode(messages[0]["value"].as_str().expect("a value"))
        .expect("base64");
    assert_eq!(value, payload(GET_MESSAGE_BYTES, 0), "the first message");
    (messages.len(), answer.body.len())
}

/// Sends `repeats` GetMessages requests over `conns` connections, each connection sending its
/// share back to back after one untimed warm-up request.
async fn get_latencies(target: &Target, path: &str, conns: usize, repeats: usize) -> Vec<Duration> {
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..conns {
        let (target, path) = (target.clone(), path.to_owned());
        let share = repeats / conns + usize::from(c < repeats % conns);
        tasks.spawn(async move {
            let mut conn = Conn::open(&target).await;
            conn.request(Method::GET, &path, Bytes::new(), false)
                .await
                .expect_ok("GetMessages");
            let mut samples = Vec::with_capacity(share);
            for _ in 0..share {
                let started = Instant::now();
                let answer = conn.request(Method::GET, &path, Bytes::new(), false).await;
                samples.push(started.elapsed());
                assert_eq!(answer.status, 200);
            }
            samples
        });
    }
    let mut all = Vec::with_capacity(repeats);
    while let Some(samples) = tasks.join_next().await {
        all.extend(samples.expect("a client task"));
    }
    all
}

/// Follows `opc-next-cursor` from the start until the partition is read whole.
async fn read_whole_partition(conn: &mut Conn, stream: &str, auth: &str) {
    let started = Instant::now();
    let mut cursor = trim_horizon_cursor(conn, stream, 0).await;
    let (mut read, mut requests) = (0usize, 0usize);
    while read < GET_PREFILL_MESSAGES {
        let path = streams(stream, &format!("messages?cursor={cursor}&limit=10000"));
        let answer = conn
            .request(Method::GET, &path, Bytes::new(), false)
            .await
            .expect_ok("GetMessages");
        requests += 1;
        let count = answer.json().as_array().expect("an array").len();
        assert!(count > 0, "messages remain");
        read += count;
        cursor = answer.next_cursor();
    }
    println!(
        "get_messages_drain auth={auth} durability=fsync message=1KiB limit=10000 conns=1: {read} messages in {requests} requests (cursor chain, incl. CreateCursor and client JSON parsing) in {:.1} ms",
        ms(started.elapsed())
    );
}

// ---------------------------------------------------------------------------------------------
// 2. PutMessages throughput.

impl Bench {
    fn put_scenario(&self, auth: &str, put: PutRun, run: Duration) {
        let PutRun {
            batch,
            conns,
            partitions,
        } = put;
        let stream = format!("writes-{batch}-{conns}-{partitions}");
        self.create_hub(&stream, partitions);
        let body = put_body(batch);
        let body_bytes = body.len();
        let path = streams(&stream, "messages");
        let target = self.target.clone();
        let before = Cpu::now();
        let (messages, elapsed, latencies) = self
            .client_rt
            .block_on(put_load(&target, &path, body, conns, run));
        let cpu = Cpu::now().since(before);
        let rate = messages as f64 / elapsed.as_secs_f64();
        let stored = self.stored_messages(&stream, partitions);
        assert_eq!(stored, messages, "every acknowledged message is stored");
        println!(
            "put_messages auth={auth} durability=fsync message=100B key=null partitions={partitions} batch={batch} ({:.0} KB request) conns={conns}: {rate:.0} messages/s ({messages} in {:.1} s); request latency {}; CPU per message: server {:.2} us, client {:.2} us",
            body_bytes as f64 / 1e3,
            elapsed.as_secs_f64(),
            Latencies::new(latencies).summary(),
            cpu.server_s * 1e6 / messages as f64,
            cpu.client_s * 1e6 / messages as f64,
        );
    }

    fn stored_messages(&self, stream: &str, partitions: u32) -> u64 {
        (0..partitions)
            .map(|p| {
                let props = self
                    .broker
                    .partition_properties(stream, &p.to_string())
                    .expect("partition");
                u64::try_from(props.last_enqueued_sequence_number + 1).expect("non-negative")
            })
            .sum()
    }
}

/// A PutMessagesDetails body of `batch` null-key messages.
fn put_body(batch: usize) -> Bytes {
    let entries: Vec<String> = (0..batch)
        .map(|i| {
            let value = STANDARD.encode(payload(PUT_MESSAGE_BYTES, i as u64 + 1));
            format!(r#"{{"value":"{value}"}}"#)
        })
        .collect();
    Bytes::from(format!(r#"{{"messages":[{}]}}"#, entries.join(",")))
}

/// `conns` connections send `body` back to back for `run`; returns the messages acknowledged,
/// the time taken and each request's latency.
async fn put_load(
    target: &Target,
    path: &str,
    body: Bytes,
    conns: usize,
    run: Duration,
) -> (u64, Duration, Vec<Duration>) {
    let mut conns_open = Vec::with_capacity(conns);
    for _ in 0..conns {
        conns_open.push(Conn::open(target).await);
    }
    let batch = body_messages(&body);
    let started = Instant::now();
    let deadline = started + run;
    let mut tasks = tokio::task::JoinSet::new();
    for mut conn in conns_open {
        let (path, body) = (path.to_owned(), body.clone());
        tasks.spawn(async move {
            let mut samples = Vec::new();
            while Instant::now() < deadline {
                let sent = Instant::now();
                let answer = conn.request(Method::POST, &path, body.clone(), false).await;
                samples.push(sent.elapsed());
                assert_eq!(
                    answer.status,
                    200,
                    "{}",
                    String::from_utf8_lossy(&answer.body)
                );
                assert!(
                    answer.body.starts_with(b"{\"failures\":0,"),
                    "no message failed"
                );
            }
            samples
        });
    }
    let mut latencies = Vec::new();
    while let Some(samples) = tasks.join_next().await {
        latencies.extend(samples.expect("a client task"));
    }
    let elapsed = started.elapsed();
    (latencies.len() as u64 * batch, elapsed, latencies)
}

fn body_messages(body: &Bytes) -> u64 {
    let json: serde_json::Value = serde_json::from_slice(body).expect("JSON");
    json["messages"].as_array().expect("messages").len() as u64
}

// ---------------------------------------------------------------------------------------------
// 3. Group rebalance.

/// One group instance as a client sees it.
struct Instance {
    name: &'static str,
    conn: Conn,
    cursor: String,
}

impl Instance {
    async fn join(target: &Target, stream: &str, name: &'static str) -> Instance {
        let mut conn = Conn::open(target).await;
        let body = format!(
            r#"{{"groupName": "g", "instanceName": "{name}", "type": "TRIM_HORIZON", "commitOnGet": true, "timeoutInMs": {REBALANCE_TIMEOUT_MS}}}"#
        );
        let answer = conn
            .request(
                Method::POST,
                &streams(stream, "groupCursors"),
                body.into(),
                true,
            )
            .await
            .expect_ok("CreateGroupCursor");
        let cursor = answer.json()["value"]
            .as_str()
            .expect("a cursor")
            .to_owned();
        Instance { name, conn, cursor }
    }

    /// One GetMessages; returns the partitions the answer had messages from.
    async fn get(&mut self, stream: &str) -> std::collections::BTreeSet<u32> {
        let path = streams(stream, &format!("messages?cursor={}", self.cursor));
        let answer = self
            .conn
            .request(Method::GET, &path, Bytes::new(), false)
            .await
            .expect_ok("group GetMessages");
        self.cursor = answer.next_cursor();
        answer
            .json()
            .as_array()
            .expect("an array")
            .iter()
            .map(|m| {
                m["partition"]
                    .as_str()
                    .and_then(|p| p.parse().ok())
                    .expect("a partition")
            })
            .collect()
    }
}

type Holdings = std::collections::BTreeMap<String, Vec<u32>>;

/// GetGroup: the partitions each instance holds.
async fn holdings(conn: &mut Conn, stream: &str) -> Holdings {
    let answer = conn
        .request(
            Method::GET,
            &streams(stream, "groups/g"),
            Bytes::new(),
            false,
        )
        .await
        .expect_ok("GetGroup");
    let mut out = Holdings::new();
    for r in answer.json()["reservations"]
        .as_array()
        .expect("reservations")
    {
        if let Some(instance) = r["reservedInstance"].as_str() {
            let p = r["partition"].as_str().and_then(|p| p.parse().ok());
            out.entry(instance.to_owned())
                .or_default()
                .push(p.expect("a partition"));
        }
    }
    out
}

impl Bench {
    fn rebalance_scenario(&self, auth: &str) {
        let stream = "groups";
        self.create_hub(stream, REBALANCE_PARTITIONS);
        for p in 0..REBALANCE_PARTITIONS {
            self.prefill(stream, p, 20, PUT_MESSAGE_BYTES);
        }
        let target = self.target.clone();
        self.client_rt.block_on(async move {
            let mut a = Instance::join(&target, stream, "a").await;
            let mut b = Instance::join(&target, stream, "b").await;
            let mut c = Instance::join(&target, stream, "c").await;
            let mut admin = Conn::open(&target).await;
            let before = holdings(&mut admin, stream).await;
            // Everyone reads its share; a and b drain theirs, so any message they get later comes
            // from a partition they did not hold. c reads once (uncommitted) and stops.
            for i in [&mut a, &mut b, &mut c] {
                i.get(stream).await;
            }
            let stopped = Instant::now();
            a.get(stream).await;
            b.get(stream).await;
            let taken = before.get("c").cloned().unwrap_or_default();
            let [(a_gets, a_after), (b_gets, b_after)] =
                poll_until_taken_over([&mut a, &mut b], stream, &taken, stopped).await;
            let after = holdings(&mut admin, stream).await;
            println!(
                "group_rebalance auth={auth} durability=fsync partitions={REBALANCE_PARTITIONS} instances=3 timeoutInMs={REBALANCE_TIMEOUT_MS} poll_every={REBALANCE_POLL_MS}ms: before {before:?}; c stopped; a's get #{a_gets} after c's last request ({:.0} ms) returned c's partitions, b's get #{b_gets} ({:.0} ms); after {after:?}",
                ms(a_after),
                ms(b_after)
            );
        });
    }
}

/// Each instance gets every [`REBALANCE_POLL_MS`] (which also keeps it alive) until an answer
/// of each holds a partition of `taken`; returns per instance how many gets that took (counting
/// from the stop) and when it came.
async fn poll_until_taken_over(
    instances: [&mut Instance; 2],
    stream: &str,
    taken: &[u32],
    stopped: Instant,
) -> [(usize, Duration); 2] {
    let mut found: [Option<(usize, Duration)>; 2] = [None, None];
    let mut gets = [1usize, 1usize];
    let mut instances = instances;
    while found.iter().any(Option::is_none) {
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "the stopped instance's partitions were never handed over"
        );
        tokio::time::sleep(Duration::from_millis(REBALANCE_POLL_MS)).await;
        for (k, instance) in instances.iter_mut().enumerate() {
            gets[k] += 1;
            let partitions = instance.get(stream).await;
            if found[k].is_none() && partitions.iter().any(|p| taken.contains(p)) {
                found[k] = Some((gets[k], stopped.elapsed()));
                println!(
                    "# {} got messages of partitions {partitions:?} on its get #{} after the stop",
                    instance.name, gets[k]
                );
            }
        }
    }
    found.map(|f| f.expect("found"))
}
