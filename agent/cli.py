"""edge-agent: a real-time inference agent for NVIDIA Jetson (and any Linux box).

It reads frames from cameras, video files or image folders, runs a detector (TensorRT on a
Jetson, ONNX Runtime on the CPU elsewhere) and publishes every result on a ZeroMQ stream,
holding a per-frame deadline (capture to publish, 50 ms by default) and reporting where
every millisecond went. `edge-agent run` with no arguments runs the embedded default: a
synthetic camera and the bundled detector, results on tcp://127.0.0.1:5556.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import time
from typing import Any, ClassVar, get_args, get_type_hints

from edge_agent import __version__

log = logging.getLogger("edge_agent")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _JournalFormatter(logging.Formatter):
    """sd-daemon(3) priority prefixes (``<3>`` error ... ``<7>`` debug): journald files each
    line at its level, and adds the timestamp itself."""

    _PRIORITY: ClassVar[dict[int, int]] = {
        logging.CRITICAL: 2,
        logging.ERROR: 3,
        logging.WARNING: 4,
        logging.INFO: 6,
        logging.DEBUG: 7,
    }

    def format(self, record: logging.LogRecord) -> str:
        text = f"{record.name}: {record.getMessage()}"
        if record.exc_info:
            text += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        return f"<{self._PRIORITY.get(record.levelno, 6)}>{text}"


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):  # set by systemd when stderr goes to the journal
        handler.setFormatter(_JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])


def _latency_first_interpreter() -> None:
    # A thread that wakes (a frame arrived, inference ended) waits for the GIL until the
    # running thread yields it, by default after up to 5 ms: a whole stage's budget.
    # 0.5 ms bounds that wait at the cost of a few more interpreter switches.
    sys.setswitchinterval(0.0005)


def _load_config(
    path: str | None,
    device: str | None = None,
    overlay: str | None = None,
    check_files: bool = False,
    resolve_paths: bool = True,
):
    """The effective config (see ``fleet.load_effective``): a file, a fleet's device or the
    embedded default, with the overlay and ``EDGE_AGENT__`` variables applied.
    ``check_files`` (what ``run`` loads): a missing input file is a config error naming its
    line. ``resolve_paths`` false: paths as written (to compare configs, not run them)."""
    from edge_agent.fleet import load_effective

    return load_effective(path, device, overlay, check_files=check_files, resolve_paths=resolve_paths).config


def _problem_lines(e: Any, limit: int = 12) -> str:
    """A config error's problems, one a line, at most ``limit`` of them."""
    lines = [str(p) for p in e.problems]
    if len(lines) > limit:
        lines = [*lines[: limit - 1], f"... and {len(lines) - limit + 1} more problems"]
    return "\n".join(lines)


def _fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"edge-agent: error: {message}", file=sys.stderr)
    return code


# -- run ----------------------------------------------------------------------


def _status_line(beat: dict[str, Any]) -> str:
    """One line from the latest heartbeat."""
    w, c = beat["latency_ms"]["window"], beat["counts"]
    ladder = beat["ladder"]
    step = f" | ladder: {ladder['name']}" if ladder["step"] else ""
    return (
        f"[{beat['uptime_s']:7.1f}s] {beat['source']}: {beat['fps']:6.1f} fps"
        f" | e2e p50 {w['p50']:6.2f} ms p99 {w['p99']:6.2f} ms"
        f" | on time {c['on_time']} late {c['late']} dropped {c['dropped']}{step}"
    )


