"""Hostile arguments to the stores and to delivery: one typed refusal on every store, before any
I/O. The full list of rules is the conformance kit's (`test_arguments_refused_alike`, run on
every store by `tests/stores/test_conformance.py`); here are the paths a caller outside reaches."""

from __future__ import annotations

from datetime import datetime

import pytest

from runfold import CommandHandler, EventStore, RunfoldError
from runfold.engine import AwaitHook, Engine, RuntimeDecision, StepInvocation, WorkflowInvocation
from runfold.errors import HookNotFound, InvalidArgument, InvalidCommand, StoreClosed
from runfold.stores import arguments
from tests.conftest import Clock

HOSTILE_TOKENS = {
    "a lone surrogate": "secret-\ud800",
    "a trailing lone surrogate": "secret-\udfff",
    "bytes": b"secret",
    "None": None,
}


class Hooked:
    """A runtime whose runs wait on a hook."""

    workflow_names = ("hooked",)

    async def run_workflow(self, invocation: WorkflowInvocation) -> RuntimeDecision:
        return AwaitHook(hook_id="h", token="secret-token")

    async def run_step(self, invocation: StepInvocation) -> bytes:
        raise AssertionError("no steps here")


@pytest.mark.parametrize("token", HOSTILE_TOKENS.values(), ids=HOSTILE_TOKENS)
async def test_a_token_utf8_cannot_carry_is_an_invalid_command_before_any_io(
    store: EventStore, clock: Clock, token: object
) -> None:
    engine = Engine(CommandHandler(store, clock=clock), Hooked())
    await engine.start("hooked", b"", run_id="r")
    before = await store.read("r")
    for deliver in (engine.deliver, engine.handler.deliver):
        with pytest.raises(InvalidCommand, match=r"^hook token ") as refused:
            await deliver(token, b"x")  # type: ignore[arg-type]
        assert "secret" not in str(refused.value)
    assert await store.read("r") == before
    with pytest.raises(HookNotFound):  # a guessed token that is text is simply held by no hook
        await engine.deliver("secret-guess", b"x")
    await store.close()
    with pytest.raises(InvalidCommand):  # not StoreClosed: the store was never asked
        await engine.deliver(token, b"x")  # type: ignore[arg-type]
    with pytest.raises(StoreClosed):
        await engine.deliver("secret-guess", b"x")


async def test_a_store_refuses_a_hostile_token_naming_it_never_quoting_it(
    store: EventStore,
) -> None:
    for token in HOSTILE_TOKENS.values():
        with pytest.raises(InvalidArgument) as refused:
            await store.find_hook(token, now=datetime.now().astimezone())  # type: ignore[arg-type]
        assert refused.value.argument == "token"
        assert "secret" not in str(refused.value) and "secret" not in repr(refused.value)


def test_an_invalid_argument_is_a_runfold_error_and_a_value_error() -> None:
    with pytest.raises(InvalidArgument) as refused:
        arguments.check_count(2**63, "limit")
    error = refused.value
    assert isinstance(error, ValueError) and isinstance(error, RunfoldError)
    assert (error.argument, error.code, error.status) == ("limit", "invalid_argument", 400)
    assert str(error) == "limit is outside the 64-bit integer range"
    for value in (2**63 - 1, -(2**63), 0):
        arguments.check_count(value, "limit")
    for wrong in (-(2**63) - 1, 1.0, True, "1", None):
        with pytest.raises(InvalidArgument, match=r"^limit "):
            arguments.check_count(wrong, "limit")
