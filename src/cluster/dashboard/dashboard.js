// trainyard's dashboard: every 2 s it reads the cluster status, the jobs and the metrics history
// from the head (docs/METRICS.md) and draws tables and Chart.js charts. The token comes from the
// URL fragment (#token=...) or the form, is kept in sessionStorage and sent as
// "Authorization: Bearer" on every call. Tests read the charts through window.trainyardDashboard.
"use strict";

const REFRESH_MS = 2000;
const MAX_POINTS = 300;
const PHASES = ["data", "forward", "backward", "communication", "optimizer", "other"];
const PHASE_COLORS = ["#8e24aa", "#1e88e5", "#43a047", "#e53935", "#fb8c00", "#9e9e9e"];
const LINE_COLORS = ["#1e88e5", "#e53935", "#43a047", "#fb8c00", "#8e24aa", "#00897b",
                     "#6d4c41", "#c0ca33", "#3949ab", "#d81b60"];

const dashboard = { charts: {}, selectedJob: null, refreshes: 0, lastError: null };
window.trainyardDashboard = dashboard;

// --- the token ---------------------------------------------------------------------------------
function takeTokenFromUrl() {
  const m = /(?:^|&)token=([^&]*)/.exec(location.hash.slice(1));
  if (m) {
    sessionStorage.setItem("trainyard-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);  // out of the URL bar
  }
}

async function api(path) {
  const token = sessionStorage.getItem("trainyard-token");
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const res = await fetch(path, { headers, cache: "no-store" });
  if (res.status === 401 || res.status === 403) {
    document.getElementById("token-form").hidden = false;
    throw new Error("The head refused the token (HTTP " + res.status + "): enter its token.");
  }
  if (!res.ok) throw new Error(path + ": HTTP " + res.status + " " + (await res.text()));
  return res.json();
}

// --- formatting --------------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c instanceof Node ? c : String(c));
  return e;
}
const GiB = 1024 ** 3;
const gib = (bytes) => (bytes / GiB).toFixed(1) + " GiB";
function duration(seconds) {
  if (seconds < 0 || !isFinite(seconds)) return "";
  const h = Math.floor(seconds / 3600), m = Math.floor(seconds / 60) % 60, s = Math.floor(seconds % 60);
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + s + "s";
}
function stateBadge(state) {
  const kind = { alive: "ok", RUNNING: "ok", SUCCEEDED: "ok", suspect: "bad", PENDING: "idle",
                 pending: "warn", dead: "bad", FAILED: "bad", STOPPED: "idle",
                 exited: "idle", drained: "idle" }[state] || "idle";
  return el("span", { class: "badge " + kind, "data-state": state }, state);
}
const clock = (t) => new Date(t * 1000).toLocaleTimeString([], { hour12: false });

// --- tables ------------------------------------------------------------------------------------
function renderNodes(status) {
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren(...status.nodes.map((n) => {
    const used = n.usage || {}, res = n.resources || {};
    return el("tr", { "data-node-id": n.node_id, "data-state": n.state },
      el("td", {}, n.node_id), el("td", {}, n.hostname),
      el("td", {}, stateBadge(n.state), n.reason ? " " + n.reason : ""),
      el("td", {}, `${used.cpu_used ?? 0} / ${res.cpu ?? 0}`),
      el("td", {}, String(res.gpu ?? 0)),
      el("td", {}, res.memory_bytes ? gib(res.memory_bytes) : ""),
      el("td", {}, n.heartbeat_age_s.toFixed(1) + " s ago"));
  }));
}

function renderJobs(jobs) {
  const body = document.querySelector("#jobs tbody");
  const now = Date.now();
  body.replaceChildren(...jobs.slice().reverse().map((j) => {
    const end = j.end_time || now;
    const logs = el("button", { class: "link" }, "logs");
    logs.onclick = () => showLogs(j.job_id);
    const pick = el("button", { class: "link" }, j.job_id);
    pick.onclick = () => { dashboard.selectedJob = j.job_id; refresh(); };
    const nodes = (j.trainyard && j.trainyard.assigned_nodes) || [];
    return el("tr", { "data-job-id": j.job_id, class: j.job_id === dashboard.selectedJob ? "selected" : "" },
      el("td", {}, pick), el("td", {}, stateBadge(j.status)),
      el("td", {}, j.start_time ? duration((end - j.start_time) / 1000) : ""),
      el("td", {}, nodes.join(", ")), el("td", {}, logs));
  }));
}

