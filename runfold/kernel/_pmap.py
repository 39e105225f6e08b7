"""A persistent mapping for snapshots, so `apply` costs O(new events), not O(run length).

Snapshots of one run form a lineage: each `apply` derives a newer snapshot from an older one. All
views of a lineage share one dict, owned by the newest view (the tip). Advancing the tip writes the
changed entries into the shared dict in place and hands the previous tip a small undo dict (the
values it saw) plus a link to the newer view: Baker's trick for persistent arrays. Reading the tip
is a dict lookup; reading an older view walks its undo chain. An older view that nobody references
is garbage-collected together with its undo dict, so memory follows the live snapshots, not the
history. Deriving from a view that is no longer the tip (a second branch, e.g. after a sequence
conflict) copies it first: correct, O(entries), and rare.

Keys are only ever added, never removed, so a view's keys are the first `len(view)` keys of the
shared dict in insertion order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any, Generic, TypeVar

__all__ = ["PView", "stored"]

R = TypeVar("R")
V = TypeVar("V")

_ABSENT: Any = object()


def _identity(value: Any) -> Any:
    return value


class PView(Mapping[str, V], Generic[R, V]):
    """A read-only mapping from ids to public values, storing internal records `R`.

    `public` turns a stored record into the value the mapping hands out (a frozen state object).
    """

    __slots__ = ("_data", "_len", "_lock", "_next", "_public", "_undo")

    def __init__(
        self,
        data: dict[str, R],
        public: Callable[[R], V] = _identity,
        lock: threading.Lock | None = None,
    ) -> None:
        self._data: dict[str, R] | None = data
        self._len = len(data)
        self._undo: dict[str, R] | None = None
        self._next: PView[R, V] | None = None
        self._public = public
        # One lock per lineage: applies that race on the same tip are serialized.
        self._lock = lock if lock is not None else threading.Lock()

    # --- reads --------------------------------------------------------------------------------

    def raw(self, key: str) -> R | None:
        """The stored record for `key`, or None."""
        view = self
        while view._data is None:
            undo = view._undo
            assert undo is not None and view._next is not None
            found = undo.get(key, _ABSENT)
            if found is not _ABSENT:
                return None if found is _ABSENT_MARK else found
            view = view._next
        return view._data.get(key)

    def _tip_data(self) -> dict[str, R]:
        view = self
        while view._data is None:
            assert view._next is not None
            view = view._next
        return view._data

    def keys_list(self) -> list[str]:
        """This view's keys in insertion order (a copy: safe while the lineage moves on)."""
        data = self._tip_data()
        if len(data) == self._len:
            return list(data)
        return list(islice(data, self._len))

    def raw_items(self) -> list[tuple[str, R]]:
        """(key, record) pairs in insertion order."""
        if self._data is not None:
            return list(self._data.items())
        raw = self.raw
        return [(key, raw(key)) for key in self.keys_list()]  # type: ignore[misc]

    def __getitem__(self, key: str) -> V:
        data = self._data  # the tip (the usual read): its dict, without `raw`'s call
        found = data.get(key) if data is not None else self.raw(key)
        if found is None:
            raise KeyError(key)
        return self._public(found)

    def get(self, key: str, default: Any = None) -> Any:
        """The public value for `key`, or `default` (one lookup, not `Mapping`'s two calls)."""
        data = self._data  # the tip (the usual read): its dict, without `raw`'s call
        found = data.get(key) if data is not None else self.raw(key)
        return default if found is None else self._public(found)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.raw(key) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_list())

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"{{{', '.join(f'{k!r}: {v!r}' for k, v in self.items())}}}"

    # --- derivation ---------------------------------------------------------------------------

    def derive(self, changes: dict[str, R]) -> PView[R, V]:
        """A newer view: this one with `changes` (new or replaced entries) written over it."""
        if not changes:
            return self
        with self._lock:
            data = self._data
            if data is not None:
                undo = {}  # a loop, not a comprehension: a fold changes one entry or two
                for key in changes:
                    undo[key] = data.get(key, _ABSENT_MARK)
                data.update(changes)
                newer = PView(data, self._public, self._lock)
                self._undo = undo
                self._next = newer
                self._data = None
                return newer
        # Not the tip: branch off with a private copy.
        copy = dict(self.raw_items())
        copy.update(changes)
        return PView(copy, self._public)


# Marks "absent in this older view" inside an undo dict (distinct from a lookup miss).
_ABSENT_MARK: Any = object()


if TYPE_CHECKING:

    def stored(view: Mapping[str, Any], key: str) -> Any:
        """What `view` (a snapshot's mapping, a `PView`) stores under `key`, unfrozen; None if
        absent.

        A snapshot's public fields are typed by the public states they hand out; the kernel's
        rules read a field or two of the fold's record instead, which builds no frozen state.
        """

else:
    stored = PView.raw  # the unbound read itself: no call more than `view.raw(key)`
