// Tributary dashboard: applies the sections the server sends over server-sent events, draws
// the charts (its own SVG: a UTC time axis over the last two minutes and a value scale from 0;
// nothing is fetched to draw them), and sends the operator's forms to the admin API with the
// session's CSRF token.
"use strict";
(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const status = document.getElementById("status");
  const hubs = document.getElementById("hubs");
  const POINTS = 120;
  // The charts' window: the last POINTS ticks of about a second.
  const WINDOW_MS = POINTS * 1000;
  // A time-axis label every 30 s, on the clock's half minutes.
  const TIME_STEP_MS = 30000;
  // Room around the plot for the value labels (left) and the time labels (below).
  const MARGIN = { left: 46, right: 10, top: 8, bottom: 20 };
  const series = { t: [], in: [], out: [], lag: [] };

  function hubSection(name) {
    for (const s of hubs.children) if (s.dataset.hub === name) return s;
    const s = document.createElement("section");
    s.className = "hub";
    s.dataset.hub = name;
    return s;
  }

  function apply(message) {
    const sections = message.sections;
    if ("overview" in sections) document.getElementById("overview").innerHTML = sections.overview;
    const wanted = message.hubs.map(hubSection);
    for (const s of [...hubs.children]) if (!wanted.includes(s)) s.remove();
    wanted.forEach((s, i) => {
      const html = sections["hub:" + s.dataset.hub];
      if (html !== undefined) s.innerHTML = html;
      if (hubs.children[i] !== s) hubs.insertBefore(s, hubs.children[i] || null);
    });
    series.t.push(message.time);
    for (const k of ["in", "out", "lag"]) series[k].push(message.totals[k]);
    // Points older than the window (or beyond POINTS, after a reconnect's burst) leave it.
    while (series.t.length > POINTS || series.t[0] < message.time - WINDOW_MS) {
      for (const k of ["t", "in", "out", "lag"]) series[k].shift();
    }
    for (const cell of document.querySelectorAll("td[data-since]")) {
      cell.textContent = age(message.time - Number(cell.dataset.since));
    }
    draw("chart-rates", [["in", series.in], ["out", series.out]]);
    draw("chart-lag", [["lag", series.lag]]);
    const time = new Date(message.time).toISOString().slice(11, 19);
    status.textContent = `live · ${time} UTC · tick ${message.costMs.toFixed(1)} ms`;
    status.className = "status live";
  }

  // The server's `render::duration`, for the ages it leaves to the page between renders.
  function age(ms) {
    ms = Math.max(0, ms);
    if (ms < 1000) return `${ms} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
    if (ms < 3600000) return `${(ms / 60000).toFixed(1)} min`;
    return `${(ms / 3600000).toFixed(1)} h`;
  }

  // A value scale for 0..max: a top and a step of 1, 2 or 5 × a power of ten, 2 to 4 steps.
  function scale(max) {
    const m = Math.max(max, 1);
    const power = 10 ** Math.floor(Math.log10(m / 4));
    const step = [1, 2, 5, 10].map((f) => f * power).find((s) => s >= m / 4);
    return { top: Math.ceil(m / step) * step, step };
  }

  // A value-axis label: 0, 0.5, 40, 1.5k, 2M.
  function short(v) {
    if (v >= 1e6) return `${+(v / 1e6).toFixed(1)}M`;
    if (v >= 1e3) return `${+(v / 1e3).toFixed(1)}k`;
    return `${+v.toFixed(2)}`;
  }

  function add(svg, tag, attributes, text) {
    const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [name, value] of Object.entries(attributes)) el.setAttribute(name, value);
    if (text !== undefined) el.textContent = text;
    svg.appendChild(el);
  }

  // Draws `lines` ([class, values] over series.t) in the SVG `id`, at its size on the page (so
  // text is not stretched): grid, value labels, UTC time labels, then the lines.
  function draw(id, lines) {
    const svg = document.getElementById(id);
    const width = svg.clientWidth || 600;
    const height = svg.clientHeight || 150;
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    const left = MARGIN.left, right = width - MARGIN.right;
    const top = MARGIN.top, bottom = height - MARGIN.bottom;
    const end = series.t[series.t.length - 1];
    const start = end - WINDOW_MS;
    const x = (t) => (left + ((t - start) / WINDOW_MS) * (right - left)).toFixed(1);
    const values = scale(Math.max(0, ...lines.flatMap(([, v]) => v)));
    const y = (v) => (bottom - (v / values.top) * (bottom - top)).toFixed(1);
    svg.replaceChildren();
    const steps = Math.round(values.top / values.step);
    for (let i = 0; i <= steps; i++) {
      const v = i * values.step;
      add(svg, "line", { class: "grid", x1: left, x2: right, y1: y(v), y2: y(v) });
      add(svg, "text", { class: "axis-y", x: left - 5, y: Number(y(v)) + 4 }, short(v));
    }
    for (let t = Math.ceil(start / TIME_STEP_MS) * TIME_STEP_MS; t <= end; t += TIME_STEP_MS) {
      add(svg, "line", { class: "grid", x1: x(t), x2: x(t), y1: top, y2: bottom });
      add(svg, "text", { class: "axis-x", x: x(t), y: height - 5 }, new Date(t).toISOString().slice(11, 19));
    }
    for (const [cls, v] of lines) {
      add(svg, "polyline", { class: cls, points: v.map((value, i) => `${x(series.t[i])},${y(value)}`).join(" ") });
    }
  }

  const source = new EventSource("/dashboard/events");
  source.addEventListener("tick", (e) => apply(JSON.parse(e.data)));
  source.onerror = () => {
    status.textContent = "reconnecting…";
    status.className = "status";
    // Closed for good (the session expired, or was ended): show the login form.
    if (source.readyState === EventSource.CLOSED) location.reload();
  };

  const path = (...parts) => parts.map(encodeURIComponent).join("/");
  // A reset form's position: earliest, latest, or a UTC time.
  const resetTo = (f) => (f.type === "AT_TIME" ? { type: f.type, time: new Date(f.time + "Z").toISOString() } : { type: f.type });
  const requests = {
    "create-hub": (f) => [
      "POST",
      "/admin/v1/hubs",
      { name: f.name, partitionCount: Number(f.partitionCount), retentionDescription: { cleanupPolicy: f.cleanupPolicy } },
    ],
    // Azure's captureDescription: a directory is Tributary's destination, a container Azure's.
    "capture-hub": (f) => [
      "PATCH",
      "/admin/v1/hubs/" + path(f.hub),
      {
        captureDescription: {
          enabled: true,
          encoding: f.encoding,
          intervalInSeconds: Number(f.interval),
          skipEmptyArchives: f.skipEmpty === "on",
          destination: {
            name: f.kind === "directory" ? "Tributary.Directory" : "EventHubArchive.AzureBlockBlob",
            properties: { [f.kind]: f.where },
          },
        },
      },
    ],
    "stop-capture": (f) => ["PATCH", "/admin/v1/hubs/" + path(f.hub), { captureDescription: { enabled: false } }],
    "delete-hub": (f) => ["DELETE", "/admin/v1/hubs/" + path(f.hub)],
    "create-consumer-group": (f) => ["POST", "/admin/v1/hubs/" + path(f.hub) + "/consumergroups", { name: f.name }],
    "delete-consumer-group": (f) => ["DELETE", "/admin/v1/hubs/" + path(f.hub, "consumergroups", f.name)],
    "reset-group": (f) => ["PUT", "/20180418/streams/" + path(f.hub, "groups", f.name), resetTo(f)],
    "reset-processor-group": (f) => ["POST", "/admin/v1/hubs/" + path(f.hub, "consumergroups", f.name, "reset"), resetTo(f)],
  };

  for (const form of document.querySelectorAll("form[data-action]")) {
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const result = document.getElementById("action-result");
      const fields = Object.fromEntries(new FormData(form));
      const action = form.dataset.action;
      if ((action.startsWith("delete") || action === "stop-capture") && !confirm(`${action.replace(/-/g, " ")} ${fields.hub} ${fields.name || ""}?`)) return;
      const [method, url, body] = requests[action](fields);
      try {
        const response = await fetch(url, {
          method,
          credentials: "same-origin",
          headers: { "content-type": "application/json", "x-tributary-csrf": csrf },
          body: body === undefined ? undefined : JSON.stringify(body),
        });
        const text = await response.text();
        let message = response.ok ? "done" : text;
        try {
          if (!response.ok) message = JSON.parse(text).message;
        } catch (_) {}
        result.textContent = `${action}: ${response.ok ? "" : response.status + " "}${message}`;
        result.className = response.ok ? "ok" : "error";
      } catch (err) {
        result.textContent = `${action}: ${err}`;
        result.className = "error";
      }
    });
  }
})();
