"""The kit assumes nothing about timing: its checks pass on PostgreSQL while another session on
the server keeps transactions open, which holds the global feed back (`read_all` serves only
transactions older than every one still running, and waits just `feed_wait` for them).

`test_token_conflict_across_runs` once failed on a loaded machine for that reason: it compared
two readings of the feed taken straight after writes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from runfold.conformance import run_conformance
from tests.stores import test_conformance
from tests.support.postgres_support import DSN, admin

HELD = 0.3
"""Seconds each transaction of the other session stays open: three times `feed_wait`."""

FEED_CHECKS = [
    "test_token_conflict_across_runs",
    "test_append_stale_sequence_refused",
    "test_read_all_in_position_order",
    "test_read_all_pages_by_position",
    "test_round_trip_every_event_type",
    "test_tailing_reader_never_skips",
    "test_delete_runs_before_cutoff",
    "test_corrupt_payload_fails_its_run_only",
    "test_reopen_holds_acknowledged",
    "test_state_machine",
]
"""Checks that compare the feed with what was just written."""


@pytest.fixture
def open_transactions() -> Iterator[threading.Event]:
    """Another session that keeps a transaction (with an id) open for `HELD` seconds, again and
    again, until the test ends; set the event it yields once it has held at least one."""
    admin()  # skips (fails under CI=true) without a server
    stop, holding = threading.Event(), threading.Event()

    def hold() -> None:
        with psycopg.connect(DSN, autocommit=True, connect_timeout=5) as conn:
            while not stop.is_set():
                with conn.transaction():
                    conn.execute("SELECT pg_current_xact_id()")
                    holding.set()
                    stop.wait(HELD)
                time.sleep(0.01)

    thread = threading.Thread(target=hold, name="open-transactions", daemon=True)
    thread.start()
    try:
        assert holding.wait(10), "the other session never opened a transaction"
        yield holding
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


def test_feed_checks_pass_while_another_session_holds_transactions_open(
    open_transactions: threading.Event,
) -> None:
    report = run_conformance(
        test_conformance.TestPostgresStore, checks=FEED_CHECKS, examples=3, shrink=False
    )
    assert report.ok, report
