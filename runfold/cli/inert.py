"""Stored text made inert for a terminal: what the CLI prints can neither steer it nor lie.

Run ids, attributes, payloads, errors, progress messages and cancel reasons come from whoever
started a run or called a webhook. Written raw, an escape sequence among them would clear the
operator's screen, set the window title or write the clipboard (OSC 52), and a bidi override
would show one id as another. `inert` is the one function every printed value goes through
(`Terminal` applies it to every line, table cell, error and JSON document): each C0 and C1
control character, DEL, lone surrogate, bidi control and line or paragraph separator is shown
visibly as its escape (`\\x1b`, `\\u202e`) instead. Rich markup in stored text (`[/]`,
`[link=…]`) is never parsed: `Terminal` hands rich `Text` objects, never markup strings.
"""

from __future__ import annotations

import re

__all__ = ["inert", "inert_json"]

# C0 controls, DEL and C1 controls; the Arabic letter mark and the bidi marks, embeddings,
# overrides and isolates; the line and paragraph separators; lone surrogates (which a UTF-8
# terminal cannot even be sent). Written by hand: neither rich nor the standard library has a
# function that shows these instead of dropping or passing them.
_BEYOND_C0 = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(f"[\x00-\x1f{_BEYOND_C0}]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def inert(text: str) -> str:
    """`text` with every character that could steer a terminal shown as its escape instead.

    `"run\\x1b]0;title\\x07"` becomes `"run\\\\x1b]0;title\\\\x07"`: the same characters a reader
    sees, none that a terminal acts on.
    """
    return _UNSAFE.sub(_visible, text)


_UNSAFE_IN_JSON = re.compile(f"[{_BEYOND_C0}]")  # json.dumps escapes C0 itself


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def inert_json(document: str) -> str:
    """A JSON document with the characters `inert` shows written as JSON `\\uXXXX` escapes.

    The document comes from `json.dumps(..., ensure_ascii=False)`; the result is the same value,
    safe on a terminal.
    `json.dumps` already escapes C0 controls; these can only occur inside strings, where the
    escape is valid JSON that decodes to the same text.
    """
    return _UNSAFE_IN_JSON.sub(_json_escape, document)
