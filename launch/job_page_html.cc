// The job page's document (launch/job_page.h): no data in it, so it is the
// same for every job; its script reads /job/state.
#include "launch/job_page.h"

namespace fleet::launch {

std::string_view JobPageHtml() {
  static constexpr std::string_view kHtml = R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>FleetPS job</title>
<style>
  body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; }
  h1 { font-size: 18px; margin: 0 0 4px; }
  #summary { color: #555; margin-bottom: 12px; }
  #error { color: #b00; }
  table { border-collapse: collapse; margin-bottom: 16px; }
  th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
  .running { color: #070; } .failed { color: #b00; } .done { color: #555; }
  details pre { margin: 4px 0; font-size: 12px; max-width: 900px; white-space: pre-wrap; }
  #charts { display: flex; flex-wrap: wrap; gap: 16px; }
  .panel h2 { font-size: 14px; margin: 0; }
  svg.chart { background: #fafafa; border: 1px solid #ddd; }
  .legend span { margin-right: 10px; font-size: 12px; }
</style>
</head>
<body>
<h1>FleetPS job <span id="job"></span></h1>
<div id="summary">loading...</div>
<div id="error"></div>
<table id="processes">
  <thead><tr><th>host</th><th>process</th><th>pid</th><th>state</th><th>restarts</th>
  <th>endpoint</th><th>log</th></tr></thead>
  <tbody></tbody>
</table>
<div id="charts"></div>
<script>
"use strict";
const token = new URLSearchParams(location.hash.slice(1)).get("token");
const colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                "#7f7f7f", "#bcbd22", "#17becf"];
const W = 420, H = 200, PAD = 40;

const SVG_TAGS = new Set(["svg", "polyline", "text"]);
function el(tag, attrs, text) {
  const e = SVG_TAGS.has(tag) ? document.createElementNS("http://www.w3.org/2000/svg", tag)
                              : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function stateClass(state) {
  if (state === "running") return "running";
  return state === "exited 0" ? "done" : "failed";
}

function drawProcesses(processes) {
  const body = document.querySelector("#processes tbody");
  body.replaceChildren();
  for (const p of processes) {
    const tr = el("tr", {"class": "process", "data-name": p.name, "data-state": p.state});
    for (const v of [p.host, p.name, p.pid, p.state, p.restarts, p.endpoint || "-"]) {
      tr.appendChild(el("td", {}, String(v)));
    }
    tr.children[3].className = stateClass(p.state);
    const log = el("td");
    const details = el("details");
    details.appendChild(el("summary", {}, p.log));
    details.appendChild(el("pre", {}, p.tail.join("\n")));
    log.appendChild(details);
    tr.appendChild(log);
    body.appendChild(tr);
  }
}

// One chart per figure ("loss", "auc", "samples_per_s", ...), one line per
// process that reports it, over seconds since the job's first report.
function drawCharts(series) {
  const figures = new Set();
  let t0 = Infinity;
  for (const s of Object.values(series)) {
    for (const k of Object.keys(s)) if (k !== "t" && k !== "step") figures.add(k);
    if (s.t.length) t0 = Math.min(t0, s.t[0]);
  }
  const charts = document.getElementById("charts");
  charts.replaceChildren();
  for (const figure of [...figures].sort()) {
    const lines = [];
    let xmax = 1, ymin = Infinity, ymax = -Infinity;
    for (const [name, s] of Object.entries(series)) {
      const column = s[figure];
      if (!column) continue;
      const points = [];
      column.forEach((v, i) => {
        if (v === null) return;
        const x = (s.t[i] - t0) / 1000;
        points.push([x, v]);
        xmax = Math.max(xmax, x); ymin = Math.min(ymin, v); ymax = Math.max(ymax, v);
      });
      if (points.length) lines.push([name, points]);
    }
    if (!lines.length) continue;
    if (ymax === ymin) { ymax += 1; ymin -= 1; }
    const sx = x => PAD + x / xmax * (W - PAD - 10);
    const sy = y => H - PAD / 2 - (y - ymin) / (ymax - ymin) * (H - PAD);
    const panel = el("div", {"class": "panel"});
    panel.appendChild(el("h2", {}, figure));
    const svg = el("svg", {"class": "chart", "data-figure": figure, "width": W, "height": H});
    svg.appendChild(el("text", {"x": 2, "y": 12, "font-size": 10}, ymax.toPrecision(4)));
    svg.appendChild(el("text", {"x": 2, "y": H - PAD / 2, "font-size": 10}, ymin.toPrecision(4)));
    svg.appendChild(el("text", {"x": W - 50, "y": H - 4, "font-size": 10},
                       xmax.toFixed(0) + " s"));
    const legend = el("div", {"class": "legend"});
    lines.forEach(([name, points], i) => {
      const color = colors[i % colors.length];
      svg.appendChild(el("polyline", {
        "data-process": name, "fill": "none", "stroke": color, "stroke-width": 1.5,
        "points": points.map(([x, y]) => sx(x).toFixed(1) + "," + sy(y).toFixed(1)).join(" ")}));
      legend.appendChild(el("span", {"style": "color:" + color}, name));
    });
    panel.appendChild(svg);
    panel.appendChild(legend);
    charts.appendChild(panel);
  }
}

async function refresh() {
  try {
    const response = await fetch("/job/state", {
      headers: token ? {"Authorization": "Bearer " + token} : {}, cache: "no-store"});
    if (!response.ok) throw new Error(response.status + " " + await response.text());
    const state = await response.json();
    document.getElementById("job").textContent = state.job;
    document.getElementById("summary").textContent =
        state.mode + "; " + state.status + "; " + state.wall_s.toFixed(0) + " s";
    document.getElementById("error").textContent = "";
    drawProcesses(state.processes);
    drawCharts(state.series);
  } catch (e) {
    document.getElementById("error").textContent = "cannot read /job/state: " + e.message;
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
)html";
  return kHtml;
}

}  // namespace fleet::launch
