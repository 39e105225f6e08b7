"""Kill the primary of a Patroni cluster under load, three times, and check what runfold saw.

    python scripts/ha_failover.py DIR [--failovers 3] [--workflows 64] [--steps 10]

DIR holds a cluster that `scripts/ha-cluster.sh start DIR` built (two Patroni nodes, synchronous
replication). For each failover, `--workflows` durable `runfold.flow` workflows of `--steps`
steps (each body sleeps `--body-seconds`) start on the multi-host connection string; two
seconds in, the primary's Patroni and postmaster are SIGKILLed, so the standby is promoted once
the leader key expires (Patroni's `ttl`). Then the killed node is started again (it rejoins as
a standby) for the next round.

It checks, and exits non-zero unless each holds: every workflow completes with its output and
no error reaches the application (the handler's retry budget outlasts the outage); every
acknowledged append is in the store with the same events (0 acknowledged events lost); no step
body runs twice and no step spends a second attempt; throughput is back to half of what it was
before the kill within 2 s of the promotion. It prints the write outage (from the kill to the
first append that succeeded after one failed) and how long after the promotion throughput was
back to half.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from runfold.flow import Flow, step, workflow  # noqa: E402
from runfold.kernel import Envelope  # noqa: E402
from runfold.store_retry import StoreRetry  # noqa: E402
from runfold.stores import PostgresStore  # noqa: E402
from runfold.testing import DelegatingStore  # noqa: E402

DSN = (
    "host=127.0.0.1,127.0.0.1 port=55431,55432 user=postgres dbname=postgres "
    "target_session_attrs=read-write connect_timeout=2"
)
NODES = {1: 55431, 2: 55432}
BODY_RUNS: Counter[tuple[str, int]] = Counter()
SETTINGS = {"steps": 10, "body": 0.5}


async def work(key: str, n: int) -> int:
    BODY_RUNS[(key, n)] += 1
    await asyncio.sleep(SETTINGS["body"])
    return n


@workflow(name="ha-steps")
async def steps(key: str) -> int:
    total = 0
    for n in range(int(SETTINGS["steps"])):
        total += await step(work, key, n)
    return total


class Acknowledged(DelegatingStore):
    """Keeps every acknowledged append, and when appends failed and succeeded."""

    def __init__(self, inner: PostgresStore) -> None:
        super().__init__(inner)
        self.acknowledged: list[Envelope] = []
        self.succeeded: list[float] = []
        self.failed: list[float] = []

    async def _append_if_sequence(self, *call: Any) -> list[Envelope]:
        try:
            written = await super()._append_if_sequence(*call)
        except Exception:
            self.failed.append(time.monotonic())
            raise
        self.succeeded.append(time.monotonic())
        self.acknowledged.extend(written)
        return written


def role(node: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:5800{node}/patroni", timeout=1) as reply:
            return str(json.load(reply).get("role", ""))
    except OSError:
        return ""


def sync_standby(node: int) -> bool:
    """Whether the cluster lists `node` as its synchronous standby: only it may be promoted."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:58001/cluster", timeout=1) as reply:
            members = json.load(reply)["members"]
    except OSError:
        try:
            with urllib.request.urlopen("http://127.0.0.1:58002/cluster", timeout=1) as reply:
                members = json.load(reply)["members"]
        except OSError:
            return False
    return any(m["name"] == f"node{node}" and m["role"] == "sync_standby" for m in members)


def leader() -> int:
    for node in NODES:
        if role(node) in ("master", "primary"):
            return node
    raise RuntimeError("the cluster has no primary")


def kill(directory: Path, node: int) -> None:
    """SIGKILL node's Patroni and postmaster (processes `ha-cluster.sh` started)."""
    patroni = int((directory / f"node{node}.pid").read_text())
    postmaster = int((directory / f"node{node}" / "postmaster.pid").read_text().split()[0])
    for pid in (patroni, postmaster):
        os.kill(pid, signal.SIGKILL)


