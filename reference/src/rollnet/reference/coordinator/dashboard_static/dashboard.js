// rollnet operator dashboard: polls /api/overview and /api/nodes, renders with textContent only
// (values such as reject reasons come from other parties), charts with the vendored uPlot.
"use strict";

const POLL_MS = 2000;
const STATES = ["pending", "active", "suspect", "offline", "ejected", "banned", "deregistered"];
const ROLES = ["worker", "validator", "trainer", "operator", "relay"];
const charts = {};
let nodesAfter = "";
let latestStep = null;

function $(id) { return document.getElementById(id); }

function fmt(n) {
  if (n === null || n === undefined) return "–";
  if (typeof n !== "number") return String(n);
  if (Math.abs(n) >= 1e6) return n.toExponential(3);
  return Number.isInteger(n) ? n.toLocaleString("en-US") : n.toFixed(3);
}

function fillList(id, pairs) {
  const dl = $(id);
  dl.replaceChildren();
  for (const [key, value] of pairs) {
    const dt = document.createElement("dt");
    dt.textContent = key;
    const dd = document.createElement("dd");
    dd.textContent = fmt(value);
    dd.dataset.key = key;
    dl.append(dt, dd);
  }
}

function ago(iso) {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}

function chart(id, label, timeAxis) {
  const el = $(id);
  const opts = {
    width: Math.max(300, el.clientWidth || 400),
    height: 200,
    scales: { x: { time: timeAxis } },
    series: [{ label: timeAxis ? "time" : "step" }, { label, stroke: "#0969da", width: 2,
                                                      fill: "rgba(9,105,218,0.08)" }],
    axes: [{}, { size: 60 }],
    legend: { show: true },
  };
  return new uPlot(opts, [[], []], el);
}

function setChart(name, xs, ys) {
  charts[name].setData([xs, ys]);
  charts[name].root.dataset.points = String(xs.length);
  charts[name].root.dataset.last = ys.length ? String(ys[ys.length - 1]) : "";
}

function render(data) {
  $("network-id").textContent = data.network_id;
  $("coordinator-key").textContent = data.coordinator_public_key.slice(0, 16) + "…";
  $("nodes-total").textContent = fmt(data.nodes.total);
  fillList("nodes-by-state", STATES.filter(s => data.nodes.by_state[s])
    .map(s => [s, data.nodes.by_state[s]]));
  fillList("tasks-by-state", ["queued", "leased", "submitted", "validating", "accepted",
                              "rejected", "failed", "expired"].map(s => [s, data.tasks[s]]));
  const v = data.validation;
  fillList("validation", [["jobs queued", v.queued], ["jobs leased", v.leased],
    ["accepted", v.accepted], ["rejected", v.rejected],
    ["spot check skipped", v.spot_check_skipped], ["given up", v.given_up]]);
  const l = data.ledger;
  fillList("ledger", [["entries", l.tip_sequence],
    ["credited", l.amounts.credit || 0], ["slashed", l.amounts.slash || 0],
    ["validator rewards", l.amounts.validator_reward || 0],
    ["adjustments", l.amounts.adjustment || 0], ["nodes credited", l.nodes_credited]]);
  const head = l.signed_head;
  $("signed-head").textContent = head
    ? `sequence ${head.sequence} of ${l.tip_sequence}, hash ${head.hash.slice(0, 16)}…, ` +
      `signed ${ago(head.signed_at)}`
    : "none yet";

  const rewards = data.rewards;
  setChart("reward", rewards.map(r => r.step), rewards.map(r => r.mean_reward));
  $("reward-note").textContent = rewards.length
    ? `${rewards.length} steps, ${fmt(rewards.reduce((a, r) => a + r.rollouts, 0))} validated rollouts`
    : "no validated rollouts yet";
  const t = data.throughput;
  setChart("rollouts", t.t, t.rollouts_per_s);
  setChart("tokens", t.t, t.tokens_per_s);
  setChart("verdicts", t.t, t.verdicts_per_s);

  const c = data.checkpoints;
  latestStep = c.latest;
  $("latest-step").textContent = c.latest === null ? "none" : String(c.latest);
  $("at-latest").textContent = fmt(c.at_latest);
  $("counted-at").textContent = c.counted_at === null ? "none" : String(c.counted_at);
  $("within-one").textContent = fmt(c.within_one_step);
  $("live-nodes").textContent = fmt(c.live_nodes);
  $("broadcast-bar").style.width = c.live_nodes ? `${100 * c.at_latest / c.live_nodes}%` : "0";
  fillList("nodes-by-step", c.nodes_by_step.map(s => [
    s.step === null ? "no checkpoint yet" : `step ${s.step}`, s.nodes]));

  const body = $("rejects").tBodies[0];
  body.replaceChildren();
  for (const [reason, count] of Object.entries(v.rejects_by_reason)) {
    const row = body.insertRow();
    row.insertCell().textContent = reason;
    const cell = row.insertCell();
    cell.textContent = fmt(count);
    cell.className = "num";
  }
  const reported = data.relay_reports;
  const relays = $("relay-reports").tBodies[0];
  relays.replaceChildren();
  for (const r of reported.relays) {
    const row = relays.insertRow();
    row.dataset.relay = r.url;
    row.insertCell().textContent = r.url;
    for (const count of [r.reporters, r.reports]) {
      const cell = row.insertCell();
      cell.textContent = fmt(count);
      cell.className = "num";
    }
    row.insertCell().textContent = `${r.last_shard.slice(0, 16)}… (${r.last_step})`;
    row.insertCell().textContent = r.last_reporter.slice(0, 12);
    row.insertCell().textContent = new Date(r.last_at).toLocaleTimeString();
  }
  $("relay-note").textContent = reported.relays_reported
    ? `${reported.relays_reported} relays reported by nodes for serving shards that do not match their digest (since this coordinator started)`
    : "no relay reported serving wrong shard bytes";
  $("status").textContent = `updated ${new Date(data.generated_at).toLocaleTimeString()}`;
  $("status").className = "status ok";
  document.body.dataset.generatedAt = data.generated_at;
}

