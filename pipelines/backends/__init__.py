"""Inference backends behind one interface (see base.py); each module that adds one declares
it as ``BACKENDS``, which registry.py collects."""
