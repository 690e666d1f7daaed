"""``edge-agent config``: validate, show, render and diff configs and fleets."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import TYPE_CHECKING

from edge_agent.commands.common import EXIT_OK, EXIT_USAGE, load_config, problem_lines

if TYPE_CHECKING:
    from edge_agent.core.config import AgentConfig
    from edge_agent.core.effective.parse import ConfigFile, Rendered

log = logging.getLogger("edge_agent")


def cmd_config(args: argparse.Namespace) -> int:
    from edge_agent.core.config import printed
    from edge_agent.core.configload import ConfigError, dump
    from edge_agent.core.effective.diff import diff_configs
    from edge_agent.core.effective.render import load_fleet

    if args.config_command == "validate":
        try:
            return _validate(args.file)
        except ConfigError as e:  # the problems alone, one a line: this command's whole answer
            print(problem_lines(e), file=sys.stderr)
            return EXIT_USAGE
    elif args.config_command == "render":
        # Paths as written: the rendered config is for a device, not for this machine.
        rendered = load_fleet(args.fleet).render(args.device, overlay=args.overlay, resolve_paths=False)
        if args.explain:
            for key, origin in sorted(rendered.origins.items()):
                print(f"{key}: {origin}")
        else:
            print(dump(printed(rendered.config)), end="")
    elif args.config_command == "diff":
        # Paths as written: two checkouts of one fleet do not differ by where they lie.
        a, b = (printed(_for_diff(p, args.device)) for p in (args.a, args.b))
        print("\n".join(diff_configs(a, b)) or "no differences")
    else:
        print(dump(printed(load_config(args.file, args.device), home=True)), end="")
    return EXIT_OK


def _for_diff(path: str, device: str | None) -> AgentConfig:
    """A side of a diff, rendered as ``device`` also when it is a plain file (whose id is
    otherwise this host's name), so a file and a fleet device compare like with like. An id
    the file sets itself stays."""
    from edge_agent.core.effective.parse import DEVICE_ID_ORIGIN
    from edge_agent.core.effective.render import load_effective

    rendered = load_effective(path, device, resolve_paths=False)
    if device and rendered.origins.get("device_id") == DEVICE_ID_ORIGIN:
        return dataclasses.replace(rendered.config, device_id=device)
    return rendered.config


def _validate(path: str) -> int:
    from edge_agent.core.effective.parse import ConfigFile
    from edge_agent.core.effective.render import load_effective

    # Read once: whether it is a fleet and what it says come from the same bytes (a pipe
    # has no second read: a second one found it empty).
    source = ConfigFile.read(path)
    if source.is_fleet:
        return _validate_fleet(source)
    rendered = load_effective(source, check_files=True)
    note = " (empty: the embedded default, every key at its default)" if rendered.defaults_only else ""
    print(f"{path}: OK{note}")
    _warn(path, rendered)
    return EXIT_OK


def _validate_fleet(source: ConfigFile) -> int:
    from edge_agent.core.configload import ConfigError
    from edge_agent.core.configpaths import ENV_PREFIX
    from edge_agent.core.effective.render import load_fleet, validate_fleet

    problems = validate_fleet(source)
    if problems:
        raise ConfigError(problems)
    fleet, path = load_fleet(source), source.path
    print(f"{path}: OK ({len(fleet.device_ids())} devices, {len(fleet.group_names())} groups)")
    print("the files a device's config names are checked on the device, when it loads its config")
    # ${VAR} as in validate_fleet; the EDGE_AGENT__ variables are this machine's, not the devices'.
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    for device_id in fleet.device_ids():
        _warn(f"{path}: device {device_id}", fleet.render(device_id, env=env))
    return EXIT_OK


def _warn(where: str, rendered: Rendered) -> None:
    """The config's exposure warnings on stderr, each with the layer that set its key."""
    from edge_agent.core.exposure import exposure_warnings

    for warning in exposure_warnings(rendered.config):
        key = warning.split(":", 1)[0]
        origin = rendered.origins.get(key)
        print(f"{where}: warning: {warning}" + (f" [set by {origin}]" if origin else ""), file=sys.stderr)
