"""``edge-agent bench``: where every millisecond goes, measured in one run.

Four phases on the real pipeline code, the model the source runs (the config's, the
source's own, or ``--model``) and frames of the config's source, or of a video file or
image folder (``--source``):

1. **pure inference**: the backend alone on one fixed, preprocessed input, back to back,
   on the very session the sequential phase runs;
2. **sequential**: capture → preprocess → infer → postprocess → publish one frame after
   another on one thread (what a hand-written loop does); phases 1 and 2 run on one
   agent in alternating blocks (``alone_and_sequential``), so the host's drift (its
   clocks, other work) weighs on both alike;
3. **pipelined, saturated**: the three stage threads with an unpaced source, for the
   highest throughput (frames queue in the hand-offs by design);
4. **pipelined, live**: a paced source (the config's fps, or ``--source-fps``), so the
   latency and the overhead around the model are those a camera would see, including
   admission drops and the degradation ladder under overload.

The bench's own timed loops keep every duration (exact percentiles) and start once no
other thread of the process runs (``phases.settle``: ONNX Runtime's pool threads spin on
after a run). Each phase also records the cores other processes used meanwhile
(``phases.host_load``), and the result says whether the model's inference (the larger
p50 of alone and live) fits the per-frame budget (``core.budget_fit``).

``overhead`` is each frame's end-to-end time minus its capture and inference stages:
preprocessing, hand-offs, postprocessing and publishing (JSON + socket send included).
When the model runs as an input-adapted copy (``model.input_adapter``: the normalisation
moved into the graph), that work is inside the inference stage: the bench times what the
adapter put in front of the model (a Transpose and a Cast) alone, in a session of its own
with the same settings (``adapter_prefix``), and adds it to the overhead it reports (its
p50 to the p50; its p99 to the p99, an upper bound). The whole adapted and original
models are timed too, in alternating blocks after phase 2, for information: their
difference is within the noise of two p50s of the model.

Frames: a synthetic camera for a synthetic or live-camera source (a camera may be held by
the agent the bench runs beside); from a video file or an image folder (the config's own
single file source, or ``--source``) the frames are decoded into memory first and played
from there, looped (``sources.MemorySource``): unpaced in the inference, sequential and
saturated phases, as a camera at the live rate in the live phase. Decoding a file (a PNG
costs milliseconds) is thus no part of any figure, as a camera's frames arrive decoded,
and it never competes with inference for the cores. Each phase counts the detections of
every published frame, so the figures describe the model on these scenes.

``compare_bare`` (``--compare-bare``) adds a fifth phase: a plain ONNX Runtime loop on one
thread (letterbox, ``session.run``, decode and NMS) on the same frames, with the config's
ONNX Runtime settings (``bare_loop``), compared with the sequential phase (the same frames,
one at a time): overhead against the loop's pre + post, and inference less the adapter's
in-graph work against the loop's ``session.run``.

``--sources N`` benchmarks several cameras on one accelerator instead (``run_multi_bench``):
saturated throughput of one source, of N sources without batching and of N sources
batched; then N paced sources live, with each source's latency and the batch sizes."""
