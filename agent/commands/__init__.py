"""The commands of ``edge-agent``, one module per group; ``cli`` parses and dispatches."""
