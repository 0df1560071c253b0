//! A real Tributary hub on 127.0.0.1 for integration tests: a broker on a temporary directory
//! and its AMQP front door on a free port (AMQPS when given a certificate), with three shared
//! access policies — `RootManageSharedAccessKey` (Manage), `listen-only` and `send-only`.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tempfile::TempDir;
use tributary_amqp::{AccessPolicies, AccessPolicy, AmqpConfig, Right, RunningAmqpServer};
use tributary_broker::{Broker, BrokerConfig, HubSpec, ReceiverSpec, SendReceipt, SendTarget};
use tributary_event::{EventData, EventPosition, ReceivedEvent};
use tributary_http::{AmqpOverWebSockets, AuthConfig, HttpConfig, RunningHttpServer};
use tributary_tls::ServerTls;

/// A running hub. Dropping it stops accepting connections; [`TestHub::stop`] also closes them
/// and shuts the broker down.
#[derive(Debug)]
pub struct TestHub {
    /// The broker the front door serves.
    pub broker: Broker,
    /// The AMQP front door (None between [`TestHub::stop_server`] and
    /// [`TestHub::restart_server`]).
    pub server: Option<RunningAmqpServer>,
    /// Every policy the front door accepts tokens of.
    pub policies: AccessPolicies,
    /// `RootManageSharedAccessKey`: every right.
    pub root: AccessPolicy,
    /// `listen-only`: the Listen right.
    pub listen: AccessPolicy,
    /// `send-only`: the Send right.
    pub send: AccessPolicy,
    /// The root policy's connection string (emulator mode: plain AMQP).
    pub connection_string: String,
    /// Where the front door listens.
    pub addr: SocketAddr,
    /// The HTTP door carrying AMQP over WebSockets, once [`TestHub::with_websockets`] started it.
    pub http: Option<RunningHttpServer>,
    tls: Option<ServerTls>,
    _dir: TempDir,
}

impl TestHub {
    /// A namespace with these event hubs (name, partition count).
    pub async fn start(hubs: &[(&str, u32)]) -> TestHub {
        TestHub::start_in(tempfile::tempdir().expect("temp dir"), hubs, |_| {}, None).await
    }

    /// A hub whose broker keeps its data in `dir` with its configuration changed by
    /// `configure`, and whose listener speaks AMQPS with `tls`.
    pub async fn start_in(
        dir: TempDir,
        hubs: &[(&str, u32)],
        configure: impl FnOnce(&mut BrokerConfig),
        tls: Option<ServerTls>,
    ) -> TestHub {
        let mut config = BrokerConfig::new(dir.path());
        configure(&mut config);
        let broker = Broker::open(config).await.expect("broker opens");
        for (name, partitions) in hubs {
            broker
                .create_hub(HubSpec::new(*name, *partitions))
                .await
                .expect("hub created");
        }
        let policy = |name: &str, right| AccessPolicy::generate(name, vec![right]).expect("policy");
        let root = policy("RootManageSharedAccessKey", Right::Manage);
        let listen = policy("listen-only", Right::Listen);
        let send = policy("send-only", Right::Send);
        let policies = AccessPolicies::new(vec![root.clone(), listen.clone(), send.clone()])
            .expect("policies");
        let mut config = AmqpConfig::new("127.0.0.1:0".parse().expect("addr"), policies.clone());
        config.tls = tls.clone();
        let server = tributary_amqp::start(broker.clone(), config)
            .await
            .expect("AMQP server starts");
        let addr = server.local_addr();
        let connection_string = tributary_amqp::connection_string("127.0.0.1", addr.port(), &root);
        TestHub {
            broker,
            server: Some(server),
            policies,
            root,
            listen,
            send,
            connection_string,
            addr,
            http: None,
            tls,
            _dir: dir,
        }
    }

