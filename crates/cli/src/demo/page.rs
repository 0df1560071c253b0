//! The residents' page of `tributary demo`: one HTML page with a small script (no CDN, works
//! offline) that polls two JSON endpoints — the overview (sent and aggregated counts, the
//! instances and their partitions, the announcements, latency) every second, and the home a
//! resident searched for (its latest activity and per-minute counts) four times a second.
//!
//! `GET /`, `GET /api/overview`, `GET /api/home/{id}`. Reads only; a bad home id is a 400.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rusqlite::{Connection, OptionalExtension};
use serde_json::{Value, json};

use super::PARTITIONS;
use super::aggregate::now_ms;
use super::run::{Shared, percentiles};
use super::sensors::KINDS;

const PAGE: &str = include_str!("page.html");

/// How many recent minutes a home's table shows.
const MINUTES_SHOWN: i64 = 10;

/// The running page server.
pub struct RunningPage {
    addr: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningPage {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops it.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Serves the page on 127.0.0.1:`port`.
pub async fn start(shared: Arc<Shared>, port: u16) -> Result<RunningPage> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| {
            format!("cannot serve the residents' page on port {port} (choose another with --port <port>; 0 picks a free one)")
        })?;
    let addr = listener.local_addr()?;
    let router = Router::new()
        .route("/", get(index))
        .route("/api/overview", get(overview))
        .route("/api/home/{id}", get(home))
        .with_state(shared);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = stopped.await;
            })
            .await;
        if let Err(e) = served {
            eprintln!("tributary demo: the residents' page stopped: {e}");
        }
    });
    Ok(RunningPage { addr, stop, task })
}

fn json_response(status: StatusCode, value: &Value) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        value.to_string(),
    )
        .into_response()
}

async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
}

async fn overview(State(shared): State<Arc<Shared>>) -> Response {
    let owners = shared.owners.lock().expect("owners").clone();
    let per_instance = shared.per_instance.lock().expect("per instance").clone();
    let instances: Vec<Value> = shared
        .instances
        .lock()
        .expect("instances")
        .iter()
        .map(|i| {
            let partitions: Vec<u32> = owners
                .iter()
                .filter(|(_, o)| **o == i.name)
                .map(|(p, _)| *p)
                .collect();
            json!({
                "name": i.name, "pid": i.pid, "alive": i.alive, "partitions": partitions,
                "events": per_instance.get(&i.name).copied().unwrap_or(0),
            })
        })
        .collect();
    let owners: BTreeMap<String, String> = owners
        .into_iter()
        .map(|(p, o)| (p.to_string(), o))
        .collect();
    let sensors = &shared.sensors;
    let body = json!({
        "now_ms": now_ms(),
        "homes": shared.homes,
        "partitions": PARTITIONS,
        "sensor_kinds": &KINDS[..sensors.kinds()],
        "readings_per_second": sensors.events_per_second(),
        "sent": sensors.sent.load(Ordering::Relaxed),
        "aggregated": shared.stored.load(Ordering::Relaxed),
        "instances": instances,
        "owners": owners,
        "latency": percentiles(&shared.window.lock().expect("window")),
        "announcements": *shared.announcements.lock().expect("announcements"),
    });
    json_response(StatusCode::OK, &body)
}

async fn home(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    let home = match id.trim().parse::<u32>() {
        Ok(home) if home < shared.homes => home,
        _ => {
            let error = format!(
                "no home {id:?}: homes are numbered 0 to {}",
                shared.homes.saturating_sub(1)
            );
            return json_response(StatusCode::BAD_REQUEST, &json!({ "error": error }));
        }
    };
    let read = tokio::task::block_in_place(|| {
        let conn = shared.db.lock().expect("aggregates connection");
        home_json(&conn, home)
    });
    match read {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(e) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"error": format!("cannot read the aggregates: {e:#}")}),
        ),
    }
}

/// A home's latest reading and its counts over the last minutes.
fn home_json(conn: &Connection, home: u32) -> Result<Value> {
    let latest = conn
        .prepare("SELECT kind, state, at_ms, stored_ms, instance FROM latest WHERE home = ?1")?
        .query_row([home], |row| {
            Ok(json!({
                "kind": row.get::<_, String>(0)?, "state": row.get::<_, String>(1)?,
                "at_ms": row.get::<_, i64>(2)?, "stored_ms": row.get::<_, i64>(3)?,
                "instance": row.get::<_, String>(4)?,
            }))
        })
        .optional()?;
    let since = now_ms().div_euclid(60_000) - MINUTES_SHOWN;
    let mut statement = conn.prepare(
        "SELECT minute, kind, count, last_ms FROM home_minute
         WHERE home = ?1 AND minute > ?2 ORDER BY minute DESC",
    )?;
    let mut minutes: BTreeMap<i64, serde_json::Map<String, Value>> = BTreeMap::new();
    let mut rows = statement.query(rusqlite::params![home, since])?;
    while let Some(row) = rows.next()? {
        let (minute, kind, count, last_ms): (i64, String, i64, i64) =
            (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?);
        let entry = minutes.entry(minute).or_default();
        entry.insert(kind, json!(count));
        let last = entry.get("last_ms").and_then(Value::as_i64).unwrap_or(0);
        entry.insert("last_ms".into(), json!(last.max(last_ms)));
    }
    let minutes: Vec<Value> = minutes
        .into_iter()
        .rev()
        .map(|(minute, mut counts)| {
            counts.insert("minute_ms".into(), json!(minute * 60_000));
            Value::Object(counts)
        })
        .collect();
    let key = home.to_string();
    Ok(json!({
        "home": home,
        "partition": tributary_event::partition_for_key(&key, PARTITIONS),
        "latest": latest,
        "minutes": minutes,
    }))
}
