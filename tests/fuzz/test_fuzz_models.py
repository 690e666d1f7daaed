"""Fuzz targets for a model's own text: its manifest (YAML beside it) and its ONNX metadata.

Both are the model author's, so both are hostile until read: a manifest goes through
``load_manifest`` (bounded read, then the typed load), metadata through ``parse_value`` and
``parse_names`` and, whole, through ``manifest_from_info`` (the rules that pick a decoder
read ``task``, ``args``, ``end2end``, ``head``, ``kpt_shape`` and ``imgsz`` from it). The
property (``fuzzing.bounded``): a value, or the project's own error.
"""

from __future__ import annotations

import os
import tempfile

import yaml
from fuzzing import bounded, examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edge_agent.core.configload import ConfigError
from edge_agent.models import onnx_info
from edge_agent.models.decoders import registry as decoders
from edge_agent.models.decoders.recognition import Tensor
from edge_agent.models.manifest import ModelError, load_manifest, manifest_from_info

# -- strategies ---------------------------------------------------------------------------------------

#: Characters a hostile author reaches for: controls, quotes, brackets, surrogates, YAML syntax.
ODD = st.sampled_from([*"\x00\x07\x1b\r\n\t'\"\\{}[]():,&*!|>-#%@`", "\ud800", "\u202e", "é", " "])
TEXT = st.text(st.one_of(ODD, st.characters()), max_size=40)


@st.composite
def big(draw: st.DrawFn) -> str:
    """Long and deep strings: a piece repeated up to past every bound (1 MiB for names)."""
    piece = draw(st.sampled_from(["1+", "[", "(", "{0:", "-", "not ", "'a', ", "x", "{0: 'a', ", "\\x1b"]))
    n = draw(st.sampled_from([10, 300, 30_000, 300_000, 600_000]))
    head = draw(st.sampled_from(["", "[", "{", "(", "1"]))
    return head + piece * n + draw(st.sampled_from(["", "1", "]", "}", "'"]))


SCALAR = st.one_of(st.integers(), st.floats(), st.booleans(), st.none(), TEXT, st.integers(-(2**70), 2**70))
LITERAL = st.recursive(
    SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.integers(-2, 100), TEXT, st.booleans()), inner, max_size=6),
    ),
    max_leaves=20,
)
#: A metadata value: a Python literal's repr (what Ultralytics writes), raw text, or a big one.
VALUE = st.one_of(LITERAL.map(repr), TEXT, big())
NAMES = st.one_of(
    st.lists(TEXT, min_size=1, max_size=20).map(lambda xs: repr(dict(enumerate(xs)))),
    st.lists(TEXT, max_size=20).map(repr),
    st.integers(0, 12_000).map(lambda n: repr([f"c{i}" for i in range(n)])),
    VALUE,
)
KEYS = ("names", "task", "stride", "imgsz", "kpt_shape", "args", "end2end", "head", "batch", "channels")
METADATA = st.fixed_dictionaries(
    {},
    optional={
        "names": NAMES,
        "task": st.one_of(st.sampled_from([*onnx_info.TASKS, "classify", "detect\x1b"]), VALUE),
        "imgsz": st.one_of(st.lists(st.integers(-5, 10**6), max_size=3).map(repr), VALUE),
        "kpt_shape": st.one_of(st.lists(st.integers(-1, 10**6), max_size=3).map(repr), VALUE),
        "args": st.one_of(
            st.fixed_dictionaries({"nms": st.one_of(st.booleans(), TEXT), "batch": st.integers()}).map(repr),
            VALUE,
        ),
        "end2end": st.one_of(st.sampled_from(["True", "False", "true"]), VALUE),
        "head": st.one_of(st.just("RTDETRDecoder"), VALUE),
        "stride": VALUE,
    },
)

DIM = st.one_of(st.none(), st.sampled_from([1, 3, 6, 8, 56, 84, 116, 300, 2100, 8400]), st.integers(1, 10**9))
#: What the rules see of a graph: the usual heads' outputs, or any shapes.
OUTPUTS = st.one_of(
    st.sampled_from(
        [
            (Tensor("output0", (None, 84, 8400), "float32"),),
            (Tensor("output0", (None, 56, None), "float32"),),
            (Tensor("output0", (None, 300, 6), "float32"),),
            (
                Tensor("output0", (None, 116, 8400), "float32"),
                Tensor("output1", (None, 32, 160, 160), "float32"),
            ),
            (Tensor("output0", (None, 8400, 85), "float32"),),
        ]
    ),
    st.lists(
        st.builds(
            Tensor, TEXT, st.lists(DIM, max_size=5).map(tuple), st.sampled_from(["float32", "int32", ""])
        ),
        min_size=1,
        max_size=4,
    ).map(tuple),
)
INPUTS = st.one_of(
    st.just((Tensor("images", (None, 3, None, None), "float32"),)),
    st.just((Tensor("images", (1, 640, 640, 3), "uint8"),)),
    st.lists(DIM, max_size=5).map(lambda dims: (Tensor("images", tuple(dims), "float32"),)),
)


