"""What the handlers of each kind of call (steps, waits, children, messages, …) ask of the
interpreter that dispatches to them: a protocol, so that those modules need not import the
interpreter that imports them (no circle, not even one closed only for the type checker)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from runfold.flow.encoding import PayloadCodec
from runfold.flow.session import Consumed, Expected, Session
from runfold.kernel import Snapshot

__all__ = ["Interpreting"]


class Interpreting(Protocol):
    """The interpreter as a call's handler sees it (`runfold.flow.interpreter.Interpreter`)."""

    codec: PayloadCodec
    """Encodes step inputs and results, decodes recorded ones."""
    clock: Callable[[], datetime]
    """The time a relative timeout counts from."""
    bodies: dict[str, Callable[..., Any]]
    """Step bodies by step name, as workflow code last passed them."""
    sessions: OrderedDict[str, Session]
    """The live coroutines by run id."""

    def consumed(
        self, session: Session, durable: Snapshot | None, key: Consumed, expected: Expected
    ) -> None:
        """Note a result fed to the coroutine: unconfirmed unless `durable` already holds it."""

    def mismatch(self, session: Session, snapshot: Snapshot, recorded: str) -> None:
        """Raise `FlowNonDeterminism` for the session's current call against `recorded`."""

    def recorded_at(self, snapshot: Snapshot, call_id: str) -> str | None:
        """What the history holds at `call_id`, described, or None when nothing."""

    def other_kind(
        self, session: Session, snapshot: Snapshot, call_id: str, *, steps: bool = True
    ) -> None:
        """Raise if the history holds another kind of call at `call_id`.

        `steps=False`: the caller found no step there, so steps are not looked at again.
        """
