"""The code version a run records: the application's, or a hash of the served workflows' code.

A run records the version of the code that started it (`RunCreated.workflow_version`,
`workflow_info().workflow_version`): `Flow(version=...)` when the application names one (a
release, a commit), else `code_version(workflows)`, a digest of the served workflows' names
and source (DBOS's default application version). Editing any served workflow function gives
a new version; step bodies are not part of it (they do not change a run's history's shape).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Iterable

from runfold.flow.definition import Workflow

__all__ = ["code_version"]

_DIGITS = 16  # hex digits of the digest: 64 bits, unique enough among one service's deploys


def _source(workflow: Workflow) -> bytes:
    try:
        return inspect.getsource(workflow.fn).encode()
    except (OSError, TypeError):  # defined where no source is kept (exec, a REPL)
        code = getattr(workflow.fn, "__code__", None)
        return code.co_code if code is not None else workflow.origin.encode()


def code_version(workflows: Iterable[Workflow]) -> str:
    """A digest of the workflows' names and source code: `code-` and 16 hex digits."""
    digest = hashlib.sha256()
    for workflow in sorted(workflows, key=lambda w: w.name):
        digest.update(workflow.name.encode() + b"\0" + _source(workflow) + b"\0")
    return f"code-{digest.hexdigest()[:_DIGITS]}"
