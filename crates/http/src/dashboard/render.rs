//! The dashboard's HTML, rendered on the server: the page around it, the overview, and one
//! section per hub. The page's script replaces a section with the HTML the server sends for it
//! when it changes, so this is the only renderer of the tables.
//!
//! Every name and value that reaches the HTML passes [`escape`].

use std::fmt::Write as _;

use super::snapshot::{GroupTable, HubRow, PartitionRow, Snapshot};

/// Escapes text for HTML element content and quoted attribute values. Five replacements; a
/// templating crate would be more code than this.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn rate(per_s: f64) -> String {
    if per_s >= 100.0 {
        format!("{per_s:.0}")
    } else {
        format!("{per_s:.1}")
    }
}

/// A duration for a person: ms, s, min, h.
pub(crate) fn duration(ms: i64) -> String {
    match ms {
        ..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{:.1} min", ms as f64 / 60_000.0),
        _ => format!("{:.1} h", ms as f64 / 3_600_000.0),
    }
}

fn opt_ms(ms: Option<f64>) -> String {
    ms.map_or_else(|| "–".to_owned(), |v| format!("{v:.2} ms"))
}

/// `n` and the noun that goes with it: "1 event", "2 events", "0 events".
pub(crate) fn count<T: std::fmt::Display + PartialEq + From<u8>>(
    n: T,
    one: &str,
    many: &str,
) -> String {
    let noun = if n == T::from(1) { one } else { many };
    format!("{n} {noun}")
}

/// The overview: totals, the consumer groups the page has a table for (by kind), and the
/// log's sync latency.
pub(crate) fn overview(snapshot: &Snapshot) -> String {
    let (events_in, events_out, lag) = snapshot.totals();
    let partitions: usize = snapshot.hubs.iter().map(|h| h.partitions.len()).sum();
    let tables = || snapshot.hubs.iter().flat_map(|h| &h.groups);
    let processor = tables().filter(|g| g.kind == "processor").count();
    let server_side = tables().count() - processor;
    let hubs = snapshot.hubs.len();
    let s = &snapshot.sync;
    format!(
        r#"<div class="cards">
<div class="card"><b id="total-hubs">{hubs}</b> {} · {} · <span id="total-groups" title="the groups with a table below: processor groups (ownership and checkpoints kept by the hub) and server-side groups (offsets kept by the group coordinator)">{} ({processor} processor, {server_side} server-side)</span></div>
<div class="card">in <b id="total-in">{}</b> events/s · out <b id="total-out">{}</b> events/s</div>
<div class="card">lag <b id="total-lag">{lag}</b> {}</div>
<div class="card" title="syncs of the log's group committer (fdatasync, or a syncfs shared by partitions)">log sync: last second {}, mean {}, p99 {} · since start {}, mean {}, p50 {}, p99 {}</div>
</div>"#,
        if hubs == 1 { "hub" } else { "hubs" },
        count(partitions, "partition", "partitions"),
        count(processor + server_side, "consumer group", "consumer groups"),
        rate(events_in),
        rate(events_out),
        if lag == 1 { "event" } else { "events" },
        count(s.recent_count, "sync", "syncs"),
        opt_ms(s.recent_mean_ms),
        opt_ms(s.recent_p99_ms),
        count(s.total_count, "sync", "syncs"),
        opt_ms(s.total_mean_ms),
        opt_ms(s.total_p50_ms),
        opt_ms(s.total_p99_ms),
    )
}

fn partition_row(out: &mut String, p: &PartitionRow) {
    let receivers: Vec<String> = p
        .receivers
        .iter()
        .map(|r| {
            let epoch = r
                .epoch
                .map_or_else(|| "no epoch".to_owned(), |e| format!("epoch {e}"));
            let name = r
                .name
                .as_deref()
                .map(|n| format!(" ({})", escape(n)))
                .unwrap_or_default();
            format!("{}: {epoch}{name}", escape(&r.consumer_group))
        })
        .collect();
    let last_time = p
        .last_enqueued_ms
        .map(crate::oci::format_time)
        .unwrap_or_default();
    let _ = write!(
        out,
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{last_time}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        p.partition,
        p.begin_sequence,
        p.last_sequence,
        bytes(p.retained_bytes),
        rate(p.in_per_s),
        rate(p.out_per_s),
        receivers.join("<br>"),
    );
}