async function showLogs(jobId) {
  document.getElementById("logs").hidden = false;
  document.getElementById("logs-job").textContent = jobId;
  const out = document.getElementById("logs-text");
  try {
    out.textContent = (await api("/api/jobs/" + encodeURIComponent(jobId) + "/logs")).logs || "(no lines yet)";
  } catch (e) {
    out.textContent = String(e.message);
  }
}

// --- charts ------------------------------------------------------------------------------------
const timeAxis = { type: "linear", bounds: "data", ticks: { callback: clock, maxTicksLimit: 6 } };

// Creates the chart on `canvas` once, then replaces its datasets.
function lineChart(key, canvas, datasets, yTitle, yMax) {
  let chart = dashboard.charts[key];
  if (!chart) {
    chart = new Chart(canvas, {
      type: "line",
      data: { datasets: [] },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
        // spanGaps: a point without a value (no step between two heartbeats) does not cut the line.
        normalized: true, spanGaps: true, elements: { point: { radius: 0 } },
        scales: { x: timeAxis, y: { beginAtZero: true, max: yMax, title: { display: true, text: yTitle } } },
        plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
      },
    });
    dashboard.charts[key] = chart;
  }
  chart.data.datasets = datasets.map((d, i) => ({
    borderColor: LINE_COLORS[i % LINE_COLORS.length], borderWidth: 1.5, ...d }));
  chart.update("none");
  return chart;
}

const points = (t, ys, scale = 1) => t.map((x, i) => ({ x, y: ys[i] == null ? null : ys[i] * scale }));

function nodeCard(node) {
  const id = "node-card-" + node.node_id;
  let card = document.getElementById(id);
  if (!card) {
    card = el("div", { id, class: "card node-card" }, el("h3", {}),
      el("div", { class: "plot" }, el("canvas", { "data-chart": "cpu" })),
      el("div", { class: "plot" }, el("canvas", { "data-chart": "memory" })),
      el("div", { class: "gpus" }));
    document.getElementById("node-charts").append(card);
  }
  card.querySelector("h3").replaceChildren(node.node_id + " (" + node.hostname + ")", stateBadge(node.state));
  return card;
}

function renderNodeCharts(history) {
  const shown = new Set();
  for (const n of history.nodes) {
    if (!n.t.length) continue;
    shown.add("node-card-" + n.node_id);
    const card = nodeCard(n);
    lineChart(`node:${n.node_id}:cpu`, card.querySelector('[data-chart="cpu"]'),
      [{ label: "CPU %", data: points(n.t, n.cpu_ratio, 100) }], "CPU %", 100);
    const mem = [{ label: "memory used (GiB)", data: points(n.t, n.memory_used_bytes, 1 / GiB) }];
    if (n.memory_total_bytes)
      mem.push({ label: "total", data: n.t.map((x) => ({ x, y: n.memory_total_bytes / GiB })), borderDash: [4, 4] });
    lineChart(`node:${n.node_id}:memory`, card.querySelector('[data-chart="memory"]'), mem, "GiB");
    for (const g of n.gpus) {
      const key = `node:${n.node_id}:gpu:${g.gpu}`;
      let canvas = card.querySelector(`[data-gpu="${CSS.escape(g.gpu)}"]`);
      if (!canvas) {
        canvas = el("canvas", { "data-gpu": g.gpu });
        card.querySelector(".gpus").append(el("h3", {}, "GPU " + g.gpu), el("div", { class: "plot" }, canvas));
      }
      const total = g.memory_total_bytes || 1;
      lineChart(key, canvas, [
        { label: "utilisation %", data: points(n.t, g.utilization_ratio, 100) },
        { label: "memory %", data: points(n.t, g.memory_used_bytes, 100 / total) }], "%", 100);
    }
  }
  for (const card of document.querySelectorAll(".node-card")) {
    if (!shown.has(card.id)) {
      for (const key of Object.keys(dashboard.charts))
        if (key.startsWith(`node:${card.id.slice(10)}:`)) { dashboard.charts[key].destroy(); delete dashboard.charts[key]; }
      card.remove();
    }
  }
}

// The newest non-null value of a series.
function latest(values) {
  for (let i = values.length - 1; i >= 0; --i) if (values[i] != null) return values[i];
  return null;
}

