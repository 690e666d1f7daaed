"""A scanner of flat Python literals, for text a model's author wrote (Ultralytics writes
its ONNX metadata as reprs: ``{0: 'person', 1: 'bicycle'}``).

``ast.literal_eval`` is not safe on such text: a deep expression overflows the stack (a
RecursionError, or a segfault on Python 3.10) and a long one the parser's own. This reads
str, int, float, True/False/None, and lists, tuples and dicts of them to a bounded depth,
with an explicit stack, each container's items and each number's length bounded.
"""

from __future__ import annotations

import re
from typing import Any

MAX_NUMBER_CHARS = 32  # int() of thousands of digits is slow, or refused (Python 3.11+)


class NotLiteral(ValueError):
    """Why a text is not a flat literal (for the refusal)."""


_TOKEN = re.compile(
    r"""\s*(?:
    (?P<str>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")
    |(?P<num>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)
    |(?P<word>True|False|None)\b
    |(?P<punct>[][{}(),:])
    )""",
    re.X,
)
#: The escapes Python's repr() writes in a string.
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)")
_SIMPLE = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
_WORDS = {"True": True, "False": False, "None": None}
_CLOSE = {"{": "}", "[": "]", "(": ")"}


def _unescape(match: re.Match) -> str:
    e = match.group(1)
    if len(e) == 1:
        if e not in _SIMPLE:
            raise NotLiteral(f"a string with the escape \\{e}, which repr() never writes")
        return _SIMPLE[e]
    code = int(e[1:], 16)
    if code > 0x10FFFF:
        raise NotLiteral(f"a string with the escape \\{e}, past Unicode")
    return chr(code)


def _scalar(kind: str, token: str) -> Any:
    if kind == "str":
        return _ESCAPE.sub(_unescape, token[1:-1])
    if kind == "word":
        return _WORDS[token]
    if len(token) > MAX_NUMBER_CHARS:
        raise NotLiteral(f"a number of {len(token)} characters")
    return float(token) if any(c in token for c in ".eE") else int(token)


class _Open:
    """A container being read: its closing bracket, items, and a dict's pending key."""

    __slots__ = ("close", "items", "key", "state")

    def __init__(self, opening: str) -> None:
        self.close = _CLOSE[opening]
        self.items: Any = {} if opening == "{" else []
        self.key: Any = None
        self.state = "first"  # first | key (a dict's, read) | colon | value (read) | comma

    def value(self) -> Any:
        return tuple(self.items) if self.close == ")" else self.items


def literal(text: str, max_items: int, max_depth: int) -> Any:
    """The flat literal ``text`` (str, int, float, True/False/None, and lists, tuples and
    dicts of them at most ``max_depth`` deep, each of at most ``max_items`` items), read
    with an explicit stack. Raises NotLiteral saying where and why."""
    stack: list[_Open] = []
    done, result, pos = False, None, 0
    while True:
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip():
                raise NotLiteral(f"{text[pos : pos + 12].strip()!r} at character {pos + 1} is not a literal")
            break
        pos, kind = m.end(), m.lastgroup or ""
        token = m.group(kind)
        if done:
            raise NotLiteral(f"{token!r} at character {pos} after the value's end")
        top = stack[-1] if stack else None
        if kind == "punct" and token in ",:)]}":
            if top is None:
                raise NotLiteral(f"{token!r} at character {pos} outside a list or dict")
            if token == ",":
                if top.state != "value":
                    raise NotLiteral(f"',' at character {pos} where a value belongs")
                top.state = "comma"
            elif token == ":":
                if top.state != "key":
                    raise NotLiteral(f"':' at character {pos} outside a dict's key")
                top.state = "colon"
            else:
                if token != top.close or top.state not in ("first", "value", "comma"):
                    raise NotLiteral(f"{token!r} at character {pos} does not close {top.close!r}")
                stack.pop()
                value = top.value()
                if _put(stack, value, max_items):
                    done, result = True, value
            continue
        if top is not None and top.state not in ("first", "comma", "colon"):
            raise NotLiteral(f"{token!r} at character {pos}: a ',' or {top.close!r} belongs here")
        if kind == "punct":  # an opening bracket
            if len(stack) >= max_depth:
                raise NotLiteral(f"lists or dicts nested more than {max_depth} deep")
            if top is not None and isinstance(top.items, dict) and top.state != "colon":
                raise NotLiteral(f"a list or dict as a dict's key at character {pos}")
            stack.append(_Open(token))
            continue
        value = _scalar(kind, token)
        if _put(stack, value, max_items):
            done, result = True, value
    if stack:
        raise NotLiteral(f"{stack[-1].close!r} missing at the end")
    if not done:
        raise NotLiteral("no value")
    return result


def _put(stack: list[_Open], value: Any, max_items: int) -> bool:
    """``value`` into the open container (a dict's key, or its value, or an item); True
    when none is open: ``value`` is the whole literal."""
    if not stack:
        return True
    top = stack[-1]
    if isinstance(top.items, dict):
        if top.state != "colon":
            top.key, top.state = value, "key"
            return False
        top.items[top.key] = value
    else:
        top.items.append(value)
    if len(top.items) > max_items:
        raise NotLiteral(f"more than {max_items:,} items")
    top.state = "value"
    return False
