"""The stages every frame goes through, and the stamps that bound them.

Each frame carries one ``time.monotonic_ns()`` stamp per boundary; stage i lasts from stamp
i to stamp i + 1, so the stages add up to the end-to-end time. Config (``deadline``), the
pipeline, its accounting and the tools all name stages by these.
"""

CAPTURED, PRE_START, PRE_END, INFER_START, INFER_END, POST_START, POST_END, PUBLISH = range(8)
N_STAMPS = 8
STAGES = ("capture", "preprocess", "wait_infer", "infer", "wait_post", "postprocess", "publish")