@st.composite
def manifests(draw: st.DrawFn) -> bytes:
    """A manifest's bytes: near-valid YAML (keys right, values anything), YAML-shaped noise,
    or raw bytes."""
    kind = draw(st.sampled_from(["near", "noise", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=400))
    if kind == "noise":
        tokens = st.sampled_from(
            ["labels:", "input:", "output:", "{", "}", "[", "]", "- ", "\n", "  ", "&a ", "*a", ": ", ",",
             "!!python/object:os.system", "<<: *a", "'", '"', "\\e", "? ", "---\n", "%YAML 1.1\n", "a"]
        )  # fmt: skip
        return "".join(draw(st.lists(tokens, max_size=60))).encode()
    number = st.one_of(st.integers(1, 2000), st.integers(-(2**40), 2**40), st.floats(), TEXT)
    doc = draw(
        st.fixed_dictionaries(
            {
                "labels": st.one_of(
                    st.lists(TEXT, max_size=30), st.lists(st.text(max_size=300), max_size=3), LITERAL
                )
            },
            optional={
                "name": TEXT,
                "input": st.fixed_dictionaries(
                    {},
                    optional={
                        "name": TEXT,
                        "height": number,
                        "width": number,
                        "layout": st.sampled_from(["NCHW", "NHWC", "x"]),
                        "dtype": st.sampled_from(["float32", "uint8", "int8"]),
                        "mean": st.lists(number, max_size=4),
                        "pad_value": number,
                    },
                ),
                "output": st.fixed_dictionaries(
                    {},
                    optional={
                        "name": TEXT,
                        "decoder": st.one_of(st.sampled_from(decoders.names()), TEXT),
                        "kpt_shape": st.lists(number, max_size=3),
                        "efficient_nms": st.dictionaries(TEXT, TEXT, max_size=4),
                    },
                ),
                "score_threshold": number,
                "extra": LITERAL,
            },
        )
    )
    return yaml.safe_dump(doc, allow_unicode=draw(st.booleans())).encode("utf-8", "surrogatepass")


# -- targets ------------------------------------------------------------------------------------------


def _load_bytes(data: bytes) -> object:
    fd, path = tempfile.mkstemp(suffix=".yaml")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return bounded(lambda: load_manifest(path), (ModelError, ConfigError))
    finally:
        os.unlink(path)


@settings(max_examples=examples(50))  # each example writes a file and composes YAML
@given(manifests())
@example(b"labels: [" + b",".join(b"a" for _ in range(200_000)) + b"]\n")  # 25 s to compose, before
@example(b"labels: ['\\ud800']\n")
@example(b"")  # an empty manifest: a bare FieldError (exit 1, no file named), before
@example(b"\x00")  # yaml's ReaderError, raised outside the composer's handling, before
@example(b"!!python/object:os.system")  # ConstructorError from the typed build, before
@example(b"labels: [!!binary x]")
def test_a_manifest_loads_or_is_refused(data: bytes) -> None:
    _load_bytes(data)


@settings(max_examples=examples(100))
@given(st.sampled_from(KEYS), VALUE)
@example("names", "1" + "+1" * 300_000)  # RecursionError in ast.literal_eval; a segfault on 3.10
@example("task", "-" * 100_000 + "1")  # the parser's MemoryError
@example("args", "[" * 3000)
def test_a_metadata_value_parses_or_is_refused(key: str, text: str) -> None:
    bounded(lambda: onnx_info.parse_value(key, text), onnx_info.MetadataError)


@settings(max_examples=examples(100))
@given(NAMES)
@example("{0: 'a', 'x': 'b'}")  # sorted() of mixed keys: TypeError, before
@example("{0: '\\ud800'}")
@example(repr([f"c{i}" for i in range(10_001)]))
def test_metadata_names_parse_or_are_refused(text: str) -> None:
    labels = bounded(lambda: onnx_info.parse_names(text), onnx_info.MetadataError)
    if labels is not None:
        assert 0 < len(labels) <= onnx_info.MAX_LABELS
        assert all(not onnx_info.label_problem(label) for label in labels)


@settings(max_examples=examples(60))  # each example runs every decoder's rules
@given(INPUTS, OUTPUTS, METADATA)
@example(
    (Tensor("images", (None, 3, None, None), "float32"),),
    (Tensor("o", (None, 84, 8400), "float32"),),
    {"imgsz": "[100000, 100000]"},
)
def test_onnx_metadata_gives_a_manifest_or_a_refusal(inputs, outputs, metadata) -> None:
    info = onnx_info.OnnxInfo(inputs, outputs, metadata, frozenset())
    bounded(lambda: manifest_from_info("model.onnx", info), ModelError)
