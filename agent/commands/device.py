"""The device: ``edge-agent power`` (status, apply, restore) and ``service install``."""

from __future__ import annotations

import argparse
import json
import logging
import signal
from typing import Any

from edge_agent.commands.common import EXIT_OK, load_config, setup_logging

log = logging.getLogger("edge_agent")


def _power_config(args: argparse.Namespace):
    from dataclasses import replace

    cfg = load_config(args.config).power  # files unchecked: a restore never depends on a model
    if args.root:
        cfg = replace(cfg, root=args.root)
    if args.state_file:
        cfg = replace(cfg, state_file=args.state_file)
    return cfg


def raise_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def cmd_power(args: argparse.Namespace) -> int:
    from edge_agent.power.controller import make_controller
    from edge_agent.power.manager import PowerManager, recover

    setup_logging("warning")
    cfg = _power_config(args)
    controller = make_controller(cfg)
    if args.power_command == "status":
        return _power_status(args, cfg, controller)
    if args.power_command == "apply":
        for line in recover(cfg, controller):
            print(f"restored first: {line}")
        if not cfg.changes_anything():
            print("the config's power section changes nothing")
            return EXIT_OK
        # SIGTERM (systemd's start timeout, say) mid-apply must still undo what was done.
        signal.signal(signal.SIGTERM, raise_interrupt)
        # The state stays saved: `power restore` (or the agent's next start) puts it back.
        done = PowerManager(cfg, controller).apply_profile()
        for line in done:
            print(line)
        print(f"previous state saved in {cfg.state_file}; `edge-agent power restore` puts it back")
        return EXIT_OK
    done = recover(cfg, controller)
    print("\n".join(done) if done else f"nothing to restore ({cfg.state_file} holds no state)")
    return EXIT_OK


def _power_status(args: argparse.Namespace, cfg: Any, controller: Any) -> int:
    """``power status``: the device, its telemetry and throttling, as text or JSON."""
    from dataclasses import asdict

    from edge_agent.power import sysfs
    from edge_agent.power.manager import throttle_reasons
    from edge_agent.power.state import load_state

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
    print("temperatures: " + (", ".join(f"{k} {v:.1f} °C" for k, v in t.temps_c.items()) or "none readable"))
    rails = ", ".join(f"{k} {v:.0f} mW" for k, v in t.rails_mw.items())
    print("power: " + (rails or "no rails readable") + (f"; total {t.total_mw:.0f} mW" if t.total_mw else ""))
    for reason in report["throttle_reasons"]:
        print(f"THROTTLED: {reason}")
    if pending is not None:
        print(f"a saved state waits in {cfg.state_file}: run `edge-agent power restore`")
    return EXIT_OK


def cmd_service(args: argparse.Namespace) -> int:
    from edge_agent.service.supervisor import install

    return install(args.prefix, args.config_path, args.dry_run, args.uplink)
