"""A fleet on PostgreSQL: 1, 2 and 4 worker processes draining a backlog of queued 10-step
workflows, as `runfold worker` processes and as DBOS Transact queue workers.

For each number of processes, a fleet of each kind is started on a fresh schema (runfold:
`runfold worker --app benchmarks.fleet_app`; DBOS: `python -m benchmarks.fleet_dbos`, one
executor id per process, a queue with `worker_concurrency` = runfold's `--concurrency`, both
polling every `POLL` seconds). Then, in rounds where the two fleets take turns, a fleet is
paused (SIGSTOP) while this process queues a batch of runs, resumed (SIGCONT), and timed from
then until its last run completed; it is paused again while the other fleet works. So a round
times the fleet alone, draining a backlog: no enqueueing, no start-up, no other fleet polling.

A third fleet, for the CPU steps only, is the ceiling: `python -m benchmarks.fleet_bare`
processes running the same step bodies on as many threads, with no store at all (the batch
split evenly among them). What 2 of them make of one is what the machine (2 cores, shared with
whatever else runs on it) gives at that moment; no durable fleet scales better on it.

Reported: workflows/s of each fleet and workload (`fleet_app`: 2 ms CPU steps, 20 ms I/O
steps), with runfold's ratios to one runfold process and to DBOS with as many processes; the
CPU time the worker processes spent per workflow, and the server's for their connections (from
/proc: Linux only; a fleet's backends are those whose client ports are its processes' sockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import attrs
import psycopg
from psycopg import sql

from benchmarks.fleet_app import CPU_STEP_SECONDS, IO_STEP_SECONDS, fleet_cpu, fleet_io
from benchmarks.harness import Comparison, Measurement, Remark, Result, compare, event_loop
from benchmarks.postgres import POSTGRES, dsn, fresh_schema
from benchmarks.targets import (
    FLEET_CPU_2_VS_1,
    FLEET_IO_4_VS_1,
    FLEET_VS_DBOS,
)
from benchmarks.workloads import PAYLOAD_BYTES, WORKFLOW_STEPS
from runfold.flow import Flow
from runfold.stores import PostgresStore, WorkerLeases

__all__ = ["bench_fleet"]

GROUP = "Fleet"
ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 8
"""Runs one worker process drives at once (runfold `--concurrency`, DBOS `worker_concurrency`)."""
POLL = 0.1
"""Seconds between a worker's looks for queued work (runfold `--poll`, DBOS
`polling_interval_sec`)."""
FINE_POLL = 0.005
COARSE_POLL = 0.05
"""Seconds between the benchmark's own looks at a draining fleet's progress: coarse while more
than a wave of runs (`CONCURRENCY` per process) is left, so that its queries do not load the
server the fleet shares, then fine, so that the end is timed closely."""
LEASE = 120.0
"""runfold's `--lease`: longer than a paused fleet waits for its turn, so that no lease lapses
while it is stopped (renewals, every third of it, are not what is measured here)."""
READY_SECONDS = 120.0
"""How long worker processes may take to start."""
DRAIN_SECONDS = 600.0
"""How long a batch may take before the benchmark gives up."""
SIZES = (1, 2, 4)
"""Worker processes per fleet."""
RUNS_PER_PROCESS = {"cpu": 60, "io": 100}
"""A round's batch: runs queued per worker process (a few seconds of work for runfold's)."""
WORKLOADS = {
    "cpu": (f"{CPU_STEP_SECONDS * 1000:g} ms CPU steps", fleet_cpu.name),
    "io": (f"{IO_STEP_SECONDS * 1000:g} ms I/O steps", fleet_io.name),
}
"""A workload's description in the rows, and the workflow's name (runfold's and DBOS's)."""


class NoLeases(Exception):
    """The store runfold's workers would share keeps no worker leases."""


