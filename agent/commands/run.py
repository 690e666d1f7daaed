"""``edge-agent run``: the agent until a signal, a frame count or a duration, with a status
line per heartbeat and a per-stage summary at exit."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from edge_agent.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    fail,
    latency_first_interpreter,
    setup_logging,
)

if TYPE_CHECKING:
    from edge_agent.pipelines.figures import LaneFigures

log = logging.getLogger("edge_agent")


def _status_line(beat: dict[str, Any]) -> str:
    """One line from the latest heartbeat."""
    from edge_agent.service.supervisor import e2e_text

    c, ladder = beat["counts"], beat["ladder"]
    step = f" | ladder: {ladder['name']}" if ladder["step"] else ""
    return (
        f"[{beat['uptime_s']:7.1f}s] {beat['source']}: {beat['fps']:6.1f} fps"
        f" | {e2e_text(beat['latency_ms']['window'], 6, 2)}"
        f" | on time {c['on_time']} late {c['late']} dropped {c['dropped']}{step}"
    )


def _summary(lane: LaneFigures, elapsed_s: float) -> str:
    c = lane.counts
    reasons = ", ".join(f"{k} {v}" for k, v in c.dropped_by_reason.items() if v) or "none"
    lines = [
        f"frames: captured {c.captured} = {c.on_time} on time + {c.late} late"
        f" + {c.dropped} dropped ({reasons})",
        f"throughput: {lane.published / elapsed_s if elapsed_s > 0 else 0.0:.1f} fps over {elapsed_s:.1f} s",
        f"{'stage':<12}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}",
    ]
    parts = [(f"  {k}", h) for k, h in lane.backend_parts.items()]  # timed by the backend
    for name, hist in [*lane.stages.items(), *parts, ("end-to-end", lane.total)]:
        p50, p90, p99 = (hist.percentile_ms(q) for q in (50, 90, 99))
        lines.append(f"{name:<12}{p50:9.3f}{p90:9.3f}{p99:9.3f}{hist.max_ns / 1e6:9.3f}")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    from edge_agent.core.effective.parse import ConfigFile
    from edge_agent.core.effective.render import load_effective
    from edge_agent.core.yamlnodes import is_stream
    from edge_agent.service.runner import Agent
    from edge_agent.service.sdnotify import Notifier
    from edge_agent.service.supervisor import Signals, Supervisor

    flags = _flags(args)
    source: str | ConfigFile | None = args.config

    def load():
        nonlocal source
        if isinstance(source, str) and is_stream(source):
            # stdin, a pipe or a FIFO is read once: a reload takes the same document (and
            # reads the overlay again); read again, a pipe is empty, a FIFO may never come
            source = ConfigFile.read(source)
        rendered = load_effective(source, args.device, args.overlay, check_files=True, flags=flags)
        if args.view:  # --view holds for the run, reloads included
            cfg = rendered.config
            rendered = dataclasses.replace(
                rendered, config=dataclasses.replace(cfg, view=dataclasses.replace(cfg.view, enabled=True))
            )
        return rendered

    # Before anything slow: a SIGHUP or SIGTERM at any moment is handled, never fatal.
    signals = Signals()
    signals.install()
    rendered = load()
    config = rendered.config
    setup_logging(config.log_level)
    latency_first_interpreter()
    if args.config and rendered.defaults_only:  # a truncated deploy must not pass unnoticed
        log.warning("%s is empty: running the embedded default (a synthetic camera)", args.config)
    notifier = Notifier.from_env()
    # A first TensorRT engine build can outlast TimeoutStartSec: ask for the time it needs.
    notifier.extend_timeout(900, "loading the model")
    agent = Agent(config, max_frames=args.frames or 0)
    if not _build(agent, signals.stop):
        # Nothing has started (no power profile, no socket): leave the loading behind.
        log.info("received %s while loading the model, stopping", signals.received)
        notifier.stopping()
        _exit_now(EXIT_OK)
    agent.start(signals.stop)
    log.info("running: %s", json.dumps(agent.describe()))
    if agent.view is not None and agent.view.url:  # no URL: its port was taken (logged, not fatal)
        print(f"live view: {agent.view.url}", file=sys.stderr, flush=True)
    t0 = time.monotonic()

    # Footprint after warm-up and at the end: a soak run (--duration) shows any growth.
    footprints: dict[str, Any] = {}
    show = _heartbeat_handler(args, agent, footprints)
    try:
        Supervisor(agent, notifier, signals, lambda: load().config, args.duration, show).run()
        if signals.received:
            log.info("received %s, stopping", signals.received)
    finally:
        clean = agent.stop()  # an exception above must still drain, publish and restore power
        notifier.close()
    _print_summaries(agent, time.monotonic() - t0, footprints)
    code = _exit_code(agent)
    if not clean:
        # A stage is stuck inside a backend or a driver: its frames are accounted, and
        # waiting for the thread could take forever (an interpreter exit joins it).
        log.error("a stage thread did not stop; exiting without waiting for it")
        _exit_now(code or EXIT_FAILED)
    return code


def _flags(args: argparse.Namespace) -> dict[str, tuple[str, object]]:
    """``--model``, ``--source`` and ``--budget-ms`` as the config's last layer (a reload
    keeps them); a source word no source reads is a usage error."""
    from edge_agent.core.source_config import source_from_text

    flags: dict[str, tuple[str, object]] = {}
    if args.model:  # its manifest is beside it or in it, not the config's model's
        path = os.path.abspath(os.path.expanduser(args.model))
        flags["--model"] = ("model", {"path": path, "manifest": args.manifest or ""})
    elif args.manifest:
        raise SystemExit(fail("--manifest goes with --model", EXIT_USAGE))
    if args.source is not None:
        try:
            flags["--source"] = ("source", source_from_text(args.source))
        except ValueError as e:
            raise SystemExit(fail(f"--source {e}", EXIT_USAGE)) from None
    if args.budget_ms is not None:  # positional notation: YAML reads no "1e-05" as a number
        flags["--budget-ms"] = ("deadline.budget_ms", f"{args.budget_ms:.9f}".rstrip("0").rstrip("."))
    return flags


def _heartbeat_handler(args: argparse.Namespace, agent: Any, footprints: dict[str, Any]):
    """The per-heartbeat callback: records footprints and prints the status lines."""

    def show(beat: dict[str, Any]) -> None:
        proc = beat.get("process", {})
        if "after_warmup" not in footprints and beat["uptime_s"] >= min(10.0, (args.duration or 60) / 10):
            footprints["after_warmup"] = (beat["uptime_s"], proc)
        footprints["last"] = (beat["uptime_s"], proc)
        if not args.quiet:
            beats = agent.health.latest_by_source if agent.health is not None else {}
            for b in beats.values() if len(beats) > 1 else (beat,):
                print(_status_line(b), file=sys.stderr, flush=True)

    return show


def _print_summaries(agent: Any, elapsed: float, footprints: dict[str, Any]) -> None:
    """The exit summary on stderr: per-source stages, batches and process footprints."""
    snap = agent.pipeline.figures()
    for lane in snap.lanes:
        title = f"source {lane.name}:\n" if len(snap.lanes) > 1 else ""
        print(title + _summary(lane, elapsed), file=sys.stderr, flush=True)
    if len(snap.lanes) > 1:
        print(f"batches: {snap.batching.summary()}", file=sys.stderr, flush=True)
    for when, (at, proc) in sorted(footprints.items(), key=lambda item: item[1][0]):
        rss_mib = proc["rss_bytes"] / 2**20 if proc.get("rss_bytes") else float("nan")
        print(
            f"process {when.replace('_', ' ')} ({at:.0f} s): RSS {rss_mib:.1f} MiB, "
            f"{proc.get('open_fds')} fds, {proc.get('threads')} threads",
            file=sys.stderr,
            flush=True,
        )


def _exit_code(agent: Any) -> int:
    """Prints the damaged sources and returns the run's exit code (a failure or lost frames)."""
    lanes = agent.pipeline.figures().lanes
    damaged = [f"source {lane.name}: {lane.damage}" for lane in lanes if lane.lost]
    for line in damaged:
        print(line, file=sys.stderr, flush=True)
    failure = agent.pipeline.failure()
    code = fail(failure) if failure else EXIT_OK
    if damaged and not code:
        code = fail("frames were lost to damaged input (above)")
    return code


def _build(agent: Any, stop: Any) -> bool:
    """``agent.build()`` (models loaded, engines built, warmed up) in a helper thread, so a
    stop signal is answered at once; False if ``stop`` came first (the thread is left)."""
    import threading

    error: list[BaseException] = []

    def build() -> None:
        try:
            agent.build()
        except BaseException as e:  # re-raised in the main thread
            error.append(e)

    loader = threading.Thread(target=build, name="load", daemon=True)
    loader.start()
    while loader.is_alive() and not stop.is_set():
        loader.join(0.05)
    if loader.is_alive():
        return False
    if error:
        raise error[0]
    return True


def _exit_now(code: int) -> None:
    """Exit without joining threads stuck in native code (os._exit), output flushed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
