"""Every public error class of runfold, importable from one module (as `psycopg.errors`).

`from runfold.errors import SequenceConflict, StepTimedOut, FlowError` works whichever package
raises the error. The kernel's errors (`runfold.kernel.errors`: rejections, history, store and
argument errors) are imported with this module; those of the engine, `runfold.flow`,
`runfold.transfer` and the command line on first use (PEP 562), so that importing this module
loads neither the engine nor a database driver. Each class's `code` and `status` are listed in
`docs/reference/errors.md`.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from runfold.kernel.errors import (
    AttemptsExhausted,
    CommitUnknown,
    CorruptEvent,
    CorruptIndex,
    EntityConflict,
    EntityNotFound,
    EventDecodeError,
    HistoryError,
    HistoryLimitExceeded,
    HookNotFound,
    InvalidArgument,
    InvalidAttributes,
    InvalidCommand,
    NonDeterministic,
    OwnershipLost,
    Rejection,
    RunExpired,
    RunfoldError,
    RunNotFound,
    RunNotSupported,
    RunOwned,
    SequenceConflict,
    StepNotFound,
    StoreClosed,
    StoreError,
    StoreOpenError,
    StoreTimeout,
    StoreUnavailable,
    TerminalState,
    TokenConflict,
    TooEarly,
    WaitNotFound,
)

if _TYPE_CHECKING:
    from runfold.cli.exit_codes import CliError as CliError
    from runfold.cli.operate import RuntimeLoadError as RuntimeLoadError
    from runfold.engine.errors import BaseExceptionRaised as BaseExceptionRaised
    from runfold.engine.errors import EngineError as EngineError
    from runfold.engine.errors import InvalidDecision as InvalidDecision
    from runfold.engine.errors import QueueDeduplicated as QueueDeduplicated
    from runfold.engine.errors import ReplayLimitExceeded as ReplayLimitExceeded
    from runfold.engine.errors import RunDefinitionConflict as RunDefinitionConflict
    from runfold.engine.errors import StepTimedOut as StepTimedOut
    from runfold.engine.errors import WorkflowNotServed as WorkflowNotServed
    from runfold.engine.runtime import StepFailure as StepFailure
    from runfold.flow.errors import ChildWorkflowError as ChildWorkflowError
    from runfold.flow.errors import ContinueAsNewError as ContinueAsNewError
    from runfold.flow.errors import DuplicateWorkflow as DuplicateWorkflow
    from runfold.flow.errors import FlowError as FlowError
    from runfold.flow.errors import FlowNonDeterminism as FlowNonDeterminism
    from runfold.flow.errors import ForkRefused as ForkRefused
    from runfold.flow.errors import NotInWorkflow as NotInWorkflow
    from runfold.flow.errors import PayloadError as PayloadError
    from runfold.flow.errors import StepError as StepError
    from runfold.flow.errors import TokenInUse as TokenInUse
    from runfold.flow.errors import UnknownWorkflow as UnknownWorkflow
    from runfold.flow.errors import UnsupportedAwait as UnsupportedAwait
    from runfold.transfer import ExportFormatError as ExportFormatError
    from runfold.transfer import RunsAlreadyExist as RunsAlreadyExist

_BEYOND_THE_KERNEL = {
    "BaseExceptionRaised": "runfold.engine.errors",
    "EngineError": "runfold.engine.errors",
    "InvalidDecision": "runfold.engine.errors",
    "QueueDeduplicated": "runfold.engine.errors",
    "ReplayLimitExceeded": "runfold.engine.errors",
    "RunDefinitionConflict": "runfold.engine.errors",
    "StepTimedOut": "runfold.engine.errors",
    "WorkflowNotServed": "runfold.engine.errors",
    "StepFailure": "runfold.engine.runtime",
    "ChildWorkflowError": "runfold.flow.errors",
    "ContinueAsNewError": "runfold.flow.errors",
    "DuplicateWorkflow": "runfold.flow.errors",
    "FlowError": "runfold.flow.errors",
    "FlowNonDeterminism": "runfold.flow.errors",
    "ForkRefused": "runfold.flow.errors",
    "NotInWorkflow": "runfold.flow.errors",
    "PayloadError": "runfold.flow.errors",
    "StepError": "runfold.flow.errors",
    "TokenInUse": "runfold.flow.errors",
    "UnknownWorkflow": "runfold.flow.errors",
    "UnsupportedAwait": "runfold.flow.errors",
    "ExportFormatError": "runfold.transfer",
    "RunsAlreadyExist": "runfold.transfer",
    "CliError": "runfold.cli.exit_codes",
    "RuntimeLoadError": "runfold.cli.operate",
}
"""The error classes defined outside the kernel, and the module each comes from."""

__all__ = [
    "AttemptsExhausted",
    "BaseExceptionRaised",
    "ChildWorkflowError",
    "CliError",
    "CommitUnknown",
    "ContinueAsNewError",
    "CorruptEvent",
    "CorruptIndex",
    "DuplicateWorkflow",
    "EngineError",
    "EntityConflict",
    "EntityNotFound",
    "EventDecodeError",
    "ExportFormatError",
    "FlowError",
    "FlowNonDeterminism",
    "ForkRefused",
    "HistoryError",
    "HistoryLimitExceeded",
    "HookNotFound",
    "InvalidArgument",
    "InvalidAttributes",
    "InvalidCommand",
    "InvalidDecision",
    "NonDeterministic",
    "NotInWorkflow",
    "OwnershipLost",
    "PayloadError",
    "QueueDeduplicated",
    "Rejection",
    "ReplayLimitExceeded",
    "RunDefinitionConflict",
    "RunExpired",
    "RunNotFound",
    "RunNotSupported",
    "RunOwned",
    "RunfoldError",
    "RunsAlreadyExist",
    "RuntimeLoadError",
    "SequenceConflict",
    "StepError",
    "StepFailure",
    "StepNotFound",
    "StepTimedOut",
    "StoreClosed",
    "StoreError",
    "StoreOpenError",
    "StoreTimeout",
    "StoreUnavailable",
    "TerminalState",
    "TokenConflict",
    "TokenInUse",
    "TooEarly",
    "UnknownWorkflow",
    "UnsupportedAwait",
    "WaitNotFound",
    "WorkflowNotServed",
]


def __getattr__(name: str) -> _Any:
    """An error class defined outside the kernel, imported from its module on first use."""
    if name not in _BEYOND_THE_KERNEL:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(_BEYOND_THE_KERNEL[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
