"""Beyond one device: ``edge-agent uplink`` (the agent's stream to an MQTT broker) and
``edge-agent fleet status`` (every device on that broker, one table)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

from edge_agent.commands.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail, load_config, log, setup_logging

_WATCHDOG_S = 1.0


def cmd_uplink(args: argparse.Namespace) -> int:
    from edge_agent.service.metrics import MetricsServer
    from edge_agent.service.sdnotify import Notifier
    from edge_agent.service.supervisor import Signals

    try:
        from edge_agent.service.uplink.link import LinkError
        from edge_agent.service.uplink.metrics import UplinkCollector
        from edge_agent.service.uplink.process import Uplink
        from edge_agent.service.uplink.spool import SpoolError
    except ImportError as e:  # exit 2: the unit does not restart into the same error
        return fail(f"the uplink needs paho-mqtt: pip install 'edge-agent[mqtt]' ({e})", EXIT_USAGE)

    signals = Signals()
    signals.install()
    cfg = load_config(args.config, args.device, check_files=True)
    setup_logging(cfg.log_level)
    notifier = Notifier.from_env()
    try:
        uplink = Uplink(cfg)
    except (LinkError, SpoolError) as e:
        # A setting that cannot work: exit 2, which the unit does not restart (no loop).
        return fail(str(e), EXIT_USAGE)
    metrics = None
    if cfg.uplink.metrics.enabled:
        m = cfg.uplink.metrics
        metrics = MetricsServer(UplinkCollector(uplink), m.host, m.port, setting="uplink.metrics")
        metrics.start()
    uplink.start()
    notifier.ready(_status(uplink))
    try:
        interval = min(_WATCHDOG_S, notifier.watchdog_interval_s() or _WATCHDOG_S)
        while not signals.stop.wait(interval):
            if uplink.alive():
                notifier.watchdog()  # only while every thread runs
            notifier.status(_status(uplink))
        log.info("received %s, stopping", signals.received or "a stop")
    finally:
        notifier.stopping()
        clean = uplink.stop()
        if metrics is not None:
            metrics.close()
        notifier.close()
    return EXIT_OK if clean else EXIT_FAILED


def _status(uplink) -> str:
    c = uplink.counters()
    state = "broker connected" if c["connected"] else "broker unreachable, spooling"
    spool = f"spool {c['spool_messages']} ({c['spool_bytes']} B)"
    return f"{state}; sent {c['sent']}, {spool}, dropped {c['dropped']}"


def cmd_fleet(args: argparse.Namespace) -> int:
    from edge_agent.core.configload import ConfigError
    from edge_agent.service.uplink.status import FleetView, table

    # From an operator's machine: the files a config names need not exist here.
    cfg = load_config(args.config, args.device).uplink if args.config else None
    try:
        from edge_agent.core.uplink_config import UplinkConfig

        overrides = {k: v for k, v in (("broker", args.broker), ("prefix", args.prefix)) if v}
        up = dataclasses.replace(cfg, **overrides) if cfg else UplinkConfig(**overrides)
    except (ValueError, ConfigError) as e:
        return fail(f"fleet status: {e}", EXIT_USAGE)
    from edge_agent.service.uplink.link import LinkError

    try:
        view = FleetView(up)
    except LinkError as e:
        return fail(f"fleet status: {e}", EXIT_USAGE)
    try:
        view.start(args.timeout)
    except (OSError, ConnectionError) as e:
        return fail(f"fleet status: cannot reach the broker {up.broker}: {e}")
    try:
        view.settle(timeout_s=args.timeout)
    except ConnectionError as e:
        view.stop()
        return fail(f"fleet status: {e}")
    try:
        while True:
            rows = view.rows()
            if args.json:
                print(json.dumps(rows), flush=True)
            else:
                clear = "\x1b[H\x1b[2J" if args.watch and sys.stdout.isatty() else ""
                print(f"{clear}{table(rows)}", flush=True)
            if not args.watch:
                return EXIT_OK
            time.sleep(1.0)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        view.stop()
