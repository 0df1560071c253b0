//! Serves a throwaway broker over AMQP for manual interop checks.
//!
//! `cargo run -p tributary-amqp --example serve -- <data-dir> [port]` creates the hub `demo`
//! (4 partitions) if missing, prints the root connection string and serves until Ctrl-C.

use tributary_amqp::{AccessPolicies, AmqpConfig};
use tributary_broker::{Broker, BrokerConfig, HubSpec};

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let dir = args.next().expect("usage: serve <data-dir> [port]");
    let port: u16 = args
        .next()
        .map_or(5672, |p| p.parse().expect("a port number"));
    let broker = Broker::open(BrokerConfig::new(&dir))
        .await
        .expect("broker opens");
    if broker.describe_hub("demo").is_err() {
        broker
            .create_hub(HubSpec::new("demo", 4))
            .await
            .expect("hub created");
    }
    let (policies, _) = AccessPolicies::load_or_create(dir.as_ref()).expect("policies");
    let root = policies
        .get("RootManageSharedAccessKey")
        .expect("root policy")
        .clone();
    let config = AmqpConfig::new(([127, 0, 0, 1], port).into(), policies);
    let server = tributary_amqp::start(broker.clone(), config)
        .await
        .expect("listener starts");
    println!(
        "{}",
        tributary_amqp::connection_string("127.0.0.1", server.local_addr().port(), &root)
    );
    tokio::signal::ctrl_c().await.expect("ctrl-c");
    server.shutdown().await;
    broker.shutdown().await.expect("broker shuts down");
}
