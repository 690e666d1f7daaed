"""The ``edge-agent`` command."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from typing import Any

from edge_agent import __version__

log = logging.getLogger("edge_agent")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _load_config(path: str | None):
    from edge_agent.config import load_config

    return load_config(path)


def _fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"edge-agent: error: {message}", file=sys.stderr)
    return code


# -- run ----------------------------------------------------------------------


def _status_line(elapsed_s: float, stats: Any, fps: float, window: Any) -> str:
    return (
        f"[{elapsed_s:7.1f}s] {fps:6.1f} fps | e2e p50 {window.percentile_ms(50):6.2f} ms "
        f"p99 {window.percentile_ms(99):6.2f} ms | published {stats.published} "
        f"late {stats.late} dropped {stats.dropped_total()}"
    )


def _summary(stats: Any, elapsed_s: float, skipped: int) -> str:
    lines = [
        f"frames: captured {stats.captured}, published {stats.published} "
        f"({stats.published - stats.late} on time, {stats.late} late), "
        f"dropped {stats.dropped_total()} {dict((k, v) for k, v in stats.dropped.items() if v)}, "
        f"skipped at source {skipped}",
        f"throughput: {stats.published / elapsed_s if elapsed_s > 0 else 0.0:.1f} fps over {elapsed_s:.1f} s",
        f"{'stage':<12}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}",
    ]
    for name, hist in [*stats.stages.items(), ("end-to-end", stats.total)]:
        lines.append(
            f"{name:<12}{hist.percentile_ms(50):9.3f}{hist.percentile_ms(99):9.3f}{hist.max_ns / 1e6:9.3f}"
        )
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    from edge_agent.configload import ConfigError
    from edge_agent.runner import Agent

    try:
        config = _load_config(args.config)
    except ConfigError as e:
        return _fail(f"invalid config:\n{e}", EXIT_USAGE)
    _setup_logging(config.log_level)
    agent = Agent(config, max_frames=args.frames or 0)
    try:
        agent.build()
    except (ConfigError, RuntimeError, OSError, ValueError) as e:
        return _fail(str(e))
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        agent.start()
    except (RuntimeError, OSError) as e:
        return _fail(str(e))
    assert agent.pipeline is not None
    pipeline, stats = agent.pipeline, agent.pipeline.stats
    log.info("running: %s", json.dumps(agent.describe()))
    t0 = time.monotonic()
    last_t, last_published = t0, 0
    while not stop.is_set():
        stop.wait(min(1.0, args.status_interval))
        now = time.monotonic()
        if pipeline.finished.is_set():
            break
        if args.duration and now - t0 >= args.duration:
            break
        if now - last_t >= args.status_interval and not args.quiet:
            fps = (stats.published - last_published) / (now - last_t)
            print(_status_line(now - t0, stats, fps, stats.take_window()), file=sys.stderr, flush=True)
            last_t, last_published = now, stats.published
    clean = agent.stop()
    elapsed = time.monotonic() - t0
    print(_summary(stats, elapsed, pipeline.source.skipped), file=sys.stderr, flush=True)
    if pipeline.error:
        return _fail(pipeline.error)
    return EXIT_OK if clean else EXIT_FAILED


# -- listen -------------------------------------------------------------------


def _format_result(msg: dict[str, Any]) -> str:
    dets = " ".join(
        f"{d['label']}:{d['score']:.2f}@[{','.join(f'{v:.0f}' for v in d['box_xyxy'])}]"
        for d in msg["detections"]
    )
    lat = msg["latency_ms"]
    late = " LATE" if msg.get("deadline_missed") else ""
    return f"{msg['source']} seq={msg['seq']} frame={msg['frame_id']} e2e={lat['total']:.2f}ms{late} {dets}"


def cmd_listen(args: argparse.Namespace) -> int:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.SUB)
    sock.linger = 0
    sock.rcvtimeo = int(args.timeout * 1000) if args.timeout else -1
    sock.connect(args.endpoint)
    for topic in args.topic or [""]:
        sock.subscribe(topic)
    count = 0
    try:
        while not args.count or count < args.count:
            try:
                raw = sock.recv()
            except zmq.Again:
                return _fail(f"no message from {args.endpoint} within {args.timeout} s")
            topic, _, body = raw.partition(b" ")
            if args.json:
                print(body.decode(), flush=True)
            else:
                msg = json.loads(body)
                print(
                    _format_result(msg) if "detections" in msg else f"{topic.decode()} {body.decode()}",
                    flush=True,
                )
            count += 1
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        ctx.term()
    return EXIT_OK


# -- config -------------------------------------------------------------------


def cmd_config(args: argparse.Namespace) -> int:
    from edge_agent.configload import ConfigError, dump

    try:
        config = _load_config(args.file)
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return EXIT_FAILED
    if args.config_command == "validate":
        print(f"{args.file}: OK")
    else:
        print(dump(config), end="")
    return EXIT_OK


# -- eval ---------------------------------------------------------------------


def cmd_eval(args: argparse.Namespace) -> int:
    from edge_agent.configload import ConfigError
    from edge_agent.evaluation import evaluate

    try:
        config = _load_config(args.config)
    except ConfigError as e:
        return _fail(f"invalid config:\n{e}", EXIT_USAGE)
    model = config.model
    if args.model:
        from dataclasses import replace

        model = replace(model, path=args.model, manifest=args.manifest or "")
    try:
        result = evaluate(model, config.backend, args.frames)
    except (RuntimeError, ValueError, OSError) as e:
        return _fail(str(e))
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edge-agent", description=__doc__)
    p.add_argument("--version", action="version", version=f"edge-agent {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the agent (no arguments: the embedded default)")
    run.add_argument("--config", "-c", help="YAML config file (default: the embedded default)")
    run.add_argument("--frames", type=int, default=0, help="stop after N frames captured")
    run.add_argument("--duration", type=float, default=0.0, help="stop after S seconds")
    run.add_argument("--status-interval", type=float, default=1.0, help="seconds between status lines")
    run.add_argument("--quiet", "-q", action="store_true", help="no status lines, only the summary")
    run.set_defaults(func=cmd_run)

    listen = sub.add_parser("listen", help="subscribe to a result stream and print it")
    listen.add_argument("endpoint", nargs="?", default="tcp://127.0.0.1:5556")
    listen.add_argument("--topic", action="append", help="topic prefix (repeatable; default: all)")
    listen.add_argument("--json", action="store_true", help="print each message body as JSON")
    listen.add_argument("--count", type=int, default=0, help="exit after N messages")
    listen.add_argument("--timeout", type=float, default=0.0, help="fail if no message for S seconds")
    listen.set_defaults(func=cmd_listen)

    cfg = sub.add_parser("config", help="check or show a config file")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    v = cfg_sub.add_parser("validate", help="check a config file; errors name file, line and key")
    v.add_argument("file")
    s = cfg_sub.add_parser("show", help="print the effective config (defaults filled in)")
    s.add_argument("file", nargs="?", default=None)
    cfg.set_defaults(func=cmd_config)

    ev = sub.add_parser("eval", help="score a model on held-out synthetic frames (mAP@0.5)")
    ev.add_argument("--config", "-c", help="YAML config (its model and backend sections)")
    ev.add_argument("--model", help="ONNX file (default: the config's model, else the bundled one)")
    ev.add_argument("--manifest", help="manifest for --model")
    ev.add_argument("--frames", type=int, default=500)
    ev.add_argument("--json", action="store_true")
    ev.set_defaults(func=cmd_eval)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
