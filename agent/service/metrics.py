"""Prometheus metrics, read from the agent's own counters and histograms at scrape time.

Nothing is observed per frame for Prometheus: the pipeline already keeps counts and
fixed-bucket latency histograms, and a custom collector turns them into Prometheus
families when scraped, so the hot path pays nothing. Latency buckets suit a 50 ms
budget; every value is in base units (seconds, hertz, watts, bytes).

Metric names (the Grafana dashboard in tools/ uses exactly these):

- ``edge_agent_frames_captured_total{source}``
- ``edge_agent_frames_published_total{source,outcome}`` (on_time | late)
- ``edge_agent_frames_dropped_total{source,reason}``
- ``edge_agent_frames_in_flight{source}``
- ``edge_agent_source_connected{source}``, ``edge_agent_source_failures_total{source}`` (live sources)
- ``edge_agent_stage_latency_seconds{source,stage}`` (histogram)
- ``edge_agent_end_to_end_latency_seconds{source}`` (histogram)
- ``edge_agent_deadline_budget_seconds{source}``, ``edge_agent_deadline_miss_ratio{source}``
- ``edge_agent_ladder_step{source,step}`` (the step index; the name as a label)
- ``edge_agent_inference_batches_total{size}`` (batches of several sources' frames, by size)
- ``edge_agent_model_info{model,backend,device}`` (always 1)
- power telemetry, where present: ``edge_agent_gpu_frequency_hertz``, ``edge_agent_gpu_load_ratio``,
  ``edge_agent_cpu_frequency_hertz{cpu}``, ``edge_agent_emc_frequency_hertz``,
  ``edge_agent_temperature_celsius{zone}``, ``edge_agent_rail_power_watts{rail}``,
  ``edge_agent_power_watts``, ``edge_agent_throttled``
- ``process_resident_memory_bytes``, ``process_cpu_seconds_total``, ... (the client's process collector)

The HTTP server is ``http_endpoint.HttpEndpoint`` (bounded connections and timeouts,
which prometheus_client's own server does not have). It has no authentication: keep it
on loopback (a warning says so otherwise) or firewalled.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from edge_agent.core.exposure import on_loopback
from edge_agent.core.latency import _UPPER, LatencyHistogram
from edge_agent.pipelines.figures import LaneFigures
from edge_agent.service.http_endpoint import CLOSE_WAIT_S, HttpEndpoint

log = logging.getLogger(__name__)

#: Seconds; dense below the 50 ms budget, a few beyond to show how late late is.
BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 1.0)


def histogram_buckets(h: LatencyHistogram) -> tuple[list[tuple[str, float]], float]:
    """Cumulative Prometheus buckets from a log-bucket histogram, and the sum in seconds.

    A sample is counted under a bound when its bucket's upper edge is at or below it,
    so counts are exact to the histogram's 2 % resolution.
    """
    counts = h.counts.copy()
    cum = np.cumsum(counts)
    out = []
    for bound in BUCKETS_S:
        idx = int(np.searchsorted(_UPPER, bound * 1e9, side="right")) - 1
        out.append((repr(bound), float(cum[idx]) if idx >= 0 else 0.0))
    out.append(("+Inf", float(cum[-1]) if len(cum) else 0.0))
    return out, h.total_ns / 1e9


class AgentCollector:
    """Reads the running agent at scrape time (the agent object stays the owner)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def collect(self):
        agent = self.agent
        pipeline = agent.pipeline
        if pipeline is None:
            return
        snap = pipeline.figures()
        yield from self._per_lane(snap.lanes)
        yield from self._analytics(snap.lanes)
        batches = CounterMetricFamily(
            "edge_agent_inference_batches", "Inference batches run, by size (frames)", labels=["size"]
        )
        for size, n in snap.batching.sizes.items():
            batches.add_metric([size], n)
        yield batches
        if agent.model is not None:
            info = agent.model.backend.describe()
            model = GaugeMetricFamily(
                "edge_agent_model_info", "Model and backend", labels=["model", "backend", "device"]
            )
            model.add_metric(
                [agent.model.manifest.name, str(info.get("backend", "")), str(info.get("device", "cpu"))], 1
            )
            yield model
        yield from self._power(agent.power)

    @staticmethod
    def _lane_families() -> dict[str, Any]:
        """The per-source families, empty, in the order they are filled."""
        return {
            "captured": CounterMetricFamily(
                "edge_agent_frames_captured", "Frames the source produced", labels=["source"]
            ),
            "published": CounterMetricFamily(
                "edge_agent_frames_published",
                "Frames published, by deadline outcome",
                labels=["source", "outcome"],
            ),
            "dropped": CounterMetricFamily(
                "edge_agent_frames_dropped", "Frames dropped, by reason", labels=["source", "reason"]
            ),
            "up": GaugeMetricFamily(
                "edge_agent_source_connected", "Live source delivering (1) or not", labels=["source"]
            ),
            "fails": CounterMetricFamily(
                "edge_agent_source_failures",
                "Camera failures (lost, errors, stalls, frozen)",
                labels=["source"],
            ),
            "in_flight": GaugeMetricFamily(
                "edge_agent_frames_in_flight", "Frames in the pipeline now", labels=["source"]
            ),
            "stage": HistogramMetricFamily(
                "edge_agent_stage_latency_seconds", "Time per pipeline stage", labels=["source", "stage"]
            ),
            "e2e": HistogramMetricFamily(
                "edge_agent_end_to_end_latency_seconds",
                "Capture to publish, per published frame",
                labels=["source"],
            ),
            "budget": GaugeMetricFamily(
                "edge_agent_deadline_budget_seconds", "The end-to-end budget", labels=["source"]
            ),
            "miss": GaugeMetricFamily(
                "edge_agent_deadline_miss_ratio", "Misses in the sliding window", labels=["source"]
            ),
            "step": GaugeMetricFamily(
                "edge_agent_ladder_step", "Degradation ladder step (0: normal)", labels=["source", "step"]
            ),
            "backend": CounterMetricFamily(
                "edge_agent_backend_counts",
                "What the backend counted (rows_dropped: rows past the most a frame keeps)",
                labels=["source", "name"],
            ),
        }

    @classmethod
    def _per_lane(cls, lanes: tuple[LaneFigures, ...]):
        """The per-source families filled from every lane (the live-source ones only if any)."""
        f = cls._lane_families()
        live = False
        for lane in lanes:
            src, c, deadline = lane.name, lane.counts, lane.deadline
            f["captured"].add_metric([src], c.captured)
            f["published"].add_metric([src, "on_time"], c.on_time)
            f["published"].add_metric([src, "late"], c.late)
            for reason, n in c.dropped_by_reason.items():
                f["dropped"].add_metric([src, reason], n)
            state = lane.source_state
            if "connected" in state:
                live = True
                f["up"].add_metric([src], float(bool(state["connected"])))
                f["fails"].add_metric([src], state.get("failures", 0))
            f["in_flight"].add_metric([src], c.in_flight)
            for name, h in lane.stages.items():
                buckets, total = histogram_buckets(h)
                f["stage"].add_metric([src, name], buckets, total)
            buckets, total = histogram_buckets(lane.total)
            f["e2e"].add_metric([src], buckets, total)
            f["budget"].add_metric([src], deadline.budget_ms / 1e3)
            f["miss"].add_metric([src], deadline.miss_rate)
            f["step"].add_metric([src, deadline.step_name], deadline.step)
            for name, n in lane.backend_counts.items():
                f["backend"].add_metric([src, name], n)
        yield from (f["captured"], f["published"], f["dropped"])
        if live:
            yield from (f["up"], f["fails"])
        yield from (f[k] for k in ("in_flight", "stage", "e2e", "budget", "miss", "step"))
        if any(lane.backend_counts for lane in lanes):
            yield f["backend"]

    @staticmethod
    def _analytics(lanes: tuple[LaneFigures, ...]):
        """Zones and lines, by source and label (only when a source has any)."""
        if not any(lane.analytics is not None for lane in lanes):
            return
        objects = GaugeMetricFamily(
            "edge_agent_zone_objects", "Tracks inside the zone now", labels=["source", "zone", "label"]
        )
        entries = CounterMetricFamily(
            "edge_agent_zone_entries", "Tracks that entered the zone", labels=["source", "zone", "label"]
        )
        exits = CounterMetricFamily(
            "edge_agent_zone_exits",
            "Tracks that left the zone (or ended in it)",
            labels=["source", "zone", "label"],
        )
        dwell = HistogramMetricFamily(
            "edge_agent_zone_dwell_seconds", "Time in the zone, per exit", labels=["source", "zone"]
        )
        crossings = CounterMetricFamily(
            "edge_agent_line_crossings",
            "Line crossings, once per track and direction",
            labels=["source", "line", "direction", "label"],
        )
        for lane in lanes:
            a = lane.analytics
            if a is None:
                continue
            for zone, z in a.zones.items():
                for label, n in z["entered"].items():  # a label once seen stays, at 0 when none is inside
                    objects.add_metric([lane.name, zone, label], z["objects"].get(label, 0))
                    entries.add_metric([lane.name, zone, label], n)
                for label, n in z["exited"].items():
                    exits.add_metric([lane.name, zone, label], n)
                d = z["dwell_s"]
                dwell.add_metric([lane.name, zone], list(d["buckets"].items()), d["sum"])
            for line, counts in a.lines.items():
                for direction in ("in", "out"):
                    for label, n in counts[direction].items():
                        crossings.add_metric([lane.name, line, direction, label], n)
        yield from (objects, entries, exits, dwell, crossings)

    @staticmethod
    def _power(power: Any):
        t = power.latest if power is not None else None
        if t is None:
            return
        gauges = [
            ("edge_agent_gpu_frequency_hertz", "GPU clock", t.gpu_freq_hz),
            (
                "edge_agent_gpu_load_ratio",
                "GPU load",
                None if t.gpu_load_pct is None else t.gpu_load_pct / 100,
            ),
            ("edge_agent_emc_frequency_hertz", "Memory clock", t.emc_hz),
            ("edge_agent_power_watts", "Total board power", None if t.total_mw is None else t.total_mw / 1e3),
        ]
        for name, text, value in gauges:
            if value is not None:
                yield GaugeMetricFamily(name, text, value=value)
        cpu = GaugeMetricFamily("edge_agent_cpu_frequency_hertz", "CPU clock per core", labels=["cpu"])
        for name, khz in t.cpu_freq_khz.items():
            cpu.add_metric([name], khz * 1e3)
        temps = GaugeMetricFamily(
            "edge_agent_temperature_celsius", "Thermal zone temperature", labels=["zone"]
        )
        for zone, celsius in t.temps_c.items():
            temps.add_metric([zone], celsius)
        rails = GaugeMetricFamily("edge_agent_rail_power_watts", "Power per INA3221 rail", labels=["rail"])
        for rail, mw in t.rails_mw.items():
            rails.add_metric([rail], mw / 1e3)
        yield from (cpu, temps, rails)
        yield GaugeMetricFamily(
            "edge_agent_throttled", "Throttling now (1) or not (0)", value=float(bool(power.throttled))
        )


