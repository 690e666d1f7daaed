"""The message schema's version: one number for every message the agent sends (results,
health, events), and what every reader of them checks (the client, the uplink).

``pipelines/schema/message-v<N>.schema.json`` describes version N.
"""

from __future__ import annotations

#: Version 2 added the tracker's fields to results, and health and event messages.
SCHEMA_VERSION = 2
