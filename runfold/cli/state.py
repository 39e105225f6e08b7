"""What the `runfold` group hands its commands: the terminal, made when first written to, and
the store the group was given. Light on purpose: `runfold --help` imports it, and nothing of
rich, the kernel or the stores."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runfold.cli.output import Terminal

__all__ = ["DEFAULT_STORE", "State"]

DEFAULT_STORE = "sqlite:///runfold.db"
"""The store used without `--store` or `RUNFOLD_STORE`."""


class State:
    """The terminal (`make_terminal()`, called once, on first use) and the group's store."""

    def __init__(self, make_terminal: Callable[[], Terminal]) -> None:
        self._make_terminal = make_terminal
        self._terminal: Terminal | None = None
        self.store: str | None = None

    @property
    def terminal(self) -> Terminal:
        """Where the command writes."""
        if self._terminal is None:
            self._terminal = self._make_terminal()
        return self._terminal