function renderJobCharts(job) {
  const ranks = job ? job.ranks : [];
  const label = (r) => `rank ${r.rank} (${r.node_id})`;
  lineChart("job:loss", document.getElementById("job-loss"),
    ranks.map((r) => ({ label: label(r), data: points(r.t, r.loss) })), "loss");
  const tokens = ranks.some((r) => latest(r.tokens_per_second) != null);
  document.getElementById("job-throughput-title").textContent = tokens ? "Tokens/s" : "Samples/s";
  lineChart("job:throughput", document.getElementById("job-throughput"),
    ranks.map((r) => ({ label: label(r), data: points(r.t, tokens ? r.tokens_per_second : r.samples_per_second) })),
    tokens ? "tokens/s" : "samples/s");
  lineChart("job:communication", document.getElementById("job-communication"),
    ranks.map((r) => ({ label: label(r), data: points(r.t, r.step_seconds.communication) })), "s/step");

  // One stacked bar per rank: a straggler's bar stands out.
  let steps = dashboard.charts["job:steps"];
  if (!steps) {
    steps = new Chart(document.getElementById("job-steps"), {
      type: "bar",
      data: { labels: [], datasets: [] },
      options: { animation: false, responsive: true, maintainAspectRatio: false,
                 scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true, title: { display: true, text: "s/step" } } },
                 plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } } },
    });
    dashboard.charts["job:steps"] = steps;
  }
  steps.data.labels = ranks.map(label);
  steps.data.datasets = PHASES.map((p, i) => ({
    label: p, backgroundColor: PHASE_COLORS[i], data: ranks.map((r) => latest(r.step_seconds[p])) }));
  steps.update("none");
}

// --- the refresh loop --------------------------------------------------------------------------
function renderJobSelect(jobs) {
  const select = document.getElementById("job-select");
  const ids = jobs.map((j) => j.job_id).reverse();
  if (!dashboard.selectedJob || !ids.includes(dashboard.selectedJob)) {
    const running = jobs.filter((j) => j.status === "RUNNING").map((j) => j.job_id);
    dashboard.selectedJob = running.length ? running[running.length - 1] : ids[0] || null;
  }
  if (select.options.length !== ids.length || [...select.options].some((o, i) => o.value !== ids[i]))
    select.replaceChildren(...ids.map((id) => el("option", { value: id }, id)));
  if (dashboard.selectedJob) select.value = dashboard.selectedJob;
}

async function refresh() {
  try {
    const [status, jobs] = await Promise.all([api("/api/cluster/status"), api("/api/jobs/")]);
    renderJobSelect(jobs);
    // At most MAX_POINTS per series (the head thins them evenly, newest kept): a chart is a few
    // hundred pixels wide, and a full history of a large job is megabytes.
    const query = "?max_points=" + MAX_POINTS +
      (dashboard.selectedJob ? "&job=" + encodeURIComponent(dashboard.selectedJob) : "");
    const history = await api("/api/cluster/metrics/history" + query);
    renderNodes(status);
    renderJobs(jobs);
    renderNodeCharts(history);
    renderJobCharts(history.jobs.find((j) => j.job_id === dashboard.selectedJob));
    dashboard.refreshes += 1;
    dashboard.lastError = null;
    document.getElementById("error").hidden = true;
    document.getElementById("refreshed").textContent = "updated " + clock(history.time);
  } catch (e) {
    dashboard.lastError = String(e.message || e);
    const box = document.getElementById("error");
    box.textContent = dashboard.lastError;
    box.hidden = false;
  }
}
dashboard.refresh = refresh;

takeTokenFromUrl();
document.getElementById("token-form").onsubmit = (ev) => {
  ev.preventDefault();
  sessionStorage.setItem("trainyard-token", document.getElementById("token-input").value.trim());
  document.getElementById("token-form").hidden = true;
  refresh();
};
document.getElementById("job-select").onchange = (ev) => { dashboard.selectedJob = ev.target.value; refresh(); };
document.getElementById("logs-close").onclick = () => { document.getElementById("logs").hidden = true; };
// The next refresh is scheduled when one ends, so that slow answers never pile up.
async function refreshForever() {
  await refresh();
  setTimeout(refreshForever, REFRESH_MS);
}
refreshForever();