class MetricsServer:
    """The Prometheus endpoint (``/metrics``) on a bounded ``HttpEndpoint`` (its limits are
    keyword arguments); failure to bind is logged, never fatal."""

    def __init__(self, collector: Any, host: str, port: int, **limits: Any) -> None:
        """``collector``: what the endpoint reports (``AgentCollector``, the uplink's own)."""
        self.registry = CollectorRegistry()
        self.registry.register(collector)
        self.registry.register(ProcessCollector(registry=None))
        self.http = HttpEndpoint(host, port, "/metrics", self._render, name="metrics", **limits)

    @property
    def host(self) -> str:
        return self.http.host

    @property
    def port(self) -> int:
        return self.http.port  # the real one once started, when 0 asked for any

    def _render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def start(self) -> None:
        self.http.start()
        if not self.http.listening:
            return
        if not on_loopback(self.host):
            log.warning(
                "metrics on %s: anyone who can reach the port reads the agent's metrics "
                "(there is no auth on /metrics); set metrics.host to 127.0.0.1 with a scraper "
                "on the device, or firewall the port",
                self.http.url,
            )
        log.info("metrics on %s", self.http.url)

    def stop(self, timeout_s: float = CLOSE_WAIT_S) -> bool:
        """Stop serving; True if the server thread ended within ``timeout_s``."""
        return self.http.close(timeout_s)

    def close(self) -> None:
        self.http.close()
