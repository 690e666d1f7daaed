"""Fuzz targets: config YAML, structure and values, through the real loader: a file read as
``run`` and ``config validate`` read it (``load_effective``: the bounded read, the fleet
check, the merge, ``${VAR}`` substitution, the typed build, the file checks), and text
through ``configload.load``. Inputs: near-valid agent configs and fleets built from the real
schema's section and key names with values of any type, YAML text with anchors, aliases,
tags (``!!python/object``), directives, deep nesting and huge scalars, and raw bytes.
Property: an ``AgentConfig`` or a ``ConfigError``, within the time and memory bound."""

from __future__ import annotations

import dataclasses
import functools
import typing
from pathlib import Path

import pytest
import yaml
from fuzzing import bounded, examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edge_agent.core import configload
from edge_agent.core.config import AgentConfig
from edge_agent.core.configbuild import is_union
from edge_agent.core.configload import ConfigError
from edge_agent.core.effective.render import load_effective

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=16)  # encodable as UTF-8
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 2**31, 2**63, 1e308, -1e308, 3e9]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
ANY = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)


@functools.cache
def typed(hint: typing.Any, depth: int) -> st.SearchStrategy:
    """A value of ``hint`` as the schema reads it, or near it (any type, any size)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return section(hint, depth) if depth > 0 else st.just({})
    if origin is typing.Literal:
        return st.one_of(st.sampled_from(args), ANY)
    if is_union(hint):
        return st.one_of(*(typed(a, depth) for a in args if a is not type(None)), st.none())
    if origin in (list, tuple):
        inner = typed(args[0], depth - 1) if args and depth > 0 else ANY
        return st.one_of(st.lists(inner, max_size=5), ANY)
    if origin is dict:
        return st.one_of(st.dictionaries(TEXT, SCALARS, max_size=4), ANY)
    simple = {int: NUMBERS, float: NUMBERS, bool: st.booleans(), str: TEXT}
    return st.one_of(simple.get(hint, ANY), ANY)


@functools.cache
def section(cls: type, depth: int) -> st.SearchStrategy:
    """A mapping of ``cls``'s keys (and now and then one it does not have) to values; a
    section of a union gets one of its ``type`` values."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]

    @st.composite
    def build(draw: st.DrawFn) -> dict:
        out: dict = {}
        for _ in range(draw(st.integers(0, min(6, len(names))))):
            name = draw(st.sampled_from(names))
            out[name] = draw(typed(hints[name], depth - 1))
        if draw(st.integers(0, 9)) == 0:
            out[draw(TEXT)] = draw(ANY)  # an unknown key
        return out

    return build()


AGENT_CONFIGS = section(AgentConfig, 4)
FLEETS = st.fixed_dictionaries(
    {},
    optional={
        "defaults": AGENT_CONFIGS,
        "groups": st.lists(
            st.fixed_dictionaries(
                {"name": st.one_of(st.from_regex(r"[a-z]{1,6}", fullmatch=True), ANY)},
                optional={
                    "match": st.dictionaries(st.sampled_from(["hostname", "module", "labels"]), ANY),
                    "config": AGENT_CONFIGS,
                },
            ),
            max_size=3,
        ),
        "devices": st.dictionaries(
            st.one_of(st.from_regex(r"[a-z]{1,6}", fullmatch=True), TEXT),
            st.fixed_dictionaries({}, optional={"config": AGENT_CONFIGS, "labels": ANY, "hostname": ANY}),
            max_size=3,
        ),
    },
)

