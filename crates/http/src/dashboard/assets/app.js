// Tributary dashboard: applies the sections the server sends over server-sent events, draws
// the charts, and sends the operator's forms to the admin API with the session's CSRF token.
"use strict";
(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const status = document.getElementById("status");
  const hubs = document.getElementById("hubs");
  const POINTS = 120;
  const series = { in: [], out: [], lag: [] };

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
    for (const k of ["in", "out", "lag"]) {
      series[k].push(message.totals[k]);
      if (series[k].length > POINTS) series[k].shift();
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

  function draw(id, lines) {
    const svg = document.getElementById(id);
    const ns = "http://www.w3.org/2000/svg";
    const max = Math.max(1, ...lines.flatMap(([, v]) => v));
    svg.replaceChildren();
    for (const [cls, values] of lines) {
      const points = values
        .map((v, i) => `${(i * 600) / (POINTS - 1)},${115 - (v / max) * 105}`)
        .join(" ");
      const line = document.createElementNS(ns, "polyline");
      line.setAttribute("points", points);
      line.setAttribute("class", cls);
      svg.appendChild(line);
    }
    const label = document.createElementNS(ns, "text");
    label.setAttribute("x", "4");
    label.setAttribute("y", "12");
    label.textContent = max >= 100 ? max.toFixed(0) : max.toFixed(1);
    svg.appendChild(label);
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
    "create-hub": (f) => ["POST", "/admin/v1/hubs", { name: f.name, partitionCount: Number(f.partitionCount) }],
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
      if (action.startsWith("delete") && !confirm(`${action.replace(/-/g, " ")} ${fields.hub} ${fields.name || ""}?`)) return;
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
