"""The result stream from the other side: ``edge-agent listen`` and CURVE key pairs
(``edge-agent keys generate``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from typing import Any

from edge_agent.commands.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail
from edge_agent.core.text import printable

log = logging.getLogger("edge_agent")


def _say(line: str) -> None:
    """One line of what a peer sent (labels, source names, topics, counts), its control
    characters escaped: an ESC sequence must not redraw the terminal, a CR or LF forge a line."""
    print(printable(line, None), flush=True)


def _track(d: Any) -> str:
    return f"#{d.track_id}" if d.track_id is not None else ""


def _format_result(msg: Any) -> str:
    dets = " ".join(
        f"{d.label}{_track(d)}:{d.score:.2f}@[{','.join(f'{v:.0f}' for v in d.box_xyxy)}]"
        for d in msg.detections
    )
    late = " LATE" if msg.deadline_missed else ""
    gap = f" (lost {msg.gap})" if msg.gap else ""
    e2e = msg.latency_ms.get("total", 0.0)
    return f"{msg.source} seq={msg.seq}{gap} frame={msg.frame_id} e2e={e2e:.2f}ms{late} {dets}"


def _format_event(msg: Any) -> str:
    gap = f" (lost {msg.gap})" if msg.gap else ""
    where = f"{msg.where} {msg.direction}" if msg.direction else msg.where
    extra = msg.raw.get("dwell_s") if msg.kind == "exit" else msg.raw.get("threshold_s")
    extra = f" after {extra:g} s" if isinstance(extra, (int, float)) else ""
    what = f"{msg.kind} {where} {msg.label}#{msg.track_id}{extra}"
    return f"{msg.source} event {msg.seq}{gap}: {what} frame={msg.frame_id}"


def _joined(gaps: Any, topic: str) -> str:
    seq = gaps.joined.get(topic, 0)
    return f"joined at seq {seq}" + (f": {seq} earlier not received" if seq else "")


def cmd_listen(args: argparse.Namespace) -> int:
    import zmq

    from edge_agent.client import Event, GapTracker, Health, connect, parse
    from edge_agent.core.stream_frames import MessageError, decode

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
                    return fail(f"no message from {args.endpoint} within {args.timeout} s")
                if not count and nothing_yet_s and silent_s > nothing_yet_s:
                    _print_nothing_yet(args.endpoint, topics)
                    nothing_yet_s = 0.0
                continue
            t_last = time.monotonic()
            try:  # anyone may publish on the endpoint: one bad message is told and skipped
                topic, body = decode(frame)
                first = topic not in gaps.last
                msg = parse(topic, body)
                seq = body.get("seq")
                if isinstance(seq, int) and not isinstance(seq, bool):
                    gap = gaps.update(topic, seq)
                    if gap and not isinstance(msg, Health):
                        msg = dataclasses.replace(msg, gap=gap)
                count += 1
                if args.stats:
                    if not isinstance(msg, (Health, Event)):
                        per_topic.setdefault(topic, []).append(float(msg.latency_ms.get("total", 0.0)))
                    if t_last - t_start >= 1.0:
                        _print_stats(per_topic, gaps, t_last - t_start)
                        per_topic, t_start = {}, t_last
                else:
                    _print_message(args, topic, body, msg, gaps, first)
            except (MessageError, TypeError, ValueError, AttributeError) as e:  # fields of odd types
                print(printable(f"listen: a message skipped: {e}", 300), file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return EXIT_OK


def _print_nothing_yet(endpoint: str, topics: tuple[str, ...]) -> None:
    """The one hint on stderr that nothing has arrived yet, and where we listen."""
    print(
        f"listen: nothing received yet from {endpoint} (topics: "
        f"{', '.join(repr(t) for t in topics)}); is an agent publishing there?",
        file=sys.stderr,
        flush=True,
    )


def _print_stats(per_topic: dict[str, list[float]], gaps: Any, elapsed_s: float) -> None:
    """One stats line per topic: message rate, e2e p50/p99 and losses over ``elapsed_s``."""
    import numpy as np

    for name, lat in per_topic.items():
        a = np.asarray(lat)
        _say(
            f"{name.partition('.')[2] or name}: {len(a) / elapsed_s:6.1f} msg/s"
            f"  e2e p50 {np.percentile(a, 50):6.2f} ms "
            f"p99 {np.percentile(a, 99):6.2f} ms  lost {gaps.lost.get(name, 0)}"
            f" ({_joined(gaps, name)})"
        )


def _print_message(args: argparse.Namespace, topic: str, body: Any, msg: Any, gaps: Any, first: bool) -> None:
    """One received message as JSON, a health line or a result line (after a join note)."""
    from edge_agent.client import Event, Health

    if args.json:
        print(json.dumps(body), flush=True)  # ASCII: json escapes every control character
    elif isinstance(msg, Health):
        c = msg.counts
        _say(
            f"{topic} fps={msg.fps:.1f} captured={c.get('captured')} late={c.get('late')} "
            f"dropped={c.get('dropped')}{' final' if msg.final else ''}"
        )
    else:
        if first and gaps.joined.get(topic):
            _say(f"{topic}: {_joined(gaps, topic)}")
        _say(_format_event(msg) if isinstance(msg, Event) else _format_result(msg))


def cmd_keys(args: argparse.Namespace) -> int:
    from pathlib import Path

    import zmq.auth

    name = args.name
    if not name or name.startswith(".") or not all(c.isalnum() or c in "._-" for c in name):
        return fail(
            f"key name {name!r}: use a plain file name (letters, digits, '.', '_', '-'; not starting "
            "with '.'); the folder goes in --dir",
            EXIT_USAGE,
        )
    folder = Path(args.dir)
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    existing = [str(p) for p in (public, secret) if p.exists()]
    if existing and not args.force:
        return fail(
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


def cmd_health(args: argparse.Namespace) -> int:
    from edge_agent.checks import healthcheck
    from edge_agent.commands.common import load_config
    from edge_agent.core.config import config_hash

    min_frames = args.min_frames
    more = "a longer --timeout, or a lower --min-frames"
    usage = healthcheck.usage_error(args.timeout, args.max_miss_rate, min_frames)
    if usage:
        return fail(f"health: {usage}", EXIT_USAGE)
    cfg = load_config(args.config, args.device)
    where = "--endpoint" if args.endpoint else "publish.endpoint"
    if usage := healthcheck.endpoint_error(args.endpoint or cfg.publish.endpoint):
        return fail(f"health: {where} {usage}", EXIT_USAGE)
    expect = config_hash(load_config(args.expect_config, args.device)) if args.expect_config else ""
    try:
        verdict = healthcheck.check(
            args.endpoint or cfg.publish.endpoint,
            args.timeout,
            args.max_miss_rate,
            expect,
            wait=args.wait_ready,
            server_key=cfg.publish.curve_server_key or None,
            client_cert=args.client_cert or cfg.uplink.curve_client_cert or None,
            min_frames=min_frames,
            more_frames=more,
        )
    except ValueError as e:  # an address ZeroMQ refuses all the same, or unusable CURVE keys
        return fail(f"health: {e}", EXIT_USAGE)
    if args.json:
        print(
            json.dumps({**verdict.as_dict(), "max_miss_rate": args.max_miss_rate, "min_frames": min_frames})
        )
    else:
        print(f"{'healthy' if verdict.healthy else 'unhealthy'}: {verdict.reason}")
        for s in verdict.sources:
            print(f"  {s.source}: {'ok' if s.ok else 'FAIL'} ({s.reason}; config {s.config_hash})")
            if s.counts:
                print(f"    frames judged: {healthcheck.counts_line(s.counts)}")
    return EXIT_OK if verdict.healthy else EXIT_FAILED
