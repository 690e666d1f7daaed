"""Inference backends behind one interface (see base.py), registered in registry.py."""
