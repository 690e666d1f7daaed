"""The live view's page: plain HTML and a little JavaScript, no framework, no build step.
Each source's image is its MJPEG stream; its figures and a one-minute latency chart come
from ``/api/health`` once a second, drawn in the browser."""

from __future__ import annotations

import html
import json

from edge_agent.core.config import ViewConfig

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>edge-agent live view</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 16px; background: #111; color: #eee; }
.source { display: inline-block; vertical-align: top; margin: 0 16px 16px 0; }
.source img { display: block; max-width: 100%; background: #222; min-width: 320px; min-height: 180px; }
.stats { margin: 6px 0; font-family: ui-monospace, monospace; }
canvas { background: #1b1b1b; display: block; }
.missed { color: #ff6060; }
</style></head><body>
<h1>edge-agent: __DEVICE__</h1>
__SOURCES__
<script>
const TOKEN = __TOKEN__;
const SOURCES = __NAMES__;
const history = {};
function q() { return TOKEN ? "?token=" + encodeURIComponent(TOKEN) : ""; }
function draw(name, budget) {
  const c = document.getElementById("chart-" + name), g = c.getContext("2d"), h = history[name];
  g.clearRect(0, 0, c.width, c.height);
  const top = Math.max(budget * 1.5, ...h.map(p => p[1] || 0), 1);
  const y = v => c.height - 4 - (c.height - 8) * v / top, x = i => c.width * i / 59;
  g.strokeStyle = "#777"; g.setLineDash([4, 4]); g.beginPath();
  g.moveTo(0, y(budget)); g.lineTo(c.width, y(budget)); g.stroke();
  g.setLineDash([]);
  [[0, "#4fc3f7"], [1, "#ffb74d"]].forEach(([k, colour]) => {
    g.strokeStyle = colour; g.beginPath();
    let drawing = false;  // a second without frames (null) breaks the line
    h.forEach((p, i) => {
      const at = x(i + 60 - h.length);
      if (p[k] === null) { drawing = false; return; }
      if (drawing) g.lineTo(at, y(p[k])); else g.moveTo(at, y(p[k]));
      drawing = true;
    });
    g.stroke();
  });
}
function show(name, b) {
  const w = b.latency_ms.window, c = b.counts, missed = c.late + (c.dropped_by_reason.stale || 0);
  const ms = v => w.count ? `${v.toFixed(1)} ms` : "–";  // no frame in the last second
  const throttled = b.power && b.power.throttled ? "yes" : "no";
  const el = document.getElementById("stats-" + name);
  el.textContent = `fps ${b.fps.toFixed(1)} | e2e p50 ${ms(w.p50)} p99 ${ms(w.p99)} | ` +
    `missed ${missed} (${(100 * b.miss_rate).toFixed(1)}%) | ladder ${b.ladder.name} | ` +
    `throttled ${throttled}`;
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
<canvas id="chart-__NAME__" width="480" height="100"></canvas></div>
"""


def page(sources: list[str], cfg: ViewConfig, device: str = "") -> str:
    """The page for these sources (names are the agent's: letters, digits, '-' and '_')."""
    q = f"?token={cfg.token}" if cfg.token else ""
    blocks = "".join(_SOURCE.replace("__NAME__", html.escape(s)).replace("__Q__", q) for s in sources)
    return (
        _PAGE.replace("__SOURCES__", blocks)
        .replace("__NAMES__", json.dumps(sources))
        .replace("__TOKEN__", json.dumps(cfg.token))
        .replace("__DEVICE__", html.escape(device))
    )