def _summary(stats: Any, elapsed_s: float) -> str:
    c = stats.counts()
    reasons = ", ".join(f"{k} {v}" for k, v in c["dropped_by_reason"].items() if v) or "none"
    lines = [
        f"frames: captured {c['captured']} = {c['on_time']} on time + {c['late']} late"
        f" + {c['dropped']} dropped ({reasons})",
        f"throughput: {stats.published / elapsed_s if elapsed_s > 0 else 0.0:.1f} fps over {elapsed_s:.1f} s",
        f"{'stage':<12}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}",
    ]
    parts = [(f"  {k}", h) for k, h in stats.backend_parts.items()]  # timed by the backend
    for name, hist in [*stats.stages.items(), *parts, ("end-to-end", stats.total)]:
        p50, p90, p99 = (hist.percentile_ms(q) for q in (50, 90, 99))
        lines.append(f"{name:<12}{p50:9.3f}{p90:9.3f}{p99:9.3f}{hist.max_ns / 1e6:9.3f}")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    from edge_agent.fleet import load_effective
    from edge_agent.runner import Agent
    from edge_agent.sdnotify import Notifier
    from edge_agent.service import Signals, Supervisor

    def load():
        return load_effective(args.config, args.device, args.overlay, check_files=True)

    # Before anything slow: a SIGHUP or SIGTERM at any moment is handled, never fatal.
    signals = Signals()
    signals.install()
    rendered = load()
    config = rendered.config
    _setup_logging(config.log_level)
    _latency_first_interpreter()
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
    t0 = time.monotonic()

    # Footprint after warm-up and at the end: a soak run (--duration) shows any growth.
    footprints: dict[str, Any] = {}

    def show(beat: dict[str, Any]) -> None:
        proc = beat.get("process", {})
        if "after_warmup" not in footprints and beat["uptime_s"] >= min(10.0, (args.duration or 60) / 10):
            footprints["after_warmup"] = (beat["uptime_s"], proc)
        footprints["last"] = (beat["uptime_s"], proc)
        if not args.quiet:
            beats = agent.health.latest_by_source if agent.health is not None else {}
            for b in beats.values() if len(beats) > 1 else (beat,):
                print(_status_line(b), file=sys.stderr, flush=True)

    try:
        Supervisor(agent, notifier, signals, lambda: load().config, args.duration, show).run()
        if signals.received:
            log.info("received %s, stopping", signals.received)
    finally:
        clean = agent.stop()  # an exception above must still drain, publish and restore power
        notifier.close()
    elapsed = time.monotonic() - t0
    for lane in agent.pipeline.lanes:
        title = f"source {lane.name}:\n" if len(agent.pipeline.lanes) > 1 else ""
        print(title + _summary(lane.stats, elapsed), file=sys.stderr, flush=True)
    if len(agent.pipeline.lanes) > 1:
        print(f"batches: {agent.pipeline.scheduler.summary()}", file=sys.stderr, flush=True)
    for when, (at, proc) in sorted(footprints.items(), key=lambda item: item[1][0]):
        rss_mib = proc["rss_bytes"] / 2**20 if proc.get("rss_bytes") else float("nan")
        print(
            f"process {when.replace('_', ' ')} ({at:.0f} s): RSS {rss_mib:.1f} MiB, "
            f"{proc.get('open_fds')} fds, {proc.get('threads')} threads",
            file=sys.stderr,
            flush=True,
        )
    lanes = agent.pipeline.lanes
    damaged = [f"source {lane.name}: {lane.source.damage}" for lane in lanes if lane.source.lost]
    for line in damaged:
        print(line, file=sys.stderr, flush=True)
    failure = agent.pipeline.failure()
    code = _fail(failure) if failure else EXIT_OK
    if damaged and not code:
        code = _fail("frames were lost to damaged input (above)")
    if not clean:
        # A stage is stuck inside a backend or a driver: its frames are accounted, and
        # waiting for the thread could take forever (an interpreter exit joins it).
        log.error("a stage thread did not stop; exiting without waiting for it")
        _exit_now(code or EXIT_FAILED)
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


# -- listen -------------------------------------------------------------------


def _format_result(msg: Any) -> str:
    dets = " ".join(
        f"{d.label}:{d.score:.2f}@[{','.join(f'{v:.0f}' for v in d.box_xyxy)}]" for d in msg.detections
    )
    late = " LATE" if msg.deadline_missed else ""
    gap = f" (lost {msg.gap})" if msg.gap else ""
    e2e = msg.latency_ms.get("total", 0.0)
    return f"{msg.source} seq={msg.seq}{gap} frame={msg.frame_id} e2e={e2e:.2f}ms{late} {dets}"


def _joined(gaps: Any, topic: str) -> str:
    seq = gaps.joined.get(topic, 0)
    return f"joined at seq {seq}" + (f": {seq} earlier not received" if seq else "")


