// The status page: polls the learner's JSON API and redraws. Everything a peer
// could have influenced is inserted with textContent or setAttribute, never as
// HTML, so a hostile string shows as text.
"use strict";

const POLL_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";
// What a node's AutoNAT check found, in words.
const REACH = { public: "public", private: "behind NAT", unknown: "not yet known" };

// A learner bound beyond loopback wants its API token: the URL it prints
// carries it after "#token=" (a fragment never leaves the browser).
const TOKEN = new URLSearchParams(location.hash.slice(1)).get("token");

async function getJSON(path) {
  const headers = TOKEN ? { Authorization: `Bearer ${TOKEN}` } : {};
  const resp = await fetch(path, { cache: "no-store", headers });
  if (!resp.ok) throw new Error(`${path}: HTTP ${resp.status}`);
  return resp.json();
}

function el(tag, text, attrs = {}) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = String(text);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

// What a node runs on, as it reports it: "cuda, 7.5 GiB free".
function deviceText(p) {
  return p.memory_mib ? `${p.device}, ${(p.memory_mib / 1024).toFixed(1)} GiB free` : p.device;
}

function shortPeer(id) {
  return id.length > 14 ? "…" + id.slice(-12) : id;
}

function facts(id, pairs) {
  const dl = document.getElementById(id);
  dl.replaceChildren(...pairs.flatMap(([k, v]) => [el("dt", k), el("dd", v)]));
}

function rows(tableId, items, cells, empty) {
  const body = document.querySelector(`#${tableId} tbody`);
  if (items.length === 0 && empty) {
    const span = document.querySelectorAll(`#${tableId} thead th`).length;
    const tr = el("tr", undefined, { class: "empty" });
    tr.append(el("td", empty, { colspan: span }));
    body.replaceChildren(tr);
    return;
  }
  body.replaceChildren(...items.map((item) => {
    const tr = el("tr");
    for (const value of cells(item)) tr.append(el("td", value));
    return tr;
  }));
}

