"""The published conformance kit: how anyone proves a store or a runtime honours runfold's contract.

- `StoreConformance`: the pytest base class a store implementer subclasses (one hook,
  `async def make_store(self)`); every check is one of its `test_…` methods (`CHECK_NAMES`).
- `Capabilities`: what a store offers beyond the core contract; checks needing more are reported
  "not offered".
- `StoreStateMachine`: the hypothesis state machine comparing a store with the memory oracle.
- `run_conformance(factory)` / `python -m runfold.conformance MODULE:FACTORY`: the kit without a
  test file, reported as a table by capability.
- `strategies`: hypothesis strategies for runtime authors (commands, valid and invalid histories,
  snapshots, events).

Importing it installs no pytest plugin, hypothesis profile or event loop. It does ask pytest to
rewrite the asserts of its check modules (`pytest.register_assert_rewrite`), so that under
pytest a failing check shows the values it compared, not a bare `AssertionError`.
"""

import sys

try:
    import hypothesis  # noqa: F401  (the kit's extra: checked first, to say so in one line)
    import pytest
except ImportError as _missing:
    _NEEDS = (
        "runfold.conformance needs its extra: pip install 'runfold[conformance]' "
        f"({_missing.name or _missing} is missing)"
    )
    if sys.argv[:1] == ["-m"]:  # `python -m runfold.conformance`: one line, not a traceback
        print(f"runfold.conformance: error: {_NEEDS}", file=sys.stderr)
        raise SystemExit(2) from None
    raise ImportError(_NEEDS, name=_missing.name) from None

import pytest

from runfold.conformance._core import CHECK_MODULES

# Before the check modules are imported: pytest rewrites only modules registered by then. Outside
# a pytest run this merely records the names.
pytest.register_assert_rewrite(
    *(f"runfold.conformance.{module}" for module in (*CHECK_MODULES, "builders"))
)

from runfold.conformance import strategies
from runfold.conformance._core import Capabilities, Check, Effort
from runfold.conformance.kit import CHECK_NAMES, CHECKS, StoreConformance
from runfold.conformance.machine import StoreStateMachine
from runfold.conformance.runner import (
    CheckResult,
    ConformanceReport,
    StoreTarget,
    load_factory,
    main,
    run_conformance,
)

__all__ = [
    "CHECKS",
    "CHECK_NAMES",
    "Capabilities",
    "Check",
    "CheckResult",
    "ConformanceReport",
    "Effort",
    "StoreConformance",
    "StoreStateMachine",
    "StoreTarget",
    "load_factory",
    "main",
    "run_conformance",
    "strategies",
]
