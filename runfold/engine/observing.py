"""`ObserverFanOut`: hands what the engine appended to its observers, each only what it asks for."""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence

from runfold.engine.runtime import EngineObserver
from runfold.kernel import Envelope

__all__ = ["ObserverFanOut"]

_log = logging.getLogger("runfold.engine")


class ObserverFanOut:
    """The engine's observers, with the event classes each observes (`observed_events`).

    An observer's failure is logged (logger `runfold.engine`) and never reaches the run.
    """

    __slots__ = ("_by_kind", "observed", "observers")

    def __init__(self, observers: Iterable[EngineObserver]) -> None:
        self.observers = tuple(observers)
        # Per observer, the event classes it sees (its `observed_events`), or None: every one.
        self.observed: tuple[Collection[type] | None, ...] = tuple(
            getattr(observer, "observed_events", None) for observer in self.observers
        )
        # Per event class met so far, the observers that see it, in order.
        self._by_kind: dict[type, tuple[EngineObserver, ...]] = {}

    def _observing(self, kind: type) -> tuple[EngineObserver, ...]:
        """The observers that see events of class `kind`, in order (found once per class)."""
        found = self._by_kind.get(kind)
        if found is None:
            found = self._by_kind[kind] = tuple(
                observer
                for observer, observed in zip(self.observers, self.observed, strict=True)
                if observed is None or kind in observed
            )
        return found

    async def notify(self, envelopes: Sequence[Envelope]) -> None:
        """Await each observer on each envelope of a class it observes, in order."""
        for envelope in envelopes:
            for observer in self._observing(type(envelope.event)):
                try:
                    await observer.on_event(envelope)
                except Exception:
                    _log.exception(
                        "observer %r failed on event %d of run %r; the run goes on",
                        observer,
                        envelope.sequence,
                        envelope.run_id,
                    )