def _with_schema(url: str, schema: str) -> str:
    """`url` naming `schema` (a query parameter runfold's store URLs know)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError("the fleet benchmark needs its server's DSN as a postgresql:// URL")
    query = urlencode([*parse_qsl(parts.query), ("schema", schema)])
    return urlunsplit(parts._replace(query=query))


class Fleet(Protocol):
    """Worker processes on one store: paused between rounds, resumed to drain a batch."""

    processes: _Processes

    def enqueue(self, workflow_name: str, count: int) -> None:
        """Queue `count` runs of the workflow (while the fleet is paused)."""

    def finished(self) -> int:
        """How many runs completed so far; raises if one failed."""
        ...


class _Processes:
    """A fleet's worker processes, each logging into a file of its own in `logs`."""

    def __init__(self, logs: Path, kind: str) -> None:
        self.logs = logs
        self.kind = kind
        self.running: list[subprocess.Popen[str]] = []

    def start(self, command: Sequence[str], *, stdin: int | None = None) -> subprocess.Popen[str]:
        log = self.logs / f"{self.kind}-{len(self.running)}.log"
        with log.open("w") as stderr:
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        self.running.append(process)
        return process

    def signal(self, signum: signal.Signals) -> None:
        for process in self.running:
            if process.poll() is None:
                process.send_signal(signum)

    def check(self) -> None:
        """Raise if a worker process exited."""
        for number, process in enumerate(self.running):
            if process.poll() is not None:
                log = self.logs / f"{self.kind}-{number}.log"
                raise RuntimeError(
                    f"a {self.kind} worker exited ({process.returncode}): {log.read_text()[-2000:]}"
                )

    def stop(self) -> None:
        """SIGTERM (after SIGCONT), and wait for every process to exit."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        for process in self.running:
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()

    def cpu_seconds(self) -> float:
        """User and system CPU time the processes used so far (Linux: from /proc)."""
        return sum(_cpu_seconds(process.pid) for process in self.running)

    def log_texts(self) -> list[str]:
        return [path.read_text() for path in sorted(self.logs.glob(f"{self.kind}-*.log"))]


class _RunfoldFleet:
    """`runfold worker` processes on a fresh schema; runs queued with `Flow.start(queued=True)`."""

    def __init__(self, stack: ExitStack, size: int, logs: Path) -> None:
        schema = stack.enter_context(fresh_schema())
        loop = stack.enter_context(event_loop())
        self._loop = loop
        store = loop.run_until_complete(
            PostgresStore.open(dsn(), schema=schema, pool_min=1, pool_max=CONCURRENCY)
        )
        stack.callback(lambda: loop.run_until_complete(store.close()))
        if not isinstance(store, WorkerLeases):
            raise NoLeases("PostgresStore keeps no worker leases (WorkerLeases): no fleet")
        self._flow = Flow(store, [fleet_cpu, fleet_io])
        self._conn = stack.enter_context(psycopg.connect(dsn(), autocommit=True))
        self._finished = sql.SQL("SELECT status, count(*) FROM {}.runs GROUP BY status").format(
            sql.Identifier(schema)
        )
        self.processes = _Processes(logs, "runfold")
        stack.callback(self.processes.stop)
        runfold = Path(sys.executable).with_name("runfold")
        command = [str(runfold), "worker", "--app", "benchmarks.fleet_app"]
        command += ["--store", _with_schema(dsn(), schema), "--concurrency", str(CONCURRENCY)]
        command += ["--lease", str(LEASE), "--poll", str(POLL), "--grace", "5"]
        for _ in range(size):
            self.processes.start(command)
        deadline = time.monotonic() + READY_SECONDS
        while len(loop.run_until_complete(store.list_leases())) < size:
            self.processes.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{size} runfold workers did not all take a lease")
            time.sleep(0.1)

    def enqueue(self, workflow_name: str, count: int) -> None:
        workflow = {fleet_cpu.name: fleet_cpu, fleet_io.name: fleet_io}[workflow_name]

        async def queue_all() -> None:
            for first in range(0, count, CONCURRENCY):
                batch = min(CONCURRENCY, count - first)
                await asyncio.gather(
                    *(
                        self._flow.start(workflow, "i" * PAYLOAD_BYTES, queued=True)
                        for _ in range(batch)
                    )
                )

        self._loop.run_until_complete(queue_all())

    def finished(self) -> int:
        counts: dict[str, int] = dict(self._conn.execute(self._finished).fetchall())
        if counts.get("failed") or counts.get("cancelled"):
            raise RuntimeError(f"runfold fleet runs failed: {counts}")
        return int(counts.get("completed", 0))


class _BareFleet:
    """`benchmarks.fleet_bare` processes: the CPU steps' bodies with no store (the ceiling)."""

    def __init__(self, stack: ExitStack, size: int, logs: Path) -> None:
        self.processes = _Processes(logs, "bare")
        stack.callback(self.processes.stop)
        self._counters = [logs / f"bare-{number}.count" for number in range(size)]
        for counter in self._counters:
            command = [sys.executable, "-m", "benchmarks.fleet_bare"]
            command += ["--concurrency", str(CONCURRENCY), "--counter", str(counter)]
            self.processes.start(command, stdin=subprocess.PIPE)
        deadline = time.monotonic() + READY_SECONDS
        while not all(counter.exists() for counter in self._counters):
            self.processes.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{size} bare processes did not all start")
            time.sleep(0.05)

    def enqueue(self, workflow_name: str, count: int) -> None:
        if workflow_name != fleet_cpu.name:
            raise ValueError("the bare fleet runs the CPU steps only")
        size = len(self.processes.running)
        for number, process in enumerate(self.processes.running):
            assert process.stdin is not None
            process.stdin.write(f"{count // size + (number < count % size)}\n")
            process.stdin.flush()

    def finished(self) -> int:
        return sum(int(counter.read_text() or 0) for counter in self._counters)


