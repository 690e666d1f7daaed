"""The foundation: config schema and loading, stage names, latency histograms, files,
process resources. Depends on nothing else of edge-agent (tests/test_layers.py)."""
