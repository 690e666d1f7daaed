"""Frame sources, preprocessing, inference backends, decoding and the staged pipeline."""