class _DbosFleet:
    """DBOS Transact queue workers on a fresh system database; runs enqueued by a DBOSClient."""

    def __init__(self, stack: ExitStack, size: int, logs: Path) -> None:
        from benchmarks import fleet_dbos

        schema = stack.enter_context(fresh_schema())
        self._conn = stack.enter_context(psycopg.connect(dsn(), autocommit=True))
        self._finished = sql.SQL(
            "SELECT status, count(*) FROM {}.workflow_status WHERE queue_name = %s GROUP BY status"
        ).format(sql.Identifier(schema))
        self._queue, self._version = fleet_dbos.QUEUE, fleet_dbos.VERSION
        self.processes = _Processes(logs, "DBOS")
        stack.callback(self.processes.stop)
        command = [sys.executable, "-m", "benchmarks.fleet_dbos", "--url", dsn()]
        command += ["--schema", schema, "--concurrency", str(CONCURRENCY), "--poll", str(POLL)]
        # The first process creates the system database; the others start once it is there.
        first = self.processes.start([*command, "--executor", f"bench-{uuid.uuid4().hex[:8]}"])
        self._ready([first])
        others = [
            self.processes.start([*command, "--executor", f"bench-{uuid.uuid4().hex[:8]}"])
            for _ in range(size - 1)
        ]
        self._ready(others)
        self._client = fleet_dbos.client(dsn(), schema)
        stack.callback(self._client.destroy)

    def _ready(self, processes: Sequence[subprocess.Popen[str]]) -> None:
        for process in processes:
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                self.processes.check()
                raise RuntimeError("a DBOS worker did not say it was ready")

    def enqueue(self, workflow_name: str, count: int) -> None:
        options = {"queue_name": self._queue, "workflow_name": workflow_name}
        options["app_version"] = self._version
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            handles: list[object] = list(
                pool.map(
                    lambda _: self._client.enqueue(options, "i" * PAYLOAD_BYTES),  # type: ignore[arg-type]
                    range(count),
                )
            )
            assert len(handles) == count

    def finished(self) -> int:
        counts: dict[str, int] = dict(self._conn.execute(self._finished, (self._queue,)).fetchall())
        failed = {k: v for k, v in counts.items() if k not in ("SUCCESS", "ENQUEUED", "PENDING")}
        if failed:
            raise RuntimeError(f"DBOS fleet workflows failed: {counts}")
        return int(counts.get("SUCCESS", 0))