def cmd_listen(args: argparse.Namespace) -> int:
    import numpy as np
    import zmq

    from edge_agent.client import GapTracker, Health, connect, decode, parse

    topics = tuple(args.topic or [""])
    sock = connect(args.endpoint, topics, args.server_key, args.client_cert)
    sock.rcvtimeo = 200
    gaps = GapTracker()
    per_topic: dict[str, list[float]] = {}  # result latencies since the last stats line
    count, t_last, t_start = 0, time.monotonic(), time.monotonic()
    nothing_yet_s = 3.0  # then say where we listen: a wrong endpoint looks like a quiet agent
    try:
        while not args.count or count < args.count:
            try:
                frame = sock.recv()
            except zmq.Again:
                silent_s = time.monotonic() - t_last
                if args.timeout and silent_s > args.timeout:
                    return _fail(f"no message from {args.endpoint} within {args.timeout} s")
                if not count and nothing_yet_s and silent_s > nothing_yet_s:
                    print(
                        f"listen: nothing received yet from {args.endpoint} (topics: "
                        f"{', '.join(repr(t) for t in topics)}); is an agent publishing there?",
                        file=sys.stderr,
                        flush=True,
                    )
                    nothing_yet_s = 0.0
                continue
            t_last = time.monotonic()
            topic, body = decode(frame)
            first = topic not in gaps.last
            msg = parse(topic, body, gaps.update(topic, int(body["seq"])) if "seq" in body else 0)
            count += 1
            if args.stats:
                if not isinstance(msg, Health):
                    per_topic.setdefault(topic, []).append(msg.latency_ms.get("total", 0.0))
                if t_last - t_start >= 1.0:
                    for name, lat in per_topic.items():
                        a = np.asarray(lat)
                        print(
                            f"{name.partition('.')[2] or name}: {len(a) / (t_last - t_start):6.1f} msg/s"
                            f"  e2e p50 {np.percentile(a, 50):6.2f} ms "
                            f"p99 {np.percentile(a, 99):6.2f} ms  lost {gaps.lost.get(name, 0)}"
                            f" ({_joined(gaps, name)})",
                            flush=True,
                        )
                    per_topic, t_start = {}, t_last
            elif args.json:
                print(json.dumps(body), flush=True)
            elif isinstance(msg, Health):
                c = msg.counts
                print(
                    f"{topic} fps={msg.fps:.1f} captured={c.get('captured')} late={c.get('late')} "
                    f"dropped={c.get('dropped')}{' final' if msg.final else ''}",
                    flush=True,
                )
            else:
                if first and gaps.joined[topic]:
                    print(f"{topic}: {_joined(gaps, topic)}", flush=True)
                print(_format_result(msg), flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return EXIT_OK


def cmd_keys(args: argparse.Namespace) -> int:
    from pathlib import Path

    import zmq.auth

    name = args.name
    if not name or name.startswith(".") or not all(c.isalnum() or c in "._-" for c in name):
        return _fail(
            f"key name {name!r}: use a plain file name (letters, digits, '.', '_', '-'; not starting "
            "with '.'); the folder goes in --dir",
            EXIT_USAGE,
        )
    folder = Path(args.dir)
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    existing = [str(p) for p in (public, secret) if p.exists()]
    if existing and not args.force:
        return _fail(
            f"{' and '.join(existing)}: already there; a new key pair replaces the identity that "
            "the other side trusts (use --force to replace it)",
            EXIT_USAGE,
        )
    if not folder.is_dir():
        folder.mkdir(parents=True)
        folder.chmod(0o700)  # a folder made for keys; an existing one (".") keeps its mode
    # The secret certificate is the identity: readable by its owner only, from its first byte.
    old_umask = os.umask(0o077)
    try:
        zmq.auth.create_certificates(str(folder), name)
    finally:
        os.umask(old_umask)
    os.chmod(secret, 0o600)
    os.chmod(public, 0o644)
    print(f"public key (give it to the other side): {public}")
    print(f"secret key (keep it here, mode 600): {secret}")
    return EXIT_OK


# -- config -------------------------------------------------------------------


def cmd_config(args: argparse.Namespace) -> int:
    from edge_agent.core.configload import ConfigError, dump, to_plain
    from edge_agent.fleet import diff_configs, load_fleet

    if args.config_command == "validate":
        try:
            return _validate(args.file)
        except ConfigError as e:  # the problems alone, one a line: this command's whole answer
            print(_problem_lines(e), file=sys.stderr)
            return EXIT_USAGE
    elif args.config_command == "render":
        # Paths as written: the rendered config is for a device, not for this machine.
        rendered = load_fleet(args.fleet).render(args.device, overlay=args.overlay, resolve_paths=False)
        if args.explain:
            for key, origin in sorted(rendered.origins.items()):
                print(f"{key}: {origin}")
        else:
            print(dump(rendered.config), end="")
    elif args.config_command == "diff":
        # Paths as written: two checkouts of one fleet do not differ by where they lie.
        a, b = (to_plain(_load_config(p, args.device, resolve_paths=False)) for p in (args.a, args.b))
        print("\n".join(diff_configs(a, b)) or "no differences")
    else:
        print(dump(_load_config(args.file, args.device)), end="")
    return EXIT_OK


def _validate(path: str) -> int:
    from edge_agent.core.configload import ConfigError
    from edge_agent.fleet import is_fleet, load_effective, load_fleet, validate_fleet

    if is_fleet(path):
        problems = validate_fleet(path)
        if problems:
            raise ConfigError(problems)
        fleet = load_fleet(path)
        print(f"{path}: OK ({len(fleet.device_ids())} devices, {len(fleet.group_names())} groups)")
        print("the files a device's config names are checked on the device, when it loads its config")
        return EXIT_OK
    rendered = load_effective(path, check_files=True)
    note = " (empty: the embedded default, every key at its default)" if rendered.defaults_only else ""
    print(f"{path}: OK{note}")
    return EXIT_OK


# -- eval ---------------------------------------------------------------------


def cmd_eval(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from edge_agent.evaluation import evaluate

    config = _load_config(args.config)
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


# -- models -------------------------------------------------------------------


def cmd_models(args: argparse.Namespace) -> int:
    from dataclasses import replace
    from pathlib import Path

    from edge_agent.modelcheck import check_model, write_manifest
    from edge_agent.models.manifest import ModelError
    from edge_agent.pipelines.backends.base import BackendError

    config = _load_config(args.config)
    model = replace(config.model, path=args.model, manifest=args.manifest or "")
    _setup_logging("error")  # the check prints the assumptions itself
    try:
        report, loaded = check_model(model, config.backend, args.frames)
    except (ModelError, BackendError) as e:  # the model, or the backend refused it
        print(f"refused: {e}")
        return EXIT_USAGE
    print(report.format())
    if args.write_manifest is not None:
        target = args.write_manifest or str(Path(args.model).with_suffix(".yaml"))
        try:
            print(f"manifest written: {write_manifest(loaded.manifest, target, args.force)}")
        except FileExistsError as e:
            return _fail(str(e), EXIT_USAGE)
    print("ok: the agent runs this model")
    return EXIT_OK


# -- bench --------------------------------------------------------------------


def _progress(line: str) -> None:
    """A phase begins: said on the terminal, so a long run is not silent."""
    print(f"bench: {line} ...", file=sys.stderr, flush=True)


def cmd_bench(args: argparse.Namespace) -> int:
    from edge_agent.bench import format_multi_report, format_report, run_bench, run_multi_bench, with_model

    config = _load_config(args.config)
    if args.manifest and not args.model:
        return _fail("bench: --manifest goes with --model", EXIT_USAGE)
    if args.model:
        config = with_model(config, args.model, args.manifest or "")
    _setup_logging("warning")
    _latency_first_interpreter()
    progress = _progress if sys.stderr.isatty() and not args.json else lambda _line: None
    # --source plays one file as one camera: it replaces the config's source(s).
    if args.sources or (len(config.source_list()) > 1 and not args.source):
        if args.source:
            return _fail("bench: --source plays one file; --sources measures synthetic cameras", EXIT_USAGE)
        if args.compare_bare:
            return _fail("bench: --compare-bare measures one source; not with several", EXIT_USAGE)
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


# -- engine / selftest ----------------------------------------------------------


def cmd_engine_build(args: argparse.Namespace) -> int:
    from edge_agent.core.config import TensorRTConfig
    from edge_agent.models.manifest import resolve_model
    from edge_agent.pipelines.backends.tensorrt import TensorRTBackend

    _setup_logging("info")
    cfg = TensorRTConfig(
        precision=args.precision,
        dla_core=args.dla_core,
        gpu_fallback=not args.no_gpu_fallback,
        workspace_mib=args.workspace_mib,
        optimization_level=args.optimization_level,
        calibration_images=args.calibration_images or "",
        preprocess=args.preprocess,
        cache_dir=args.cache_dir or TensorRTConfig().cache_dir,
    )
    resolved = resolve_model(args.model or "", args.manifest or "")
    with contextlib.closing(TensorRTBackend(cfg)) as backend:
        backend.load(resolved.path, resolved.manifest.input.format())
        print(json.dumps(backend.describe(), indent=2))
    return EXIT_OK


def cmd_selftest(args: argparse.Namespace) -> int:
    from edge_agent.selftest import run_selftest, write_report

    _setup_logging("warning")
    checks = run_selftest(args.frames, args.cache_dir or "")
    for c in checks:
        print(f"{c.status.upper():5} {c.name:<16} {c.detail}")
    json_path, md_path = write_report(checks, args.report)
    print(f"report: {json_path} and {md_path}")
    return EXIT_FAILED if any(c.status == "fail" for c in checks) else EXIT_OK


# -- power ----------------------------------------------------------------------


def _power_config(args: argparse.Namespace):
    from dataclasses import replace

    cfg = _load_config(args.config).power  # files unchecked: a restore never depends on a model
    if args.root:
        cfg = replace(cfg, root=args.root)
    if args.state_file:
        cfg = replace(cfg, state_file=args.state_file)
    return cfg


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def cmd_power(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from edge_agent.power import sysfs
    from edge_agent.power.controller import make_controller
    from edge_agent.power.manager import PowerManager, recover, throttle_reasons
    from edge_agent.power.state import load_state

    _setup_logging("warning")
    cfg = _power_config(args)
    controller = make_controller(cfg)
    if args.power_command == "status":
        info = sysfs.detect(cfg.root)
        t = sysfs.read_telemetry(cfg.root)
        pending = load_state(cfg.state_file)
        report = {
            "jetson": info.is_jetson,
            "module": info.module,
            "model": info.model,
            "l4t": info.l4t,
            "backend": controller.name,
            "telemetry": asdict(t),
            "throttle_reasons": throttle_reasons(t, cfg),  # the lock itself is not known here
            "state_file": cfg.state_file,
            "state_to_restore": pending is not None,
        }
        if args.json:
            print(json.dumps(report, indent=2))
            return EXIT_OK
        print(
            f"device: {info.model or 'not a Jetson'}"
            + (f" ({info.module}, {info.l4t})" if info.is_jetson else "")
        )
        if not info.is_jetson:
            print("not a Jetson: read-only; the power profile cannot be applied here")
        print(f"backend: {controller.name}")
        gpu = f"{t.gpu_freq_hz / 1e6:.0f} MHz" if t.gpu_freq_hz else "unknown"
        print(f"GPU: {gpu}, load {t.gpu_load_pct if t.gpu_load_pct is not None else 'unknown'} %")
        print(
            "temperatures: " + (", ".join(f"{k} {v:.1f} °C" for k, v in t.temps_c.items()) or "none readable")
        )
        rails = ", ".join(f"{k} {v:.0f} mW" for k, v in t.rails_mw.items())
        print(
            "power: "
            + (rails or "no rails readable")
            + (f"; total {t.total_mw:.0f} mW" if t.total_mw else "")
        )
        for reason in report["throttle_reasons"]:
            print(f"THROTTLED: {reason}")
        if pending is not None:
            print(f"a saved state waits in {cfg.state_file}: run `edge-agent power restore`")
        return EXIT_OK
    if args.power_command == "apply":
        for line in recover(cfg, controller):
            print(f"restored first: {line}")
        if not cfg.changes_anything():
            print("the config's power section changes nothing")
            return EXIT_OK
        # SIGTERM (systemd's start timeout, say) mid-apply must still undo what was done.
        signal.signal(signal.SIGTERM, _raise_interrupt)
        # The state stays saved: `power restore` (or the agent's next start) puts it back.
        done = PowerManager(cfg, controller).apply_profile()
        for line in done:
            print(line)
        print(f"previous state saved in {cfg.state_file}; `edge-agent power restore` puts it back")
        return EXIT_OK
    done = recover(cfg, controller)
    print("\n".join(done) if done else f"nothing to restore ({cfg.state_file} holds no state)")
    return EXIT_OK


def cmd_tune(args: argparse.Namespace) -> int:
    from pathlib import Path

    from edge_agent.tune import FramesError, TuneSettings, image_files, no_choice, tune

    _setup_logging("warning")
    _latency_first_interpreter()
    frames = os.path.abspath(args.frames) if args.frames else ""
    if frames:
        try:
            image_files(frames)  # before any config or model is loaded
        except FramesError as e:
            return _fail(f"--frames: {e}", EXIT_USAGE)
    config = _load_config(args.config, args.device)
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
        return _fail(str(e))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    if chosen is None:
        why = no_choice(grid, settings.budget_ms)
        return _fail(f"{why[0].lower()}{why[1:]} (see {paths['report']})")
    agree = f", agreement {chosen.agreement:.3f}" if chosen.agreement is not None else ""
    print(f"chosen: {chosen.name} (p99 {chosen.e2e['p99']:.2f} ms{agree})")
    return EXIT_OK


def cmd_service(args: argparse.Namespace) -> int:
    from edge_agent.service import install

    return install(args.prefix, args.config_path, args.dry_run)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's paragraphs and adds each option's default to its help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is False or default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)"


def _sub(parent: Any, name: str, text: str) -> argparse.ArgumentParser:
    return parent.add_parser(name, help=text, description=text, formatter_class=_HelpFormatter)


def build_parser() -> argparse.ArgumentParser:
    from edge_agent.core.config import TensorRTConfig

    p = argparse.ArgumentParser(
        prog="edge-agent",
        description=__doc__ + "\n`edge-agent COMMAND --help` tells what each command takes.",
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"edge-agent {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = _sub(sub, "run", "run the agent (no arguments: the embedded default)")
    run.add_argument("--config", "-c", help="YAML config or fleet (default: the embedded default)")
    run.add_argument("--device", help="for a fleet: this device's id (default: the host name)")
    run.add_argument(
        "--overlay", help="a local overlay file applied last (e.g. the tuning tool's tuned.yaml)"
    )
    run.add_argument("--frames", type=int, default=0, help="stop after N frames captured; 0: no limit")
    run.add_argument("--duration", type=float, default=0.0, help="stop after S seconds; 0: no limit")
    run.add_argument("--quiet", "-q", action="store_true", help="no status lines, only the summary")
    run.set_defaults(func=cmd_run)

    listen = _sub(sub, "listen", "subscribe to a result stream and print it")
    listen.add_argument(
        "endpoint", nargs="?", default="tcp://127.0.0.1:5556", help="the agent's ZeroMQ endpoint"
    )
    listen.add_argument("--topic", action="append", help="topic prefix (repeatable; default: all)")
    listen.add_argument("--json", action="store_true", help="print each message body as JSON, one a line")
    listen.add_argument("--count", type=int, default=0, help="exit after N messages; 0: never")
    listen.add_argument(
        "--timeout", type=float, default=0.0, help="fail after S seconds without a message; 0: wait forever"
    )
    listen.add_argument(
        "--stats",
        action="store_true",
        help="once a second: rate, latency percentiles, messages lost and the seq joined at, per source",
    )
    listen.add_argument("--server-key", help="CURVE: the agent's public certificate (.key)")
    listen.add_argument("--client-cert", help="CURVE: this client's secret certificate (.key_secret)")
    listen.set_defaults(func=cmd_listen)

    cfg = _sub(sub, "config", "check, show, render and compare configs and fleets")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    v = _sub(
        cfg_sub, "validate", "check a config (and the files it names) or a fleet (every device, all errors)"
    )
    v.add_argument("file", help="a YAML config file, a fleet file or a fleet directory")
    s = _sub(cfg_sub, "show", "print the effective config (defaults, overrides and resolved paths filled in)")
    s.add_argument("file", nargs="?", default=None, help="config or fleet (default: the embedded default)")
    s.add_argument("--device", help="for a fleet: the device (default: this host's name)")
    r = _sub(cfg_sub, "render", "a fleet device's effective config")
    r.add_argument("fleet", help="a fleet file or directory")
    r.add_argument("--device", required=True, help="the device id to render")
    r.add_argument("--overlay", help="a local overlay file (e.g. written by the tuning tool)")
    r.add_argument("--explain", action="store_true", help="print which layer set each value instead")
    d = _sub(cfg_sub, "diff", "compare two effective configs (files or fleets)")
    d.add_argument("a", help="the first config or fleet")
    d.add_argument("b", help="the second config or fleet")
    d.add_argument("--device", help="for fleets: the device to render (default: this host's name)")
    cfg.set_defaults(func=cmd_config)

    bench = _sub(sub, "bench", "measure inference, sequential, pipelined and live latency")
    bench.add_argument("--config", "-c", help="YAML config: its model, backend, deadline (default: embedded)")
    bench.add_argument("--frames", type=int, default=1000, help="frames per phase")
    bench.add_argument(
        "--source-fps",
        type=float,
        default=None,
        help="live phase camera rate (default: the fps of the config's synthetic or V4L2 camera, a video's "
        "own rate, else 30)",
    )
    bench.add_argument("--live-seconds", type=float, default=10.0, help="length of the live phase (s)")
    bench.add_argument(
        "--sources",
        type=int,
        default=0,
        help="N synthetic cameras on one model (0: the config's sources): throughput with and without "
        "batching, per-source latency (frames are per camera)",
    )
    bench.add_argument(
        "--source",
        help="frames to measure on: a video file or an image folder, decoded into memory first (up to "
        "256 MiB), then played looped, live at --source-fps (default: the config's source; a live "
        "camera is replaced by a synthetic one)",
    )
    bench.add_argument("--model", help="ONNX file to measure (default: the config's model)")
    bench.add_argument("--manifest", help="manifest for --model (default: beside it, else from the ONNX)")
    bench.add_argument(
        "--compare-bare",
        action="store_true",
        help="also run a plain ONNX Runtime loop (letterbox, run, decode, NMS; one thread) on the same "
        "frames and print the agent's overhead against it",
    )
    bench.add_argument(
        "--json", action="store_true", help="machine-readable result (schema in README), no progress lines"
    )
    bench.set_defaults(func=cmd_bench)

    models = _sub(sub, "models", "what the agent understands of a model file")
    models_sub = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    mc = _sub(
        models_sub,
        "check",
        "load a model as `run` would, print what was decided (input, decoder, labels, thresholds) and "
        "run it on a few synthetic frames; exit 2 if the agent cannot run it",
    )
    mc.add_argument("model", help="ONNX file")
    mc.add_argument("--manifest", help="its manifest (default: beside it, else read from the ONNX)")
    mc.add_argument("--config", "-c", help="YAML config: its backend and model settings (default: embedded)")
    mc.add_argument("--frames", type=int, default=8, help="synthetic frames to run it on")
    mc.add_argument(
        "--write-manifest",
        nargs="?",
        const="",
        metavar="PATH",
        help="write the manifest the agent inferred, to edit and keep beside the model (default path: "
        "MODEL with .yaml, which run reads from then on)",
    )
    mc.add_argument("--force", action="store_true", help="replace an existing manifest file")
    mc.set_defaults(func=cmd_models)

    engine = _sub(sub, "engine", "TensorRT engines (Jetson)")
    engine_sub = engine.add_subparsers(dest="engine_command", required=True, metavar="ACTION")
    eb = _sub(engine_sub, "build", "build (or find in the cache) the engine for a model")
    eb.add_argument("model", nargs="?", help="ONNX file (default: the bundled detector)")
    eb.add_argument("--manifest", help="its manifest (default: beside it)")
    # Defaults and choices are TensorRTConfig's own: the command builds what `run` would.
    trt, hints = TensorRTConfig(), get_type_hints(TensorRTConfig)
    eb.add_argument(
        "--precision", choices=get_args(hints["precision"]), default=trt.precision, help="engine precision"
    )
    eb.add_argument("--dla-core", type=int, default=trt.dla_core, help="DLA core; -1: the GPU")
    eb.add_argument("--no-gpu-fallback", action="store_true", help="fail if a layer cannot run on the DLA")
    eb.add_argument("--workspace-mib", type=int, default=trt.workspace_mib, help="builder workspace (MiB)")
    eb.add_argument(
        "--optimization-level",
        type=int,
        default=trt.optimization_level,
        choices=range(6),
        help="TensorRT builder level 0..5",
    )
    eb.add_argument("--calibration-images", help="int8: folder of frames for calibration")
    eb.add_argument(
        "--preprocess",
        choices=get_args(hints["preprocess"]),
        default=trt.preprocess,
        help="where a float model's normalisation runs",
    )
    eb.add_argument("--cache-dir", help=f"engine cache (default: {trt.cache_dir})")
    eb.set_defaults(func=cmd_engine_build)

    st = _sub(sub, "selftest", "check this device: ONNX Runtime vs TensorRT (GPU, DLA) on the same frames")
    st.add_argument("--frames", type=int, default=50, help="held-out frames compared per target")
    st.add_argument("--report", default="edge-agent-selftest", help="report path without suffix (.json, .md)")
    st.add_argument("--cache-dir", help="engine cache for the self-test's engines (default: a temporary one)")
    st.set_defaults(func=cmd_selftest)

    power = _sub(sub, "power", "device power state: status, apply the profile, restore")
    power_sub = power.add_subparsers(dest="power_command", required=True, metavar="ACTION")
    for name, text in (
        ("status", "clocks, load, temperatures, rail power, throttling (read only)"),
        ("apply", "save the current state, then apply the config's power section (root)"),
        ("restore", "put back the state saved by apply or by a crashed agent (root)"),
    ):
        p_ = _sub(power_sub, name, text)
        p_.add_argument(
            "--config", "-c", help="YAML config: its power section (default: the embedded default)"
        )
        p_.add_argument("--root", help="filesystem root to read and write (default: the config's, /)")
        p_.add_argument("--state-file", help="where the state to restore is kept (default: the config's)")
        if name == "status":
            p_.add_argument("--json", action="store_true", help="print the report as JSON")
        p_.set_defaults(func=cmd_power)

    tu = _sub(sub, "tune", "find the cheapest configuration that holds the deadline")
    tu.add_argument("--config", "-c", help="YAML config or fleet (default: the embedded default)")
    tu.add_argument("--device", help="for a fleet: the device (default: this host's name)")
    tu.add_argument("--budget-ms", type=float, default=0.0, help="0: the config's deadline.budget_ms")
    tu.add_argument(
        "--objective",
        choices=["latency", "throughput", "power"],
        default="latency",
        help="what the chosen candidate is best at",
    )
    tu.add_argument("--margin", type=float, default=0.1, help="p99 must stay under budget × (1 - margin)")
    tu.add_argument("--quick", action="store_true", help="a smaller grid and shorter windows (< 2 min here)")
    tu.add_argument(
        "--model", action="append", help="a model variant to try (repeatable), e.g. another input size"
    )
    tu.add_argument(
        "--source-fps",
        type=float,
        default=0.0,
        help="camera rate; 0: the fps of the config's synthetic or V4L2 camera, a video's own rate, else 30",
    )
    tu.add_argument(
        "--frames",
        metavar="DIR",
        help="a folder of your images to measure candidates on (decoded into memory, played looped as a "
        "camera at --source-fps) and to judge "
        "their accuracy on: agreement with the first candidate's detections (default: the config's source)",
    )
    tu.add_argument(
        "--out", default="edge-agent-tune", help="folder for tuned.yaml, the report and the chart"
    )
    tu.set_defaults(func=cmd_tune)

    keys = _sub(sub, "keys", "CURVE key pairs for the result stream")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    kg = _sub(keys_sub, "generate", "write NAME.key (public) and NAME.key_secret (mode 600)")
    kg.add_argument("name", help="a plain file name, e.g. the agent's or the client's host name")
    kg.add_argument("--dir", default=".", help="folder for the two files (created mode 700 if missing)")
    kg.add_argument("--force", action="store_true", help="replace an existing key pair of that name")
    kg.set_defaults(func=cmd_keys)

    svc = _sub(sub, "service", "install the systemd units")
    svc_sub = svc.add_subparsers(dest="service_command", required=True, metavar="ACTION")
    si = _sub(svc_sub, "install", "create the user, install and enable the units (root)")
    si.add_argument("--dry-run", action="store_true", help="print what would be done, change nothing")
    si.add_argument("--prefix", default="/etc/systemd/system", help="where the unit files go")
    si.add_argument(
        "--config", dest="config_path", default="/etc/edge-agent/agent.yaml", help="the config the units run"
    )
    si.set_defaults(func=cmd_service)

    ev = _sub(sub, "eval", "score a model on held-out synthetic frames (mAP@0.5)")
    ev.add_argument(
        "--config", "-c", help="YAML config: its model and backend (default: the embedded default)"
    )
    ev.add_argument("--model", help="ONNX file (default: the config's model, else the bundled one)")
    ev.add_argument("--manifest", help="manifest for --model (default: beside it)")
    ev.add_argument("--frames", type=int, default=500, help="held-out frames scored")
    ev.add_argument("--json", action="store_true", help="print the result as JSON")
    ev.set_defaults(func=cmd_eval)
    return p


def main(argv: list[str] | None = None) -> int:
    from edge_agent.core.configload import ConfigError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        return _fail(f"invalid config:\n{_problem_lines(e)}", EXIT_USAGE)
    except (RuntimeError, OSError, ValueError) as e:
        # Models, sources and sockets raise these with the file, device or endpoint named.
        return _fail(str(e))


if __name__ == "__main__":
    sys.exit(main())
