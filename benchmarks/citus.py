"""A run-sharded Citus cluster against one of its nodes as a plain server: 8 writers on distinct
runs through `PostgresStore`, the cluster's store opened with `distributed=True` on the
coordinator, the plain one on a schema of the same server that is not distributed.

It runs where `RUNFOLD_BENCH_CITUS_DSN` names a Citus coordinator (`make bench-citus` starts a
coordinator and two workers on loopback with `scripts/citus-cluster.sh`); elsewhere it gives a
remark and no rows, so `make bench` skips it cleanly.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Sequence

import psycopg

from benchmarks.harness import Remark, Result, Target, compare, event_loop, interleaved, opened
from benchmarks.writes import store_appends
from runfold.stores import PostgresStore

__all__ = ["bench_citus"]

WRITERS = 8
GROUP = "Citus cluster"
TARGET = Target(goal="issue #35: at least half a plain server's rate", bound=0.5)


def _dsn() -> str:
    return os.environ.get("RUNFOLD_BENCH_CITUS_DSN", "")


def bench_citus(quick: bool) -> Sequence[Result | Remark]:
    """8 writers on distinct runs: the cluster through its coordinator, then a plain server."""
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
    count = 8 if quick else 150
    repeats = 2 if quick else 5
    tag = uuid.uuid4().hex[:6]
    schemas = [f"bench_citus_{tag}", f"bench_plain_{tag}"]
    with event_loop() as loop:
        try:
            cluster_store = opened(
                loop,
                PostgresStore.open(dsn, schema=schemas[0], pool_max=WRITERS, distributed=True),
            )
            plain_store = opened(loop, PostgresStore.open(dsn, schema=schemas[1], pool_max=WRITERS))
            with cluster_store as cluster, plain_store as plain:
                rates = interleaved(
                    {
                        "cluster": store_appends(
                            loop, cluster, writers=WRITERS, count=count, batch=1
                        ),
                        "plain": store_appends(loop, plain, writers=WRITERS, count=count, batch=1),
                    },
                    units=WRITERS * count,
                    repeats=repeats,
                )
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    on = f"coordinator and {workers} workers on this machine's cores"
    case = f"{WRITERS} writers on distinct runs, ×{count} appends of one event each"
    return [
        Result(
            group=GROUP,
            case=f"plain server (one node, schema not distributed): {case}",
            on=on,
            unit="appends/s",
            value=rates["plain"],
        ),
        Result(
            group=GROUP,
            case=f"cluster through the coordinator (distributed=True): {case}",
            on=on,
            unit="appends/s",
            value=rates["cluster"],
            comparisons=compare(rates["cluster"], "plain server", rates["plain"], TARGET),
        ),
    ]
