"""edge-agent: a real-time inference agent for NVIDIA Jetson (and any Linux box).

It reads frames from cameras, video files or image folders, runs a detector (TensorRT on a
Jetson, ONNX Runtime on the CPU elsewhere) and publishes every result on a ZeroMQ stream,
holding a per-frame deadline (capture to publish, 50 ms by default) and reporting where
every millisecond went. `edge-agent run` with no arguments runs the embedded default: a
synthetic camera and the bundled detector, results on tcp://127.0.0.1:5556.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, get_args, get_type_hints

from edge_agent import __version__
from edge_agent.commands.common import EXIT_FAILED, EXIT_USAGE, fail, problem_lines
from edge_agent.commands.configs import cmd_config
from edge_agent.commands.device import cmd_power, cmd_service
from edge_agent.commands.measure import cmd_bench, cmd_record, cmd_tune
from edge_agent.commands.models import cmd_engine_build, cmd_eval, cmd_models, cmd_selftest
from edge_agent.commands.run import cmd_run
from edge_agent.commands.stream import cmd_health, cmd_keys, cmd_listen
from edge_agent.commands.uplink import cmd_fleet, cmd_uplink

log = logging.getLogger("edge_agent")


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
    from edge_agent.checks.healthcheck import DEFAULT_MIN_FRAMES
    from edge_agent.core.model_config import TensorRTConfig

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
        "--overlay",
        help="a local overlay file applied over the config (e.g. the tuning tool's tuned.yaml);"
        " EDGE_AGENT__ variables, then --model/--source/--budget-ms, apply after it",
    )
    run.add_argument(
        "--model", help="an ONNX model to run (an Ultralytics export, or one with a manifest beside it)"
    )
    run.add_argument("--manifest", help="--model's manifest (default: beside it, else read from the ONNX)")
    run.add_argument(
        "--source",
        help="frames from: a video file, an image folder, /dev/videoN, rtsp://..., a GStreamer pipeline"
        " or 'synthetic' (default: the config's, else the synthetic camera)",
    )
    run.add_argument(
        "--budget-ms",
        type=float,
        help="the per-frame deadline, capture to publish, in ms (deadline.budget_ms; a source's own"
        " budget_ms still wins)",
    )
    run.add_argument("--frames", type=int, default=0, help="stop after N frames captured; 0: no limit")
    run.add_argument("--duration", type=float, default=0.0, help="stop after S seconds; 0: no limit")
    run.add_argument("--quiet", "-q", action="store_true", help="no status lines, only the summary")
    run.add_argument("--view", action="store_true", help="the live view on, for this run (prints its URL)")
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

    he = _sub(sub, "health", "is the agent doing its job? exit 0 when frames flow and the miss rate is low")
    he.add_argument(
        "--config", "-c", help="the agent's config or fleet: its stream endpoint (default: embedded)"
    )
    he.add_argument("--device", help="for a fleet: this device's id (default: the host name)")
    he.add_argument("--endpoint", help="the agent's stream (default: the config's publish.endpoint)")
    he.add_argument(
        "--wait-ready", action="store_true", help="wait until healthy (loading, reloading) or --timeout"
    )
    he.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for heartbeats")
    he.add_argument("--max-miss-rate", type=float, default=0.05, help="the highest miss rate that is healthy")
    he.add_argument(
        "--min-frames",
        type=int,
        default=DEFAULT_MIN_FRAMES,
        help="judge each source on at least this many frames ended (published or missed)",
    )
    he.add_argument(
        "--expect-config", help="healthy only when the agent runs this config (its hash; after a reload)"
    )
    he.add_argument(
        "--client-cert", help="CURVE: this client's secret certificate (default: uplink.curve_client_cert)"
    )
    he.add_argument("--json", action="store_true", help="print the verdict as JSON")
    he.set_defaults(func=cmd_health)

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
        "--json",
        action="store_true",
        help="machine-readable result (schema in docs/deadline.md), no progress lines",
    )
    bench.add_argument(
        "--emulate",
        metavar="RECORDING",
        help="run the model on the emulated accelerator: its outputs recorded by `edge-agent record-outputs`"
        " replayed, each inference waiting --device-ms off the CPU (measurement only); with --source (the"
        " frames recorded), --sources N cameras or --capacity",
    )
    bench.add_argument(
        "--device-ms",
        type=float,
        default=None,
        help="with --emulate: the device's time per inference (default: 5)",
    )
    bench.add_argument(
        "--capacity",
        type=int,
        default=0,
        metavar="MAX",
        help="with --emulate: find the most cameras (up to MAX) at --source-fps (default 30) with 99%% of"
        " frames on time; each trial runs --live-seconds",
    )
    bench.set_defaults(func=cmd_bench)

    rec = _sub(
        sub,
        "record-outputs",
        "record a model's raw outputs over a clip or image folder (ONNX Runtime), for the emulated"
        " accelerator (backend type: emulated; bench --emulate)",
    )
    rec.add_argument("--model", help="ONNX file (default: the config's model)")
    rec.add_argument("--manifest", help="its manifest (default: beside it, else read from the ONNX)")
    rec.add_argument("--config", "-c", help="YAML config: its model settings (default: embedded)")
    rec.add_argument("--source", required=True, help="a video file or an image folder")
    rec.add_argument("--frames", type=int, default=100, help="frames to record (the first N)")
    rec.add_argument(
        "--out", required=True, help="the recording to write (written atomically, never through a symlink)"
    )
    rec.set_defaults(func=cmd_record)

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
    si.add_argument("--uplink", action="store_true", help="enable the MQTT uplink's unit too")
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

    up = _sub(sub, "uplink", "carry the agent's results and health to an MQTT broker (a process of its own)")
    up.add_argument("--config", "-c", help="the agent's config or fleet: its uplink and publish sections")
    up.add_argument("--device", help="for a fleet: this device's id (default: the host name)")
    up.set_defaults(func=cmd_uplink)

    fl = _sub(sub, "fleet", "the devices of a fleet, as their uplinks report them on the broker")
    fl_sub = fl.add_subparsers(dest="fleet_command", required=True, metavar="ACTION")
    fs = _sub(
        fl_sub, "status", "one line per device: online, last seen, model, config hash, fps, p99, misses"
    )
    fs.add_argument("--broker", help="mqtt://host[:port] or mqtts://host[:port] (default: the config's)")
    fs.add_argument("--prefix", help="topic prefix (default: the config's, else edge-agent)")
    fs.add_argument(
        "--config", "-c", help="take the broker, prefix and TLS settings from this config's uplink"
    )
    fs.add_argument("--device", help="with a fleet as --config: the device whose uplink settings to use")
    fs.add_argument("--json", action="store_true", help="print the rows as JSON")
    fs.add_argument("--watch", action="store_true", help="redraw once a second until Ctrl-C")
    fs.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the broker")
    fs.set_defaults(func=cmd_fleet)
    return p


def main(argv: list[str] | None = None) -> int:
    from edge_agent.core.configload import ConfigError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        return fail(f"invalid config:\n{problem_lines(e)}", EXIT_USAGE)
    except (RuntimeError, OSError, ValueError) as e:
        from edge_agent.models.manifest import ModelError

        # Models, sources and sockets raise these with the file, device or endpoint named; a
        # model file the agent cannot use is the user's to change, as `models check` says (2).
        return fail(str(e), EXIT_USAGE if isinstance(e, ModelError) else EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