async def wait_for(condition: object, seconds: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if condition():  # type: ignore[operator]
            return time.monotonic()
        await asyncio.sleep(0.05)
    raise RuntimeError("timed out")


async def failover(directory: Path, number: int, args: argparse.Namespace) -> list[str]:
    await wait_for(lambda: sync_standby(3 - leader()), 180)
    schema = f"runfold_ha_{uuid.uuid4().hex[:8]}"
    store = await PostgresStore.open(DSN, schema=schema, pool_max=8, call_timeout=5.0)
    acked = Acknowledged(store)
    flow = Flow(acked, [steps])
    flow.handler.store_retry = StoreRetry(budget=120.0)
    keys = [f"{schema}-{n}" for n in range(args.workflows)]
    running = asyncio.gather(
        *(flow.start(steps, key, run_id=key) for key in keys), return_exceptions=True
    )
    await asyncio.sleep(2.0)
    old = leader()
    new = 3 - old
    window = [t for t in acked.succeeded if t > time.monotonic() - 1.5]
    before = len(window) / 1.5
    killed_at = time.monotonic()
    kill(directory, old)
    promoted_at = await wait_for(lambda: role(new) in ("master", "primary"), 120)
    results = await running
    # Throughput back to half: the first 0.5 s window after the promotion with half the rate.
    recovered_at = None
    t = promoted_at
    while t < promoted_at + 60:
        if len([s for s in acked.succeeded if t <= s < t + 0.5]) / 0.5 >= before / 2:
            recovered_at = t
            break
        t += 0.1
    # The write outage: from the kill to the first append that succeeded after the first that
    # failed (appends answered as the kill landed still succeed, and appends on connections
    # whose server went silent fail only at their deadline).
    failed = [f for f in acked.failed if f > killed_at]
    first_failed = failed[0] if failed else killed_at
    after = [s for s in acked.succeeded if s > first_failed]
    outage = (after[0] - killed_at) if after else float("nan")
    resumed = (after[0] - promoted_at) if after else float("nan")
    missed: list[str] = []
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        missed.append(f"failover {number}: {len(errors)} errors reached the application")
        for error in errors[:3]:
            print(f"  {type(error).__name__}: {error}")
    unfinished = [
        r
        for r in results
        if not isinstance(r, BaseException) and r.output != sum(range(int(SETTINGS["steps"])))
    ]
    lost = 0
    for envelope in acked.acknowledged:
        stored = await store.read(envelope.run_id, after=envelope.sequence - 1, limit=1)
        if not stored or stored[0].event != envelope.event:
            lost += 1
    re_run = sum(count > 1 for (key, _), count in BODY_RUNS.items() if key.startswith(schema))
    spent = 0
    for key in keys:
        snapshot = await flow.handler.snapshot(key)
        spent += sum(s.attempt - 1 for s in snapshot.steps.values())
    print(
        f"failover {number}: node{old} killed, node{new} promoted "
        f"{promoted_at - killed_at:.1f} s later; write outage {outage:.1f} s (appends resumed "
        f"{resumed:+.1f} s from the promotion); "
        f"throughput ({before:.0f}/s before) back to half "
        + (f"{recovered_at - promoted_at:.1f} s after the promotion" if recovered_at else "never")
        + f"; errors {len(errors)}, unfinished {len(unfinished)}, acknowledged events lost "
        f"{lost} of {len(acked.acknowledged)}, bodies re-run {re_run}, attempts spent {spent}"
    )
    if recovered_at is None or recovered_at - promoted_at > 2.0:
        missed.append(f"failover {number}: throughput not back to half within 2 s")
    for name, value in [
        ("unfinished", len(unfinished)),
        ("lost", lost),
        ("re-run", re_run),
        ("attempts spent", spent),
    ]:
        if value:
            missed.append(f"failover {number}: {name} {value}")
    await store.close()
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    # The killed node rejoins as a standby before the next round.
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "ha-cluster.sh"), "node", str(old), str(directory)],
        check=True,
    )
    # In synchronous mode only the synchronous standby may be promoted: wait until it is one.
    await wait_for(lambda: sync_standby(old), 180)
    return missed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--workflows", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--body-seconds", type=float, default=0.5)
    args = parser.parse_args()
    SETTINGS.update(steps=args.steps, body=args.body_seconds)
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    missed: list[str] = []
    for number in range(1, args.failovers + 1):
        missed += asyncio.run(failover(args.directory, number, args))
    for line in missed:
        print(f"MISSED {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
