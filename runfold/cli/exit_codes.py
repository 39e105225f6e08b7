"""Exit codes and the one-line failure: how a `runfold` command tells the shell what happened.

Exit codes are public (each keeps its meaning across releases), so they live here once: the
constants, the table `runfold --help` prints after the commands, and `CliError`, which a command
raises to end with one line on stderr and one of these codes, never a traceback.
"""

from __future__ import annotations

__all__ = [
    "EPILOG",
    "EXIT_DATA",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_STORE",
    "EXIT_USAGE",
    "CliError",
]

EXIT_OK = 0
"""Success."""
EXIT_FAILED = 1
"""A check failed, or the engine refused something (the message says what).

That is: `verify` found problems it did not repair, a `conformance` check failed, the demo's
run did not complete, or `cancel` found the run already ended otherwise.
"""
EXIT_USAGE = 2
"""A usage error: bad arguments, a malformed store URL, cursor or `MODULE:FACTORY`.

Also when the conformance kit is not installed.
"""
EXIT_NOT_FOUND = 3
"""The run id is unknown to the store."""
EXIT_STORE = 4
"""The store cannot be used (the message says why).

No such file or schema, not a runfold database, written by a newer runfold, a missing driver,
or a server that does not answer or refuses the login.
"""
EXIT_DATA = 5
"""Stored data is corrupt: an event or an index row does not decode, or a history breaks a law."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C)."""

EPILOG = """\b
exit codes:
  0    success
  1    a check failed (verify, conformance, the demo run) or the engine refused something
  2    usage error: bad arguments, store URL, cursor or MODULE:FACTORY
  3    unknown run id
  4    the store cannot be opened or reached
  5    stored data is corrupt (an event, a history, an index row)
  130  interrupted
"""
"""The exit codes as `runfold --help` lists them after the commands."""


class CliError(Exception):
    """A user-facing failure: `message` is printed as one line, `exit_code` returned."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