@attrs.frozen(kw_only=True)
class _Drained:
    """One drain: its seconds, the CPU seconds of the fleet's processes and of the server's
    backends serving them, and how busy the machine's cores were (of `os.cpu_count()`)."""

    seconds: float
    worker_cpu: float
    server_cpu: float
    busy_cores: float


def _drain(fleet: Fleet, workflow_name: str, count: int, size: int) -> _Drained:
    """How the paused `fleet` of `size` processes, once resumed, completes `count` new runs."""
    done = fleet.finished() + count
    fleet.enqueue(workflow_name, count)
    with psycopg.connect(dsn(), autocommit=True) as conn:
        cpu, server = fleet.processes.cpu_seconds(), _server_cpu(conn, fleet.processes)
        machine = _machine_times()
        fleet.processes.signal(signal.SIGCONT)
        start = time.perf_counter()
        while (left := done - fleet.finished()) > 0:
            fleet.processes.check()
            if time.perf_counter() - start > DRAIN_SECONDS:
                raise RuntimeError(f"{fleet.processes.kind} fleet did not finish {count} runs")
            time.sleep(FINE_POLL if left <= CONCURRENCY * size else COARSE_POLL)
        seconds = time.perf_counter() - start
        fleet.processes.signal(signal.SIGSTOP)
        (total_after, idle_after), (total_before, idle_before) = _machine_times(), machine
        total, idle = total_after - total_before, idle_after - idle_before
        return _Drained(
            seconds=seconds,
            worker_cpu=fleet.processes.cpu_seconds() - cpu,
            server_cpu=sum(
                seconds - server.get(pid, 0.0)
                for pid, seconds in _server_cpu(conn, fleet.processes).items()
            ),
            busy_cores=(os.cpu_count() or 1) * (1 - idle / total) if total else 0.0,
        )


def _machine_times() -> tuple[int, int]:
    """The machine's CPU time so far, all and idle (ticks of /proc/stat's first line)."""
    fields = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]  # idle, iowait


def _server_cpu(conn: psycopg.Connection[tuple[Any, ...]], fleet: _Processes) -> dict[int, float]:
    """User and system CPU time so far, by pid, of the local server's backends serving the
    fleet's processes: those whose client port is the local port of one of their TCP sockets
    (Linux /proc). A backend that ends meanwhile takes its time with it; the server's shared
    processes (WAL writer, checkpointer) and other clients' backends are not counted."""
    ports = sorted({port for process in fleet.running for port in _local_ports(process.pid)})
    rows = conn.execute(_SERVING, (ports,)).fetchall()
    return {int(pid): _cpu_seconds(int(pid)) for (pid,) in rows}


_SERVING = "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s::integer[])"


