"""The fleet's chaos run: worker processes on one store, SIGKILLed, SIGSTOPped, and counted.

`run_chaos` starts `workers` real `runfold worker` processes serving `tests.support.fleet_workflows`
on one store, queues `runs` runs of its 10-step ledger workflow, and every `every` seconds picks a
worker at random: it is SIGKILLed and restarted, or SIGSTOPped for longer than its lease and
then resumed. When every run ended it stops the fleet with SIGTERM and reads what happened from
the ledger (each body's start and end, with its process) and the runs' histories:

- `ran_twice`: step bodies started more than once; `explained` those of them whose earlier body
  was in flight at a kill or a stop of its process (from its start until the step's next body
  began: its outcome was not durable yet), the only re-runs allowed; `lapses`: the workers that
  found their lease lapsed (each one stopped past its lease, on resuming; one starved on a
  loaded machine too, whose bodies are then re-run as well);
- `overlaps_live`: two bodies of one step running at once in two processes, neither of them
  stopped or killed meanwhile (never allowed: two workers that both held a lease);
- `zombie_outcomes`: step outcomes recorded from a body that was not the run's owner's;
- `past_budget`: attempts past the step's retry policy; `failed`: runs that did not complete
  with the right output; `takeover_seconds`: the slowest resumption of a killed worker's runs.

`python -m tests.support.fleet_chaos --store URL` runs a longer round and prints the figures as
JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runfold.flow import Flow
from runfold.kernel import RunClaimed, RunReleased, StepCompleted, StepStarted
from runfold.stores import open_store
from tests.support.fleet_workflows import EXPECTED, LEDGER_ENV, RETRY, fleet_run, read_ledger

ROOT = Path(__file__).resolve().parents[2]
_STARTUP = 5.0
"""Seconds a worker process may take to start serving (imports, opening the store)."""
_SERVING = " serving ["
"""What a worker logs once it took its lease and handles SIGTERM."""
_LOCK_TRIES = 500
"""How many times a stop with `locked_stops` tries to catch its worker holding the lock."""


@dataclass
class Chaos:
    """What a chaos round did to the fleet, in monotonic nanoseconds."""

    kills: list[tuple[int, int]] = field(default_factory=list)  # (pid, at)
    stops: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, from, to)
    locked: set[int] = field(default_factory=set)  # stops (their index) of a lock holder
    began_ns: int = field(default_factory=time.monotonic_ns)
    wall_offset_ns: int = field(default_factory=lambda: time.time_ns() - time.monotonic_ns())


def _worker(store: str, lease: float, ledger: Path) -> subprocess.Popen[bytes]:
    runfold = Path(sys.executable).with_name("runfold")
    command = [str(runfold), "worker", "--app", "tests.support.fleet_workflows", "--store", store]
    command += ["--lease", str(lease), "--poll", "0.05", "--grace", "1", "--concurrency", "4"]
    env = {**os.environ, LEDGER_ENV: str(ledger)}
    with open(ledger.with_suffix(".log"), "ab") as log:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)


async def _all_serving(log: Path, started: int) -> None:
    """Wait until `started` workers logged that they serve (each does once), or `_STARTUP`
    seconds past the last one's start at most per worker."""
    deadline = time.monotonic() + _STARTUP * started
    while log.read_text(errors="replace").count(_SERVING) < started:
        if time.monotonic() > deadline:
            return  # the exit codes will tell which one never served
        await asyncio.sleep(0.05)


async def run_chaos(
    store_url: str,
    *,
    workers: int,
    runs: int,
    every: float,
    lease: float,
    work: float = 0.05,
    limit: float = 240.0,
    ledger: Path | None = None,
    locked_stops: bool = False,
) -> dict[str, Any]:
    """One chaos round; its figures (see the module's docstring).

    With `locked_stops` (SQLite), a worker is stopped while it holds the file's write lock,
    mid-transaction (it is stopped and resumed at once until it does): every other worker's
    writes, lease renewals included, then wait for it to resume.
    """
    ledger = ledger or Path(tempfile.mkdtemp()) / "ledger"
    ledger.touch()
    store = await open_store(store_url)
    chaos = Chaos()
    fleet = [_worker(store_url, lease, ledger) for _ in range(workers)]
    began = time.monotonic()
    try:
        flow = Flow(store, [fleet_run])
        ids = [
            (await flow.start(fleet_run, {"work": work, "sleep": 0.05}, queued=True)).run_id
            for _ in range(runs)
        ]
        pending = set(ids)
        next_chaos = time.monotonic() + every
        while pending and time.monotonic() - began < limit:
            await asyncio.sleep(0.2)
            for summary in await store.get_runs(sorted(pending)):
                if summary is not None and summary.status not in ("pending", "running"):
                    pending.discard(summary.run_id)
            if every and time.monotonic() >= next_chaos:
                next_chaos = time.monotonic() + every
                await _strike(fleet, chaos, store_url, lease, ledger, locked_stops)
        seconds = time.monotonic() - began
        # A worker SIGTERMed before Python runs runfold's code dies of it: let every worker
        # started (the first ones and one per kill) reach serving, however loaded the machine.
        await _all_serving(ledger.with_suffix(".log"), workers + len(chaos.kills))
        for process in fleet:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
        codes = [process.wait(timeout=30) for process in fleet]
        figures = await _count(flow, ids, ledger, chaos, lease)
        log = ledger.with_suffix(".log").read_text(errors="replace")
        figures.update(
            lapses=log.count("let its lease lapse"),
            seconds=round(seconds, 2),
            unfinished=len(pending),
            exit_codes=codes,
            kills=len(chaos.kills),
            stops=len(chaos.stops),
            stops_locked=len(chaos.locked),
        )
        if figures["ran_twice"] > figures["explained"]:
            lapsed = [line for line in log.splitlines() if "lapse" in line]
            print("\n".join(["lapses:", *lapsed]), file=sys.stderr)
        return figures
    finally:
        for process in fleet:
            if process.poll() is None:
                process.kill()
                process.wait()
        await store.close()