fn group_table(out: &mut String, g: &GroupTable, now_ms: i64) {
    let lag: i64 = g.rows.iter().map(|r| r.lag_events).sum();
    let _ = write!(
        out,
        "<h3>{} group <span class=\"name\">{}</span> <small>lag {}</small></h3>\
         <table class=\"group\" data-group=\"{}\"><thead><tr><th>Partition</th><th>Owner</th>\
         <th>Checkpoint</th><th>Last enqueued</th><th>Lag (events)</th><th>Lag (time)</th></tr></thead><tbody>",
        if g.kind == "processor" {
            "Processor"
        } else {
            "Server-side"
        },
        escape(&g.name),
        count(lag, "event", "events"),
        escape(&g.name),
    );
    for r in &g.rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td>{}</tr>",
            r.partition,
            r.owner.as_deref().map_or_else(|| "–".to_owned(), escape),
            r.checkpoint
                .map_or_else(|| "–".to_owned(), |c| c.to_string()),
            r.last_enqueued,
            if r.lag_events > 0 { "lagging" } else { "" },
            r.lag_events,
            lag_time(r.lag_events, r.waiting_since_ms, now_ms),
        );
    }
    out.push_str("</tbody></table>");
}

/// The lag in time as of `now_ms`; the script keeps it current from `data-since` between
/// renders of the section.
fn lag_time(lag_events: i64, since: Option<i64>, now_ms: i64) -> String {
    match (lag_events, since) {
        (0, _) => "<td>0 ms</td>".to_owned(),
        (_, None) => "<td title=\"no longer retained\">?</td>".to_owned(),
        (_, Some(t)) => format!(
            "<td data-since=\"{t}\">{}</td>",
            duration((now_ms - t).max(0))
        ),
    }
}

/// The hub's retention and cleanup policy, for its meta line.
fn cleanup_text(h: &HubRow, retention: String) -> String {
    let c = &h.cleanup;
    match (c.policy.compacts(), c.policy.deletes()) {
        (false, _) => retention,
        (true, deletes) => format!(
            "{}compacted by key (min. lag {}, tombstones kept {})",
            if deletes {
                format!("{retention} and ")
            } else {
                String::new()
            },
            duration(c.min_compaction_lag_ms),
            duration(c.tombstone_retention_ms),
        ),
    }
}

/// A compacted hub's compaction table: per partition, the dirty ratio and the last run.
fn compaction_table(out: &mut String, h: &HubRow) {
    if h.compaction.is_empty() {
        return;
    }
    out.push_str(
        "<table class=\"compaction\"><thead><tr><th>Partition</th><th>Dirty ratio</th>\
         <th>Last compaction (UTC)</th><th>Bytes before</th><th>Bytes after</th><th>Events removed</th></tr></thead><tbody>",
    );
    for (p, state) in h.compaction.iter().enumerate() {
        let last = state
            .last_run_ms
            .map_or_else(|| "not yet".to_owned(), crate::oci::format_time);
        let outcome = state.last_outcome.unwrap_or_default();
        let _ = write!(
            out,
            "<tr><td>{p}</td><td>{:.0}%</td><td>{last}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            state.dirty_ratio * 100.0,
            bytes(outcome.bytes_before),
            bytes(outcome.bytes_after),
            outcome.events_removed,
        );
    }
    out.push_str("</tbody></table>");
}