def _local_ports(pid: int) -> set[int]:
    """The local ports of the process's TCP sockets (its /proc fds, matched by inode)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    except OSError:  # the process ended
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:  # local_address is HEXIP:HEXPORT; inode is column 10
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (0 once it ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _refusals(logs: Sequence[str]) -> tuple[int, int]:
    """Drives and refused claims (`RunOwned`/`OwnershipLost`) the runfold workers logged."""
    drives = refused = 0
    for text in logs:
        found = re.search(r"WorkerCounts\(drives=(\d+), takeovers=\d+, refused=(\d+)", text)
        if found:
            drives += int(found[1])
            refused += int(found[2])
    return drives, refused


def _runs(system: str, workload: str) -> bool:
    """Whether the fleet of `system` runs the workload (the bare one: the CPU steps only)."""
    return system != BARE or workload == "cpu"


def _case(system: str, size: int, workload: str) -> str:
    processes = f"{size} worker process{'es' if size > 1 else ''}"
    return f"{system}: {processes}, {WORKFLOW_STEPS}-step workflow, {WORKLOADS[workload][0]}"


OURS = "runfold worker"
PEER = "DBOS Transact queue"
BARE = "bare step bodies, no store"
_ANCHORS = {OURS: "runfold", PEER: "DBOS", BARE: "bare"}
TARGETS_VS_ONE = {("cpu", 2): FLEET_CPU_2_VS_1, ("io", 4): FLEET_IO_4_VS_1}


@attrs.frozen(kw_only=True)
class _Measured:
    """What the rounds found: rates by (system, workload, processes), CPU milliseconds per
    workflow by (system, workload), and the runfold workers' drives and refused claims."""

    rates: dict[tuple[str, str, int], Measurement]
    cpu: dict[tuple[str, str], Measurement]
    server: dict[tuple[str, str], Measurement]
    """The PostgreSQL server's CPU milliseconds per workflow, by (system, workload)."""
    busy: dict[tuple[str, str, int], Measurement]
    """How many of the machine's cores were busy (anyone's work) while a fleet drained."""
    drives: int
    refused: int


def _measure(
    systems: dict[str, Callable[[ExitStack, int, Path], Fleet]],
    sizes: Sequence[int],
    per_process: dict[str, int],
    repeats: int,
    warmup: int,
) -> _Measured:
    rates: dict[tuple[str, str, int], Measurement] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    server: dict[tuple[str, str], list[float]] = {}
    busy: dict[tuple[str, str, int], list[float]] = {}
    drives = refused = 0
    for size in sizes:
        with ExitStack() as stack:
            logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="runfold-fleet-")))
            fleets = {name: make(stack, size, logs) for name, make in systems.items()}
            for fleet in fleets.values():
                fleet.processes.signal(signal.SIGSTOP)
            for workload, (_, workflow_name) in WORKLOADS.items():
                count = per_process[workload] * size
                taking = {name: f for name, f in fleets.items() if _runs(name, workload)}
                samples: dict[str, list[float]] = {name: [] for name in taking}
                for round_number in range(warmup + repeats):
                    for name, fleet in taking.items():  # the fleets take turns
                        drained = _drain(fleet, workflow_name, count, size)
                        if round_number >= warmup:
                            samples[name].append(count / drained.seconds)
                            cpu.setdefault((name, workload), []).append(drained.worker_cpu / count)
                            server.setdefault((name, workload), []).append(
                                drained.server_cpu / count
                            )
                            busy.setdefault((name, workload, size), []).append(drained.busy_cores)
                for name, found in samples.items():
                    rates[(name, workload, size)] = Measurement.of(found)
                    median = rates[(name, workload, size)].median
                    print(f"  … {_case(name, size, workload)}: {median:.1f}/s", file=sys.stderr)
            ours = fleets[OURS].processes
            ours.stop()  # its log's last line counts what it did
            counted = _refusals(ours.log_texts())
            drives, refused = drives + counted[0], refused + counted[1]
    return _Measured(
        rates=rates,
        cpu={key: Measurement.of([s * 1000 for s in found]) for key, found in cpu.items()},
        server={key: Measurement.of([s * 1000 for s in found]) for key, found in server.items()},
        busy={key: Measurement.of(found) for key, found in busy.items()},
        drives=drives,
        refused=refused,
    )


