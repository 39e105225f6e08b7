"""Many durable workflows on PostgreSQL through a proxy that cuts connections around commits.

    python scripts/faults_soak.py [--workflows 64] [--steps 10] [--rates 0.03,0.4]
                                  [--holes 3] [--hole-seconds 2] [--call-timeout 1]
                                  [--body-seconds 0.2]

For each cut rate, `--workflows` concurrent `runfold.flow` workflows of `--steps` steps run
through `tests/support/fault_proxy.py` (in front of `RUNFOLD_TEST_POSTGRES_DSN`, else the local
server), which cuts that share of the append statements it sees (before they are sent, right after,
or after the reply), and `--holes` times stops relaying for `--hole-seconds` (a black hole). Each
store call has `--call-timeout` seconds. It prints, per rate, what the issue's targets name and
exits non-zero if one is missed: runs failed that no body failed, step attempts spent on store
faults, bodies run more than once, records of a run or a step held more than once, runs not
finished, and a store call (append or read) that took longer than its deadline plus 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from runfold.flow import Flow, step, workflow  # noqa: E402
from runfold.kernel import Envelope  # noqa: E402
from runfold.stores import PostgresStore  # noqa: E402
from runfold.testing import DelegatingStore  # noqa: E402
from tests.support.fault_proxy import FaultProxy, random_plan  # noqa: E402

DSN = os.environ.get("RUNFOLD_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
BODY_RUNS: Counter[tuple[str, int]] = Counter()
STEPS = [10]


BODY_SECONDS = [0.2]


async def work(key: str, n: int) -> int:
    BODY_RUNS[(key, n)] += 1
    await asyncio.sleep(BODY_SECONDS[0])
    return n


class Timed(DelegatingStore):
    """Times each append and read: the longest is what a caller waited for one store call."""

    longest = 0.0

    async def _append_if_sequence(self, *call: Any) -> list[Envelope]:
        started = time.monotonic()
        try:
            return await super()._append_if_sequence(*call)
        finally:
            self.longest = max(self.longest, time.monotonic() - started)

    async def _read(self, *call: Any) -> list[Envelope]:
        started = time.monotonic()
        try:
            return await super()._read(*call)
        finally:
            self.longest = max(self.longest, time.monotonic() - started)


@workflow(name="soak-steps")
async def steps(key: str) -> int:
    total = 0
    for n in range(STEPS[0]):
        total += await step(work, key, n)
    return total


def duplicates(history: Sequence[Envelope]) -> int:
    """Records a run of `steps` holds more than once: of the run (created, started, ended) or of
    a step (created, completed; a start beyond the first is an attempt, counted as spent)."""
    kinds = Counter(
        (e.event.event_type, getattr(e.event, "step_id", None))
        for e in history
        if e.event.event_type != "step_started"
    )
    return sum(count - 1 for count in kinds.values() if count > 1)


async def holes(proxy: FaultProxy, count: int, seconds: float, every: float) -> None:
    for _ in range(count):
        await asyncio.sleep(every)
        proxy.black_hole()
        await asyncio.sleep(seconds)
        proxy.heal()


async def soak(rate: float, args: argparse.Namespace) -> list[str]:
    schema = f"runfold_soak_{uuid.uuid4().hex[:8]}"
    params = conninfo_to_dict(DSN)
    upstream = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    await (await PostgresStore.open(DSN, schema=schema)).close()
    missed: list[str] = []
    try:
        async with FaultProxy(upstream, random_plan(rate, seed=int(rate * 1000))) as proxy:
            store = await PostgresStore.open(
                proxy.dsn(DSN), schema=schema, pool_max=8, call_timeout=args.call_timeout
            )
            try:
                timed = Timed(store)
                flow = Flow(timed, [steps])
                keys = [f"{schema}-{n}" for n in range(args.workflows)]
                started = time.monotonic()
                holing = asyncio.create_task(holes(proxy, args.holes, args.hole_seconds, 0.3))
                results = await asyncio.gather(
                    *(flow.start(steps, key, run_id=key) for key in keys), return_exceptions=True
                )
                await holing
                elapsed = time.monotonic() - started
                proxy.plan = lambda: None
                failed = [r for r in results if isinstance(r, BaseException)]
                spent = re_run = recorded_twice = unfinished = 0
                for key in keys:
                    snapshot = (await flow.result(key)).snapshot
                    unfinished += snapshot.status != "completed"
                    spent += sum(s.attempt - 1 for s in snapshot.steps.values())
                    re_run += sum(BODY_RUNS[(key, n)] > 1 for n in range(STEPS[0]))
                    recorded_twice += duplicates(await timed.inner.read(key))
            finally:
                await store.close()
        cuts = sum(proxy.cuts.values())
        print(
            f"rate {rate:.0%}: {args.workflows} workflows in {elapsed:.1f} s, {cuts} cuts "
            f"{dict(proxy.cuts)}, {args.holes} black holes of {args.hole_seconds} s; "
            f"failed {len(failed)}, attempts spent {spent}, bodies re-run {re_run}, "
            f"recorded twice {recorded_twice}, unfinished {unfinished}; longest store call "
            f"{timed.longest:.2f} s (deadline {args.call_timeout} s)"
        )
        if timed.longest > args.call_timeout + 1:
            missed.append(f"rate {rate:.0%}: a store call took {timed.longest:.2f} s")
        for name, value in [
            ("failed", len(failed)),
            ("attempts spent", spent),
            ("bodies re-run", re_run),
            ("recorded twice", recorded_twice),
            ("unfinished", unfinished),
        ]:
            if value:
                missed.append(f"rate {rate:.0%}: {name} {value}")
        for error in failed[:3]:
            print(f"  {type(error).__name__}: {error}")
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rates", default="0.03,0.4")
    parser.add_argument("--holes", type=int, default=3)
    parser.add_argument("--hole-seconds", type=float, default=2.0)
    parser.add_argument("--call-timeout", type=float, default=1.0)
    parser.add_argument("--body-seconds", type=float, default=0.2)
    args = parser.parse_args()
    STEPS[0] = args.steps
    BODY_SECONDS[0] = args.body_seconds
    logging.getLogger("psycopg").setLevel(logging.ERROR)  # each cut and hole logs warnings
    missed: list[str] = []
    for rate in (float(r) for r in args.rates.split(",")):
        missed += asyncio.run(soak(rate, args))
    for line in missed:
        print(f"MISSED {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
