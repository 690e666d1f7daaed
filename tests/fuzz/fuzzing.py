"""The fuzzing suite's profiles and its one property.

Every parser or validator of outside input (a socket, a broker, a file, a folder, a model)
has a target in tests/fuzz/: within a time and memory bound it returns a value or raises
the project's own error type, never another exception and never a hang (``bounded``).
Targets import what they need from here (``from fuzzing import bounded, examples``);
importing it loads the profile.

Profiles (``HYPOTHESIS_PROFILE``):

- ``ci`` (the default): derandomised, so a run is the same on every machine and a failure
  reproduces; few examples per target, so the whole suite stays near 60 s on 2 cores.
- ``long``: random, 20 times the examples, with Hypothesis' example database under
  ``.hypothesis/``: for a local hunt (``HYPOTHESIS_PROFILE=long pytest tests/fuzz -n 0``).

A defect a fuzzer finds becomes an ``@example`` on its target, so it is tried on every run.
(Not a conftest.py: beside tests/conftest.py it would take the module name ``conftest``.)
"""

from __future__ import annotations

import os
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings

#: Examples per target in CI; a target that parses something slow may ask for fewer.
CI_EXAMPLES = 150

settings.register_profile(
    "ci",
    max_examples=CI_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,  # a busy machine must not fail a test: fuzzing.bounded bounds hangs only
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "long",
    max_examples=CI_EXAMPLES * 20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(in_ci: int) -> int:
    """``in_ci`` examples under the ci profile, as many times more as the loaded profile
    has (a target's own ``max_examples`` would otherwise hold the long profile to the CI
    count)."""
    return max(1, in_ci * settings.default.max_examples // settings.get_profile("ci").max_examples)


#: Per example: more than this is a hang or a blow-up, not a slow machine (the inputs are
#: small; a parser that takes seconds on them is what a fuzzer is here to find).
MAX_SECONDS = 10.0
MAX_MIB = 64


def bounded(
    call: Callable[[], Any],
    allowed: type[BaseException] | tuple[type[BaseException], ...],
    *,
    max_seconds: float = MAX_SECONDS,
    max_mib: float = MAX_MIB,
) -> Any:
    """Run ``call`` and hold it to the property: it returns (its value is returned) or
    raises one of ``allowed`` (``None`` is returned); any other exception propagates, and
    an AssertionError is raised when it took over ``max_seconds`` or allocated over
    ``max_mib`` at its peak (Python's and numpy's allocations, through tracemalloc)."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    start = time.monotonic()
    try:
        value = call()
    except allowed:
        value = None
    finally:
        took = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1] - base
        if not tracing:
            tracemalloc.stop()
    assert took <= max_seconds, f"took {took:.1f} s (bound {max_seconds} s)"
    assert peak <= max_mib * 2**20, f"allocated {peak / 2**20:.1f} MiB at its peak (bound {max_mib} MiB)"
    return value