def _rows(measured: _Measured, sizes: Sequence[int], systems: Sequence[str]) -> list[Result]:
    found: list[Result] = []
    for workload in WORKLOADS:
        for size in sizes:
            for name in systems:
                if not _runs(name, workload):
                    continue
                rate = measured.rates[(name, workload, size)]
                comparisons: tuple[Comparison, ...] = ()
                if size > 1:
                    anchor = f"1 {_ANCHORS[name]} process"
                    target = TARGETS_VS_ONE.get((workload, size)) if name == OURS else None
                    one = measured.rates[(name, workload, 1)]
                    comparisons += compare(rate, anchor, one, target)
                if name == OURS and PEER in systems:
                    peer = measured.rates[(PEER, workload, size)]
                    comparisons += compare(rate, "DBOS", peer, FLEET_VS_DBOS)
                if name == OURS and BARE in systems and _runs(BARE, workload):
                    bare = measured.rates[(BARE, workload, size)]
                    comparisons += compare(rate, "bare step bodies", bare)
                found.append(
                    Result(
                        group=GROUP,
                        case=_case(name, size, workload),
                        on=POSTGRES.describe(),
                        unit="workflows/s",
                        value=rate,
                        comparisons=comparisons,
                    )
                )
    for workload, (description, _) in WORKLOADS.items():
        for name in systems:
            if name == BARE:
                continue
            cost = measured.cpu[(name, workload)]
            peer_cost = measured.cpu.get((PEER, workload)) if name == OURS else None
            found.append(
                Result(
                    group=GROUP,
                    case=f"{name}: CPU time of the worker processes per {WORKFLOW_STEPS}-step "
                    f"workflow, {description} (every fleet size)",
                    on=POSTGRES.describe(),
                    unit="ms",
                    value=cost,
                    comparisons=compare(cost, "DBOS", peer_cost),
                    lower_is_better=True,
                )
            )
            server = measured.server[(name, workload)]
            peer_server = measured.server.get((PEER, workload)) if name == OURS else None
            found.append(
                Result(
                    group=GROUP,
                    case=f"{name}: CPU time of the PostgreSQL server per {WORKFLOW_STEPS}-step "
                    f"workflow, {description} (every fleet size)",
                    on=POSTGRES.describe(),
                    unit="ms",
                    value=server,
                    comparisons=compare(server, "DBOS", peer_server),
                    lower_is_better=True,
                )
            )
    return found


def _ceilings(measured: _Measured) -> str:
    """What the CPU figures allow the targets on 2 cores, however fast the rest.

    CPU-bound, one worker process is held to 1/w by its own core while two share both cores
    with the server, 2/(w + p): two make at most 2w/(w + p) of one. Against DBOS, a runfold
    workflow costs at least the steps' own work plus the server's p.
    """
    key = (OURS, "cpu")
    if key not in measured.cpu:
        return ""
    w, p = measured.cpu[key].median, measured.server[key].median
    text = (
        f" Ceilings from the CPU figures (2 cores, CPU steps): 2 runfold processes make at most "
        f"2w/(w+p) = {2 * w / (w + p):.2f}× one (w = {w:.1f} ms the worker's, p = {p:.1f} ms "
        "the server's, per workflow)"
    )
    peer = (PEER, "cpu")
    if peer in measured.cpu:
        dbos = measured.cpu[peer].median + measured.server[peer].median
        work = WORKFLOW_STEPS * CPU_STEP_SECONDS * 1000
        text += (
            f"; against DBOS ({dbos:.1f} ms per workflow, server included) at most "
            f"{dbos / (work + p):.2f}×, were runfold's own cost nothing but the steps' "
            f"{work:g} ms and the server's"
        )
    text += "." + _machine(measured, w, p)
    io = [
        (size, measured.rates[(PEER, "io", size)].median)
        for (name, load, size) in measured.rates
        if name == OURS and load == "io" and (PEER, "io", size) in measured.rates
    ]
    if io:
        floor = WORKFLOW_STEPS * IO_STEP_SECONDS  # a workflow's latency is at least its steps'
        bounds = ", ".join(
            f"{CONCURRENCY * size / floor / rate:.2f}× DBOS's rate with {size} process(es)"
            for size, rate in sorted(io)
        )
        text += (
            f" With I/O steps a process holds {CONCURRENCY} runs at once, so no fleet drains "
            f"faster than {CONCURRENCY} per process per {floor * 1000:g} ms (the steps' own "
            f"latency): at most {bounds}."
        )
    return text