function renderNodes(page) {
  const body = $("nodes").tBodies[0];
  body.replaceChildren();
  for (const n of page.nodes) {
    const row = body.insertRow();
    row.dataset.nodeId = n.node_id;
    const id = row.insertCell();
    const code = document.createElement("code");
    code.textContent = n.node_id;
    id.append(code);
    row.insertCell().textContent = n.role;
    const state = row.insertCell();
    state.textContent = n.state;
    state.className = `state-${n.state}`;
    row.insertCell().textContent = ago(n.last_heartbeat_at);
    const step = row.insertCell();
    if (n.checkpoint_step === null) {
      step.textContent = "–";
    } else {
      const behind = latestStep === null ? 0 : latestStep - n.checkpoint_step;
      step.textContent = behind > 0 ? `${n.checkpoint_step} (${behind} behind)` : String(n.checkpoint_step);
      if (behind > 0) step.className = "behind";
    }
    const balance = row.insertCell();
    balance.textContent = fmt(n.balance);
    balance.className = "num";
    row.insertCell().textContent = n.state_reason;
  }
  $("nodes-next").disabled = !page.next_after;
  $("nodes-next").dataset.after = page.next_after || "";
}

async function poll() {
  try {
    const response = await fetch("/api/overview", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    render(await response.json());
    const query = new URLSearchParams({ after: nodesAfter, state: $("filter-state").value,
                                        role: $("filter-role").value });
    const nodes = await fetch(`/api/nodes?${query}`, { cache: "no-store" });
    if (nodes.ok) renderNodes(await nodes.json());
  } catch (error) {
    $("status").textContent = `cannot reach the coordinator (${error.message}); retrying`;
    $("status").className = "status bad";
  }
}

function start() {
  for (const s of STATES) $("filter-state").add(new Option(s, s));
  for (const r of ROLES) $("filter-role").add(new Option(r, r));
  for (const id of ["filter-state", "filter-role"]) {
    $(id).addEventListener("change", () => { nodesAfter = ""; poll(); });
  }
  $("nodes-first").addEventListener("click", () => { nodesAfter = ""; poll(); });
  $("nodes-next").addEventListener("click", () => { nodesAfter = $("nodes-next").dataset.after; poll(); });
  charts.reward = chart("chart-reward", "mean reward", false);
  charts.rollouts = chart("chart-rollouts", "rollouts/s", true);
  charts.tokens = chart("chart-tokens", "tokens/s", true);
  charts.verdicts = chart("chart-verdicts", "verdicts/s", true);
  poll();
  setInterval(poll, POLL_MS);
}

start();