async def _strike(
    fleet: list[subprocess.Popen[bytes]],
    chaos: Chaos,
    store: str,
    lease: float,
    ledger: Path,
    locked: bool,
) -> None:
    place = random.randrange(len(fleet))
    victim = fleet[place]
    if random.random() < 0.5:
        victim.kill()
        victim.wait()
        chaos.kills.append((victim.pid, time.monotonic_ns()))
        fleet[place] = _worker(store, lease, ledger)
    else:
        pause = lease * 1.5
        for _ in range(_LOCK_TRIES if locked else 1):
            start = time.monotonic_ns()
            victim.send_signal(signal.SIGSTOP)
            held = _holds_write_lock(store)
            if held or not locked:
                break
            # Not in a write transaction: let it go on a moment, and stop it again.
            victim.send_signal(signal.SIGCONT)
            await asyncio.sleep(random.uniform(0.0, 0.01))
        chaos.stops.append((victim.pid, start, start + int(pause * 1e9)))
        if held:
            chaos.locked.add(len(chaos.stops) - 1)

        stop = len(chaos.stops) - 1

        async def resume() -> None:
            await asyncio.sleep(pause)
            if victim.poll() is None:
                victim.send_signal(signal.SIGCONT)
            # A loaded loop resumes it late: the stop lasted until now.
            pid, start, _ = chaos.stops[stop]
            chaos.stops[stop] = (pid, start, time.monotonic_ns())

        asyncio.get_running_loop().create_task(resume())


def _holds_write_lock(store: str) -> bool:
    """Whether a SQLite store's write lock stays taken for a while (by a stopped worker)."""
    if not store.startswith("sqlite:///"):
        return False
    conn = sqlite3.connect(store.removeprefix("sqlite:///"), timeout=0, isolation_level=None)
    try:
        for _ in range(10):  # other workers' transactions last milliseconds
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("ROLLBACK")
                return False
            except sqlite3.OperationalError:
                time.sleep(0.02)
        return True
    finally:
        conn.close()


