"""edge-agent: a real-time inference agent with a hard per-frame deadline."""

__version__ = "0.1.0"
