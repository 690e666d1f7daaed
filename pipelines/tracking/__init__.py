"""Tracks from detections, per source: a ByteTrack-class tracker with journeys
(``bytetrack.py``), its assignment (``assign.py``) and box arithmetic (``boxes.py``). The
step that runs a source's tracker on each decoded frame: ``pipelines/steps/tracking.py``."""