#: Pieces of YAML no dump writes: anchors and aliases (loops and bombs too), tags, directives,
#: complex keys, several documents, deep nesting, huge scalars, ``${VAR}``, stray indents.
FRAGMENTS = [
    "source:",
    "sources:",
    "  - ",
    "  ",
    "    ",
    "\n",
    ": ",
    ", ",
    "[",
    "]",
    "{",
    "}",
    "- ",
    "? ",
    "&a ",
    "*a",
    "&b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]",
    "<<: *a",
    "!!python/object:os.system ",
    "!!python/name:os.system",
    "!!binary aGVsbG8=",
    "!!set {a, b}",
    "!!timestamp 2001-12-14",
    "!!float ",
    "!!int ",
    "!!str ",
    "!!map ",
    "!!omap [a: 1]",
    "!custom ",
    "%YAML 1.1\n---\n",
    "%TAG ! tag:x,2000:\n",
    "---\n",
    "...\n",
    "# c\n",
    "|\n  x\n",
    ">-\n  y\n",
    '"\\x00\\u0007"',
    "'\t'",
    "~",
    "null",
    ".inf",
    ".nan",
    "0x1F",
    "0o17",
    "1_000",
    "+12e3",
    "9" * 5000,
    "2001-13-45",
    "2002-02-30 25:61:61",
    "!!bool maybe",
    "!!int x",
    "1e999",
    "-" + "9" * 400,
    "x" * 70_000,
    "${HOME}",
    "${A:-${B:-${C}}}",
    "$${x}",
    "\ufeff",
    "type: synthetic",
    "type: video",
    "type: tensorrt",
    "fps: 30",
    "analytics:",
    "zones:",
    "points:",
    "publish:",
    "endpoint: tcp://*:5556",
    "backend:",
    "model:",
    "path: m.onnx",
    "defaults:",
    "devices:",
    "[" * 40,
    "]" * 40,
    "{a: " * 40,
    "}" * 40,
]
YAML_TEXT = st.one_of(
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), TEXT), max_size=30).map("".join),
    AGENT_CONFIGS.map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-config") / "agent.yaml"


def _through_the_file(path: Path, data: bytes) -> AgentConfig | None:
    """``data`` as ``run --config`` reads it: a file, its fleet check, every layer."""
    path.write_bytes(data)
    rendered = bounded(lambda: load_effective(str(path), device="cam", env={}, check_files=True), ConfigError)
    return None if rendered is None else rendered.config


@settings(max_examples=examples(60))  # a whole config and its fleet each: the slowest examples
@given(doc=st.one_of(AGENT_CONFIGS, FLEETS))
@example(doc={"source": {"type": "synthetic", "fps": 5}})
@example(doc={"defaults": {"source": {"fps": 5}}, "devices": {"cam": {"config": {"source": {"seed": 1}}}}})
def test_near_valid_configs_load_or_are_refused(config_file: Path, doc: dict) -> None:
    config = _through_the_file(config_file, yaml.safe_dump(doc, allow_unicode=True).encode())
    assert config is None or isinstance(config, AgentConfig)


@settings(max_examples=examples(100))
@given(text=YAML_TEXT)
@example(text="a: &a [*a]")  # an alias loop
@example(text="a: &a [x]\nb: &b [" + ", ".join(["*a"] * 10) + "]\nc: [" + ", ".join(["*b"] * 1_000) + "]")
@example(text="source: {labels: " + "[" * 200 + "]" * 200 + "}")
@example(text="!!python/object/apply:os.system [echo hi]")
@example(text="source: {fps: " + "9" * 5000 + "}")
@example(text="!custom ")  # found: a tag without a constructor, a ConstructorError from node_kind
@example(text="source: {fps: !!int x}")  # a ValueError from the int constructor
@example(text="source: {fps: 2001-13-45}")  # a date resolved, then a ValueError from datetime
@example(text="source: {fps: !!bool maybe}")  # a KeyError from the bool constructor
def test_yaml_text_loads_or_is_refused(text: str) -> None:
    config = bounded(lambda: configload.load(AgentConfig, text, "fuzz.yaml"), ConfigError)
    assert config is None or isinstance(config, AgentConfig)


@settings(max_examples=examples(100))
@given(data=st.one_of(st.binary(max_size=512), YAML_TEXT.map(lambda t: t.encode("utf-8", "replace"))))
@example(data=b"\xff\xfe\x00s\x00o")  # UTF-16 with a byte order mark
@example(data=b"source: {fps: 5}\x00\n")
@example(data=b"source:\n  type: synthetic\n  fps: \xc3(\n")
def test_raw_bytes_load_or_are_refused(config_file: Path, data: bytes) -> None:
    config = _through_the_file(config_file, data)
    assert config is None or isinstance(config, AgentConfig)
