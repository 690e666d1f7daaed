"""Host CPU per frame of decoding a detector's outputs (decode + NMS) and of the JSON result
message, numpy reference path against the compiled kernels, interleaved in one process.

    .venv-3.12/bin/python tools/decode_cost.py --model /tmp/peer-models/yolov8n-busy-640.onnx \\
        --frames /tmp/bench-png [--n 100] [--rounds 8] [--tracks]

Runs the model once per frame (ONNX Runtime, as ``load_model`` sets it up), keeps the
outputs, then per round times each variant over all frames, alternating them so that a busy
machine weighs on both alike. ``decode`` is ``LoadedModel.decode`` (the bound decoder the
post stage calls) over the frames in turn, so the 2.7 MB of class scores come from memory
as after an inference ("cold"); ``decode-warm`` repeats one frame (in cache: what is left
is the Python and the kernel's own work). ``message`` is ``MessageBuilder.encode`` of the
filled slot (``build``, the latencies, the head and the detections). Prints, per variant,
the range over rounds of the mean thread CPU time per frame (us). A measuring tool, not a
test: the kernels' exactness is tests/models/decoders/test_decode_kernels.py's.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
from edge_agent.models.decoders import kernels
from edge_agent.pipelines import jit
from edge_agent.pipelines.messages import MessageBuilder
from edge_agent.pipelines.model import load_model
from edge_agent.pipelines.slots import FrameSlot


def per_frame_us(fn: Callable[[int], object], count: int) -> float:
    t0 = time.thread_time_ns()
    for i in range(count):
        fn(i)
    return (time.thread_time_ns() - t0) / count / 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--frames", required=True, help="a folder of images (png, jpg)")
    p.add_argument("--n", type=int, default=100, help="frames used")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--tracks", action="store_true", help="messages with track ids and ages")
    a = p.parse_args()

    loaded = load_model(ModelConfig(path=a.model), OnnxRuntimeConfig())
    params = loaded.params
    slot = FrameSlot(
        0, loaded.backend.allocate(), loaded.input_name, params.max_detections, None, loaded.task
    )
    outputs = []
    images = sorted(f for f in Path(a.frames).iterdir() if f.suffix.lower() in (".png", ".jpg", ".jpeg"))
    for f in images[: a.n]:
        image = cv2.imread(str(f))
        loaded.preprocessor(image, slot.tensor, slot.geo)
        loaded.backend.infer(slot.io)
        outputs.append([o.copy() for o in slot.io.outputs])
    geo = slot.geo
    loaded.close()

    compiled = jit.load("decode", kernels.FUNCTIONS, kernels.warm)
    ref = MessageBuilder("cost", loaded.manifest.labels, 50.0, tracks=a.tracks)
    fast = MessageBuilder("cost", loaded.manifest.labels, 50.0, tracks=a.tracks)
    ref._kernel = None  # the % formatting, as before the kernel
    fast._unix_offset_ns = ref._unix_offset_ns  # the same capture_unix_s in both
    print(f"kernels: {jit.state()}")

    # One slot per frame, filled once, for the message variants.
    slots = []
    counts = []
    for outs in outputs:
        s = FrameSlot(0, slot.io, loaded.input_name, params.max_detections, None, loaded.task)
        s.geo = geo
        s.fill(loaded.decode(outs, params))
        s.source, s.frame_id = "cam0", 1
        s.stamps[:] = np.arange(len(s.stamps)) * 1_000_000 + 10**12
        if a.tracks:
            s.det_track[: s.det_count] = np.arange(s.det_count) % 7
            s.det_track_age[: s.det_count] = np.arange(s.det_count) * 3
        slots.append(s)
        counts.append(s.det_count)

    def message(builder: MessageBuilder) -> Callable[[int], object]:
        def one(i: int) -> bytes:
            s = slots[i]
            m = builder.build(s, i, "yolov8n")
            m["latency_ms"] = builder.latencies(s)
            return builder.encode(m, s)

        return one

    for i in range(len(slots)):
        assert message(ref)(i) == message(fast)(i), f"frame {i}: the messages differ"
        kernels.install(None)
        reference = loaded.decode(outputs[i], params)
        kernels.install(compiled)
        got = loaded.decode(outputs[i], params)
        assert all(np.array_equal(x, y) for x, y in zip(reference[:3], got[:3])), f"frame {i}: decodes differ"

    n = len(outputs)
    decode = loaded.decode

    def decoding(i: int) -> object:
        return decode(outputs[i], params)

    def decoding_warm(i: int) -> object:
        return decode(outputs[0], params)

    variants: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for name, on, fn in (
            ("decode numpy", None, decoding),
            ("decode kernel", compiled, decoding),
            ("decode-warm numpy", None, decoding_warm),
            ("decode-warm kernel", compiled, decoding_warm),
        ):
            kernels.install(on)
            variants.setdefault(name, []).append(per_frame_us(fn, n))
        variants.setdefault("message %", []).append(per_frame_us(message(ref), n))
        variants.setdefault("message kernel", []).append(per_frame_us(message(fast), n))
    kernels.install(None)
    print(
        f"{a.model}: {n} frames, detections per frame mean {np.mean(counts):.1f} "
        f"(min {min(counts)}, max {max(counts)}), {a.rounds} rounds, thread CPU us per frame"
    )
    for name, v in variants.items():
        print(f"  {name:20s} min {min(v):7.1f}  median {float(np.median(v)):7.1f}  max {max(v):7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