function duration(s) {
  if (s < 120) return `${Math.round(s)} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function bootstrapState(bp) {
  if (bp.answers === null) return "not asked yet";
  if (bp.answers) return `answers ping in ${bp.rtt_ms.toFixed(1)} ms`;
  const last = bp.last_answer_s_ago === null ? "never answered" : `last answer ${duration(bp.last_answer_s_ago)} ago`;
  return `no answer (${bp.error}); ${last}`;
}

function drawRewards(steps, heldout) {
  const svg = document.getElementById("reward-chart");
  const [w, h, pad] = [600, 200, 24];
  const nodes = [el("title", "mean reward per step, and held-out accuracy (dots)")];
  const axis = document.createElementNS(SVG, "path");
  axis.setAttribute("d", `M${pad},${pad} V${h - pad} H${w - pad}`);
  axis.setAttribute("class", "axis");
  nodes.push(axis);
  if (steps.length > 0) {
    const first = steps[0].step;
    const span = Math.max(1, steps[steps.length - 1].step - first);
    const at = (step, value) => [
      pad + ((Math.max(first, step) - first) / span) * (w - 2 * pad),
      h - pad - Math.max(0, Math.min(1, value)) * (h - 2 * pad),
    ];
    const points = steps.map((s) => {
      const [x, y] = at(s.step, s.reward_mean);
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    });
    for (const e of heldout) {
      const [x, y] = at(e.step, e.accuracy);
      const dot = document.createElementNS(SVG, "circle");
      dot.setAttribute("cx", x.toFixed(1));
      dot.setAttribute("cy", y.toFixed(1));
      dot.setAttribute("r", "4");
      dot.setAttribute("class", "heldout");
      const tip = document.createElementNS(SVG, "title");
      tip.textContent = `version ${e.version}: held-out accuracy ${e.accuracy.toFixed(3)}`;
      dot.appendChild(tip);
      nodes.push(dot);
    }
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", points.join(" "));
    line.setAttribute("class", "reward");
    line.setAttribute("data-points", String(points.length));
    nodes.push(line);
    for (const [label, y] of [["1", pad], ["0", h - pad]]) {
      const t = document.createElementNS(SVG, "text");
      t.setAttribute("x", "4");
      t.setAttribute("y", String(y + 4));
      t.textContent = label;
      nodes.push(t);
    }
  }
  svg.replaceChildren(...nodes);
}

async function refresh() {
  const [status, peers, history, ledger, refusals] = await Promise.all([
    getJSON("/api/status"), getJSON("/api/peers"), getJSON("/api/history?limit=1000"),
    getJSON("/api/ledger?limit=20"), getJSON("/api/refusals?limit=20"),
  ]);
  document.getElementById("job").textContent =
    `job ${status.job_id} — learner ${shortPeer(status.learner)}`;
  facts("job-facts", [
    ["task", status.task], ["model", `${status.model} (${status.parameters.toLocaleString()} parameters)`],
    ["version", status.version], ["step", `${status.step} / ${status.steps}`],
    ["mode", status.mode === "sync" ? "sync" : `async, staleness ≤ ${status.staleness}`],
    ["uptime", duration(status.uptime_s)],
  ]);
  facts("training-facts", [
    ["reward", status.reward === null ? "–" : status.reward.toFixed(3)],
    ["held-out accuracy", status.heldout === null ? "–"
      : `${status.heldout.accuracy.toFixed(3)} (95 % CI ${status.heldout.ci95.map((v) => v.toFixed(2)).join("–")}, version ${status.heldout.version})`],
    ["utilization", `${(100 * status.utilization).toFixed(0)} %`],
    ["steps/s", status.steps_per_s.toFixed(2)],
    ["rollouts accepted", status.rollouts_accepted.toLocaleString()],
  ]);
  const cap = status.capacity;
  const checked = cap.forecast_error === null ? "no forecast checked yet"
    : `forecasts' mean error ${cap.forecast_error.toFixed(2)}; the last said ${(100 * cap.last_forecast).toFixed(0)} %, ${(100 * cap.last_measured).toFixed(0)} % happened`;
  document.getElementById("capacity").textContent =
    `capacity: ${cap.verdict}; forecast utilization ${(100 * cap.utilization).toFixed(0)} %`
    + (cap.model_utilization === null ? "" : ` (the model alone: ${(100 * cap.model_utilization).toFixed(0)} %)`)
    + ` (${checked})`;
  const b = status.broadcast;
  facts("broadcast-facts", [
    ["newest version", b.version], ["size", `${(b.bytes / 1e6).toFixed(1)} MB`],
    ["nodes holding it", `${b.holders} of ${status.peers}`],
    ["it reached them in", b.spread_s === null ? "–" : `${b.spread_s.toFixed(1)} s`],
    ["mean time to reach a node", b.seconds > 0 ? `${b.seconds.toFixed(1)} s` : "–"],
  ]);
  drawRewards(history.steps, history.heldout);
  const names = new Map(peers.peers.map((p) => [p.peer, p.name]));
  rows("peers", peers.peers, (p) => [
    shortPeer(p.peer), p.name, p.backend, p.dtype, deviceText(p), p.tokens_per_s.toFixed(0),
    REACH[p.reachability] ?? p.reachability, p.route, p.held_version, p.rollouts_per_s.toFixed(1),
    p.accepted, p.caught ? `${p.refused} (caught: ${p.caught})` : p.refused, `${duration(p.last_seen_s)} ago`,
  ]);
  document.getElementById("bootstrap").replaceChildren(...status.bootstrap.map(
    (bp) => el("li", `${bp.addr} — ${bootstrapState(bp)}`,
      { class: bp.answers === null ? "unknown" : bp.answers ? "ok" : "down" })));
  rows("contributors", ledger.contributors, (c) => [
    shortPeer(c.peer), names.get(c.peer) ?? "",
    c.forfeited ? `${c.credit.toLocaleString()} (${c.forfeited.toLocaleString()} forfeited)` : c.credit.toLocaleString(),
    c.tokens.toLocaleString(), c.accepted, c.refused,
  ]);
  rows("refusals", refusals.refusals, (r) => [
    shortPeer(r.peer), r.version, r.reason, new Date(r.created_ms).toLocaleTimeString(),
  ], "no batch refused");
}

async function showReceipts(event) {
  event.preventDefault();
  const peer = document.getElementById("receipts-peer").value.trim();
  const out = document.getElementById("receipts");
  if (!peer) return;
  try {
    const data = await getJSON(`/api/receipts?peer=${encodeURIComponent(peer)}&limit=5000`);
    const credit = data.receipts.reduce((sum, r) => sum + r.credit, 0);
    out.textContent = `${data.receipts.length} signed receipts for ${shortPeer(peer)}, ` +
      `credit ${credit.toLocaleString()} (newest 20 below)`;
    rows("receipts-table", data.receipts.slice(-20).reverse(), (r) => [
      r.version, r.verdict, r.reason, r.tokens, r.credit.toLocaleString(),
    ]);
  } catch (err) {
    out.textContent = String(err.message);
    rows("receipts-table", [], () => []);
  }
}

async function loop() {
  const error = document.getElementById("error");
  try {
    await refresh();
    error.hidden = true;
  } catch (err) {
    error.textContent = `cannot reach the learner: ${err.message}`;
    error.hidden = false;
  }
  setTimeout(loop, POLL_MS);
}

document.getElementById("receipts-form").addEventListener("submit", showReceipts);
loop();
