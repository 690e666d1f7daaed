"""Per-frame steps: what runs on every decoded frame of a source before its result is
published (its tracker, then analytics on its tracks), as plug-ins (``base.py``)."""
