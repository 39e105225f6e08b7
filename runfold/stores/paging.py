"""Pages and cursors of the listing methods (`list_runs`, `list_hooks`), alike in every store.

A listing returns a `Page`: its items, and, when more follow, an opaque cursor to pass back. A
store fetches one item more than `limit` to learn whether more follow, and builds the page with
`runs_page` or `hooks_page`; the cursor names the last item's sort key, which
`run_cursor_key` and `hook_cursor_key` give back, refusing any cursor the store did not make
with `InvalidArgument` (before any I/O, as the contract asks). A store of its own may use these,
so that its cursors look like the bundled stores'.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import TypeVar

from runfold.kernel import HookHolder, InvalidArgument, Page, RunSummary
from runfold.stores.time_keys import time_key

__all__ = [
    "decode_cursor",
    "encode_cursor",
    "hook_cursor_key",
    "hooks_page",
    "run_cursor_key",
    "runs_page",
]

T = TypeVar("T")


def encode_cursor(*parts: str | int) -> str:
    """An opaque, URL-safe cursor from a sort key (stores share this so cursors look alike)."""
    text = "\x1f".join(str(p) for p in parts)
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, count: int) -> list[str]:
    """The `count` parts of a cursor made by `encode_cursor`.

    Raises:
        InvalidArgument: `cursor` is not one `encode_cursor` made with `count` parts (a
            `ValueError`; the message does not quote it).
    """
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        raise _malformed() from None
    parts = text.split("\x1f")
    if len(parts) != count:
        raise _malformed()
    return parts


def _malformed() -> InvalidArgument:
    return InvalidArgument("cursor", "is malformed: not a cursor this store made")


def run_cursor_key(cursor: str) -> tuple[int, str]:
    """The `(time_key(created_at), run_id)` a `runs_page` cursor continues after.

    Raises:
        InvalidArgument: `cursor` is not one `runs_page` made.
    """
    micros, run_id = decode_cursor(cursor, 2)
    try:
        return int(micros), run_id
    except ValueError:
        raise _malformed() from None


def hook_cursor_key(cursor: str) -> tuple[str, str]:
    """The `(run_id, hook_id)` a `hooks_page` cursor continues after.

    Raises:
        InvalidArgument: `cursor` is not one `hooks_page` made.
    """
    run_id, hook_id = decode_cursor(cursor, 2)
    return run_id, hook_id


def runs_page(newest_first: Sequence[RunSummary], limit: int) -> Page[RunSummary]:
    """The `list_runs` page of the first `limit` summaries; any summary past them means more.

    `has_more` (with a cursor) only when the page has items and another one follows it: an
    exactly full last page has none, and so has a page of `limit` 0. Fetch `limit + 1` (newest
    first, `created_at` then `run_id`) to learn `has_more`; the cursor decodes with
    `run_cursor_key`.
    """
    return _page(newest_first, limit, lambda s: encode_cursor(time_key(s.created_at), s.run_id))


def hooks_page(ordered: Sequence[HookHolder], limit: int) -> Page[HookHolder]:
    """The `list_hooks` page of the first `limit` holders (by `run_id`, then `hook_id`).

    As `runs_page`: fetch `limit + 1`; the cursor decodes with `hook_cursor_key`.
    """
    return _page(ordered, limit, lambda h: encode_cursor(h.run_id, h.hook_id))


def _page(found: Sequence[T], limit: int, cursor_of: Callable[[T], str]) -> Page[T]:
    # `has_more` promises a next page with items, fetched with the cursor: a page of no items
    # (`limit` 0) has no cursor to continue from, so it promises nothing.
    items = tuple(found[: max(limit, 0)])
    has_more = bool(items) and len(found) > len(items)
    return Page(items=items, cursor=cursor_of(items[-1]) if has_more else None, has_more=has_more)
