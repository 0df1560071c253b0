//! A real Tributary hub on 127.0.0.1 for the client's integration tests: the broker and its AMQP
//! front door, with the root access policy's connection string.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tempfile::TempDir;
use tributary_amqp::{AccessPolicies, AmqpConfig, RunningAmqpServer, connection_string};
use tributary_broker::{Broker, BrokerConfig, HubSpec};

/// A running hub. Dropping it stops accepting connections.
pub struct TestHub {
    pub broker: Broker,
    pub server: Option<RunningAmqpServer>,
    pub policies: AccessPolicies,
    pub connection_string: String,
    pub addr: SocketAddr,
    _dir: TempDir,
}

impl TestHub {
    /// A namespace with these event hubs (name, partition count).
    pub async fn start(hubs: &[(&str, u32)]) -> TestHub {
        let dir = tempfile::tempdir().expect("temp dir");
        let broker = Broker::open(BrokerConfig::new(dir.path()))
            .await
            .expect("broker opens");
        for (name, partitions) in hubs {
            broker
                .create_hub(HubSpec::new(*name, *partitions))
                .await
                .expect("hub created");
        }
        let (policies, _) = AccessPolicies::load_or_create(dir.path()).expect("policies");
        let server = tributary_amqp::start(
            broker.clone(),
            AmqpConfig::new("127.0.0.1:0".parse().expect("addr"), policies.clone()),
        )
        .await
        .expect("AMQP server starts");
        let addr = server.local_addr();
        let root = policies
            .get("RootManageSharedAccessKey")
            .expect("root policy");
        let connection_string = connection_string("127.0.0.1", addr.port(), root);
        TestHub {
            broker,
            server: Some(server),
            policies,
            connection_string,
            addr,
            _dir: dir,
        }
    }

    /// The root connection string with its key replaced.
    pub fn with_key(&self, key: &str) -> String {
        let root = self
            .policies
            .get("RootManageSharedAccessKey")
            .expect("root policy");
        self.connection_string.replace(&root.key, key)
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
        let config = AmqpConfig::new(self.addr, self.policies.clone());
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
}

/// Runs `future` with a generous deadline, so a hang fails the test instead of the run.
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 60 s"))
}
