"""``edge-agent config``: validate, show, render and diff configs and fleets."""

from __future__ import annotations

import argparse
import logging
import sys

from edge_agent.commands.common import EXIT_OK, EXIT_USAGE, load_config, problem_lines

log = logging.getLogger("edge_agent")


def cmd_config(args: argparse.Namespace) -> int:
    from edge_agent.core.configload import ConfigError, dump, to_plain
    from edge_agent.fleet.diff import diff_configs
    from edge_agent.fleet.render import load_fleet

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
            print(dump(rendered.config), end="")
    elif args.config_command == "diff":
        # Paths as written: two checkouts of one fleet do not differ by where they lie.
        a, b = (to_plain(load_config(p, args.device, resolve_paths=False)) for p in (args.a, args.b))
        print("\n".join(diff_configs(a, b)) or "no differences")
    else:
        print(dump(load_config(args.file, args.device)), end="")
    return EXIT_OK


def _validate(path: str) -> int:
    from edge_agent.core.configload import ConfigError
    from edge_agent.fleet.render import is_fleet, load_effective, load_fleet, validate_fleet

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