/// A captured hub's capture table: per partition, how far it is captured, its lag, its files
/// and its state (failing, or holding retention back).
fn capture_table(out: &mut String, h: &HubRow, now_ms: i64) {
    let Some(capture) = &h.capture else {
        return;
    };
    let _ = write!(
        out,
        "<p class=\"meta\">capture on, to {}</p><table class=\"capture\"><thead><tr><th>Partition</th>\
         <th>Captured to</th><th>Lag (events)</th><th>Lag</th><th>Files</th><th>Bytes</th><th>State</th></tr></thead><tbody>",
        escape(&capture.destination)
    );
    for (p, (status, lag)) in capture.partitions.iter().enumerate() {
        let state = match (&status.last_error, status.retention_held) {
            (Some(error), _) => format!("failing: {}", escape(error)),
            (None, true) => "behind retention: retention held".to_owned(),
            (None, false) if status.captured_to.is_none() => "starting".to_owned(),
            (None, false) => "ok".to_owned(),
        };
        let lag_ms = (status.lag_seconds(now_ms) * 1000.0) as i64;
        let _ = write!(
            out,
            "<tr><td>{p}</td><td>{}</td><td>{lag}</td><td>{}</td><td>{}</td><td>{}</td><td>{state}</td></tr>",
            status.captured_to.map_or("-".to_owned(), |s| s.to_string()),
            duration(lag_ms),
            status.files_written,
            bytes(status.bytes_written),
        );
    }
    out.push_str("</tbody></table>");
}

/// The inside of one hub's section, as of `now_ms`.
pub(crate) fn hub(h: &HubRow, now_ms: i64) -> String {
    let (events_in, events_out) = h
        .partitions
        .iter()
        .fold((0.0, 0.0), |(i, o), p| (i + p.in_per_s, o + p.out_per_s));
    let retention = h
        .retention_ms
        .map_or_else(|| "forever".to_owned(), duration);
    let retention = cleanup_text(h, retention);
    let mut out = String::with_capacity(256 + h.partitions.len() * 160);
    let _ = write!(
        out,
        "<h2>{}</h2><p class=\"meta\">{} · retention {retention} · in {} events/s · out {} events/s · consumer groups: {}</p>\
         <table class=\"partitions\"><thead><tr><th>Partition</th><th>Begin seq.</th><th>Last seq.</th><th>Size</th>\
         <th>Last enqueued (UTC)</th><th>In/s</th><th>Out/s</th><th>Receivers (group: epoch)</th></tr></thead><tbody>",
        escape(&h.name),
        count(h.partitions.len(), "partition", "partitions"),
        rate(events_in),
        rate(events_out),
        h.consumer_groups
            .iter()
            .map(|g| escape(g))
            .collect::<Vec<_>>()
            .join(", "),
    );
    for p in &h.partitions {
        partition_row(&mut out, p);
    }
    out.push_str("</tbody></table>");
    compaction_table(&mut out, h);
    capture_table(&mut out, h, now_ms);
    for g in &h.groups {
        group_table(&mut out, g, now_ms);
    }
    out
}

/// The whole page: header, operator actions, charts, overview and every hub.
pub(crate) fn page(snapshot: &Snapshot, csrf: &str, development: bool) -> String {
    let mut out = String::with_capacity(4096 + snapshot.hubs.len() * 8192);
    let _ = write!(
        out,
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf-token" content="{}"><title>Tributary</title><link rel="stylesheet" href="/dashboard/app.css"></head>
<body><header><h1>Tributary</h1><span id="status" class="status">connecting…</span>{}</header>
<main>"#,
        escape(csrf),
        if development {
            r#"<span class="warn">development mode: no authentication</span>"#
        } else {
            r#"<form id="logout" method="post" action="/dashboard/logout"><button type="submit">Log out</button></form>"#
        }
    );
    out.push_str(ACTIONS);
    out.push_str(
        r#"<section class="charts"><figure><figcaption>Events/s — <span class="in">in</span>, <span class="out">out</span> · last 2 minutes, UTC</figcaption><svg id="chart-rates" role="img" aria-label="events per second in and out over the last 2 minutes"></svg></figure>
<figure><figcaption>Lag (events, all consumer groups) · last 2 minutes, UTC</figcaption><svg id="chart-lag" role="img" aria-label="lag in events over the last 2 minutes"></svg></figure></section>"#,
    );
    let _ = write!(
        out,
        "<section id=\"overview\">{}</section><div id=\"hubs\">",
        overview(snapshot)
    );
    for h in &snapshot.hubs {
        let _ = write!(
            out,
            "<section class=\"hub\" data-hub=\"{}\">{}</section>",
            escape(&h.name),
            hub(h, snapshot.time_ms)
        );
    }
    out.push_str("</div></main><script src=\"/dashboard/app.js\"></script></body></html>");
    out
}

