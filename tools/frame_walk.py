"""One frame's walk from capture to publish, traced on a running agent.

    .venv-3.12/bin/python tools/frame_walk.py              # the inference thread posts (light load)
    .venv-3.12/bin/python tools/frame_walk.py --queued     # every frame through the post thread

Runs the agent in-process on a synthetic camera at 20 fps (the bundled detector, results
on a private loopback port) with a profiler on its stage threads, and prints the walk of
one frame, in order, from the capture stage's call of ``Lane.take`` to the publisher's
send: every call from one edge_agent module into another is one hop, followed inside
wherever it goes, except inside the plug-ins (source, preprocessor, backend, decoder,
per-frame step) and the histograms, which are each one module on the walk. A plug-in's method inherited from
its base class is the plug-in's. A call within a module is no hop (the reader stays in the
file). A call site repeated in a loop counts once; the walk printed is the one most frames
took. Then the hops, the modules and how often the walk entered each (consecutive calls
into one module are one entry: from ``put`` to ``next_batch`` the frame waits in the
scheduler).

Python 3.12 (``co_qualname``). Prints only; asserts nothing. docs/architecture.md shows
the walk it prints.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time

from edge_agent.core.analytics_config import AnalyticsConfig, LineConfig, ZoneConfig
from edge_agent.core.config import AgentConfig
from edge_agent.core.endpoint_config import MetricsConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.pipelines.stages import FrameQueue
from edge_agent.service.runner import Agent

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Not followed inside: the plug-ins and the histograms.
LEAVES = (
    "pipelines/sources/",
    "pipelines/preprocess",
    "pipelines/backends/",
    "models/decoders/",
    "pipelines/steps/",
    "core/latency",
)

Hop = tuple[str, str, str, str]  # caller module, caller, callee module, callee


def module(code) -> str | None:
    """The edge_agent module of ``code`` as a path under the repo (agent/ dropped), or None."""
    path = os.path.relpath(code.co_filename, ROOT)
    if path.startswith("agent/"):
        return path[len("agent/") : -3]
    if path.split("/")[0] in ("pipelines", "models", "power"):
        return path[:-3]
    return None


def frame_module(frame) -> str | None:
    """The module of the function's code; for a plug-in's method, of the plug-in (a backend's
    ``upload`` inherited from the base class is still the backend's)."""
    mod = module(frame.f_code)
    obj = frame.f_locals.get("self") if mod else None
    owner = type(obj).__module__ if obj is not None else ""
    if owner.startswith("edge_agent."):
        plugin = "/".join(owner.split(".")[1:])
        if is_leaf(plugin):
            return plugin
    return mod


def is_leaf(mod: str) -> bool:
    return any(mod == leaf or (leaf.endswith("/") and mod.startswith(leaf)) for leaf in LEAVES)


class Tracer:
    """Records each stage thread's hops per frame: capture from ``Lane.take`` to the
    scheduler's ``put``; inference from ``next_batch`` returning a batch to the send (or to
    its post inbox's ``put``); post from its inbox's ``get`` returning a frame to the send."""

    def __init__(self) -> None:
        self.walks: dict[str, list[list[Hop]]] = collections.defaultdict(list)
        self._local = threading.local()

    @staticmethod
    def _role() -> str | None:
        name = threading.current_thread().name
        return "capture" if name.startswith("capture-") else name if name in ("infer", "post") else None

    def __call__(self, frame, event: str, arg) -> None:
        if event not in ("call", "return"):
            return
        role = self._role()
        mod = frame_module(frame) if role else None
        if role is None or mod is None:
            return
        name = frame.f_code.co_qualname
        caller = frame.f_back
        caller_mod = frame_module(caller) if caller is not None else None
        hop = (caller_mod, caller.f_code.co_qualname, mod, name) if caller_mod else None
        st = self._local.__dict__
        if st.get("hops") is None:
            if not self._starts(role, event, name, arg):
                return
            st["hops"], st["leaf"] = [], 0
            if event == "return":  # the call that handed this thread the frame
                if hop and caller_mod != mod:
                    st["hops"].append(hop)
                return
        if event == "call":
            if st["leaf"] == 0 and hop and caller_mod != mod:
                st["hops"].append(hop)
            if st["leaf"] or is_leaf(mod):
                st["leaf"] += 1
        elif st["leaf"]:
            st["leaf"] -= 1
        if self._ends(role, event, name) and st["leaf"] <= 1:
            self.walks[role].append(st["hops"])
            st["hops"] = None

    @staticmethod
    def _starts(role: str, event: str, name: str, arg) -> bool:
        if role == "capture":
            return event == "call" and name == "Lane.take"
        wanted = "BatchScheduler.next_batch" if role == "infer" else "FrameQueue.get"
        return event == "return" and name == wanted and arg is not None

    @staticmethod
    def _ends(role: str, event: str, name: str) -> bool:
        if role == "capture":
            return event == "return" and name == "BatchScheduler.put"
        if role == "infer" and event == "return" and name == "FrameQueue.put":
            return True
        return event == "call" and name == "ZmqPublisher.send"


def typical(walks: list[list[Hop]]) -> tuple[list[Hop], int, int]:
    """The walk most frames took (each call site once), how many took it, of how many."""
    # The first and last few frames are left out (start-up, the stop), if there are others.
    seen = collections.Counter(tuple(dict.fromkeys(w)) for w in walks[3:-2] or walks)
    best, n = seen.most_common(1)[0]
    return list(best), n, sum(seen.values())


ZONES = AnalyticsConfig(
    zones=(ZoneConfig(name="left", points=((0, 0), (0.5, 0), (0.5, 1), (0, 1))),),
    lines=(LineConfig(name="door", points=((0.5, 0), (0.5, 1))),),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queued", action="store_true", help="every frame through the post thread")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--zones", action="store_true", help="with a zone and a line (the analytics step)")
    a = ap.parse_args()
    if sys.version_info < (3, 11):
        sys.exit("frame_walk needs Python 3.11 or later (code objects' co_qualname)")
    cfg = AgentConfig(
        device_id="walk",
        source=SyntheticSourceConfig(fps=20, seed=1, analytics=ZONES if a.zones else AnalyticsConfig()),
        publish=PublishConfig(endpoint="tcp://127.0.0.1:*", wait_for_subscribers=0),
        metrics=MetricsConfig(enabled=False),
    )
    agent = Agent(cfg)
    agent.build()
    if a.queued:
        FrameQueue.claim = lambda self: False  # type: ignore[method-assign]
    tracer = Tracer()
    threading.setprofile(tracer)
    agent.start()
    try:
        time.sleep(a.seconds)
    finally:
        threading.setprofile(None)
        agent.stop()
    walk: list[Hop] = []
    for role in ("capture", "infer", "post"):
        if tracer.walks[role]:
            hops, n, total = typical(tracer.walks[role])
            print(f"-- {role} thread (this walk in {n} of {total} frames)")
            for caller_mod, caller, mod, name in hops:
                walk.append((caller_mod, caller, mod, name))
                print(f"  {len(walk):2d}. {caller} -> {name} ({mod})")
    modules = list(dict.fromkeys(m for hop in walk for m in (hop[0], hop[2])))
    entries: collections.Counter[str] = collections.Counter()
    last = None
    for caller_mod, _, mod, _ in walk:
        if mod != caller_mod:
            if mod != last:
                entries[mod] += 1
            last = mod
    print(f"hops {len(walk)}, modules {len(modules)}: {', '.join(modules)}")
    print("entries:", ", ".join(f"{m} {n}" for m, n in entries.items()))


if __name__ == "__main__":
    main()
