"""Zones, lines, dwell and events on a source's tracks."""
