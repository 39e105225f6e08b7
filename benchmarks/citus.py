"""A run-sharded Citus cluster against one of its nodes as a plain server, with the ceilings
that bound any store there; every row timed in one run (contenders in turns), so the ratios
compare like with like on a shared machine.

- **Ceilings** (`benchmarks.citus_raw`): bare psycopg, no runfold, 8 connections each appending
  to a run of its own, one call per append: a single-row `INSERT` through the coordinator
  against the same on a plain schema of the same server; the same `INSERT` in a function Citus
  pushes down to the run's worker; and the leads for a whole append (run on the worker, with
  the worker's or the coordinator's transaction id as its position; routed statement by
  statement, as the store's group commits are; one routed `INSERT ... SELECT`, as the store's
  appends alone are).
- **The store**: 8 writers on distinct runs through `PostgresStore`, the cluster's store opened
  with `distributed=True` on the coordinator, the plain one on a schema of the same server that
  is not distributed.

It runs where `RUNFOLD_BENCH_CITUS_DSN` names a Citus coordinator (`make bench-citus` starts a
coordinator and two workers on loopback with `scripts/citus-cluster.sh`); elsewhere it gives a
remark and no rows, so `make bench` skips it cleanly.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Sequence

import psycopg

from benchmarks.citus_raw import RawSchema, raw_appends
from benchmarks.harness import (
    Remark,
    Result,
    Rows,
    Target,
    Trial,
    compare,
    event_loop,
    interleaved,
    opened,
)
from benchmarks.writes import store_appends
from runfold.stores import PostgresStore

__all__ = ["bench_citus"]

WRITERS = 8
GROUP = "Citus cluster"
TARGET = Target(goal="issue #35: at least half a plain server's rate", bound=0.5)

RAW_CASES: tuple[tuple[str, bool, str, str], ...] = (
    ("plain insert", False, "insert", "ceiling: one single-row INSERT per call, plain schema"),
    (
        "cluster insert",
        True,
        "insert",
        "ceiling: one single-row INSERT per call through the coordinator (routed)",
    ),
    (
        "cluster pushed",
        True,
        "pushed",
        "ceiling: that INSERT in a function pushed down to the run's worker",
    ),
    (
        "plain append",
        False,
        "append_routed",
        "raw append (head moved, event inserted) in one function call, plain schema",
    ),
    (
        "cluster routed",
        True,
        "append_routed",
        "raw append run on the coordinator, each statement routed (the store's group commits)",
    ),
    (
        "plain one",
        False,
        "append_one",
        "raw append as one INSERT ... SELECT (head checked by the previous event), plain schema",
    ),
    (
        "cluster one",
        True,
        "append_one",
        "the same through the coordinator, routed, autocommit: the store's path",
    ),
    (
        "cluster on worker",
        True,
        "append_on_worker",
        "raw append pushed down, position from the worker's transaction id",
    ),
    (
        "cluster xact",
        True,
        "append_xact",
        "raw append pushed down, position from a coordinator transaction id taken first",
    ),
)
"""The raw contenders: (name, distributed, `citus_raw` case, what the row says)."""

_ANCHORS = {
    "insert": "plain insert",
    "pushed": "plain insert",
    "append_one": "plain one",
    "append": "plain append",
}


def _dsn() -> str:
    return os.environ.get("RUNFOLD_BENCH_CITUS_DSN", "")


def bench_citus(quick: bool) -> Sequence[Result | Remark]:
    """The ceilings (bare psycopg) and 8 writers through the store, the cluster through its
    coordinator and a plain server."""
    dsn = _dsn()
    if not dsn:
        text = "Not measured here: RUNFOLD_BENCH_CITUS_DSN names no Citus coordinator."
        print(f"  {text} Skipped.", file=sys.stderr)
        return [Remark(group=GROUP, text=text)]
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute("SELECT count(*) FROM citus_get_active_worker_nodes()").fetchone()
            workers = int(row[0]) if row else 0
    except psycopg.Error as exc:
        text = f"Not measured here: no Citus coordinator at {dsn} ({type(exc).__name__})."
        print(f"  {text}", file=sys.stderr)
        return [Remark(group=GROUP, text=text)]
    on = f"coordinator and {workers} workers on this machine's cores"
    return _measured(dsn, quick, on)


def _measured(dsn: str, quick: bool, on: str) -> list[Result]:
    """Every row, timed in one run: the raw contenders and the two stores take turns."""
    count = 8 if quick else 100
    repeats = 2 if quick else 5
    tag = uuid.uuid4().hex[:6]
    schemas = [f"bench_citus_{tag}", f"bench_plain_{tag}"]
    closers: list[Callable[[], object]] = []
    with (
        event_loop() as loop,
        RawSchema(dsn, f"bench_raw_plain_{tag}", distributed=False) as plain_raw,
        RawSchema(dsn, f"bench_raw_cluster_{tag}", distributed=True) as cluster_raw,
    ):
        try:
            trials: dict[str, Trial] = {}
            for name, distributed, case, _ in RAW_CASES:
                schema = cluster_raw if distributed else plain_raw
                prepare, run, close = raw_appends(loop, schema, case, writers=WRITERS, count=count)
                trials[name] = Trial(prepare=prepare, run=run)
                closers.append(close)
            cluster_store = opened(
                loop,
                PostgresStore.open(dsn, schema=schemas[0], pool_max=WRITERS, distributed=True),
            )
            plain_store = opened(loop, PostgresStore.open(dsn, schema=schemas[1], pool_max=WRITERS))
            with cluster_store as cluster, plain_store as plain:
                trials["plain server"] = store_appends(
                    loop, plain, writers=WRITERS, count=count, batch=1
                )
                trials["cluster"] = store_appends(
                    loop, cluster, writers=WRITERS, count=count, batch=1
                )
                rates = interleaved(trials, units=WRITERS * count, repeats=repeats)
        finally:
            for close in closers:
                close()
            with psycopg.connect(dsn, autocommit=True) as conn:
                for schema_name in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema_name}" CASCADE')
    row = Rows(GROUP, on)
    results = []
    for name, _, case, text in RAW_CASES:
        anchor = next(a for key, a in _ANCHORS.items() if key in case)
        against = () if name == anchor else compare(rates[name], anchor, rates[anchor])
        results.append(
            row(
                f"{text}: {WRITERS} connections, ×{count} calls each",
                "calls/s",
                rates[name],
                against,
            )
        )
    case = f"{WRITERS} writers on distinct runs, ×{count} appends of one event each"
    results += [
        row(
            f"plain server (one node, schema not distributed): {case}",
            "appends/s",
            rates["plain server"],
            compare(rates["plain server"], "plain append", rates["plain append"]),
        ),
        row(
            f"cluster through the coordinator (distributed=True): {case}",
            "appends/s",
            rates["cluster"],
            (
                *compare(rates["cluster"], "plain server", rates["plain server"], TARGET),
                *compare(rates["cluster"], "cluster one", rates["cluster one"]),
            ),
        ),
    ]
    return results
