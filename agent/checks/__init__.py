"""Checks a user runs: the on-device self-test (``selftest``), a model's accuracy on
labelled images (``evaluation``), what a model file holds and whether it fits the deadline
(``modelcheck``), and a running agent's health (``healthcheck``, `edge-agent health`)."""
