"""How the inspector shows an opaque payload: JSON pretty-printed, else text, else hex or base64.

Payloads are bytes only the runtime understands; the inspector guesses the most readable form
and labels it, so a reader knows whether they see the bytes' JSON, their text or an encoding of
them. The result is plain text: the templates escape it like every other stored value.
"""

from __future__ import annotations

import base64
import json

import attrs

__all__ = ["HEX_LIMIT", "ShownPayload", "show_payload"]

HEX_LIMIT = 64
"""Binary payloads up to this many bytes are shown as hex, longer ones as base64."""


@attrs.frozen(kw_only=True, slots=True)
class ShownPayload:
    """A payload as the page shows it: `label` says which form `text` is in."""

    label: str
    text: str
    size: int


def show_payload(payload: bytes) -> ShownPayload:
    """`payload` as pretty JSON, UTF-8 text, hex (short) or base64 (long), labelled."""
    size = len(payload)
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        if size <= HEX_LIMIT:
            return ShownPayload(label="hex", text=payload.hex(" "), size=size)
        return ShownPayload(label="base64", text=base64.b64encode(payload).decode(), size=size)
    try:
        value = json.loads(text)
    except ValueError:
        return ShownPayload(label="text", text=text, size=size)
    return ShownPayload(
        label="json", text=json.dumps(value, indent=2, ensure_ascii=False), size=size
    )
