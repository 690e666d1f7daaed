"""The import layers stay true: no module imports a layer above its own, and no import cycle;
and nothing outside the frame path reads the pipeline's insides.

Layers, bottom up (docs/architecture.md): the foundation (``edge_agent.core``), model files
and the device's power (``models``, ``power``), the frame path (``pipelines``), the service
(runner, service, metrics, ...), the tools (bench, tune, selftest, ...), the command line.
Every import counts, also one inside a function: a lazy import still ties the layers.

Above the frame path, the pipeline is read through its figures (``Pipeline.figures``):
its lanes, scheduler and stages, and a lane's source, are its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Bottom first; a module belongs to the first entry whose name is it or a parent package.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("edge_agent.core", "edge_agent.__init__")),
    ("models and power", ("edge_agent.models", "edge_agent.power", "edge_agent.systemd")),
    ("frame path", ("edge_agent.pipelines",)),
    ("service", ("edge_agent.service", "edge_agent.client")),
    ("tools", ("edge_agent.bench", "edge_agent.tune", "edge_agent.checks")),
    ("command line", ("edge_agent.cli", "edge_agent.commands", "edge_agent.__main__")),
]


def package_dirs() -> dict[str, Path]:
    """The package → folder mapping pyproject declares (what installs honour)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    dirs = {}
    for line in section.strip().splitlines():
        key, value = (part.strip().strip('"') for part in line.split("=", 1))
        dirs[key] = ROOT / value
    return dirs


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package's ``__init__`` as ``pkg.__init__``)."""
    found = {}
    for package, folder in package_dirs().items():
        for f in folder.glob("*.py"):
            found[f"{package}.{f.stem}"] = f
    return found


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The edge_agent modules ``path`` imports, wherever the import statement is."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path}: relative import (the project imports by absolute name)"
            base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"  # a submodule, or a name in the module
                package = f"{base}.__init__"
                out.add(full if full in known else package if package in known else base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in known and m != name}


def layer_of(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise LookupError(module)


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, name, set(found)) for name, path in found.items()}


def upward(g: dict[str, set[str]]) -> list[str]:
    """Each import of a higher layer, as 'a (layer) imports b (layer)'."""
    bad = []
    for a, targets in sorted(g.items()):
        for b in sorted(targets):
            if layer_of(b) > layer_of(a):
                bad.append(f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})")
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


#: The pipeline's insides: its lanes, scheduler and stages (``pipelines/pipeline.py``).
PIPELINE_INSIDES = {"lanes", "_lanes", "scheduler", "_scheduler", "_captures", "_infer", "_post", "_control"}


def insides_read(path: Path) -> list[str]:
    """Where ``path`` reads the pipeline's insides, or a lane's source: 'path:line: code'.

    ``.lanes`` is the figures' own field, so it is allowed on them (a ``figures()`` or
    ``take_figures()`` call, or a name with ``snap`` or ``fig`` in it); a lane's ``.source``
    is refused on anything named lane (its figures' is ``source_state``)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Attribute):
            continue
        owner = ast.unparse(node.value)
        on_figures = "snap" in owner or "fig" in owner or (
            isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr in ("figures", "take_figures")
        )
        lane_source = node.attr == "source" and "lane" in owner.rsplit(".", 1)[-1].lower()
        if (node.attr in PIPELINE_INSIDES and not on_figures) or lane_source:
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
            bad.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return bad


def outside_the_frame_path() -> list[Path]:
    """Every module above the frame path (and below it), and the tools."""
    found = [f for name, f in modules().items() if not name.startswith("edge_agent.pipelines.")]
    return found + sorted((ROOT / "tools").rglob("*.py"))


def test_nothing_outside_the_frame_path_reads_the_pipelines_insides():
    bad = [line for path in outside_the_frame_path() for line in insides_read(path)]
    assert not bad, "read Pipeline.figures() instead:\n" + "\n".join(bad)


def test_the_insides_check_catches_a_lane_read(tmp_path):
    f = tmp_path / "reader.py"
    f.write_text(
        "a = agent.pipeline.lanes[0].stats\n"
        "b = pipeline.scheduler.summary()\n"
        "c = lane.source.damage\n"
        "d = agent.pipeline.figures().lanes[0].counts\n"
        "e = [x.source_state for x in snap.lanes]\n"
    )
    found = [line.split(": ", 1)[1] for line in insides_read(f)]
    assert sorted(found) == ["agent.pipeline.lanes", "lane.source", "pipeline.scheduler"], found


def test_every_module_has_a_layer():
    unplaced = []
    for name in modules():
        try:
            layer_of(name)
        except LookupError:
            unplaced.append(name)
    assert not unplaced, f"add these modules to LAYERS in tests/test_layers.py: {unplaced}"


def test_no_module_imports_a_layer_above_its_own():
    bad = upward(graph())
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, f"import cycles: {found}"


def test_the_checks_catch_an_upward_import_and_a_cycle():
    """The checks themselves, on the real graph plus one bad edge each."""
    g = {k: set(v) for k, v in graph().items()}
    g["edge_agent.core.config"].add("edge_agent.pipelines.slots")
    assert upward(g) == ["edge_agent.core.config (core) imports edge_agent.pipelines.slots (frame path)"]
    g = {k: set(v) for k, v in graph().items()}
    g["edge_agent.pipelines.slots"].add("edge_agent.pipelines.scheduler")
    pair = {"edge_agent.pipelines.slots", "edge_agent.pipelines.scheduler"}
    assert any(pair <= set(c) for c in cycles(g)), cycles(g)


def test_the_graph_sees_lazy_imports():
    """Imports inside functions count: the bench command imports the bench only when run."""
    g = graph()
    assert "edge_agent.bench.single" in g["edge_agent.commands.measure"]
    assert "edge_agent.pipelines.backends.registry" in g["edge_agent.pipelines.model"]
