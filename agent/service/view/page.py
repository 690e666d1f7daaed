"""The live view's page: plain HTML and a little JavaScript, no framework, no build step.
Each source's image is its MJPEG stream; its figures and a one-minute latency chart come
from ``/api/health`` once a second, drawn in the browser. The chart has axes with units
(ms; seconds ago) and a legend in the page (which line is p50, which p99, the budget)."""

from __future__ import annotations

import html
import json

from edge_agent.core.endpoint_config import ViewConfig

#: The chart's series: (heartbeat figure, colour); the legend and the lines share them.
SERIES = (("p50", "#4fc3f7"), ("p99", "#ffb74d"))
BUDGET_COLOUR = "#9e9e9e"  # the dashed budget line
AXIS_COLOUR = "#bdbdbd"  # tick labels and axis titles
#: Room around the plot for the axes: tick labels and the y title on the left, the x ticks and
#: title below.
PAD = {"left": 52, "right": 10, "top": 8, "bottom": 30}

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>edge-agent live view</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 16px; background: #111; color: #eee; }
.source { display: inline-block; vertical-align: top; margin: 0 16px 16px 0; }
.source img { display: block; max-width: 100%; background: #222; min-width: 320px; min-height: 180px; }
.stats { margin: 6px 0; font-family: ui-monospace, monospace; }
canvas { background: #1b1b1b; display: block; }
.legend { margin: 4px 0; font-size: 12px; color: #ccc; }
.legend span { margin-right: 14px; }
.legend i { display: inline-block; width: 18px; margin-right: 4px; vertical-align: middle; }
.missed { color: #ff6060; }
</style></head><body>
<h1>edge-agent: __DEVICE__</h1>
__SOURCES__
<script>
const TOKEN = __TOKEN__;
const SOURCES = __NAMES__;
const SERIES = __SERIES__, BUDGET = "__BUDGET_COLOUR__", AXIS = "__AXIS_COLOUR__";
const PAD = __PAD__;
const history = {};
function q() { return TOKEN ? "?token=" + encodeURIComponent(TOKEN) : ""; }
function step(top) {  // a 1-2-5 tick step giving at most 5 ticks up to top
  const unit = Math.pow(10, Math.floor(Math.log10(top / 5)));
  return [1, 2, 5, 10].map(m => m * unit).find(s => top / s <= 5);
}
function draw(name, budget) {
  const c = document.getElementById("chart-" + name), g = c.getContext("2d"), h = history[name];
  const x0 = PAD.left, x1 = c.width - PAD.right, y0 = PAD.top, y1 = c.height - PAD.bottom;
  g.clearRect(0, 0, c.width, c.height);
  const top = Math.max(budget * 1.5, ...h.map(p => Math.max(p[0] || 0, p[1] || 0)), 1);
  const y = v => y1 - (y1 - y0) * v / top, x = ago => x1 - (x1 - x0) * ago / 60;
  g.font = "11px system-ui, sans-serif"; g.fillStyle = AXIS; g.strokeStyle = "#555"; g.lineWidth = 1;
  g.beginPath(); g.moveTo(x0, y0); g.lineTo(x0, y1); g.lineTo(x1, y1); g.stroke();
  g.textAlign = "right"; g.textBaseline = "middle";
  const dy = step(top);
  for (let v = 0; v <= top + 1e-9; v += dy) {
    g.fillText(+v.toFixed(3) + "", x0 - 4, y(v));
    g.beginPath(); g.moveTo(x0 - 2, y(v)); g.lineTo(x0, y(v)); g.stroke();
  }
  g.save(); g.translate(11, (y0 + y1) / 2); g.rotate(-Math.PI / 2);
  g.textAlign = "center"; g.fillText("latency (ms)", 0, 0); g.restore();
  g.textAlign = "center"; g.textBaseline = "top";
  for (const ago of [60, 45, 30, 15, 0]) {
    const at = x(ago);
    g.fillText(ago + "", at, y1 + 3);
    g.beginPath(); g.moveTo(at, y1); g.lineTo(at, y1 + 2); g.stroke();
  }
  g.fillText("seconds ago", (x0 + x1) / 2, y1 + 16);
  const drawn = budget > 0;
  if (drawn) {
    g.strokeStyle = BUDGET; g.setLineDash([4, 4]); g.beginPath();
    g.moveTo(x0, y(budget)); g.lineTo(x1, y(budget)); g.stroke(); g.setLineDash([]);
  }
  const budgetKey = document.getElementById("legend-budget-" + name);
  budgetKey.hidden = !drawn;
  budgetKey.lastChild.textContent = `budget ${+budget.toFixed(3)} ms`;
  SERIES.forEach(([label, colour], k) => {
    g.strokeStyle = colour; g.lineWidth = 1.5; g.beginPath();
    let drawing = false;  // a second without frames (null) breaks the line
    h.forEach((p, i) => {
      const at = x(h.length - 1 - i);  // the newest point is "0 seconds ago"
      if (p[k] === null) { drawing = false; return; }
      if (drawing) g.lineTo(at, y(p[k])); else g.moveTo(at, y(p[k]));
      drawing = true;
    });
    g.stroke();
  });
  c.setAttribute("aria-label", `end-to-end latency of the last minute: ` +
    SERIES.map(([label]) => label).join(" and ") + ` in ms (0 to ${+top.toFixed(1)}) ` +
    `against seconds ago (60 to 0)` + (drawn ? `, budget ${+budget.toFixed(3)} ms dashed` : ""));
}
function missedText(b) {
  // Two figures of different kinds, each named: a rate over the miss window (the heartbeat's
  // frames ended in it) and a count since the agent started (late + dropped as stale).
  const c = b.counts, total = c.late + (c.dropped_by_reason.stale || 0), n = b.miss_window_frames;
  const secs = b.deadline.miss_window_s ? ` in the last ${b.deadline.miss_window_s} s` : "";
  const rate = n ? `missed ${(100 * b.miss_rate).toFixed(1)} % of the last ${n} frames${secs}`
    : `no frame ended lately`;
  return `${rate} | missed ${total} since start`;
}
function show(name, b) {
  const w = b.latency_ms.window;
  const ms = v => w.count ? `${v.toFixed(1)} ms` : "–";  // no frame in the last second
  const throttled = b.power && b.power.throttled ? "yes" : "no";
  const el = document.getElementById("stats-" + name);
  el.textContent = `fps ${b.fps.toFixed(1)} | e2e p50 ${ms(w.p50)} p99 ${ms(w.p99)} | ` +
    `${missedText(b)} | ladder ${b.ladder.name} | throttled ${throttled}`;
  el.className = "stats" + (b.miss_rate > 0 ? " missed" : "");
  (history[name] = history[name] || []).push(w.count ? [w.p50, w.p99] : [null, null]);
  if (history[name].length > 60) history[name].shift();
  draw(name, b.deadline.budget_ms);
}
async function tick() {
  let beats = {};
  try {
    beats = await (await fetch("/api/health" + q(), {cache: "no-store"})).json();
  } catch (e) {  // the agent restarts: say so, try again next second
    for (const name of SOURCES) {
      document.getElementById("stats-" + name).textContent = "no answer from the agent";
    }
    return;
  }
  for (const name of SOURCES) {
    try { if (beats[name]) show(name, beats[name]); } catch (e) { /* one odd heartbeat hides no other */ }
  }
}
for (const img of document.querySelectorAll("img")) {  // reconnect the stream after a restart
  img.onerror = () => setTimeout(() => { img.src = img.src.split("#")[0] + "#" + Date.now(); }, 2000);
}
setInterval(tick, 1000); tick();
</script></body></html>
"""

_SOURCE = """<div class="source"><h2>__NAME__</h2>
<img src="/stream/__NAME__.mjpg__Q__" alt="__NAME__ live">
<div class="stats" id="stats-__NAME__">waiting for the first heartbeat</div>
<canvas id="chart-__NAME__" width="480" height="150" role="img"
 aria-label="end-to-end latency of the last minute"></canvas>
<div class="legend" id="legend-__NAME__">__KEYS__<span id="legend-budget-__NAME__" hidden>
<i style="border-top: 2px dashed __BUDGET_COLOUR__"></i>budget</span></div></div>
"""


def page(sources: list[str], cfg: ViewConfig, device: str = "") -> str:
    """The page for these sources (names are the agent's: letters, digits, '-' and '_')."""
    q = f"?token={cfg.token}" if cfg.token else ""
    keys = "".join(
        f'<span><i style="border-top: 2px solid {colour}"></i>{label} end-to-end latency</span>'
        for label, colour in SERIES
    )
    block = _SOURCE.replace("__KEYS__", keys).replace("__BUDGET_COLOUR__", BUDGET_COLOUR)
    blocks = "".join(block.replace("__NAME__", html.escape(s)).replace("__Q__", q) for s in sources)
    return (
        _PAGE.replace("__SOURCES__", blocks)
        .replace("__NAMES__", json.dumps(sources))
        .replace("__TOKEN__", json.dumps(cfg.token))
        .replace("__DEVICE__", html.escape(device))
        .replace("__SERIES__", json.dumps(SERIES))
        .replace("__BUDGET_COLOUR__", BUDGET_COLOUR)
        .replace("__AXIS_COLOUR__", AXIS_COLOUR)
        .replace("__PAD__", json.dumps(PAD))
    )
