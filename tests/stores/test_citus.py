"""PostgresStore on a run-sharded Citus cluster: the whole conformance kit, and the feed under load.

Runs only where `RUNFOLD_TEST_CITUS_DSN` names a Citus coordinator (`make test-citus` starts a
coordinator and two workers on loopback with `scripts/citus-cluster.sh` and sets it); elsewhere
every test here is skipped with that reason. Each kit check opens the store with
`distributed=True` on a schema of its own: the store distributes its tables itself.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from runfold.conformance import Capabilities, StoreConformance
from runfold.conformance.builders import envelopes_for, hook, index_after, log, started, write
from runfold.stores import PostgresStore
from runfold.stores.postgres.placement import Placement, hashtext
from runfold.stores.protocol import EventStore

DSN = os.environ.get("RUNFOLD_TEST_CITUS_DSN", "")
pytestmark = pytest.mark.skipif(
    not DSN, reason="no Citus cluster: RUNFOLD_TEST_CITUS_DSN is unset (`make test-citus`)"
)
_PREFIX = f"runfold_citus_{uuid.uuid4().hex[:8]}"
_made: list[str] = []


def _schema(label: str) -> str:
    name = f"{_PREFIX}_{label}_{uuid.uuid4().hex[:6]}"
    _made.append(name)
    return name


@pytest.fixture(scope="module", autouse=True)
def _drop_schemas() -> Any:
    yield
    if not DSN:
        return
    with psycopg.connect(DSN, autocommit=True) as conn:
        for name in _made:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


class TestCitusStore(StoreConformance):
    """The kit on the cluster: tables distributed by run, tokens by token; every check."""

    capabilities = Capabilities(
        reopen=True, corruption=True, sharing=True, rewrite_index=True, replay=True
    )

    async def make_store(self) -> EventStore:
        return await PostgresStore.open(DSN, schema=_schema("kit"), pool_max=4, distributed=True)

    async def reopen_store(self, store: EventStore) -> EventStore:
        assert isinstance(store, PostgresStore)
        return await PostgresStore.open(DSN, schema=store._schema, pool_max=4)

    async def share_store(self, store: EventStore) -> EventStore:
        assert isinstance(store, PostgresStore)
        return await PostgresStore.open(DSN, schema=store._schema, pool_max=4)

    async def corrupt_payload(self, store: EventStore, run_id: str, sequence: int) -> None:
        assert isinstance(store, PostgresStore)
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(
                f'UPDATE "{store._schema}".events SET payload = %s '
                "WHERE run_id = %s AND sequence = %s",
                (b"\xff\x00", run_id, sequence),
            )


async def test_the_layout_is_distributed_by_run_and_tokens_by_token() -> None:
    schema = _schema("layout")
    store = await PostgresStore.open(DSN, schema=schema, distributed=True)
    await store.close()
    with psycopg.connect(DSN, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT logicalrelid::regclass::text, column_to_column_name(logicalrelid, partkey), "
            "colocationid FROM pg_dist_partition WHERE logicalrelid::regclass::text LIKE %s",
            (f"{schema}.%",),
        ).fetchall()
    layout = {name.split(".")[-1]: (column, group) for name, column, group in rows}
    assert {table: column for table, (column, _) in layout.items()} == {
        "runs": "run_id",
        "events": "run_id",
        "hooks": "run_id",
        "wakeups": "run_id",
        "due_holds": "run_id",
        "tokens": "token",
    }
    run_group = {group for table, (_, group) in layout.items() if table != "tokens"}
    assert len(run_group) == 1
    assert layout["tokens"][1] not in run_group


LAST = ""
"""What the last race wrote (printed by the benchmark of the feed)."""
FEED_RACE_SECONDS = float(os.environ.get("RUNFOLD_CITUS_RACE_SECONDS", "20"))


async def test_tailing_readers_skip_nothing_under_sixteen_writers() -> None:
    """16 writers append for `FEED_RACE_SECONDS` (20 s) while two readers tail `read_all`: every
    committed event reaches both, in position order, none skipped."""
    store = await PostgresStore.open(
        DSN, schema=_schema("race"), pool_max=24, distributed=True, feed_wait=0.05
    )
    at = datetime(2026, 1, 1, tzinfo=UTC)
    written: list[int] = []
    stop = time.monotonic() + FEED_RACE_SECONDS

    async def writer(n: int) -> None:
        run_id = f"w{n}-{uuid.uuid4().hex[:6]}"
        history = await write(store, run_id, *started(), at=at)
        written.extend(e.position for e in history if e.position is not None)
        while time.monotonic() < stop:
            # Every fifth append of odd writers claims a token: on another worker's shard, a
            # two-phase commit.
            count = len(history)
            claim = n % 2 == 1 and count % 5 == 0
            events = [hook(f"h{count}", f"{run_id}-{count}") if claim else log(f"{count}")]
            new = envelopes_for(run_id, count, events, at)
            history += await store.append_if_sequence(
                run_id, count, events, index=index_after(history, new), recorded_at=at
            )
            written.extend(e.position for e in history[count:] if e.position is not None)

    async def reader() -> list[int]:
        seen: list[int] = []
        after = 0
        while time.monotonic() < stop + 2 or len(seen) < len(written):
            batch = await store.read_all(after_position=after, limit=500)
            for envelope in batch:
                assert envelope.position is not None and envelope.position > after
                after = envelope.position
                seen.append(after)
            if not batch:
                if time.monotonic() > stop + 10:
                    break
                await asyncio.sleep(0.01)
        return seen

    try:
        readers = [asyncio.create_task(reader()) for _ in range(2)]
        await asyncio.gather(*(writer(n) for n in range(16)))
        seen = await asyncio.gather(*readers)
    finally:
        await store.close()
    global LAST
    LAST = f"{len(written)} events by 16 writers in {FEED_RACE_SECONDS:g} s, two readers"
    assert len(written) > 100
    for tail in seen:
        missed = set(written) - set(tail)
        assert not missed, f"a tailing reader skipped {len(missed)} of {len(written)} events"
        assert tail == sorted(written)


async def test_plain_appends_are_routed_to_one_worker_in_one_phase() -> None:
    """8 writers on distinct runs, plain appends, alone and in group commits: what the
    coordinator sends the workers is, per append, one `INSERT` of its event naming one shard
    (the run's row left as it is), alone or between a `BEGIN` and a `COMMIT` (a group commit's):
    no `COPY`, no statement over several shards, no two-phase commit; an append alone is that
    one statement, without a `BEGIN`."""
    issued: list[str] = []

    async def log_remote_commands(conn: psycopg.AsyncConnection[Any]) -> None:
        conn.add_notice_handler(lambda notice: issued.append(notice.message_primary or ""))

    pool = AsyncConnectionPool(
        DSN,
        kwargs={"autocommit": True, "options": "-c citus.log_remote_commands=on"},
        configure=log_remote_commands,
        min_size=1,
        max_size=4,  # 4 write slots for 8 writers: group commits too
        open=False,
    )
    await pool.open()
    store = await PostgresStore.open(pool=pool, schema=_schema("routed"), distributed=True)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    appends = 8 * 6
    try:
        histories = await asyncio.gather(
            *(write(store, f"r{n}-{uuid.uuid4().hex[:6]}", *started(), at=at) for n in range(8))
        )
        issued.clear()

        async def writer(history: list[Any]) -> None:
            run_id = history[0].run_id
            for _ in range(appends // 8):
                count = len(history)
                events = [log(f"{count}")]
                new = envelopes_for(run_id, count, events, at)
                history += await store.append_if_sequence(
                    run_id, count, events, index=index_after(history, new), recorded_at=at
                )

        await asyncio.gather(*(writer(history) for history in histories))
    finally:
        await store.close()
        await pool.close()
    commands = [text.removeprefix("issuing ").split(" ", 3) for text in issued]
    kinds = [words[0] for words in commands]
    inserts = [words for words in commands if words[:2] == ["INSERT", "INTO"]]
    assert len(inserts) == appends and all(".events_" in words[2] for words in inserts)
    begins = [text for text in issued if text.startswith("issuing BEGIN")]
    commits = [text for text in issued if text == "issuing COMMIT"]
    assert len(begins) == len(commits) <= appends / 2
    assert len(issued) == len(begins) + len(commits) + appends, sorted(set(kinds))


async def test_the_client_places_runs_on_the_workers_citus_does() -> None:
    """`Placement.group` (the writer's grouping of group commits by worker) agrees with the
    cluster's own routing for every run id tried."""
    schema = _schema("placement")
    store = await PostgresStore.open(DSN, schema=schema, distributed=True)
    try:
        async with store._connections.connection() as conn:
            placement = await Placement.read(conn, f'"{schema}"')
    finally:
        await store.close()
    assert placement.workers == 2
    run_ids = [f"run-{n}" for n in range(200)] + ["", "é" * 13, "x" * 40]
    with psycopg.connect(DSN, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, p.groupid FROM unnest(%s::text[]) AS id, "
            "LATERAL get_shard_id_for_distribution_column(%s, id) AS s(shardid) "
            "JOIN pg_dist_placement p USING (shardid)",
            (run_ids, f"{schema}.runs"),
        ).fetchall()
    assert {run_id: placement.group(run_id) for run_id in run_ids} == dict(rows)
    assert len(set(dict(rows).values())) == 2


def test_hashtext_is_the_servers() -> None:
    words = ["", "a", "abcdefghijk", "abcdefghijkl", "abcdefghijklm", "é", "run-1", "ü" * 30]
    words += [f"w{n}-{uuid.uuid4().hex[: n % 30]}" for n in range(100)]
    with psycopg.connect(DSN, autocommit=True) as conn:
        found = conn.execute(
            "SELECT w, hashtext(w) FROM unnest(%s::text[]) AS w", (words,)
        ).fetchall()
    assert {word: hashtext(word) for word in words} == dict(found)


def _crash_the_coordinator() -> None:
    """Kill a backend of the coordinator (SIGKILL, from the server itself): its postmaster ends
    every process and recovers from its WAL on disk, as after a crash; back when it answers."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        [(pid,)] = conn.execute("SELECT pg_backend_pid()").fetchall()
        with pytest.raises(psycopg.OperationalError):
            conn.execute(f"COPY (SELECT) TO PROGRAM 'kill -9 {int(pid)}'")
    for _ in range(600):
        try:
            with psycopg.connect(DSN, autocommit=True, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            time.sleep(0.1)
    raise AssertionError("the coordinator did not come back within 60 s")


async def test_positions_outlive_a_crash_of_the_coordinator() -> None:
    """Appends answered, then the coordinator crashed at once (before its WAL writer's next
    round), three times: every append after recovery takes positions above all those answered
    before, and the feed holds each position once, in order. (An append's transaction on the
    coordinator writes no rows there; unless it writes a WAL record, its commit is not flushed,
    and recovery hands its id, hence its positions, out again.)"""
    schema = _schema("crash")
    at = datetime(2026, 1, 1, tzinfo=UTC)
    answered: list[int] = []
    for _ in range(3):
        store = await PostgresStore.open(DSN, schema=schema, pool_max=2, distributed=True)
        try:
            before = max(answered, default=0)
            for _ in range(4):
                history = await write(store, f"c-{uuid.uuid4().hex[:8]}", *started(), at=at)
                positions = [e.position for e in history if e.position is not None]
                assert min(positions) > before, "positions went back below ones answered"
                answered += positions
            _crash_the_coordinator()
        finally:
            await store.close()
    store = await PostgresStore.open(DSN, schema=schema, pool_max=2)
    try:
        feed = [e.position or 0 for e in await store.read_all(after_position=0, limit=1000)]
    finally:
        await store.close()
    assert feed == sorted(set(feed)), "the feed holds a position twice"
    assert feed == answered
