"""One rule for the names that become a ZeroMQ stream topic and an MQTT topic level (a
source's name, ``publish.topic``, ``device_id``): the config checks them with it, and the
uplink checks what it reads from the stream with the same rule, so a name the config takes
is never one the uplink rejects (nor the other way round)."""

from __future__ import annotations

from typing import Any

#: At most this many characters (a topic level, a Prometheus label, a file name, a URL).
MAX_NAME = 128
_LEVEL_UNSAFE = frozenset("/#+")  # a level separator and the MQTT wildcards
_TOPIC_UNSAFE = frozenset("#+")  # in a whole topic, '/' separates levels


def chars_problem(text: str, unsafe: frozenset[str] = _LEVEL_UNSAFE) -> str | None:
    """Why ``text`` has characters no broker takes (None when it has none): MQTT wildcards
    (and '/' in one level), U+0000 or any control character (brokers disconnect for these),
    an unpaired surrogate (not UTF-8)."""
    if unsafe & set(text):
        return "contains " + ", ".join(repr(c) for c in sorted(unsafe))
    # isprintable() is False for control characters, surrogates, unassigned code points
    # and separators other than the space.
    if not text.isprintable():
        return "contains a control character or an unprintable code point"
    return None


def topic_chars_problem(topic: str) -> str | None:
    """:func:`chars_problem` for a whole topic (levels separated by '/')."""
    return chars_problem(topic, _TOPIC_UNSAFE)


def level_problem(name: Any) -> str | None:
    """Why ``name`` cannot be one MQTT topic level (None when it can): empty, longer than
    MAX_NAME characters, a space, or what :func:`chars_problem` refuses."""
    if not isinstance(name, str) or not name:
        return "empty or not a string"
    if len(name) > MAX_NAME:
        return f"longer than {MAX_NAME} characters"
    if " " in name:
        return "contains a space"
    return chars_problem(name)


def name_ok(name: str) -> bool:
    """A name the config takes: letters, digits, '-' and '_' (anything else is awkward in
    URLs, Prometheus labels and file names), and a topic level by :func:`level_problem`."""
    return level_problem(name) is None and all(c.isalnum() or c in "-_" for c in name)


#: The config's explanation for a name :func:`name_ok` refuses.
NAME_RULE = f"use letters, digits, '-' and '_' only, at most {MAX_NAME} characters"
