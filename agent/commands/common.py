"""What every command shares: exit codes, logging (journald's priorities under systemd), the
effective config, and error lines."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, ClassVar

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


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):  # set by systemd when stderr goes to the journal
        handler.setFormatter(_JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])


def latency_first_interpreter() -> None:
    # A thread that wakes (a frame arrived, inference ended) waits for the GIL until the
    # running thread yields it, by default after up to 5 ms: a whole stage's budget.
    # 0.5 ms bounds that wait at the cost of a few more interpreter switches.
    sys.setswitchinterval(0.0005)


def load_config(
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
    from edge_agent.core.effective.render import load_effective

    return load_effective(path, device, overlay, check_files=check_files, resolve_paths=resolve_paths).config


def problem_lines(e: Any, limit: int = 12) -> str:
    """A config error's problems, one a line, at most ``limit`` of them."""
    lines = [str(p) for p in e.problems]
    if len(lines) > limit:
        lines = [*lines[: limit - 1], f"... and {len(lines) - limit + 1} more problems"]
    return "\n".join(lines)


def fail(message: str, code: int = EXIT_FAILED) -> int:
    print(f"edge-agent: error: {message}", file=sys.stderr)
    return code