    /// Another namespace with these event hubs that takes this one's keys, as the two hubs of a
    /// failover pair share their authorization rules: one connection string's key works on
    /// both (its endpoint decides, or an alias does).
    pub async fn start_sharing_keys(&self, hubs: &[(&str, u32)]) -> TestHub {
        let mut twin = TestHub::start(hubs).await;
        twin.policies = self.policies.clone();
        twin.root = self.root.clone();
        twin.listen = self.listen.clone();
        twin.send = self.send.clone();
        twin.connection_string = twin.conn(&twin.root);
        twin.stop_server().await;
        twin.restart_server().await;
        twin
    }

    /// Also starts the HTTP door on 127.0.0.1:0 (HTTPS with `tls`, no request signatures),
    /// handing its AMQP-over-WebSockets connections to this hub's AMQP door, as `tributary
    /// serve` wires them.
    pub async fn with_websockets(mut self, tls: Option<ServerTls>) -> Self {
        let connections = self.server.as_ref().expect("AMQP door").connections();
        let auth = AuthConfig::DevelopmentUnauthenticated;
        let mut config = HttpConfig::new("127.0.0.1:0".parse().expect("addr"), auth);
        config.tls = tls;
        config.websocket_amqp = Some(AmqpOverWebSockets::new(move |stream, peer| {
            let connections = connections.clone();
            Box::pin(async move { connections.serve(stream, peer).await })
        }));
        let http = tributary_http::start(self.broker.clone(), config).await;
        self.http = Some(http.expect("HTTP door starts"));
        self
    }

    /// The HTTP door's port (see [`TestHub::with_websockets`]).
    pub fn http_port(&self) -> u16 {
        self.http.as_ref().expect("HTTP door").local_addr().port()
    }

    /// The front door's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `policy`'s connection string (emulator mode: plain AMQP).
    pub fn conn(&self, policy: &AccessPolicy) -> String {
        tributary_amqp::connection_string("127.0.0.1", self.port(), policy)
    }

    /// The root connection string with its key replaced.
    pub fn with_key(&self, key: &str) -> String {
        self.connection_string.replace(&self.root.key, key)
    }

    /// Appends one event with `body` to a partition, in process.
    pub async fn send(&self, hub: &str, partition: &str, body: &str) -> SendReceipt {
        let target = SendTarget::Partition(partition.to_owned());
        let events = vec![EventData::new(body.as_bytes().to_vec())];
        self.broker.send(hub, target, events).await.expect("sent")
    }

    /// Everything a partition holds, read in process.
    pub async fn read_all(&self, hub: &str, partition: u32) -> Vec<ReceivedEvent> {
        let spec = ReceiverSpec::new(hub, partition.to_string(), EventPosition::Earliest);
        let mut receiver = self.broker.open_receiver(spec).expect("receiver");
        let mut all = Vec::new();
        loop {
            let batch = receiver
                .receive(1000, Duration::from_millis(200))
                .await
                .expect("receive");
            if batch.is_empty() {
                return all;
            }
            all.extend(batch);
        }
    }

    /// Stops the AMQP listener and closes every connection.
    pub async fn stop_server(&mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
    }

    /// Starts the AMQP listener again on the same address.
    pub async fn restart_server(&mut self) {
        assert!(self.server.is_none(), "stop the server first");
        let mut config = AmqpConfig::new(self.addr, self.policies.clone());
        config.tls = self.tls.clone();
        let mut attempts = 0;
        let server = loop {
            match tributary_amqp::start(self.broker.clone(), config.clone()).await {
                Ok(server) => break server,
                Err(_) if attempts < 50 => {
                    // The old listener's port may take a moment to be free again.
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("the server did not restart: {e}"),
            }
        };
        self.server = Some(server);
    }

    /// Closes the front doors and shuts the broker down (every partition synced).
    pub async fn stop(mut self) {
        self.stop_server().await;
        if let Some(http) = self.http.take() {
            http.shutdown().await.expect("HTTP door stops");
        }
        self.broker.shutdown().await.expect("broker shuts down");
    }
}

/// Runs `future` with a generous deadline, so a hang fails the test instead of the run.
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 60 s"))
}
