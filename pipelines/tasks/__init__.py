"""Tasks: what a model's detections carry beyond the box (keypoints, an oriented box, a
mask), from the decoder's values in model-input pixels to the stream.

``base`` holds the interface and picks a model's task from its decoder; one module per
task (``pose``, ``obb``, ``segment``); ``masks`` makes the segmentation masks and writes
them as polygons or RLE.
"""