/// The login page (`error`: why the last attempt failed): the dashboard's header bar and its
/// form in a card, with the same style sheet.
pub(crate) fn login(error: Option<&str>) -> String {
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tributary — log in</title><link rel="stylesheet" href="/dashboard/app.css"></head>
<body class="login"><header><h1>Tributary</h1><span class="status">dashboard · log in</span></header>
<main><form class="card" method="post" action="/dashboard/login">
<h2>Log in</h2>
<label for="credential">Connection string or SAS token of a policy with the Manage right</label>
<input id="credential" name="credential" type="password" autocomplete="off" required autofocus>
{}<button type="submit">Log in</button>
<p class="hint"><code>tributary connection-string</code> prints the root policy's connection string. It is checked by the server and never stored: the browser gets a session cookie.</p>
</form></main></body></html>"#,
        error
            .map(|e| format!("<p class=\"error\">{}</p>", escape(e)))
            .unwrap_or_default()
    )
}

/// The operator's forms; the script sends them to the admin API.
const ACTIONS: &str = r#"<section class="actions"><details><summary>Operator actions</summary>
<form data-action="create-hub"><b>Create hub</b> <input name="name" placeholder="name" required> <input name="partitionCount" type="number" min="1" max="1024" value="4" required> partitions, cleanup
<select name="cleanupPolicy"><option value="Delete">delete</option><option value="Compact">compact</option><option value="DeleteOrCompact">delete and compact</option></select> <button>Create</button></form>
<form data-action="capture-hub"><b>Capture hub</b> <input name="hub" placeholder="hub" required> to
<select name="kind"><option value="directory">directory</option><option value="containerUrl">Blob container URL</option></select> <input name="where" placeholder="/absolute/dir or https://ACCOUNT.blob.core.windows.net/CONTAINER" size="40" required>
<select name="encoding"><option>Avro</option><option>AvroDeflate</option><option>Parquet</option></select> every <input name="interval" type="number" min="60" max="900" value="300" required> s
<label><input name="skipEmpty" type="checkbox"> skip empty windows</label> <button>Capture</button></form>
<form data-action="stop-capture"><b>Stop capturing</b> <input name="hub" placeholder="hub" required> <button class="danger">Stop</button></form>
<form data-action="delete-hub"><b>Delete hub</b> <input name="hub" placeholder="hub" required> <button class="danger">Delete</button></form>
<form data-action="create-consumer-group"><b>Create consumer group</b> <input name="hub" placeholder="hub" required> <input name="name" placeholder="group" required> <button>Create</button></form>
<form data-action="delete-consumer-group"><b>Delete consumer group</b> <input name="hub" placeholder="hub" required> <input name="name" placeholder="group" required> <button class="danger">Delete</button></form>
<form data-action="reset-group"><b>Reset server-side group</b> <input name="hub" placeholder="hub" required> <input name="name" placeholder="group" required>
<select name="type"><option value="TRIM_HORIZON">earliest</option><option value="LATEST">latest</option><option value="AT_TIME">at time (UTC)</option></select> <input name="time" type="datetime-local" step="1"> <button>Reset</button></form>
<form data-action="reset-processor-group"><b>Reset processor group checkpoints</b> (its processors stopped) <input name="hub" placeholder="hub" required> <input name="name" placeholder="group" required>
<select name="type"><option value="TRIM_HORIZON">earliest</option><option value="LATEST">latest</option><option value="AT_TIME">at time (UTC)</option></select> <input name="time" type="datetime-local" step="1"> <button>Reset</button></form>
<p id="action-result" role="status"></p></details></section>"#;
