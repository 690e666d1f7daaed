"""edge-agent: a real-time inference agent with a hard per-frame deadline."""

import os

# OpenCV reads its cap on an image's pixels once, when cv2 is first imported; its default,
# 2**30, lets a small compressed file allocate gigabytes (a 30000x30000 PNG: 2.7 GB). Every
# edge_agent module imports this package first, so the cap is in place before any cv2.
# Behind the header check of pipelines/images.py; the same as the largest max_pixels
# (core/source_config.py). An operator's own value wins.
os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", "100000000")

__version__ = "0.1.0"