async def _count(
    flow: Flow, ids: list[str], ledger: Path, chaos: Chaos, lease: float
) -> dict[str, Any]:
    rows = read_ledger(ledger)
    killed = dict(chaos.kills)
    stopped: dict[int, list[tuple[int, int]]] = {}
    for pid, start, end in chaos.stops:
        stopped.setdefault(pid, []).append((start, end))
    bodies: dict[tuple[str, str, int, int], list[int]] = {}
    for kind, run, step_id, attempt, pid, at in rows:
        span = bodies.setdefault((run, step_id, attempt, pid), [at, -1])
        if kind == "end":
            span[1] = at

    def cut(pid: int, start: int, end: int) -> bool:
        """Whether a kill or a stop of `pid` fell while its body ran (end -1: never ended)."""
        stop = end if end >= 0 else 2**63
        if pid in killed and killed[pid] >= start:
            return True
        return any(s < stop and e > start for s, e in stopped.get(pid, ()))

    by_step: dict[tuple[str, str], list[tuple[int, int, int, int]]] = {}
    for (run, step_id, attempt, pid), (start, end) in bodies.items():
        by_step.setdefault((run, step_id), []).append((start, end, pid, attempt))
    failed = zombies = past_budget = 0
    decided: dict[tuple[str, str, int], int] = {}  # when each attempt began, monotonic ns
    for run_id in ids:
        result = await flow.result(run_id)
        if result.status != "completed" or result.output != EXPECTED:
            failed += 1
        history = await flow.handler.history(run_id)
        owner: str | None = None
        attempts: dict[str, int] = {}
        for envelope in history:
            event = envelope.event
            if isinstance(event, RunClaimed):
                owner = event.owner_id
            elif isinstance(event, RunReleased):
                owner = None
            elif isinstance(event, StepStarted):
                attempts[event.step_id] = event.attempt
                past_budget += event.attempt > RETRY.max_attempts
                at = int(envelope.recorded_at.timestamp() * 1e9) - chaos.wall_offset_ns
                decided[(run_id, event.step_id, event.attempt)] = at
            elif isinstance(event, StepCompleted):
                pid = int(owner.split(":")[-2]) if owner else -1
                found = bodies.get((run_id, event.step_id, attempts[event.step_id], pid))
                if found is None or found[1] < 0:
                    zombies += 1
    ran_twice = explained = overlaps_live = 0
    takeover = 0.0
    unexplained: list[tuple[str, str, list[tuple[int, int, int, int]]]] = []
    for (run, step_id), spans in by_step.items():
        if len(spans) > 1:
            ran_twice += 1
            # A body is in flight from its attempt's start (a body a stop caught before its
            # first line writes its start row on resuming) until its outcome is durable: until
            # the next attempt's body began, at the latest.
            tried = sorted(spans, key=lambda span: (span[3], span[0]))
            later = [span[0] for span in tried[1:]]
            if all(
                cut(pid, min(start, decided.get((run, step_id, attempt), start)), nxt)
                for (start, _, pid, attempt), nxt in zip(tried[:-1], later, strict=True)
            ):
                explained += 1
            else:
                unexplained.append((run, step_id, tried))
        spans.sort()
        for i, (start, end, pid, _) in enumerate(spans):
            for other_start, other_end, other_pid, _ in spans[i + 1 :]:
                finish = end if end >= 0 else 2**63
                live = not cut(pid, start, end) and not cut(other_pid, other_start, other_end)
                if other_pid != pid and other_start < finish and live:
                    overlaps_live += 1
            if end < 0 and pid in killed and i + 1 < len(spans):
                takeover = max(takeover, (spans[i + 1][0] - killed[pid]) / 1e9)
    if unexplained:
        _explain(unexplained, await _claims(flow, unexplained), chaos, killed)
    return {
        "runs": len(ids),
        "bodies": len(bodies),
        "ran_twice": ran_twice,
        "explained": explained,
        "overlaps_live": overlaps_live,
        "zombie_outcomes": zombies,
        "past_budget": past_budget,
        "failed": failed,
        "takeover_seconds": round(takeover, 2),
        "lease_seconds": lease,
    }


async def _claims(
    flow: Flow, unexplained: list[tuple[str, str, list[tuple[int, int, int, int]]]]
) -> dict[str, list[tuple[int, str, str | None]]]:
    """The claims in the histories of the runs of `unexplained` (wall ns, owner, displaced)."""
    found: dict[str, list[tuple[int, str, str | None]]] = {}
    for run, _, _ in unexplained:
        for envelope in await flow.handler.history(run):
            event = envelope.event
            if isinstance(event, RunClaimed):
                at = int(envelope.recorded_at.timestamp() * 1e9)
                found.setdefault(run, []).append((at, event.owner_id, event.displaced))
    return found


def _explain(
    unexplained: list[tuple[str, str, list[tuple[int, int, int, int]]]],
    claims: dict[str, list[tuple[int, str, str | None]]],
    chaos: Chaos,
    killed: dict[int, int],
) -> None:
    """Print, to stderr, each re-run that no kill or stop explains, with the chaos near it."""
    zero = chaos.began_ns

    def t(at: int) -> float:
        return round((at - zero) / 1e9, 3)

    for run, step_id, spans in unexplained:
        first, last = spans[0][0], spans[-1][0]
        print(f"unexplained re-run {run} {step_id}:", file=sys.stderr)
        for start, end, pid, attempt in spans:
            print(f"  body pid {pid} attempt {attempt}: {t(start)}..{t(end)}", file=sys.stderr)
        for at, owner, displaced in claims.get(run, []):
            mono = at - chaos.wall_offset_ns
            if first - 10**10 <= mono <= last + 10**9:
                print(f"  claim at {t(mono)} by {owner} displacing {displaced}", file=sys.stderr)
        for index, (pid, start, end) in enumerate(chaos.stops):
            if start <= last and end >= first - 10**10:
                held = " holding the write lock" if index in chaos.locked else ""
                print(f"  stop of {pid}: {t(start)}..{t(end)}{held}", file=sys.stderr)
        for pid, at in killed.items():
            if first - 10**10 <= at <= last:
                print(f"  kill of {pid} at {t(at)}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--limit", type=float, default=900.0)
    parser.add_argument(
        "--locked-stops",
        action="store_true",
        help="SQLite: stop workers while they hold the write lock",
    )
    args = parser.parse_args()
    figures = asyncio.run(
        run_chaos(
            args.store,
            workers=args.workers,
            runs=args.runs,
            every=args.every,
            lease=args.lease,
            limit=args.limit,
            locked_stops=args.locked_stops,
        )
    )
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
