"""``edge-agent tune``: measure candidate configurations on this device, keep the cheapest
that holds the deadline, and write it as a config overlay with a report.

The axes are the ones this machine has: ONNX Runtime threads, graph optimisation level
and thread spinning everywhere; model variants (input size profiles) given with
``--model``; on a Jetson also TensorRT precision and DLA core, and GPU clock locks and
power modes through the power manager (restored after every candidate, and on any
interruption). Each candidate runs the real pipeline on real work: the user's frames
(``--frames DIR``), else the config's own video file or image folder, decoded into memory
once and played, looped, as a camera at the camera rate (the same ``MemorySource`` bench
plays: no decoding during a measurement); else (a synthetic or a live camera) the
synthetic camera.

A change must be worth it: the best candidate replaces the config as given only if it beats
it by more than the noise measured on this machine (the spread between the config's two
runs, one before the sweep and one after, and between the thirds of each measured window)
and by ``min_gain``; otherwise the config stays, and the report gives the figures (see
``noise``).

The search is cheap first: a candidate whose model alone (pure inference p50) cannot fit
the budget is pruned without a pipeline run; a pipeline run stops early once its running
median is past the budget. Accuracy is judged by agreement, so it works for any model:
the reference (the first candidate, the config as given) runs a fixed set of frames
(spread evenly over the same folder or video, or held-out synthetic ones for a synthetic
or live camera) through the live path, whatever its own measurement gave, and its
detections are the ground truth; each candidate that could be chosen (feasible: within
the budget) runs the same frames and scores mAP@0.5 against them, its agreement, and one
below ``1 - map_tolerance`` is rejected. Nothing is scored when the reference detects
nothing. Candidates whose detections cannot differ from the reference's (the same model
with only ONNX Runtime's thread settings, or the power state, changed) are not re-scored,
and each distinct model and arithmetic is scored once."""
