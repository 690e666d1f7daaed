"""``edge-agent bench`` and ``edge-agent tune``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from edge_agent.commands.common import (
    EXIT_OK,
    EXIT_USAGE,
    fail,
    latency_first_interpreter,
    load_config,
    setup_logging,
)

log = logging.getLogger("edge_agent")


def progress_line(line: str) -> None:
    """A phase begins: said on the terminal, so a long run is not silent."""
    print(f"bench: {line} ...", file=sys.stderr, flush=True)


def cmd_bench(args: argparse.Namespace) -> int:
    from edge_agent.bench.configs import with_model
    from edge_agent.bench.multi import run_multi_bench
    from edge_agent.bench.report import format_multi_report, format_report
    from edge_agent.bench.single import run_bench

    config = load_config(args.config)
    if args.manifest and not args.model:
        return fail("bench: --manifest goes with --model", EXIT_USAGE)
    if args.model:
        config = with_model(config, args.model, args.manifest or "")
    setup_logging("warning")
    latency_first_interpreter()
    # On stderr, tty or not (a run piped to a file is not silent); --json stays quiet.
    progress = progress_line if not args.json else lambda _line: None
    if args.emulate:
        return _bench_emulated(config, args, progress)
    if args.capacity or args.device_ms is not None:
        return fail("bench: --capacity and --device-ms go with --emulate RECORDING", EXIT_USAGE)
    # --source plays one file as one camera: it replaces the config's source(s).
    if args.sources or (len(config.source_list()) > 1 and not args.source):
        if args.source:
            return fail("bench: --source plays one file; --sources measures synthetic cameras", EXIT_USAGE)
        if args.compare_bare:
            return fail("bench: --compare-bare measures one source; not with several", EXIT_USAGE)
        result = run_multi_bench(
            config, args.sources, args.frames, args.source_fps, args.live_seconds, progress
        )
        print(json.dumps(result, indent=2) if args.json else format_multi_report(result))
        return EXIT_OK
    result = run_bench(
        config,
        args.frames,
        args.source_fps,
        args.live_seconds,
        progress,
        source=args.source,
        compare_bare=args.compare_bare,
    )
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    return EXIT_OK


def _bench_emulated(config: Any, args: argparse.Namespace, progress: Any) -> int:
    """``bench --emulate``: cameras on the emulated accelerator (``bench.capacity``)."""
    from edge_agent.bench.capacity import MAX_SOURCES, run_capacity
    from edge_agent.bench.configs import BenchError
    from edge_agent.bench.record import clip
    from edge_agent.bench.report import format_capacity_report
    from edge_agent.pipelines.backends.base import BackendError
    from edge_agent.pipelines.backends.recording import RecordingError
    from edge_agent.pipelines.sources.base import SourceError

    if not args.source:
        return fail("bench: --emulate needs --source: the frames the recording was made of", EXIT_USAGE)
    if args.compare_bare:
        return fail("bench: --compare-bare runs ONNX Runtime; not with --emulate", EXIT_USAGE)
    most = args.capacity or args.sources or 1
    if not 1 <= most <= MAX_SOURCES:
        flag = "--capacity" if args.capacity else "--sources"
        return fail(f"bench: {flag} {most}: must be within 1..{MAX_SOURCES}", EXIT_USAGE)
    device_ms = 5.0 if args.device_ms is None else args.device_ms
    if not 0 <= device_ms <= 1000:
        return fail("bench: --device-ms must be within 0..1000", EXIT_USAGE)
    try:
        images = clip(args.source, 300)
        result = run_capacity(
            config,
            os.path.abspath(args.emulate),
            os.path.abspath(args.source),
            images,
            device_ms=device_ms,
            fps=args.source_fps or 30.0,
            seconds=args.live_seconds,
            sources=args.sources or 1,
            search_to=args.capacity,
            progress=progress,
        )
    except (BenchError, BackendError, SourceError, RecordingError) as e:
        return fail(f"bench: {e}", EXIT_USAGE)
    print(json.dumps(result, indent=2) if args.json else format_capacity_report(result))
    return EXIT_OK


def cmd_record(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from edge_agent.bench.record import record_outputs
    from edge_agent.core.files import UnsafePathError
    from edge_agent.models.manifest import ModelError
    from edge_agent.pipelines.backends.base import BackendError
    from edge_agent.pipelines.sources.base import SourceError

    config = load_config(args.config)
    model = (
        replace(config.model, path=args.model, manifest=args.manifest or "") if args.model else config.model
    )
    setup_logging("warning")
    if args.frames < 1 or args.frames > 100_000:
        return fail("record-outputs: --frames must be within 1..100000", EXIT_USAGE)
    try:
        result = record_outputs(model, args.source, args.out, args.frames)
    except (ModelError, BackendError, SourceError, UnsafePathError, OSError) as e:
        return fail(f"record-outputs: {e}", EXIT_USAGE)
    print(
        f"recorded {result['frames']} frames ({result['distinct_frames']} distinct) of {result['model']}"
        f" into {result['recording']} ({result['bytes'] / 2**20:.1f} MiB)"
    )
    return EXIT_OK


def cmd_tune(args: argparse.Namespace) -> int:
    from pathlib import Path

    from edge_agent.tune.candidates import TuneSettings
    from edge_agent.tune.report import no_choice
    from edge_agent.tune.search import tune
    from edge_agent.tune.workload import FramesError, image_files

    setup_logging("warning")
    latency_first_interpreter()
    frames = os.path.abspath(args.frames) if args.frames else ""
    if frames:
        try:
            image_files(frames)  # before any config or model is loaded
        except FramesError as e:
            return fail(f"--frames: {e}", EXIT_USAGE)
    config = load_config(args.config, args.device)
    settings = TuneSettings(
        budget_ms=args.budget_ms if args.budget_ms else config.deadline.budget_ms,
        objective=args.objective,
        margin=args.margin,
        quick=args.quick,
        models=tuple(os.path.abspath(m) for m in args.model or ()),  # tuned.yaml lives elsewhere
        source_fps=args.source_fps,
        frames=frames,
    )
    try:
        chosen, grid, paths = tune(config, settings, Path(args.out))
    except FramesError as e:  # the config's own video file or image folder
        return fail(str(e))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if chosen is None:
        why = no_choice(grid, settings.budget_ms)
        return fail(f"{why[0].lower()}{why[1:]} (see {paths['report']})")
    agree = f", agreement {chosen.agreement:.3f}" if chosen.agreement is not None else ""
    print(f"chosen: {chosen.name} (p99 {chosen.e2e['p99']:.2f} ms{agree})")
    if chosen.reason:  # kept the current config, or changed it: against the measured noise
        print(chosen.reason)
    return EXIT_OK