def _machine(measured: _Measured, w: float, p: float) -> str:
    """What the machine gave while runfold's CPU fleets drained: the bare fleets' scaling (the
    ceiling measured), and its busy cores against those runfold's processes and server used."""
    rates = measured.rates
    text = ""
    if (BARE, "cpu", 2) in rates and (BARE, "cpu", 1) in rates and (OURS, "cpu", 2) in rates:
        bare = rates[(BARE, "cpu", 2)].median / rates[(BARE, "cpu", 1)].median
        ours = rates[(OURS, "cpu", 2)].median / rates[(OURS, "cpu", 1)].median
        text += (
            f" Measured ceiling: 2 processes of the bare step bodies made {bare:.2f}× one on "
            f"this machine meanwhile; runfold's 2 made {ours:.2f}× one, {ours / bare:.0%} of it."
        )
    busy = [
        f"{measured.busy[(OURS, 'cpu', size)].median:.2f} with {size} (runfold's own "
        f"{(w + p) * rates[(OURS, 'cpu', size)].median / 1000:.2f})"
        for size in (1, 2)
        if (OURS, "cpu", size) in measured.busy
    ]
    if busy:
        text += (
            f" Busy cores of {os.cpu_count()} while runfold's CPU fleet drained, anyone's work: "
            + "; ".join(busy)
            + "."
        )
    return text


def bench_fleet(quick: bool) -> list[Result | Remark]:
    if POSTGRES.version() is None:
        return [Remark(group=GROUP, text="PostgreSQL: no server, not measured.")]
    found: list[Result | Remark] = []
    systems: dict[str, Callable[[ExitStack, int, Path], Fleet]] = {
        OURS: _RunfoldFleet,
        BARE: _BareFleet,
    }
    try:
        import benchmarks.fleet_dbos  # noqa: F401
    except ImportError:
        found.append(Remark(group=GROUP, text="DBOS is not installed: no peer rows."))
    else:
        systems[PEER] = _DbosFleet
    sizes = (1, 2) if quick else SIZES
    per_process = {"cpu": 3, "io": 3} if quick else RUNS_PER_PROCESS
    repeats, warmup = (1, 0) if quick else (3, 1)
    try:
        measured = _measure(systems, sizes, per_process, repeats, warmup)
    except NoLeases as exc:
        return [*found, Remark(group=GROUP, text=f"Not measured: {exc}.")]
    found += _rows(measured, sizes, list(systems))
    batches = ", ".join(f"{n} per process for {w}" for w, n in per_process.items())
    found.append(
        Remark(
            group=GROUP,
            text="Each fleet is its own worker processes on a fresh schema of the one server, "
            f"draining a backlog of queued runs ({batches}): timed from the fleet's resumption "
            "(SIGCONT) to its last run's completion, the fleets taking turns, each paused "
            "(SIGSTOP) while the other works and while its batch is queued. Every process "
            f"drives at most {CONCURRENCY} runs at once (runfold `--concurrency`, DBOS "
            f"`worker_concurrency`) and looks for queued work every {POLL:g} s (`--poll`, "
            "`polling_interval_sec`); DBOS runs one executor id per process, its CPU-bound "
            "workflow with its synchronous API and its I/O-bound one with its async API. "
            f"runfold's leases last {LEASE:g} s (renewed every third of it). The CPU time is the "
            "worker processes' own (user and system), the server's is counted apart; "
            f"{WORKFLOW_STEPS * CPU_STEP_SECONDS * 1000:g} ms of it is the CPU steps' work. "
            f"Claims another runfold worker won first: {measured.refused} of "
            f"{measured.drives + measured.refused}." + _ceilings(measured),
        )
    )
    return found
