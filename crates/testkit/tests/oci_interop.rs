//! The official `oci` Python SDK (StreamClient with a real request signer) against Tributary.
//! Needs `scripts/setup-oci-interop`; a missing SDK fails these tests, it never skips them.

use std::sync::Arc;

use tributary_event::{Clock, ManualClock, SystemClock};
use tributary_http::RateLimits;
use tributary_testkit::oci::{Setup, printed, run_oci_script, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_and_every_partition_cursor_type() {
    let server = start(Setup {
        event_bytes_max: Some(64 * 1024),
        ..Setup::default()
    })
    .await;
    run_oci_script(&server, "messages.py", &[], &[]).await;
    server.http.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_created_listed_used_and_deleted_with_the_admin_client() {
    let server = start(Setup::default()).await;
    run_oci_script(&server, "streams.py", &[], &[]).await;
    server.http.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_groups_and_the_seed_scenario() {
    let server = start(Setup::default()).await;
    run_oci_script(&server, "groups.py", &[], &[]).await;
    server.http.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_get_their_documented_errors_and_write_nothing() {
    let server = start(Setup::default()).await;
    run_oci_script(&server, "errors.py", &[], &[]).await;
    server.http.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_cursor_is_refused() {
    let now = SystemClock.now_ms();
    let clock = Arc::new(ManualClock::new(now));
    let server = start(Setup {
        clock: Some(clock.clone()),
        // The clock jumps ahead of the client's; keep request dates acceptable.
        clock_skew_ms_max: 3_600_000,
        ..Setup::default()
    })
    .await;
    let out = run_oci_script(&server, "errors.py", &["make_cursor"], &[("PHASE", "1")]).await;
    let (stream, cursor) = (printed(&out, "STREAM"), printed(&out, "CURSOR"));
    clock.advance_ms(5 * 60 * 1000 + 1000);
    let env = [
        ("PHASE", "2"),
        ("STREAM", stream.as_str()),
        ("CURSOR", cursor.as_str()),
    ];
    run_oci_script(&server, "errors.py", &["expired_cursor"], &env).await;
    server.http.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rates_beyond_the_configured_limits_get_429() {
    let server = start(Setup {
        rate_limits: RateLimits {
            get_requests_per_second: Some(2),
            put_bytes_per_second: Some(2000),
        },
        ..Setup::default()
    })
    .await;
    run_oci_script(&server, "throttle.py", &[], &[]).await;
    server.http.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_and_committed_offsets_survive_a_restart() {
    let setup = Setup::default();
    let server = start(Setup::default()).await;
    let env = [("PHASE", "1"), ("STREAM", "durable")];
    let out = run_oci_script(&server, "groups.py", &["before_restart"], &env).await;
    let cursor = printed(&out, "CURSOR");
    let tributary_testkit::oci::Server {
        dir, broker, http, ..
    } = server;
    http.shutdown().await.unwrap();
    broker.shutdown().await.unwrap();
    drop(broker);
    // Let the coordinator's background task notice, then reopen everything on the same directory.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let broker = tributary_testkit::oci::open_broker(dir.path(), &setup).await;
    let http = tributary_testkit::oci::start_http(&broker, &setup).await;
    let url = format!("http://{}", http.local_addr());
    let server = tributary_testkit::oci::Server {
        dir,
        broker,
        http,
        url,
    };
    let env = [
        ("PHASE", "2"),
        ("STREAM", "durable"),
        ("CURSOR", cursor.as_str()),
    ];
    run_oci_script(&server, "groups.py", &["after_restart"], &env).await;
    server.http.shutdown().await.unwrap();
}

/// HTTPS with the development authority: the SDK's admin and stream clients work with the
/// certificate checked, and a client trusting another authority is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_over_https_checks_the_certificate() {
    let server = start(Setup {
        tls: true,
        ..Setup::default()
    })
    .await;
    let other = tempfile::tempdir().unwrap();
    let hosts = ["localhost".to_owned()];
    let stranger = tributary_tls::write_development_certificates(other.path(), &hosts).unwrap();
    let wrong = stranger.ca_cert.to_str().unwrap();
    run_oci_script(&server, "https.py", &[], &[("WRONG_CA", wrong)]).await;
    server.http.shutdown().await.unwrap();
}
