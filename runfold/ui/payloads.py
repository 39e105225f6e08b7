"""How the inspector shows an opaque payload: JSON pretty-printed, else text, else hex or base64.

Payloads are bytes only the runtime understands; the inspector guesses the most readable form
and labels it, so a reader knows whether they see the bytes' JSON, their text or an encoding of
them. The result is plain text: the templates escape it like every other stored value.
"""

from __future__ import annotations

import base64
import json

import attrs

__all__ = [
    "HEX_LIMIT",
    "LISTED_LIMIT",
    "MAX_JSON_DEPTH",
    "SHOWN_LIMIT",
    "ShownPayload",
    "show_payload",
]

HEX_LIMIT = 64
"""Binary payloads up to this many bytes are shown as hex, longer ones as base64."""
MAX_JSON_DEPTH = 64
"""JSON nested deeper than this is shown as its text, not pretty-printed."""
SHOWN_LIMIT = 16_384
"""A payload's shown form is cut after this many characters."""
LISTED_LIMIT = 1_024
"""The cut of a payload in a table or history row: a page of rows stays well under a megabyte."""


@attrs.frozen(kw_only=True, slots=True)
class ShownPayload:
    """A payload as the page shows it: `label` says which form `text` is in."""

    label: str
    text: str
    size: int


def show_payload(payload: bytes, limit: int = SHOWN_LIMIT) -> ShownPayload:
    """`payload` as pretty JSON, UTF-8 text, hex (short) or base64 (long), labelled.

    JSON nested deeper than `MAX_JSON_DEPTH` is shown as its text, and any form longer than
    `limit` characters is cut there (`size` still says how large the payload is): a
    hostile payload can make a page neither fail nor grow without bound.
    """
    size = len(payload)
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        if size <= HEX_LIMIT:
            return ShownPayload(label="hex", text=payload.hex(" "), size=size)
        encoded = base64.b64encode(payload[: limit * 3 // 4]).decode()
        return ShownPayload(
            label="base64", text=_cut(encoded, limit, size > limit * 3 // 4), size=size
        )
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's stack
        return ShownPayload(label="text", text=_cut(text, limit), size=size)
    if not _within_depth(value, MAX_JSON_DEPTH):
        return ShownPayload(label="text", text=_cut(text, limit), size=size)
    pretty = json.dumps(value, indent=2, ensure_ascii=False)
    return ShownPayload(label="json", text=_cut(pretty, limit), size=size)


def _cut(text: str, limit: int, more: bool = False) -> str:
    """`text` up to `limit` characters, saying so when it was cut."""
    if len(text) <= limit and not more:
        return text
    return text[:limit] + "\n… (cut: the payload is larger than the page shows)"


def _within_depth(value: object, limit: int) -> bool:
    """Whether `value` (parsed JSON) nests no deeper than `limit`, found without recursing.

    The CLI has the same check (`runfold.cli.output`); the inspector does not import the CLI
    (nor the CLI the inspector's extra), so each keeps its few lines.
    """
    pending: list[tuple[object, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return True
