"""`runfold workers` in a subprocess: each worker's lease as it is, a spent one shown as spent."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from runfold import CommandHandler
from runfold.cli.values import timestamp
from runfold.commands import ClaimRun, StartRun
from runfold.stores import SQLiteStore
from tests.support.cli_support import ok, runfold_cli
from tests.support.rules_helpers import create


async def test_workers_shows_a_lease_taken_over_as_spent_not_as_ending_in_1970(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    now = datetime.now(UTC)
    past = now - timedelta(minutes=10)
    async with await SQLiteStore.open(path) as store:
        handler = CommandHandler(store)
        for run_id, owner in (("r1", "gone"), ("r2", "lapsed")):
            await handler.execute(run_id, StartRun(create=create()))
            await handler.execute(run_id, ClaimRun(owner_id=owner))
            assert await store.renew_lease(owner, lease_until=past + timedelta(seconds=1), now=past)
        assert await store.renew_lease("live", lease_until=now + timedelta(hours=1), now=now)
        # "live" takes one run of "gone" over: the store spends that lease.
        [taken] = await store.claim_due("live", now, hold_until=now, limit=1)
        assert (taken.run_id, taken.displacing) == ("r1", "gone")
        await handler.execute("r1", ClaimRun(owner_id="live", displacing="gone"))

    url = f"sqlite:///{path}"
    lines = ok(runfold_cli("--store", url, "workers")).splitlines()
    assert [line.split("  ")[:3] for line in lines] == [
        ["gone", "runs 0", "lease spent (its runs taken over)"],
        ["lapsed", "runs 1", f"lease lapsed at {timestamp(past + timedelta(seconds=1))}"],
        ["live", "runs 1", f"lease until {timestamp(now + timedelta(hours=1))}"],
    ]
    assert "1970" not in "".join(lines)
    rows = json.loads(ok(runfold_cli("--store", url, "workers", "--json")))
    assert [(row["worker_id"], row["lease"], row["runs"]) for row in rows] == [
        ("gone", "spent", 0),
        ("lapsed", "lapsed", 1),
        ("live", "holds", 1),
    ]
    assert rows[0]["lease_until"] is None
    assert rows[2]["lease_until"] == timestamp(now + timedelta(hours=1))
