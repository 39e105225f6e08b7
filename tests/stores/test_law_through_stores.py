"""The law through encoding: whatever `decide` accepts is appended, read back and replayed to an
equal snapshot and equal index rows, on every store.

Commands come from the kit's generators with hostile values mixed in (malformed fields, lone
surrogates, NUL, oversized payloads, bad retry policies, naive and non-UTC times) and more of
our own (None attribute values, integers past 64 bits, intervals at `timedelta.max`, NaN and
huge coefficients). A refused command must be a `Rejection` and write nothing; anything else
the handler or the store raises fails the law.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runfold import CommandHandler, EventStore
from runfold.commands import (
    Command,
    CreateRun,
    LazyStep,
    RecordProgress,
    SetAttributes,
    StartRun,
    StartStep,
)
from runfold.conformance.strategies import commands
from runfold.errors import Rejection
from runfold.events import AttributeChange, RetryPolicy
from runfold.kernel import project_run, run_index
from tests.conftest import BACKENDS, T0, _open

RUN = "law"
_HUGE = st.sampled_from([2**63, -(2**63) - 1, 10**30, 2**63 - 1, -(2**63)])
_POLICIES = st.sampled_from(
    [
        RetryPolicy(max_interval=timedelta.max),
        RetryPolicy(initial_interval=timedelta.max),
        RetryPolicy(backoff_coefficient=float("nan")),
        RetryPolicy(backoff_coefficient=float("-inf")),
        RetryPolicy(backoff_coefficient=10**400),
        RetryPolicy(max_attempts=2**70),
        RetryPolicy(max_attempts=1),
    ]
)
_HOSTILE: st.SearchStrategy[Command] = st.one_of(
    st.builds(
        RecordProgress,
        progress_id=st.sampled_from(["p", "q"]),
        completed=_HUGE,
        total=st.none() | _HUGE,
    ),
    st.builds(
        StartStep,
        step_id=st.sampled_from(["s", "t"]),
        lazy=st.builds(LazyStep, step_name=st.just("n"), input=st.just(b""), retry=_POLICIES),
    ),
    st.builds(
        SetAttributes,
        changes=st.lists(
            st.builds(
                AttributeChange,
                key=st.sampled_from(["k", "\x00", "\ud800", "$reserved"]),
                value=st.none() | st.sampled_from(["v", "\x00", "\ud800", "x" * 300]),
            ),
            max_size=3,
        ).map(tuple),
    ),
    st.builds(
        StartRun,
        create=st.builds(
            CreateRun,
            workflow_name=st.just("wf"),
            input=st.just(b""),
            attributes=st.dictionaries(
                st.sampled_from(["tenant", "k"]), st.none() | st.just("v"), max_size=2
            ),
            deadline=st.none()
            | st.sampled_from(
                [
                    datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-5))),
                    T0.replace(tzinfo=None),
                    T0.astimezone(timezone(timedelta(hours=14))),
                ]
            ),
        ),
    ),
)


_FIRST = st.just(StartRun(create=CreateRun(workflow_name="wf", input=b""))) | _HOSTILE


async def _check(store: EventStore, run_id: str, drawn: list[Command]) -> None:
    """Execute `drawn` on a new run; after each accepted command, the store gives it back."""
    handler = CommandHandler(store, clock=lambda: T0)
    for command in drawn:
        before = await store.read(run_id)
        try:
            outcome = await handler.execute(run_id, command)
        except Rejection:
            assert await store.read(run_id) == before, f"{command!r} was refused but wrote"
            continue
        history = await store.read(run_id)
        replayed = project_run(history)
        assert replayed == outcome.snapshot, f"{command!r}: the replay differs"
        [summary] = await store.get_runs([run_id])
        assert summary == run_index(replayed).summary, f"{command!r}: the index rows differ"
        assert repr(replayed)  # printable, whatever it holds


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_decide_accepts_is_stored_and_replays_equal(backend: str, tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    store = loop.run_until_complete(_open(backend, tmp_path))
    runs = itertools.count()
    rest = st.lists(commands(RUN, malformed=True) | _HOSTILE, max_size=6)

    @settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
    @given(_FIRST, rest)
    def law(first: Command, drawn: list[Command]) -> None:
        loop.run_until_complete(_check(store, f"{RUN}-{next(runs)}", [first, *drawn]))

    try:
        law()
    finally:
        loop.run_until_complete(store.close())
        loop.close()
