"""Tasks: what a model's detections carry beyond the box (keypoints, an oriented box, a
mask), from the decoder's values in model-input pixels to source pixels and the stream.

``base`` holds the interface (``Task``, which is also plain detection) and the helpers the
tasks share; one module per further task (``pose``, ``obb``, ``segment``), each declaring
its class as ``TASK``; ``registry`` collects those by name and gives a loaded model its
task (``task_for``: the one its decoder's ``Decoder.task`` names); ``masks`` makes the
segmentation masks and writes them as polygons or RLE.
"""
