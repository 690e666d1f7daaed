"""Tracks from detections, per source: a ByteTrack-class tracker (``bytetrack.py``) with
its assignment (``assign.py``), and the post step that runs a source's tracker on each of
its decoded frames and writes the track ids into the frame's slot (``step.py``)."""
