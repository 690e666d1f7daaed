"""Commands about a model: ``eval``, ``models check``, ``engine build`` and the device's
``selftest``."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging

from edge_agent.commands.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail, load_config, setup_logging

log = logging.getLogger("edge_agent")


def cmd_eval(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from edge_agent.checks.evaluation import evaluate

    config = load_config(args.config)
    model = config.model
    if args.model:
        model = replace(model, path=args.model, manifest=args.manifest or "")
    result = evaluate(model, config.backend, args.frames)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"model: {result['model']}")
        print(f"held-out synthetic frames: {result['frames']}")
        print(f"mAP@0.5: {result['map50']:.4f}")
        for name, ap in result["ap50_per_class"].items():
            print(f"  AP@0.5 {name:<10} {ap:.4f}")
        print(f"mean time per frame (preprocess+infer+decode): {result['mean_frame_ms']:.2f} ms")
    return EXIT_OK


def cmd_models(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from pathlib import Path

    from edge_agent.checks.modelcheck import check_model, write_manifest
    from edge_agent.core.text import printable
    from edge_agent.models.manifest import ModelError
    from edge_agent.pipelines.backends.base import BackendError

    config = load_config(args.config)
    model = replace(config.model, path=args.model, manifest=args.manifest or "")
    setup_logging("error")  # the check prints the assumptions itself
    try:
        report, loaded = check_model(model, config.backend, args.frames, config.deadline.budget_ms)
    except (ModelError, BackendError) as e:  # the model, or the backend refused it
        print(f"refused: {printable(str(e), None)}")  # it may quote the model's own text
        return EXIT_USAGE
    print(report.format())
    if args.write_manifest is not None:
        target = args.write_manifest or str(Path(args.model).with_suffix(".yaml"))
        try:
            print(f"manifest written: {write_manifest(loaded.manifest, target, args.force)}")
        except FileExistsError as e:
            return fail(str(e), EXIT_USAGE)
    print("ok: the agent runs this model" + ("" if report.fits else ", but not within the deadline (above)"))
    return EXIT_OK


def cmd_engine_build(args: argparse.Namespace) -> int:
    from edge_agent.core.model_config import TensorRTConfig
    from edge_agent.models.manifest import resolve_model
    from edge_agent.pipelines.backends.tensorrt import TensorRTBackend

    setup_logging("info")
    cfg = TensorRTConfig(
        precision=args.precision,
        dla_core=args.dla_core,
        gpu_fallback=not args.no_gpu_fallback,
        workspace_mib=args.workspace_mib,
        optimization_level=args.optimization_level,
        calibration_images=args.calibration_images or "",
        preprocess=args.preprocess,
        cache_dir=args.cache_dir or TensorRTConfig().cache_dir,
        cuda_graphs="off",  # a build runs nothing: graphs are captured by `run`, per frame slot
    )
    resolved = resolve_model(args.model or "", args.manifest or "")
    with contextlib.closing(TensorRTBackend(cfg)) as backend:
        backend.load(resolved.path, resolved.manifest.input.format())
        print(json.dumps(backend.describe(), indent=2))
    return EXIT_OK


def cmd_selftest(args: argparse.Namespace) -> int:
    from edge_agent.checks.selftest import run_selftest, write_report

    setup_logging("warning")
    checks = run_selftest(args.frames, args.cache_dir or "")
    for c in checks:
        print(f"{c.status.upper():5} {c.name:<16} {c.detail}")
    json_path, md_path = write_report(checks, args.report)
    print(f"report: {json_path} and {md_path}")
    return EXIT_FAILED if any(c.status == "fail" for c in checks) else EXIT_OK
